import dataclasses
import json
import math
import random

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import score_with_plain_peft
from train.common.config import RewardModelConfig
from train.common.errors import ModelError
from train.common.snapshot import PreferenceRow, RankingRow
from train.reward.encoding import encode, encode_pairs
from train.reward.layout import METRICS_FILE, NORMALIZATION_FILE
from train.reward.lora import LoraRewardModel, WarmStart, build_model, plan_warm_start, train_reward_model
from train.reward.scores import Normalization
from train.reward.versions import load_reward_model
from train.reward.votes import split_by_prompt

WORDS = ["apple", "river", "stone", "cloud", "music", "light", "table", "green"]


def toy_rows(prompts: int, pairs_per_prompt: int = 1, seed: int = 0, ask: str = "Tell me about") -> list[PreferenceRow]:
    """A learnable preference: the chosen reply ends with "thanks", the rejected one with "sorry"."""
    rng = random.Random(seed)
    rows = []
    for i in range(prompts):
        prompt = [{"role": "user", "content": f"{ask} {rng.choice(WORDS)} number {i}."}]
        for _ in range(pairs_per_prompt):
            body = " ".join(rng.choice(WORDS) for _ in range(4))
            rows.append(PreferenceRow(prompt, f"{body} thanks", f"{body} sorry"))
    return rows


def prompt_key(row: PreferenceRow) -> str:
    return json.dumps(row.prompt)


def test_the_split_keeps_each_prompt_on_one_side_and_is_deterministic():
    rows = toy_rows(prompts=40, pairs_per_prompt=3)
    train, held = split_by_prompt(rows, eval_share=0.25)
    assert len(train) + len(held) == len(rows)
    assert not {prompt_key(r) for r in train} & {prompt_key(r) for r in held}
    assert 5 <= len({prompt_key(r) for r in held}) <= 15  # about a quarter of the 40 prompts
    assert len(held) == 3 * len({prompt_key(r) for r in held})  # with all their pairs

    again = split_by_prompt(list(reversed(rows)), eval_share=0.25)
    assert sorted(map(prompt_key, again[1])) == sorted(map(prompt_key, held))  # the row order does not matter
    assert [r.chosen for r in train] == [r.chosen for r in rows if r in train]  # each part keeps the order

    assert split_by_prompt(rows[:6], eval_share=0.01)[1] != []  # a share > 0 holds out at least one prompt
    assert split_by_prompt(rows[:6], eval_share=0.99)[0] != []  # and trains on at least one
    assert split_by_prompt(rows, eval_share=0.0) == (rows, [])


def test_a_prompt_is_held_out_or_not_whatever_other_prompts_there_are():
    """Warm starts rely on it: a version must never train on a prompt an earlier version held out."""
    rows = toy_rows(prompts=60)
    held = {prompt_key(r) for r in split_by_prompt(rows, eval_share=0.3)[1]}
    assert 0 < len(held) < 60
    for part in (rows[:30], rows[30:], rows[::2], rows[10:50] + toy_rows(prompts=25, seed=9)):
        train, eval_ = split_by_prompt(part, eval_share=0.3)
        assert {prompt_key(r) for r in eval_} & {prompt_key(r) for r in rows} == {prompt_key(r) for r in part} & held
        assert not {prompt_key(r) for r in train} & held


def test_long_prompts_lose_their_start_and_no_pair_is_dropped(tiny_model_dir):
    model, tokenizer = build_model(str(tiny_model_dir), RewardModelConfig())
    long_prompt = [{"role": "user", "content": " ".join(WORDS * 6)}]
    rows = [
        PreferenceRow([{"role": "user", "content": "Hi?"}], "apple", "river"),
        PreferenceRow(long_prompt, "stone cloud", "music"),
        PreferenceRow(long_prompt, "light", " ".join(WORDS * 8)),
    ]
    max_length = 40
    encoded = encode_pairs(tokenizer, rows, max_length)
    assert len(encoded.chosen_ids) == len(encoded.rejected_ids) == 3
    assert (encoded.truncated, encoded.responses_cut) == (2, 1)

    prompt_ids = tokenizer.apply_chat_template(long_prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    response_ids = tokenizer("stone cloud", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert len(prompt_ids) + len(response_ids) > max_length
    chosen = encoded.chosen_ids[1]
    assert len(chosen) == max_length
    assert chosen == (prompt_ids + response_ids)[-max_length:]  # the prompt is cut from the left, the response whole
    assert chosen[-1] == tokenizer.eos_token_id

    short = encode(tokenizer, rows[0].prompt, "apple", max_length)
    assert not short.prompt_cut and encoded.chosen_ids[0] == short.input_ids
    too_long = encode(tokenizer, long_prompt, " ".join(WORDS * 8), max_length)
    assert too_long.response_cut and too_long.input_ids == encoded.rejected_ids[2]
    long_response = tokenizer(" ".join(WORDS * 8), add_special_tokens=False)["input_ids"]
    assert too_long.input_ids == long_response[:max_length]  # a response alone over max_length keeps its start


def test_the_score_is_read_at_the_last_non_pad_token(tiny_model_dir):
    model, tokenizer = build_model(str(tiny_model_dir), RewardModelConfig())
    model.eval()
    prompts = ["Hi?", [{"role": "user", "content": "Name a colour."}], "Why?"]
    responses = ["apple", "green, like a river in the light", "because"]
    heads = RewardModelConfig().heads
    batched = LoraRewardModel(model, tokenizer, Normalization([0.0] * heads, [1.0] * heads), 512).raw_scores(prompts, responses, batch_size=3)  # right-padded

    classifier = model.get_base_model()
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        for prompt, response, got in zip(prompts, responses, batched):
            ids = torch.tensor([encode(tokenizer, prompt, response, 512).input_ids])  # (1, T)
            hidden = classifier.model(input_ids=ids).last_hidden_state  # (1, T, C)
            manual = classifier.score(hidden[:, -1])[0].tolist()  # the heads on the last token, the closing EOS
            assert got == pytest.approx(manual, abs=1e-5)

            padded = torch.cat([ids, torch.full((1, 5), pad)], dim=1)  # (1, T + 5)
            mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 5, dtype=torch.long)], dim=1)
            assert model(input_ids=padded, attention_mask=mask).logits[0].tolist() == pytest.approx(manual, abs=1e-5)
            # Right padding leaves the real tokens where they are, so even without a mask nothing changes.
            assert model(input_ids=padded).logits[0].tolist() == pytest.approx(manual, abs=1e-5)
            # Left padding needs the mask: unmasked, the pads in front are attended to.
            left = torch.cat([torch.full((1, 5), pad), ids], dim=1)
            assert model(input_ids=left).logits[0].tolist() != pytest.approx(manual, abs=1e-5)

        # Why the pad token must differ from EOS: with pad == EOS the closing EOS counts as padding
        # and the score is read one token early.
        ids = encode(tokenizer, prompts[0], responses[0], 512).input_ids
        classifier.config.pad_token_id = tokenizer.eos_token_id
        early = model(input_ids=torch.tensor([ids])).logits[0].tolist()
        assert early == pytest.approx(model(input_ids=torch.tensor([ids[:-1]])).logits[0].tolist(), abs=1e-6)
        assert early != pytest.approx(batched[0], abs=1e-5)
        classifier.config.pad_token_id = pad


TRAIN_CONFIG = RewardModelConfig(learning_rate=1e-3, epochs=4, batch_size=8, lora_dropout=0.0, max_length=64, seed=3)


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """One short run on the toy preference, shared by the tests below: (rows, train, eval, metrics, out_dir, progress)."""
    rows = toy_rows(prompts=40)
    # A few long prompts, so that truncation runs during training too.
    long_start = [{"role": "user", "content": " ".join(WORDS * 3)}]
    rows[:6] = [dataclasses.replace(row, prompt=long_start + row.prompt) for row in rows[:6]]
    train, held = split_by_prompt(rows, eval_share=0.25)
    out_dir = tmp_path_factory.mktemp("rm") / "v1"
    progress = []
    metrics = train_reward_model(str(tiny_model_dir), train, held, TRAIN_CONFIG, out_dir, on_progress=progress.append)
    return rows, train, held, metrics, out_dir, progress


def test_a_short_run_learns_a_toy_preference(trained, tiny_model_dir):
    rows, train, held, metrics, out_dir, progress = trained
    assert (metrics["pairs_train"], metrics["pairs_eval"]) == (len(train), len(held)) == (25, 15)
    assert (metrics["warm_start_from"], metrics["pairs_new"], metrics["pairs_replayed"]) == (None, 25, 0)  # from scratch
    assert metrics["new_votes_accuracy"] is None and metrics["new_votes_pairs"] is None
    assert metrics["truncated"] > 0  # long prompts were cut, and still every pair trained:
    assert metrics["steps"] == len(progress) == 4 * 4  # 25 pairs in batches of 8, four epochs
    assert [p["step"] for p in progress] == list(range(1, 17)) and {p["total_steps"] for p in progress} == {16}
    assert all(0 <= p["accuracy"] <= 1 for p in progress) and progress[-1]["accuracy"] > progress[0]["accuracy"]
    assert metrics["eval_accuracy"] >= 0.9
    assert metrics["eval_mean_margin"] > 0
    assert metrics["train_loss_end"] < metrics["train_loss_start"]
    assert metrics["pairs_per_second"] > 0 and metrics["seconds"] >= metrics["train_seconds"]

    saved = json.loads((out_dir / METRICS_FILE).read_text())
    assert saved["eval_accuracy"] == metrics["eval_accuracy"] and saved["config"]["seed"] == TRAIN_CONFIG.seed

    # The LoRA matrices and the head moved from where the same seed starts them.
    weights = load_file(out_dir / "adapter_model.safetensors")
    initial, _ = build_model(str(tiny_model_dir), TRAIN_CONFIG)
    start = {name: p.detach() for name, p in initial.named_parameters()}
    head = next(k for k in weights if k.endswith("score.weight"))
    assert not torch.allclose(weights[head], start["base_model.model.score.modules_to_save.default.weight"])
    lora_b = [k for k in weights if "lora_B" in k]
    assert lora_b and all(weights[k].abs().sum() > 0 for k in lora_b)  # LoRA B starts at zero


def test_normalised_training_scores_have_mean_0_and_std_1(trained, tiny_model_dir):
    rows, train, held, metrics, out_dir, progress = trained
    reward_model = load_reward_model(str(tiny_model_dir), out_dir)
    assert reward_model.max_length == TRAIN_CONFIG.max_length
    assert json.loads((out_dir / NORMALIZATION_FILE).read_text()) == {"mean": metrics["reward_mean"], "std": metrics["reward_std"]}
    prompts = [r.prompt for r in train] * 2
    responses = [r.chosen for r in train] + [r.rejected for r in train]
    scores = torch.tensor(reward_model.score(prompts, responses))
    assert scores.mean().item() == pytest.approx(0, abs=1e-4)
    assert scores.std(correction=0).item() == pytest.approx(1, abs=1e-4)

    scored = []
    again = reward_model.pairwise_accuracy(held, batch_size=4, on_scored=scored.append)
    assert again.accuracy == metrics["eval_accuracy"] and again.pairs == len(held)
    assert sum(scored) == 2 * len(held) and max(scored) == 4
    assert again.mean_margin == pytest.approx(metrics["eval_mean_margin"], abs=1e-4)


def test_a_saved_reward_model_scores_the_same_in_a_fresh_process_with_plain_transformers_and_peft(trained, tiny_model_dir, tmp_path):
    rows, train, held, metrics, out_dir, progress = trained
    reward_model = load_reward_model(str(tiny_model_dir), out_dir)
    cases = [(r.prompt, reply) for r in held[:4] + train[:4] for reply in (r.chosen, r.rejected)]
    full_lengths = [len(encode(reward_model.tokenizer, p, r, 10**6).input_ids) for p, r in cases]
    assert sum(n > TRAIN_CONFIG.max_length for n in full_lengths) >= 2  # truncation is part of what must match
    plain = score_with_plain_peft(tiny_model_dir, out_dir, cases, tmp_path)

    prompts, responses = [c[0] for c in cases], [c[1] for c in cases]
    ours_raw = reward_model.raw_scores(prompts, responses, batch_size=8)
    ours = reward_model.score(prompts, responses, batch_size=8)
    assert sum((p["raw"] for p in plain), []) == pytest.approx(sum(ours_raw, []), abs=1e-4)
    assert [p["normalised"] for p in plain] == pytest.approx(ours, abs=1e-4)


def test_a_run_never_overwrites_a_reward_model(tiny_model_dir, tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "keep").write_text("x")
    with pytest.raises(ModelError, match="not empty"):
        train_reward_model(str(tiny_model_dir), toy_rows(4), [], RewardModelConfig(), tmp_path / "v1")
    with pytest.raises(ModelError, match="no preference pairs"):
        train_reward_model(str(tiny_model_dir), [], [], RewardModelConfig(), tmp_path / "v2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


def test_the_config_checks_its_values():
    assert RewardModelConfig().lora_target_modules() == "all-linear"
    assert RewardModelConfig(target_modules="q_proj, v_proj").lora_target_modules() == ["q_proj", "v_proj"]
    for bad in ({"eval_share": 1.0}, {"lora_r": 0}, {"batch_size": 0}, {"target_modules": "q_proj,,v_proj"}, {"learning_rate": 0.0},
                {"precision": "fp16"}):
        with pytest.raises(ValueError):
            RewardModelConfig(**bad)


def later_votes(trained) -> tuple[list[PreferenceRow], list[PreferenceRow], list[PreferenceRow], WarmStart]:
    """v1's rows plus 16 pairs on new prompts, split as the next run splits them: (new, train, eval, plan with replay 0.5)."""
    rows, train, held, metrics, out_dir, progress = trained
    new = toy_rows(prompts=16, seed=5, ask="Now tell me of")
    all_train, all_held = split_by_prompt(rows + new, eval_share=0.25)
    new_ids = {id(r) for r in new}
    plan = plan_warm_start(out_dir, 1, all_train, all_held, lambda r: id(r) in new_ids, replay=0.5, seed=0)
    return new, all_train, all_held, plan


def test_a_warm_start_trains_on_the_new_pairs_and_a_replay_sample_and_scores_the_new_votes_first(trained, tiny_model_dir, tmp_path):
    rows, train, held, v1_metrics, v1_dir, _ = trained
    new, all_train, all_held, plan = later_votes(trained)
    # The old prompts keep their sides, so v2 neither trains on v1's held-out pairs nor replays them.
    assert [r for r in all_train if r in rows] == train and [r for r in all_held if r in rows] == held
    assert sorted(map(prompt_key, plan.new_train + plan.new_eval)) == sorted(map(prompt_key, new))
    assert plan.new_train and plan.new_eval
    assert len(plan.replayed) == round(0.5 * len(plan.new_train)) and all(r in train for r in plan.replayed)

    config = dataclasses.replace(TRAIN_CONFIG, epochs=2)
    progress = []
    metrics = train_reward_model(str(tiny_model_dir), all_train, all_held, config, tmp_path / "v2", progress.append, plan)
    assert metrics["warm_start_from"] == 1
    assert (metrics["pairs_new"], metrics["pairs_replayed"]) == (len(plan.new_train), len(plan.replayed))
    assert metrics["steps"] == len(progress) == 2 * math.ceil((len(plan.new_train) + len(plan.replayed)) / 8)
    assert (metrics["pairs_train"], metrics["pairs_eval"]) == (len(all_train), len(all_held))
    assert metrics["eval_accuracy"] >= 0.9  # old and new held-out prompts alike: nothing was forgotten
    before, after = load_file(v1_dir / "adapter_model.safetensors"), load_file(tmp_path / "v2" / "adapter_model.safetensors")
    moved = {k.split(".")[-2] for k in before if not torch.allclose(before[k], after[k])}
    assert moved == {"lora_A", "lora_B", "score"}  # the adapter and the head trained on

    # v1's accuracy on every new pair, held-out ones included, as v1 scores them loaded on its own.
    before = load_reward_model(str(tiny_model_dir), v1_dir).pairwise_accuracy(plan.new_train + plan.new_eval)
    assert metrics["new_votes_pairs"] == len(new) == before.pairs
    assert metrics["new_votes_accuracy"] == before.accuracy and 0 <= before.accuracy <= 1

    # Normalised over the pairs fitted this time, new and replayed: a sample whose cost is the round's.
    v2 = load_reward_model(str(tiny_model_dir), tmp_path / "v2")
    fitted = plan.new_train + plan.replayed
    prompts = [r.prompt for r in fitted] * 2
    responses = [r.chosen for r in fitted] + [r.rejected for r in fitted]
    scores = torch.tensor(v2.score(prompts, responses))
    assert scores.mean().item() == pytest.approx(0, abs=1e-4)
    assert scores.std(correction=0).item() == pytest.approx(1, abs=1e-4)

    # Still a plain PEFT adapter.
    cases = [(r.prompt, reply) for r in plan.new_eval[:3] + train[:3] for reply in (r.chosen, r.rejected)]
    plain = score_with_plain_peft(tiny_model_dir, tmp_path / "v2", cases, tmp_path)
    assert sum((p["raw"] for p in plain), []) == pytest.approx(sum(v2.raw_scores([c[0] for c in cases], [c[1] for c in cases]), []), abs=1e-4)


def test_a_warm_start_begins_at_the_saved_adapter_and_head(trained, tiny_model_dir, tmp_path):
    v1_dir = trained[4]
    _, all_train, all_held, plan = later_votes(trained)
    # A learning rate too small to move anything: what is saved is where training began.
    still = dataclasses.replace(TRAIN_CONFIG, learning_rate=1e-10, epochs=1)
    train_reward_model(str(tiny_model_dir), all_train, all_held, still, tmp_path / "v2", warm_start=plan)
    before, after = load_file(v1_dir / "adapter_model.safetensors"), load_file(tmp_path / "v2" / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    assert all(torch.allclose(before[k], after[k], atol=1e-6) for k in before)
    assert any("lora_B" in k and before[k].abs().sum() > 0 for k in before)  # a fresh adapter would start at B = 0


def test_a_warm_start_with_no_new_training_pairs_fails_clearly(trained, tiny_model_dir, tmp_path):
    rows, train, held, metrics, v1_dir, _ = trained
    nothing_new = plan_warm_start(v1_dir, 1, train, held, lambda r: False, replay=1.0, seed=0)
    with pytest.raises(ModelError, match="^no new pairs to train on since reward model v1$"):
        train_reward_model(str(tiny_model_dir), train, held, TRAIN_CONFIG, tmp_path / "v2", warm_start=nothing_new)
    held_out_only = plan_warm_start(v1_dir, 1, train, held, lambda r: r in held, replay=1.0, seed=0)
    with pytest.raises(ModelError, match=f"its {len(held)} new pairs are all on held-out prompts"):
        train_reward_model(str(tiny_model_dir), train, held, TRAIN_CONFIG, tmp_path / "v2", warm_start=held_out_only)
    assert not (tmp_path / "v2").exists()


def test_the_heads_are_an_ensemble_each_fitted_to_its_own_resampling_and_the_reward_is_their_mean(trained, tiny_model_dir):
    from train.reward.lora import bootstrap_weights
    from train.reward.scores import reward_and_uncertainty

    rows, train, held, metrics, out_dir, progress = trained
    heads = TRAIN_CONFIG.heads
    assert heads == metrics["heads"] == 4
    weights = [bootstrap_weights(row, heads, TRAIN_CONFIG.seed) for row in train]
    assert {w for ws in weights for w in ws} == {0.0, 2.0}  # double or nothing
    assert len({tuple(ws) for ws in weights}) > 1  # the heads see different resamplings
    assert weights == [bootstrap_weights(row, heads, TRAIN_CONFIG.seed) for row in train]  # fixed by the pair, in every version
    assert bootstrap_weights(train[0], 1, TRAIN_CONFIG.seed) == [1.0]  # one head: plain Bradley-Terry

    reward_model = load_reward_model(str(tiny_model_dir), out_dir)
    prompts = [r.prompt for r in held] * 2
    responses = [r.chosen for r in held] + [r.rejected for r in held]
    raw = torch.tensor(reward_model.raw_scores(prompts, responses), dtype=torch.float64)  # (N, K)
    assert raw.shape == (len(responses), heads)
    normalised = reward_model.normalization.apply(raw)
    # The heads differ after training: not one head K times, and not merely in their offsets.
    correlations = torch.corrcoef(normalised.T)
    assert (normalised.std(dim=1) > 1e-3).all() and correlations[~torch.eye(heads, dtype=torch.bool)].max() < 0.9999
    rewards, spreads = reward_model.score_with_uncertainty(prompts, responses)
    assert rewards == pytest.approx(normalised.mean(dim=1).tolist(), abs=1e-6)
    assert rewards == pytest.approx(reward_model.score(prompts, responses), abs=1e-9)
    assert spreads == pytest.approx(normalised.std(dim=1).tolist(), abs=1e-6)
    assert reward_and_uncertainty(normalised[:, :1])[1].abs().max() == 0  # a single head is never uncertain

    assert 0 <= metrics["eval_calibration_error"] <= 0.5


def test_calibration_error_is_zero_for_a_calibrated_guess_and_large_for_an_overconfident_one():
    from train.reward.scores import calibration_error

    # 70% sure every time, and right 7 times in 10: the chosen response is the one people voted for.
    calibrated = torch.tensor([0.7] * 7 + [0.3] * 3, dtype=torch.float64)
    assert calibration_error(calibrated) == pytest.approx(0, abs=1e-9)
    sure_and_half_wrong = torch.tensor([0.99] * 5 + [0.01] * 5, dtype=torch.float64)
    assert calibration_error(sure_and_half_wrong) == pytest.approx(0.49, abs=1e-9)


def test_the_label_noise_loss_is_bradley_terry_for_a_sure_label_and_counts_a_label_by_2c_minus_1():
    from train.reward.votes import label_noise_loss

    margin = torch.linspace(-4, 4, 9, requires_grad=True)
    assert torch.allclose(label_noise_loss(margin, torch.ones(9)), -torch.nn.functional.logsigmoid(margin))
    # At a margin of 0 a label right with probability c pulls with 2c - 1 of a sure label's force: none at all for a coin.
    for c in (1.0, 0.8, 0.5):
        margin = torch.zeros(1, requires_grad=True)
        label_noise_loss(margin, torch.tensor([c])).backward()
        assert margin.grad.item() == pytest.approx(-(2 * c - 1) / 2, abs=1e-6)


def test_plackett_luce_is_bradley_terry_at_two_answers_on_the_tiny_model_in_loss_and_gradients(tiny_model_dir):
    from train.reward.lora import plackett_luce_loss

    model, tokenizer = build_model(str(tiny_model_dir), RewardModelConfig(lora_dropout=0.0))
    rows = toy_rows(prompts=4)
    pad = tokenizer.pad_token_id
    sequences = [encode(tokenizer, row.prompt, text, 64).input_ids for row in rows for text in (row.chosen, row.rejected)]
    width = max(map(len, sequences))
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])  # (2N, T), right-padded
    mask = (torch.arange(width)[None, :] < torch.tensor([len(s) for s in sequences])[:, None]).long()
    trainable = [p for p in model.parameters() if p.requires_grad]

    def loss_and_grads(loss_of) -> tuple[torch.Tensor, list[torch.Tensor]]:
        scores = model(input_ids=ids, attention_mask=mask).logits.view(len(rows), 2, -1)  # (N, chosen|rejected, heads)
        loss = loss_of(scores.transpose(1, 2)).sum()  # over pairs and heads
        return loss.detach(), torch.autograd.grad(loss, trainable)

    ranks = torch.tensor([1, 2])  # the chosen answer first
    pl, pl_grads = loss_and_grads(lambda s: plackett_luce_loss(s, ranks.expand_as(s)))
    bt, bt_grads = loss_and_grads(lambda s: -torch.nn.functional.logsigmoid(s[..., 0] - s[..., 1]))
    assert pl.item() == pytest.approx(bt.item(), rel=1e-6)
    assert any(g.abs().sum() > 0 for g in bt_grads)
    for got, want in zip(pl_grads, bt_grads, strict=True):
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (got - want).abs().max()


def test_plackett_luce_with_ties_shares_a_denominator_and_ignores_the_order_of_the_answers():
    from train.reward.lora import plackett_luce_loss

    def lse(*x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(torch.stack(x), dim=0)

    a, b, c, d = scores = torch.tensor([0.3, -1.2, 2.0, 0.5], dtype=torch.float64)
    # a > b = c > d: a from all four; b and c, tied, each from {b, c, d}; d from {d} alone.
    want = -((a - lse(a, b, c, d)) + (b - lse(b, c, d)) + (c - lse(b, c, d)) + (d - d))
    ranks = torch.tensor([1, 2, 2, 3])
    assert plackett_luce_loss(scores, ranks).item() == pytest.approx(want.item(), rel=1e-12)
    order = torch.tensor([2, 0, 3, 1])
    assert plackett_luce_loss(scores[order], ranks[order]).item() == pytest.approx(want.item(), rel=1e-12)
    # Without the tie, a > b > c > d: the full Plackett-Luce product.
    want = -((a - lse(a, b, c, d)) + (b - lse(b, c, d)) + (c - lse(c, d)))
    assert plackett_luce_loss(scores, torch.tensor([1, 2, 3, 4])).item() == pytest.approx(want.item(), rel=1e-12)


def test_plackett_luce_leaves_out_the_padding_of_a_shorter_ranking_in_loss_and_gradients():
    from train.reward.lora import plackett_luce_loss

    three = torch.tensor([0.4, -0.3, 1.1], dtype=torch.float64, requires_grad=True)
    ranks = torch.tensor([2, 1, 2])  # the second answer best, the other two tied below it
    want = plackett_luce_loss(three, ranks)
    (want_grad,) = torch.autograd.grad(want, three)
    padded = torch.cat([three, torch.tensor([7.0, -9.0], dtype=torch.float64)]).detach().requires_grad_()
    present = torch.tensor([True, True, True, False, False])
    got = plackett_luce_loss(padded, torch.cat([ranks, torch.tensor([0, 0])]), present)
    (grad,) = torch.autograd.grad(got, padded)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    assert torch.equal(grad[3:], torch.zeros(2)) and torch.allclose(grad[:3], want_grad)


def as_rankings(rows: list[PreferenceRow]) -> list[RankingRow]:
    """Each pair as a ranking of its two answers, the chosen one first."""
    return [RankingRow(row.prompt, [row.chosen, row.rejected], [1, 2], i, i, i, [2 * i, 2 * i + 1]) for i, row in enumerate(rows)]


def test_a_ranking_of_two_answers_trains_as_its_pair_does(tiny_model_dir, tmp_path):
    """Plackett-Luce at K = 2 is Bradley-Terry: the same rows as rankings of two train step for step as the pairs do."""
    rows = toy_rows(prompts=24)
    train, held = split_by_prompt(rows, eval_share=0.25)
    config = dataclasses.replace(TRAIN_CONFIG, epochs=2)
    pair_losses, ranking_losses = [], []
    as_pairs = train_reward_model(str(tiny_model_dir), train, held, config, tmp_path / "pairs",
                                  on_progress=lambda update: pair_losses.append(update["loss"]))
    ranked = train_reward_model(str(tiny_model_dir), as_rankings(train), as_rankings(held), config, tmp_path / "rankings",
                                on_progress=lambda update: ranking_losses.append(update["loss"]))
    assert (ranked["pairs_train"], ranked["rankings_train"], ranked["pairs_eval"]) == (0, len(train), len(held))
    assert (as_pairs["pairs_train"], as_pairs["rankings_train"], as_pairs["pairs_eval"]) == (len(train), 0, len(held))
    assert len(ranking_losses) == len(pair_losses) == as_pairs["steps"] > 0
    assert ranking_losses == pytest.approx(pair_losses, rel=1e-4)
    assert ranked["eval_loss"] == pytest.approx(as_pairs["eval_loss"], rel=1e-4)


def ranked_toys(prompts: int, seed: int = 0) -> list[RankingRow]:
    """A learnable order of four answers: "thanks" first, then "please" and "okay" tied, then "sorry"."""
    rng = random.Random(seed)
    rows = []
    for i in range(prompts):
        body = " ".join(rng.choice(WORDS) for _ in range(4))
        texts = [f"{body} {end}" for end in ("thanks", "please", "okay", "sorry")]
        rows.append(RankingRow([{"role": "user", "content": f"Tell me about {rng.choice(WORDS)} number {i}."}], texts,
                               [1, 2, 2, 3], i, i, i, [4 * i + k for k in range(4)]))
    return rows


def test_a_ranking_of_four_is_one_item_beside_the_pairs_and_its_order_is_learnt(tiny_model_dir, tmp_path):
    rankings, pairs = ranked_toys(prompts=32), toy_rows(prompts=8, ask="Describe")
    train, held = split_by_prompt(rankings + pairs, eval_share=0.25)
    held_rankings = [row for row in held if isinstance(row, RankingRow)]
    progress = []
    metrics = train_reward_model(str(tiny_model_dir), train, held, TRAIN_CONFIG, tmp_path / "rm", on_progress=progress.append)
    trained_rankings = sum(isinstance(row, RankingRow) for row in train)
    assert (metrics["rankings_train"], metrics["pairs_train"]) == (trained_rankings, len(train) - trained_rankings)
    assert metrics["pairs_eval"] == 5 * len(held_rankings) + len(held) - len(held_rankings)  # 6 pairs a ranking, one tied
    # A ranking is one row of a batch, as a pair is: batches of 8 rows, not of 8 pairs.
    assert metrics["steps"] == len(progress) == math.ceil(len(train) / TRAIN_CONFIG.batch_size) * TRAIN_CONFIG.epochs
    assert metrics["eval_accuracy"] > 0.9  # of the held-out pairs, rankings' and plain ones'
