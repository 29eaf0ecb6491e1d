"""PPO on the tiny model: the recipe's invariants, and learning on a toy reward."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from peft.tuners.lora import LoraLayer

from tests.conftest import DEMO_PROMPTS, PPO_PROMPTS, first_token_probs, load_plain, set_settings, shipping_sampling_defaults
from train.common.config import ModelConfig, PPOConfig
from train.common.models import load_model
from train.policy.generate import end_of_turn_ids
from train.policy.ppo import (
    AdaptiveKL,
    RewardScorer,
    add_advantages,
    add_rewards,
    build,
    evaluate,
    optimizer_for,
    position_ids,
    ppo_step,
    response_logprobs,
    response_outputs,
    reward_scores,
    sample,
    sampling_settings,
    train_ppo,
    trainable_parameters,
    update,
)
from train.reward.encoding import encode
from train.reward.layout import METRICS_FILE, NORMALIZATION_FILE
from train.reward.versions import read_reward_adapter

def one_step(wrapped, beta=0.1, prompts=PPO_PROMPTS * 4):
    model, tokenizer, config, scorer = wrapped
    optimizer = optimizer_for(model, config)
    return ppo_step(model, scorer, optimizer, prompts, config, AdaptiveKL(beta, 0, 1),
                    end_of_turn_ids(model.peft_model, tokenizer), torch.Generator().manual_seed(0))


def test_the_toy_reward_model_favours_its_token(peaked_model_dir, favoured, wrapped):
    token, _ = favoured
    model, tokenizer, config, scorer = wrapped
    candidates = first_token_probs(peaked_model_dir).topk(20).indices
    texts = [tokenizer.decode([t]) for t in candidates.tolist()]
    for prompt in PPO_PROMPTS:
        scores, _ = reward_scores(model, scorer, [prompt] * len(texts), texts)
        assert candidates[scores.argmax()].item() == token


def test_at_step_0_the_policy_is_the_reference_and_kl_is_0(wrapped):
    stats, rollout = one_step(wrapped)
    assert torch.equal(rollout.logprobs, rollout.ref_logprobs)
    assert stats["kl"] == 0.0
    assert stats["first_clip_fraction"] == 0.0  # the first minibatch of the first epoch sees the rollout's own policy


def test_the_reference_is_unchanged_by_an_update_and_the_policy_is_changed(wrapped):
    model, tokenizer, config, scorer = wrapped
    batch = sample(model, tokenizer, PPO_PROMPTS * 4, config, end_of_turn_ids(model.peft_model, tokenizer))
    args = batch[:4]
    with model.peft_model.disable_adapter():
        before = response_logprobs(model, *args, config.temperature).detach()
    policy_before = response_logprobs(model, *args, config.temperature).detach()
    one_step(wrapped)
    with model.peft_model.disable_adapter():
        after = response_logprobs(model, *args, config.temperature).detach()
    assert torch.equal(before, after)
    assert not torch.allclose(policy_before, response_logprobs(model, *args, config.temperature).detach())


def test_rollouts_sample_with_the_policy_folded_what_it_samples_unfolded_and_the_base_comes_back_bit_for_bit(wrapped):
    model, tokenizer, config, _ = wrapped
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.peft_model.named_parameters():
            if ".policy." in name and "lora_B" in name:  # a trained policy's, not the fresh one's zeros
                param.normal_(0, 0.05)
    before = {n: p.detach().clone() for n, p in model.peft_model.named_parameters() if "lora_" not in n}
    eos = end_of_turn_ids(model.peft_model, tokenizer)
    base_layer = next(m for m in model.peft_model.modules() if isinstance(m, LoraLayer)).get_base_layer()
    original = base_layer.weight.detach().clone()
    folded = []  # whether each forward pass through that layer saw its weight with the policy folded in
    hook = base_layer.register_forward_hook(lambda module, inputs, output: folded.append(not torch.equal(module.weight, original)))
    torch.manual_seed(7)
    query_ids, query_mask, response_ids, response_mask, _ = sample(model, tokenizer, PPO_PROMPTS * 4, config, eos)
    hook.remove()
    assert folded and all(folded)
    assert all(torch.equal(p, before[n]) for n, p in model.peft_model.named_parameters() if "lora_" not in n)
    torch.manual_seed(7)
    unfolded = model.peft_model.generate(input_ids=query_ids, attention_mask=query_mask, **sampling_settings(config, tokenizer, eos))
    unfolded = unfolded[:, query_ids.shape[1]:]
    assert torch.equal(response_ids, unfolded.masked_fill(response_mask == 0, tokenizer.pad_token_id))
    assert (response_mask.sum(dim=1) > 2).all()


def test_rewards_are_the_kl_penalty_per_token_and_the_score_on_the_last_token_only(wrapped):
    model, tokenizer, config, scorer = wrapped
    one_step(wrapped)  # the policy moves away from the reference, so the KL is not 0
    batch = sample(model, tokenizer, PPO_PROMPTS * 4, config, end_of_turn_ids(model.peft_model, tokenizer))
    rollout, _ = evaluate(model, scorer, PPO_PROMPTS * 4, batch, config)
    beta = 0.5
    kl = add_rewards(rollout, beta)
    mask = rollout.response_mask.bool()
    assert kl.abs().sum() > 0
    last = torch.zeros_like(mask)
    last[torch.arange(len(last)), rollout.response_mask.sum(1) - 1] = True
    penalty = rollout.rewards - last * rollout.scores[:, None]
    assert torch.allclose(penalty, -beta * kl)
    # The sign: where the policy likes a token more than the reference, its reward goes down.
    likes_more, likes_less = (rollout.logprobs > rollout.start_logprobs) & mask, (rollout.logprobs < rollout.start_logprobs) & mask
    assert likes_more.any() and likes_less.any()
    assert (penalty[likes_more] < 0).all() and (penalty[likes_less] > 0).all()
    assert (rollout.rewards[~mask] == 0).all()

    without_kl = add_rewards(rollout, 0.0)
    assert (rollout.rewards[~last] == 0).all() and torch.equal(rollout.rewards[last], rollout.scores)
    assert without_kl.shape == rollout.rewards.shape


def test_a_run_from_a_policy_version_pays_its_kl_to_that_version_and_counts_its_kl_to_v0_against_the_budget(
        peaked_model_dir, favoured, tmp_path):
    """A tether to v0 would pull a policy that an earlier round moved past [ppo] target_kl back towards v0, undoing that
    round: on the default model it took a DPO round's 71.1% over v0 down to 59.4% (scripts/BENCHMARKS.md)."""
    config = PPOConfig(steps=2, batch_size=8, minibatch_size=4, max_new_tokens=6, temperature=1.0, learning_rate=3e-3)
    model, tokenizer = load_plain(peaked_model_dir)
    train_ppo(model, tokenizer, PPO_PROMPTS, favoured[1], config, tmp_path / "v1")
    model, tokenizer = load_plain(peaked_model_dir)
    reward = read_reward_adapter(favoured[1])
    wrapped = build(model, reward, config, tmp_path / "v1"), tokenizer, config, RewardScorer(tokenizer, reward.normalization, 512)
    stats, rollout = one_step(wrapped, beta=0.5)
    last = torch.zeros_like(rollout.response_mask, dtype=torch.bool)
    last[torch.arange(len(last)), rollout.response_mask.sum(1) - 1] = True
    # The policy is the version it started from, so no token pays a penalty, though it is far from v0.
    assert torch.equal(rollout.logprobs, rollout.start_logprobs)
    assert (rollout.rewards[~last] == 0).all() and torch.equal(rollout.rewards[last], rollout.scores)
    assert stats["kl_to_start"] == 0.0 and stats["kl"] > 0.1
    assert stats["kl"] == pytest.approx((rollout.logprobs - rollout.ref_logprobs).sum(dim=1).mean().item())


def test_the_value_loss_does_not_change_the_policy_step(peaked_model_dir, favoured):
    """The policy's gradient and the value head's are clipped each on its own. Under one clip over both, the value
    head's gradient (6 to 10 times the policy's on the default model) shrank every policy step."""
    def built(vf_coef: float):
        model, tokenizer = load_plain(peaked_model_dir)
        config = PPOConfig(batch_size=8, minibatch_size=4, max_new_tokens=6, temperature=1.0, learning_rate=1e-3, epochs=2,
                           vf_coef=vf_coef, precision="fp32")
        reward = read_reward_adapter(favoured[1])
        return build(model, reward, config), tokenizer, config, RewardScorer(tokenizer, reward.normalization, 512)

    light, heavy = built(0.1), built(100.0)
    model, tokenizer, config, scorer = light
    torch.manual_seed(0)
    batch = sample(model, tokenizer, PPO_PROMPTS * 4, config, end_of_turn_ids(model.peft_model, tokenizer))
    rollout, _ = evaluate(model, scorer, PPO_PROMPTS * 4, batch, config)
    add_rewards(rollout, 0.1)
    add_advantages(rollout, config.gamma, config.lam)
    start = {n: p.detach().clone() for n, p in model.peft_model.named_parameters() if ".policy." in n}
    stats, policy, value = {}, {}, {}
    for name, (wrapped, _, settings, _) in (("light", light), ("heavy", heavy)):
        stats[name] = update(wrapped, optimizer_for(wrapped, settings), rollout, settings, torch.Generator().manual_seed(0))
        policy[name] = {n: p.detach().clone() for n, p in wrapped.peft_model.named_parameters() if ".policy." in n}
        value[name] = wrapped.value_head.weight.detach().clone()
    # The heavy value gradient is far over the clip, and over the policy's, as on the default model.
    assert stats["heavy"]["value_grad_norm"] > 10 * max(config.max_grad_norm, stats["heavy"]["policy_grad_norm"])
    assert stats["light"]["policy_grad_norm"] == stats["heavy"]["policy_grad_norm"] > 0
    assert any(not torch.equal(policy["light"][n], start[n]) for n in start)
    assert all(torch.equal(policy["light"][n], policy["heavy"][n]) for n in start)
    assert not torch.equal(value["light"], value["heavy"])


def test_gae_with_lambda_1_is_the_return_minus_the_value():
    from train.policy.ppo import Rollout

    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.4, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rollout = Rollout(None, None, None, response_mask=mask, logprobs=None, ref_logprobs=None, start_logprobs=None, values=values * mask,
                      scores=None,
                      finished=None, texts=[])
    rollout.rewards = rewards
    add_advantages(rollout, gamma=1.0, lam=1.0)
    expected = torch.tensor([[0.5, 0.8, 0.9], [1.7, 1.6, 0.0]])  # reward-to-go minus V
    assert torch.allclose(rollout.returns, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    valid = expected[mask.bool()]
    assert torch.allclose(rollout.advantages[mask.bool()], (valid - valid.mean()) / valid.std(correction=0), atol=1e-5)


def test_left_padding_and_temperature_give_each_sequence_its_own_log_probs(wrapped):
    model, tokenizer, config, scorer = wrapped
    batch = sample(model, tokenizer, PPO_PROMPTS, config, end_of_turn_ids(model.peft_model, tokenizer))
    query_ids, query_mask, response_ids, response_mask, _ = batch
    together = response_logprobs(model, *batch[:4], 0.7)
    for i in range(2):
        real = query_mask[i].bool()
        alone = response_logprobs(model, query_ids[i : i + 1, real], query_mask[i : i + 1, real], response_ids[i : i + 1], response_mask[i : i + 1], 0.7)
        n = response_mask[i].sum()
        assert torch.allclose(together[i, :n], alone[0, :n], atol=1e-5)
    ids = torch.cat([query_ids, response_ids], 1)
    mask = torch.cat([query_mask, response_mask], 1)
    logits = model.peft_model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits[:, -response_ids.shape[1] - 1 : -1]
    manual = (logits / 0.7).log_softmax(-1).gather(-1, response_ids[..., None])[..., 0]
    assert torch.allclose(together, manual, atol=1e-5)  # the selective log-softmax is the full one, read at the tokens


def test_ppo_raises_the_probability_of_the_favoured_token(peaked_model_dir, favoured, tmp_path):
    token, reward_dir = favoured
    before = first_token_probs(peaked_model_dir)[token].item()
    model, tokenizer = load_plain(peaked_model_dir)
    config = PPOConfig(steps=12, batch_size=16, minibatch_size=8, max_new_tokens=1, temperature=1.0, learning_rate=3e-4,
                       kl_coef=0.01, target_kl=0, missing_eos_penalty=0.0, seed=1)
    steps = []
    result = train_ppo(model, tokenizer, PPO_PROMPTS, reward_dir, config, tmp_path / "policy", on_step=steps.append)
    after = first_token_probs(peaked_model_dir, tmp_path / "policy")[token].item()
    assert after > 2 * before, (before, after, [round(s["score"], 2) for s in steps])
    scores = [s["score"] for s in result["steps"]]
    assert sum(scores[-3:]) / 3 > sum(scores[:3]) / 3
    assert [s["step"] for s in steps] == list(range(1, 13)) and all(len(s["samples"]) == 3 for s in steps)
    for name in ("score", "kl", "entropy", "clip_fraction", "approx_kl", "value_loss", "response_length", "beta"):
        assert all(isinstance(s[name], float) for s in steps), name


@pytest.mark.deep
def test_the_kl_penalty_holds_the_policy_nearer_its_start(peaked_model_dir, favoured, tmp_path):
    """The same runs without the penalty and with a strong one, over three seeds: with it, the first token's distribution
    ends nearer the start's.

    One run is a draw: at 16 responses a step, the penalised run of one seed in four moved as far as an unpenalised
    one, and the test's single draw failed on other machines. At 64 a step, over 12 seeds, the penalised runs' KL
    summed over three seeds was 0.37 of the unpenalised runs' in the median triple and 0.62 in the worst of all 220."""
    start = first_token_probs(peaked_model_dir)
    moved = {0.0: 0.0, 5.0: 0.0}
    for seed in (1, 2, 3):
        for kl_coef in moved:
            model, tokenizer = load_plain(peaked_model_dir)
            config = PPOConfig(steps=8, batch_size=64, minibatch_size=32, max_new_tokens=1, temperature=1.0, learning_rate=3e-4,
                               kl_coef=kl_coef, target_kl=0, missing_eos_penalty=0.0, seed=seed)
            out = tmp_path / f"seed-{seed}-beta-{kl_coef}"
            train_ppo(model, tokenizer, PPO_PROMPTS, favoured[1], config, out)
            policy = first_token_probs(peaked_model_dir, out)
            moved[kl_coef] += (policy * (policy.log() - start.log())).sum().item()  # KL(policy || start) on the first token
    assert 0 < moved[5.0] < 0.75 * moved[0.0], moved


PLAIN_GENERATE = """
import sys
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
base, adapter = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(base)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
ids = tokenizer.apply_chat_template([{"role": "user", "content": "Name a fruit."}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
assert not any(name.split(".")[0] in ("train", "store", "annotate", "ui") for name in sys.modules)
print(out.shape[1] - ids["input_ids"].shape[1])
"""


def test_the_saved_policy_loads_with_plain_peft_and_generates(peaked_model_dir, favoured, tmp_path):
    model, tokenizer = load_plain(peaked_model_dir)
    config = PPOConfig(steps=1, batch_size=4, minibatch_size=2, max_new_tokens=3)
    train_ppo(model, tokenizer, PPO_PROMPTS, favoured[1], config, tmp_path / "policy")
    assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == ["adapter_config.json", "adapter_model.safetensors", "kl_controller.json", "ppo_config.json"]
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(PLAIN_GENERATE))
    result = subprocess.run([sys.executable, str(script), str(peaked_model_dir), str(tmp_path / "policy")],
                            capture_output=True, text=True, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) >= 1


def test_tether_ppo_registers_the_next_policy_version_with_its_step_statistics(tiny_project, tmp_path):
    from contextlib import closing

    from store import open_database
    from tests.conftest import run_tether, toy_preferences

    set_settings(tiny_project, "ppo", steps=2, batch_size=4, max_new_tokens=6)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(tiny_project), check=True)
    run_tether("rm", "train", "--include-imported", "--project", str(tiny_project), check=True)
    missing = run_tether("ppo", "--project", str(tiny_project))
    assert missing.returncode == 1 and "no active prompts" in missing.stderr
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)

    done = run_tether("ppo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("policy v1 from v0 against reward model v1: last step score")
    assert "warning: PPO samples at most 6 tokens ([ppo] max_new_tokens) while annotators compare completions of up to 12" in done.stderr
    again = run_tether("ppo", "--project", str(tiny_project))  # continues from v1
    assert again.returncode == 0 and again.stdout.startswith("policy v2 from v1"), again.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        policies = con.execute("SELECT version, parent, adapter_path FROM policies ORDER BY version").fetchall()
        logged = con.execute("SELECT DISTINCT name FROM metrics m JOIN jobs j ON j.id = m.job_id WHERE j.kind = 'ppo'").fetchall()
        steps = con.execute("SELECT count(DISTINCT step) FROM metrics WHERE job_id = 3 AND name = 'score'").fetchone()[0]
    assert policies == [(0, None, None), (1, 0, "policies/v1"), (2, 1, "policies/v2")]
    assert {"score", "kl", "entropy", "clip_fraction", "approx_kl", "value_loss", "response_length", "beta"} <= {n for (n,) in logged}
    assert steps == 2
    assert (tiny_project / "policies" / "v2" / "adapter_config.json").exists()

    generated = run_tether("generate", "--limit", "2", "--project", str(tiny_project))  # the newest policy samples
    assert generated.returncode == 0 and "from policy v2" in generated.stdout, generated.stderr


def reward_copy(reward_dir, tmp_path, mean=0.7, std=2.5, max_length=512):
    """The toy reward model with other normalisation offsets and training max_length, as a trained one would have."""
    import shutil

    copy = tmp_path / "rm-copy"
    shutil.copytree(reward_dir, copy)
    (copy / NORMALIZATION_FILE).write_text(json.dumps({"mean": [mean], "std": [std]}))
    (copy / METRICS_FILE).write_text(json.dumps({"config": {"max_length": max_length, "heads": 1}}))
    return copy


def test_at_step_0_the_value_is_a_constant_baseline_and_its_loss_moves_its_head_alone(peaked_model_dir, favoured):
    model, tokenizer = load_plain(peaked_model_dir)
    config = PPOConfig(max_new_tokens=8)
    wrapped = build(model, read_reward_adapter(favoured[1]), config)
    eos = end_of_turn_ids(wrapped.peft_model, tokenizer)
    args = sample(wrapped, tokenizer, PPO_PROMPTS * 2, config, eos)[:4]
    logprobs, values, _ = response_outputs(wrapped, *args, config.temperature)
    assert values.shape == args[2].shape and torch.equal(values, torch.zeros_like(values))
    assert set(wrapped.peft_model.peft_config) == {"policy", "reward"}  # no adapter of its own: the value reads the policy's states
    values.sum().backward()
    policy_lora = [p for name, p in wrapped.peft_model.named_parameters() if ".policy." in name]
    assert wrapped.value_head.weight.grad.abs().sum() > 0 and all(p.grad is None for p in policy_lora)
    logprobs.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy_lora)


def test_the_value_of_each_response_token_reads_the_state_before_it(peaked_model_dir, favoured):
    """The state the logits of that token come from, as the policy's last hidden states give it."""
    model, tokenizer = load_plain(peaked_model_dir)
    config = PPOConfig(max_new_tokens=8)
    wrapped = build(model, read_reward_adapter(favoured[1]), config)
    query_ids, query_mask, response_ids, response_mask = sample(wrapped, tokenizer, PPO_PROMPTS * 2, config,
                                                                end_of_turn_ids(wrapped.peft_model, tokenizer))[:4]
    torch.manual_seed(0)
    with torch.no_grad():
        wrapped.value_head.weight.normal_()
        values = response_outputs(wrapped, query_ids, query_mask, response_ids, response_mask, config.temperature)[1]
        mask = torch.cat([query_mask, response_mask], dim=1)
        hidden = wrapped.backbone(input_ids=torch.cat([query_ids, response_ids], dim=1), attention_mask=mask,
                                  position_ids=position_ids(mask)).last_hidden_state
        before = hidden[:, query_ids.shape[1] - 1 : -1]  # the prompt's last state predicts the first response token
    assert values.std() > 0
    torch.testing.assert_close(values, wrapped.value_head(before).squeeze(-1))


def test_sampling_ignores_the_models_own_generation_config_so_the_first_ratio_is_1(peaked_model_dir, favoured, tmp_path):
    model, tokenizer = load_model(ModelConfig(name_or_path=str(shipping_sampling_defaults(peaked_model_dir, tmp_path))))
    config = PPOConfig(max_new_tokens=8, temperature=0.9)
    wrapped = build(model, read_reward_adapter(favoured[1]), config)
    eos = end_of_turn_ids(wrapped.peft_model, tokenizer)
    query_ids, query_mask, *_ = sample(wrapped, tokenizer, PPO_PROMPTS * 4, config, eos)
    torch.manual_seed(3)
    settings = sampling_settings(config, tokenizer, eos)
    sampler, = settings["logits_processor"]
    distributions = []  # what the sampler drew each token from, after whatever generate() did to the logits first
    draw_from = sampler.distribution
    sampler.distribution = lambda scores: distributions.append(draw_from(scores)) or distributions[-1]
    response = wrapped.peft_model.generate(input_ids=query_ids, attention_mask=query_mask, **settings)[:, query_ids.shape[1]:]  # (B, R)
    assert all(ids is None for _, ids in distributions)  # the whole vocabulary, no top-k or top-p
    sampled = torch.stack([probs for probs, _ in distributions], dim=1).log().gather(-1, response[..., None])[..., 0]
    is_eos = torch.isin(response, torch.tensor(sorted(eos)))
    mask = (torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0  # through the first EOS
    scored = response_logprobs(wrapped, query_ids, query_mask, response.masked_fill(~mask, tokenizer.pad_token_id), mask.long(), config.temperature)
    log_ratio = (scored.detach() - sampled)[mask]
    assert log_ratio.numel() > 8
    assert log_ratio.abs().max() < 1e-4  # ratio 1: the loss scores exactly the distribution generate sampled from
    assert (0.5 * log_ratio**2).mean() < 1e-8  # approximate KL 0


def test_ppo_scores_a_response_as_rm_score_does_prompt_cut_to_the_trained_max_length(peaked_model_dir, favoured, tmp_path):
    from train.reward.versions import load_reward_model

    reward_dir = reward_copy(favoured[1], tmp_path, max_length=14)
    model, tokenizer = load_plain(peaked_model_dir)
    reward = read_reward_adapter(reward_dir)
    wrapped = build(model, reward, PPOConfig())
    long_prompt = [{"role": "user", "content": "Tell me about music, light, fruit and the sea, all of it, at length please."}]
    prompts, texts = [long_prompt, PPO_PROMPTS[0], PPO_PROMPTS[1]], ["Music is light.", "A fig", ""]
    assert len(encode(tokenizer, long_prompt, texts[0], 10_000).input_ids) > 14  # so the cut matters
    ppo, _ = reward_scores(wrapped, RewardScorer(tokenizer, reward.normalization, reward.max_length), prompts, texts)
    rm_score = load_reward_model(str(peaked_model_dir), reward_dir).score(prompts, texts)
    assert torch.allclose(ppo, torch.tensor(rm_score), atol=1e-4), (ppo, rm_score)


def test_ppo_grpo_and_rm_score_take_the_heads_mean_as_the_reward_and_their_spread_as_its_uncertainty(
        peaked_model_dir, favoured, tmp_path):
    from tests.conftest import token_reward_model
    from train.common.config import GRPOConfig
    from train.policy.grpo import penalised_scores
    from train.reward.versions import load_reward_model

    candidates = first_token_probs(peaked_model_dir).topk(20).indices
    reward_dir = token_reward_model(peaked_model_dir, favoured[0], candidates, tmp_path / "rm", heads=(1.0, 0.5, 1.5, -0.5))
    model, tokenizer = load_plain(peaked_model_dir)
    texts = [tokenizer.decode([t]) for t in candidates[:6].tolist()]
    prompts = [PPO_PROMPTS[i % len(PPO_PROMPTS)] for i in range(len(texts))]
    rm = load_reward_model(str(peaked_model_dir), reward_dir)
    rewards, spreads = rm.score_with_uncertainty(prompts, texts)
    raw = torch.tensor(rm.raw_scores(prompts, texts))  # (N, 4), normalisation 0 and 1
    assert rewards == pytest.approx(raw.mean(dim=1).tolist(), abs=1e-5) and min(spreads) > 0.1  # the heads disagree

    reward = read_reward_adapter(reward_dir)
    ppo, ppo_spreads = reward_scores(build(model, reward, PPOConfig()), RewardScorer(tokenizer, reward.normalization, reward.max_length),
                                     prompts, texts)
    assert ppo.tolist() == pytest.approx(rewards, abs=1e-4) and ppo_spreads.tolist() == pytest.approx(spreads, abs=1e-4)

    eos = tokenizer.eos_token_id
    grpo = penalised_scores(rm.score_with_uncertainty, GRPOConfig(uncertainty_penalty=0.5, length_penalty=0.0), eos)
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    assert grpo(prompts, completions, [[t, eos] for t in candidates[:6].tolist()]) == pytest.approx(
        [r - 0.5 * s for r, s in zip(rewards, spreads)], abs=1e-5)


def test_a_reward_model_whose_adapter_fits_no_layer_is_refused_by_name(peaked_model_dir, favoured, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from train.common.errors import ModelError

    broken = tmp_path / "rm-other-model"
    shutil.copytree(favoured[1], broken)
    weights = load_file(str(broken / "adapter_model.safetensors"))
    save_file({k.replace("layers.1.", "layers.7."): v for k, v in weights.items()}, str(broken / "adapter_model.safetensors"))
    model, _ = load_plain(peaked_model_dir)
    with pytest.raises(ModelError, match="rm-other-model does not fit this model: .* match no layer"):
        build(model, read_reward_adapter(broken), PPOConfig())


def test_the_optimiser_has_no_weight_decay_and_a_steps_prompts_are_distinct(wrapped):
    import random

    from train.policy.ppo import draw_prompts

    optimizer = optimizer_for(wrapped[0], PPOConfig(learning_rate=1e-4))
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 0.0]
    assert [{p.data_ptr() for p in g["params"]} for g in optimizer.param_groups] == [
        {p.data_ptr() for p in group} for group in trainable_parameters(wrapped[0])]
    prompts = [[{"role": "user", "content": str(i)}] for i in range(10)]
    rng = random.Random(0)
    for _ in range(50):
        batch = draw_prompts(prompts, 8, rng)
        assert len({p[0]["content"] for p in batch}) == 8
    few = draw_prompts(prompts[:3], 8, rng)  # fewer prompts than the batch: each as evenly as it goes
    assert sorted(sum(p == q for q in few) for p in prompts[:3]) == [2, 3, 3]


def test_beta_goes_on_from_the_policy_version(peaked_model_dir, favoured, tmp_path):
    model, tokenizer = load_plain(peaked_model_dir)
    config = PPOConfig(steps=3, batch_size=4, minibatch_size=4, max_new_tokens=4, temperature=1.0, learning_rate=3e-3,
                       kl_coef=0.1, target_kl=0.01, kl_horizon=2)
    first = train_ppo(model, tokenizer, PPO_PROMPTS, favoured[1], config, tmp_path / "v1")["steps"]
    saved = json.loads((tmp_path / "v1" / "kl_controller.json").read_text())["beta"]
    assert first[0]["beta"] == 0.1
    for before, after in zip(first, first[1:] + [{"beta": saved}]):  # each step moves beta by at most 20% / kl_horizon
        error = max(-0.2, min(0.2, before["kl_to_start"] / 0.01 - 1))
        assert after["beta"] == pytest.approx(before["beta"] * (1 + error / 2))
    assert saved != 0.1

    model, tokenizer = load_plain(peaked_model_dir)
    steps = []
    train_ppo(model, tokenizer, PPO_PROMPTS, favoured[1], config, tmp_path / "v2", tmp_path / "v1", steps.append)
    assert steps[0]["beta"] == saved  # the next round starts where the last one ended
    assert steps[0]["kl"] > 0.0 and steps[0]["kl_to_start"] == 0.0  # v1 is far from v0, and is where this run starts
    assert (tmp_path / "v2" / "adapter_model.safetensors").exists()


def test_checkpointing_keeps_a_fraction_of_the_activations_and_updates_the_adapters_exactly_as_without(peaked_model_dir, favoured):
    """[ppo] gradient_checkpointing, with the model in eval mode: the same step, bit for bit in float32, for less memory."""
    from train.policy.ppo import RewardScorer

    def built(checkpointing: bool):
        model, tokenizer = load_plain(peaked_model_dir)
        config = PPOConfig(batch_size=8, minibatch_size=4, max_new_tokens=6, temperature=1.0, learning_rate=1e-3, epochs=2,
                           precision="fp32", gradient_checkpointing=checkpointing)
        reward = read_reward_adapter(favoured[1])
        return build(model, reward, config), tokenizer, config, RewardScorer(tokenizer, reward.normalization, 512)

    def saved_bytes(wrapped) -> int:
        """What a training forward pass of the policy and its value keeps for the backward pass."""
        model, tokenizer, config, _ = wrapped
        torch.manual_seed(0)
        args = sample(model, tokenizer, PPO_PROMPTS * 4, config, end_of_turn_ids(model.peft_model, tokenizer))[:4]
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel() * t.element_size()) or t, lambda t: t):
            logprobs, values = response_outputs(model, *args, config.temperature)[:2]
        (logprobs.sum() + values.sum()).backward()
        model.zero_grad(set_to_none=True)
        return sum(kept)

    def trained(wrapped) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        one_step(wrapped)
        return {name: p.detach().clone() for name, p in wrapped[0].named_parameters() if "lora_" in name or "value_head" in name}

    plain, checkpointed = built(False), built(True)
    assert saved_bytes(checkpointed) < 0.5 * saved_bytes(plain)  # 1.7 MB against 11.7 when written
    before, after = trained(plain), trained(checkpointed)
    assert before.keys() == after.keys() and any(".policy." in name for name in before) and any("value_head" in name for name in before)
    for name in before:
        assert torch.equal(before[name], after[name]), name
