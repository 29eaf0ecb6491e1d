"""GRPO rounds on the tiny model: a toy reward model's token gets likelier, and a round registers a plain PEFT adapter."""

from contextlib import closing

import pytest

from store import open_database
from tests.conftest import (
    PPO_PROMPTS, first_token_probs, held_back_ids, load_plain, read_parquet, run_tether, set_settings, short_training,
    vote_on_demo_pairs,
)
from train.common.config import GRPOConfig
from train.policy.grpo import train_grpo
from train.reward.versions import load_reward_model, read_reward_adapter


def test_grpo_raises_the_probability_of_the_token_a_toy_reward_model_favours(peaked_model_dir, favoured, tmp_path):
    token, reward_dir = favoured
    before = first_token_probs(peaked_model_dir)[token].item()
    model, tokenizer = load_plain(peaked_model_dir)
    reward = read_reward_adapter(reward_dir)
    config = GRPOConfig(steps=12, prompts_per_step=4, group_size=4, minibatches=2, epochs=2, max_new_tokens=1, temperature=1.0,
                        learning_rate=3e-4, beta=0.01, missing_eos_penalty=0.0, seed=1)
    steps = []
    result = train_grpo(model, tokenizer, PPO_PROMPTS, reward, config, tmp_path / "policy", on_step=steps.append, on_cpu=True)
    after = first_token_probs(peaked_model_dir, tmp_path / "policy")[token].item()  # loaded with plain PEFT
    scores = [s["score"] for s in result["steps"]]
    assert after > 2 * before, (before, after, [round(s, 2) for s in scores])
    assert sum(scores[-3:]) / 3 > sum(scores[:3]) / 3
    assert [s["step"] for s in steps] == list(range(1, 13)) and steps[-1]["total_steps"] == 12
    assert all(0 <= s["clip_ratio"] <= 1 and s["finished"] == 0 and s["response_length"] == 1 for s in steps)  # one token, no EOS
    assert {"score", "score_std", "kl_per_token", "response_length", "finished", "clip_ratio", "entropy"} <= set(steps[0])


def test_a_grpo_round_trains_a_reward_model_then_registers_the_next_policy(tiny_project, tiny_model_dir):
    from peft import PeftModel

    short_training(tiny_project)
    set_settings(tiny_project, "grpo", steps=2, prompts_per_step=2, group_size=2, minibatches=1, epochs=1)
    vote_on_demo_pairs(tiny_project)

    done = run_tether("round", "--optimizer", "grpo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("round 1: policy v1 from v0; candidate 1 of 1 (job 3) registered as v1"), done.stdout
    assert "; reward model v1 held-out accuracy" in done.stdout
    assert "GRPO 2 steps" in done.stdout
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        jobs = con.execute("SELECT id, kind, status FROM jobs WHERE round = 1 ORDER BY id").fetchall()
        round_ = con.execute("SELECT status, reward_version, policy_to, optimizer FROM rounds WHERE id = 1").fetchone()
        grpo_job = jobs[1][0]
        metrics = con.execute("SELECT name, count(*) FROM metrics WHERE job_id = ? GROUP BY name", [grpo_job]).fetchall()
        adapter = con.execute("SELECT adapter_path FROM policies WHERE version = 1").fetchone()[0]
    assert [(kind, status) for _, kind, status in jobs] == [("reward_model", "done"), ("grpo", "done"), ("predict", "done"),
                                                       ("generate", "done"), ("generate", "done")]  # v0's held-back answers, then v1's
    assert round_ == ("done", 1, 1, "grpo")
    assert {name: count for name, count in metrics if name in ("score", "score_std", "kl_per_token", "response_length", "clip_ratio")} == {
        "score": 2, "score_std": 2, "kl_per_token": 2, "response_length": 2, "clip_ratio": 2}
    prompts = {r["prompt_id"] for r in read_parquet(tiny_project / "jobs" / str(grpo_job) / "inputs" / "prompts.parquet")}
    assert prompts and not prompts & held_back_ids(tiny_project), "GRPO must not train on the held-back prompts"
    model = PeftModel.from_pretrained(load_plain(tiny_model_dir)[0], str(tiny_project / adapter))
    assert any("lora_B" in name and param.abs().sum() > 0 for name, param in model.named_parameters())
    assert "GRPO: steps 2, prompts_per_step 2, group_size 2" in run_tether("rounds", "--project", str(tiny_project), check=True).stdout


def test_grpos_reward_model_rides_on_the_policys_base_and_scores_as_rm_score_does(peaked_model_dir, favoured):
    from peft import get_peft_model

    from train.policy.adapters import policy_lora
    from train.policy.grpo import SharedReward

    model, tokenizer = load_plain(peaked_model_dir)
    peft_model = get_peft_model(model, policy_lora(None, 8, 16))  # as GRPOTrainer puts the policy's adapter on the base
    shared = SharedReward(read_reward_adapter(favoured[1]), tokenizer)
    shared.attach(peft_model)
    texts = [tokenizer.decode([favoured[0]]), "music and light", "no"]
    prompts = [PPO_PROMPTS[i % len(PPO_PROMPTS)] for i in range(len(texts))]
    rewards, spreads = shared.score(prompts, texts)
    expected_rewards, expected_spreads = load_reward_model(str(peaked_model_dir), favoured[1]).score_with_uncertainty(prompts, texts)
    assert rewards == pytest.approx(expected_rewards, abs=1e-4) and spreads == pytest.approx(expected_spreads, abs=1e-6)
    assert peft_model.active_adapter == "default"  # the policy's adapter is active again, and trains alone
    assert {name for name, p in peft_model.named_parameters() if p.requires_grad and ".reward." in name} == set()
    assert any(p.requires_grad for name, p in peft_model.named_parameters() if ".default." in name)
