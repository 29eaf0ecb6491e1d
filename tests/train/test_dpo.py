"""DPO rounds on the tiny model: the reference is the base, rounds continue, and the adapter is plain PEFT."""

import json
import math
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from annotate.agreement import flip_rate
from train.common.config import DPOConfig, ModelConfig
from train.common.models import load_model
from train.common.snapshot import PreferenceRow
from train.policy.dpo import MAX_LABEL_SMOOTHING, encode_pair, label_smoothing, ranked_pairs, train_dpo

PROMPTS = [[{"role": "user", "content": f"Say something about topic {i}."}] for i in range(8)]
ROWS = [PreferenceRow(p, "music and light", "the end of the day", chosen_finished=True, rejected_finished=True) for p in PROMPTS]


def tiny(tiny_model_dir):
    return load_model(ModelConfig(name_or_path=str(tiny_model_dir), device="cpu"))


def sequence_logprob(model, tokenizer, prompt, response) -> float:
    """log pi(response | prompt) summed over the response's tokens and its EOS."""
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    ids = torch.tensor([prompt_ids + tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]])
    with torch.no_grad():
        logprobs = model(ids).logits[0, :-1].log_softmax(-1)
    targets = ids[0, 1:]
    return logprobs[torch.arange(len(targets)), targets][len(prompt_ids) - 1 :].sum().item()


def margin(model, tokenizer) -> float:
    return sum(sequence_logprob(model, tokenizer, r.prompt, r.chosen) - sequence_logprob(model, tokenizer, r.prompt, r.rejected)
               for r in ROWS) / len(ROWS)


def test_at_step_0_the_loss_is_log_2_and_the_rewards_are_0(tiny_model_dir, tmp_path):
    """From v0 the new adapter's LoRA B is zero: the policy is the reference, so it must be the base itself."""
    model, tokenizer = tiny(tiny_model_dir)
    result = train_dpo(model, tokenizer, ROWS, DPOConfig(epochs=1, batch_size=4), tmp_path / "v1", on_cpu=True)
    first = result["steps"][0]
    assert first["step"] == 1 and first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert first["chosen_reward"] == pytest.approx(0, abs=1e-6) and first["rejected_reward"] == pytest.approx(0, abs=1e-6)
    assert len(result["steps"]) == 2 and result["pairs"] == len(ROWS)


def test_rounds_continue_from_the_policy_raise_the_chosen_and_load_with_plain_peft(tiny_model_dir, tmp_path):
    from peft import PeftModel

    base, tokenizer = tiny(tiny_model_dir)
    before = margin(base, tokenizer)
    config = DPOConfig(epochs=4, batch_size=4, learning_rate=5e-3, beta=0.1)
    train_dpo(*tiny(tiny_model_dir), ROWS, config, tmp_path / "v1", on_cpu=True)
    v1 = PeftModel.from_pretrained(tiny(tiny_model_dir)[0], str(tmp_path / "v1")).eval()
    after_one = margin(v1, tokenizer)
    assert after_one > before + 1.0

    # The next round starts from v1, still against the base: its first implicit rewards are v1's gain over v0.
    result = train_dpo(*tiny(tiny_model_dir), ROWS, config, tmp_path / "v2", tmp_path / "v1", on_cpu=True)
    first = result["steps"][0]
    assert first["margin"] == pytest.approx(config.beta * (after_one - before), rel=0.05)
    assert first["loss"] < math.log(2)
    v2 = PeftModel.from_pretrained(tiny(tiny_model_dir)[0], str(tmp_path / "v2")).eval()
    assert margin(v2, tokenizer) > after_one


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_label_smoothing_trains_with_the_robust_loss_and_zero_with_plain_dpo(tiny_model_dir, tmp_path, smoothing):
    """rDPO's loss at each step's margin m = beta * h: ((1 - e) * softplus(-m) - e * softplus(m)) / (1 - 2e)."""
    config = DPOConfig(epochs=3, batch_size=1, learning_rate=5e-3, label_smoothing=smoothing)
    result = train_dpo(*tiny(tiny_model_dir), ROWS[:1], config, tmp_path / "v1", on_cpu=True)
    assert result["label_smoothing"] == smoothing and len(result["steps"]) == 3
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    for step in result["steps"]:
        m = step["margin"]
        assert step["loss"] == pytest.approx(((1 - smoothing) * softplus(-m) - smoothing * softplus(m)) / (1 - 2 * smoothing), abs=1e-4)
    assert result["steps"][-1]["margin"] > 0.01  # the margins moved, so the two losses differ


def test_sft_weight_adds_the_chosen_answers_likelihood_to_the_loss_and_raises_it(tiny_model_dir, tmp_path):
    from peft import PeftModel

    def chosen_logprob(adapter) -> float:
        model, tokenizer = tiny(tiny_model_dir)
        policy = PeftModel.from_pretrained(model, str(adapter)).eval()
        return sum(sequence_logprob(policy, tokenizer, r.prompt, r.chosen) for r in ROWS) / len(ROWS)

    firsts = {}
    for weight in (0.0, 1.0):
        config = DPOConfig(epochs=2, batch_size=4, learning_rate=5e-3, label_smoothing=0.0, sft_weight=weight)
        firsts[weight] = train_dpo(*tiny(tiny_model_dir), ROWS, config, tmp_path / f"sft-{weight}", on_cpu=True)["steps"][0]["loss"]
    assert firsts[0.0] == pytest.approx(math.log(2), abs=1e-5)
    assert firsts[1.0] > math.log(2) + 1.0  # plus the chosen tokens' mean negative log-likelihood under v0, far above 1 nat
    assert chosen_logprob(tmp_path / "sft-1.0") > chosen_logprob(tmp_path / "sft-0.0") + 1.0


def test_auto_label_smoothing_is_the_expected_share_of_wrong_labels():
    rows = [PreferenceRow(PROMPTS[0], "a", "b", confidence=c) for c in (0.7, 0.7, 0.84, 1.0)]
    assert label_smoothing(rows, "auto") == pytest.approx((0.3 + 0.3 + 0.16) / 4)
    assert label_smoothing(rows, 0.1) == 0.1 and label_smoothing([], "auto") == 0.0
    assert label_smoothing([PreferenceRow(PROMPTS[0], "a", "b", confidence=0.55)], "auto") == MAX_LABEL_SMOOTHING


def test_a_completion_cut_at_the_length_limit_is_trained_without_an_end(tiny_model_dir):
    """As sampled: EOS closes only the completion that ended, and the prompt is the generation prompt."""
    _, tokenizer = tiny(tiny_model_dir)
    pair = encode_pair(tokenizer, PreferenceRow(PROMPTS[0], "music and light", "the end of", chosen_finished=True, rejected_finished=False))
    assert pair["prompt_ids"] == tokenizer.apply_chat_template(PROMPTS[0], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert pair["chosen_ids"] == tokenizer.encode("music and light", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert pair["rejected_ids"] == tokenizer.encode("the end of", add_special_tokens=False)
    assert tokenizer.eos_token_id not in pair["rejected_ids"]


def test_pairs_too_long_are_left_out_and_counted(tiny_model_dir, tmp_path):
    model, tokenizer = tiny(tiny_model_dir)
    long = PreferenceRow(PROMPTS[0], "music " * 200, "light", chosen_finished=False, rejected_finished=True)
    result = train_dpo(model, tokenizer, ROWS + [long], DPOConfig(epochs=1, batch_size=4, max_length=64), tmp_path / "v1", on_cpu=True)
    assert (result["pairs"], result["pairs_too_long"]) == (len(ROWS), 1)


def test_a_dpo_round_registers_the_next_policy_with_its_metrics_and_the_predictors_figures(tiny_project, tiny_model_dir):
    from contextlib import closing

    from peft import PeftModel

    from store import open_database
    from tests.conftest import REPO, held_back_ids, read_parquet, run_tether, set_settings, vote_on_demo_pairs

    set_settings(tiny_project, "dpo", batch_size=4, epochs=1, pairs="human")
    vote_on_demo_pairs(tiny_project)

    done = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    # Votes from one annotator: no pair has two votes, so robust DPO takes the least flip rate the prior allows.
    assert done.stdout.startswith("round 1: policy v1 from v0; candidate 1 of 1 (job 3) registered as v1: predicted win rate over v0 ")
    assert f"; robust DPO (label_smoothing {flip_rate([]).low:.2f}) on " in done.stdout
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        jobs = con.execute("SELECT id, kind, status FROM jobs WHERE round = 1 ORDER BY id").fetchall()
        round_ = con.execute("SELECT status, reward_version, policy_to FROM rounds WHERE id = 1").fetchone()
        metrics = {name for (name,) in con.execute("SELECT DISTINCT name FROM metrics WHERE job_id = ?", [jobs[1][0]]).fetchall()}
        adapter = con.execute("SELECT adapter_path FROM policies WHERE version = 1").fetchone()[0]
        candidate = con.execute("SELECT job, optimizer, chosen FROM candidates WHERE round = 1").fetchall()
    assert [(kind, status) for _, kind, status in jobs] == [("reward_model", "done"), ("dpo", "done"), ("predict", "done"),
                                                       ("generate", "done"), ("generate", "done")]  # v0's held-back answers, then v1's
    assert round_ == ("done", 1, 1)  # the reward model trains for the predictor, though DPO learns from the votes alone
    assert candidate == [(jobs[1][0], "dpo", True)]
    assert {"loss", "chosen_reward", "rejected_reward", "margin", "accuracy", "pairs"} <= metrics
    trained_on = read_parquet(tiny_project / "jobs" / str(jobs[1][0]) / "inputs" / "preferences.parquet")
    held_back = held_back_ids(tiny_project)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        prompts = {pid for (pid,) in con.execute(
            f"SELECT prompt_id FROM pairs WHERE id IN ({', '.join('?' * len(trained_on))})", [r["pair_id"] for r in trained_on]).fetchall()}
    assert prompts and not prompts & held_back, "DPO must not train on the held-back prompts"
    model = PeftModel.from_pretrained(tiny(tiny_model_dir)[0], str(tiny_project / adapter))
    assert any("lora_B" in name and param.abs().sum() > 0 for name, param in model.named_parameters())
    history = run_tether("rounds", "--project", str(tiny_project), check=True).stdout
    assert "v0 → v1" in history

    # scripts/bench_dpo_loss.py replays the round on its frozen pairs: with the job's own loss it trains v1's adapter
    # again, with plain DPO another one, and with the job's settings but those an arm names a third, each judged against v0.
    eval_prompts = tiny_project.parent / "eval.jsonl"
    eval_prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Name a colour.", "Say hello.")))
    replay = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_dpo_loss.py"), "--project", str(tiny_project),
                             "--judge", "concise", "--eval-prompts", str(eval_prompts), "--workdir", str(tiny_project.parent / "replay"),
                             "--arms", "job,plain,seed=1+learning_rate=5e-4"],
                            capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0, replay.stderr[-3000:]
    rows = {r["arm"]: r for r in map(json.loads, (line for line in replay.stdout.splitlines() if line.startswith("{")))}
    assert rows["job"]["label_smoothing"] == pytest.approx(flip_rate([]).low) and rows["plain"]["label_smoothing"] == 0
    assert rows["job"]["pairs"] == rows["plain"]["pairs"] == len(trained_on)
    assert all(0 <= r["low"] <= r["win_rate"] <= r["high"] <= 1 for r in rows.values())
    weights = {name: load_file(tiny_project.parent / "replay" / f"{name}-round-1" / "adapter_model.safetensors") for name in rows}
    original = load_file(tiny_project / adapter / "adapter_model.safetensors")
    assert all(torch.equal(weights["job"][k], original[k]) for k in original), "the replay must train what the round trained"
    assert not all(torch.equal(weights["plain"][k], original[k]) for k in original)
    settings = json.loads((tiny_project.parent / "replay" / "seed=1+learning_rate=5e-4-round-1" / "dpo_config.json").read_text())
    job_settings = json.loads((tiny_project / adapter / "dpo_config.json").read_text())
    assert settings == job_settings | {"seed": 1, "learning_rate": 5e-4}


def test_dpo_learns_each_vote_and_imported_preference_once_through_rollbacks(tiny_project, tmp_path):
    """Issue 46: DPO never read imported preferences, and a DPO round on them alone refused with "no resolved votes".
    Without [dpo] refit, each round continues its start on the votes it has not learnt."""
    from contextlib import closing

    from store import open_database
    from tests.conftest import DEMO_PROMPTS, held_back_ids, read_parquet, run_tether, set_settings, toy_preferences, vote_every_pair
    from ui.owner.project import load_project
    from ui.owner.round_jobs import submit_dpo

    set_settings(tiny_project, "dpo", batch_size=4, pairs="human", refit=False)
    set_settings(tiny_project, "reward_model", include_imported=True)
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(tiny_project), check=True)

    done = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        dpo_job = con.execute("SELECT id FROM jobs WHERE kind = 'dpo'").fetchone()[0]
        smoothing = con.execute("SELECT value FROM metrics WHERE job_id = ? AND name = 'label_smoothing'", [dpo_job]).fetchone()[0]
    trained_on = read_parquet(tiny_project / "jobs" / str(dpo_job) / "inputs" / "preferences.parquet")
    assert len(trained_on) == 40 and {r["chosen_policy"] for r in trained_on} == {None}
    # No two people have voted on a pair yet: every label is wrong with the least flip rate the prior allows.
    assert smoothing == pytest.approx(flip_rate([]).low) and 0 < smoothing < 0.1
    assert f"robust DPO (label_smoothing {smoothing:.2f}) on 40 pairs" in done.stdout

    # v1 has learnt them: a round from it trains on the votes it has not ([dpo] votes = "new"), whoever's answers they are on.
    again = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert again.returncode == 1 and "DPO on the votes would train policy v1 on 0 pairs it has not learnt outside the held-back prompts, fewer than [round] min_pairs" in again.stderr
    run_tether("generate", "--policy", "0", "--project", str(tiny_project), check=True)
    vote_every_pair(tiny_project)  # v0's new pairs, and the round's v1 against v0 on the held-back prompts
    held_back = held_back_ids(tiny_project)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        voted = {pair for pair, prompt in con.execute(
            "SELECT DISTINCT p.id, p.prompt_id FROM comparisons c JOIN pairs p ON p.id = c.pair_id WHERE c.source <> 'import'").fetchall()
            if prompt not in held_back}
    assert run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project)).returncode == 0
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        second = con.execute("SELECT max(id) FROM jobs WHERE kind = 'dpo'").fetchone()[0]
    trained_on = read_parquet(tiny_project / "jobs" / str(second) / "inputs" / "preferences.parquet")
    assert voted and {r["pair_id"] for r in trained_on} == voted and {r["chosen_policy"] for r in trained_on} == {0}

    # A rollback's copy of v1 has learnt what v1 learnt, the imported pairs, and not the votes v2 learnt since.
    run_tether("rollback", "1", "--project", str(tiny_project), check=True)
    project = load_project(tiny_project)
    job = submit_dpo(project, project.run)
    assert job.config["policy_version"] == 3
    assert {r["pair_id"] for r in read_parquet(tiny_project / "jobs" / str(job.id) / "inputs" / "preferences.parquet")} == voted

    # A backup carries the votes the DPO jobs behind each version learnt: restored, the next DPO job learns the same.
    run_tether("backup", str(tmp_path / "backup"), "--project", str(tiny_project), check=True)
    run_tether("restore", str(tmp_path / "backup"), "--project", str(tmp_path / "restored"), check=True)
    restored = load_project(tmp_path / "restored")
    job = submit_dpo(restored, restored.run)
    assert {r["pair_id"] for r in read_parquet(restored.root / "jobs" / str(job.id) / "inputs" / "preferences.parquet")} == voted


@pytest.mark.deep  # two rounds; one DPO round stays in the quick tier
def test_a_refit_round_trains_a_new_adapter_from_v0_on_every_vote_so_far(tiny_project, tiny_model_dir, tmp_path):
    """[dpo] refit (the default): the second round's DPO learns the first round's votes with its own, from v0, not from
    v1's adapter; and it trains only where there is a vote its start has not learnt."""
    from contextlib import closing

    from store import open_database
    from tests.conftest import held_back_ids, read_parquet, run_tether, set_settings, vote_every_pair, vote_on_demo_pairs
    from train.common.snapshot import read_preferences
    from train.runtime.jobdir import read_job

    set_settings(tiny_project, "dpo", batch_size=4, epochs=1, pairs="human")
    vote_on_demo_pairs(tiny_project)
    assert run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project)).returncode == 0
    again = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert again.returncode == 1 and "DPO on the votes would train policy v1 on 0 pairs it has not learnt outside the held-back prompts, fewer than [round] min_pairs" in again.stderr
    run_tether("generate", "--project", str(tiny_project), check=True)  # v1's pairs
    vote_every_pair(tiny_project)
    assert run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project)).returncode == 0

    held_back = held_back_ids(tiny_project)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        first, second = (job for (job,) in con.execute("SELECT id FROM jobs WHERE kind = 'dpo' ORDER BY id").fetchall())
        voted = {pair for pair, prompt in con.execute(
            "SELECT DISTINCT p.id, p.prompt_id FROM comparisons c JOIN pairs p ON p.id = c.pair_id").fetchall() if prompt not in held_back}
        adapter = con.execute("SELECT adapter_path FROM policies WHERE version = 2").fetchone()[0]
    first_pairs = {r["pair_id"] for r in read_parquet(tiny_project / "jobs" / str(first) / "inputs" / "preferences.parquet")}
    folder = tiny_project / "jobs" / str(second)
    rows = read_preferences(folder / "inputs" / "preferences.parquet")
    assert first_pairs < {r.pair_id for r in rows} == voted
    assert {r.chosen_policy for r in rows} == {0, 1}
    config = read_job(folder)["config"]
    assert config["policy_version"] == 1 and config["dpo"]["refit"] is True

    # What the round registered is DPO from v0 on those rows with the job's settings: v1's adapter had no part in it.
    model, tokenizer = tiny(tiny_model_dir)
    train_dpo(model, tokenizer, rows, DPOConfig(**config["dpo"]), tmp_path / "from-v0", None, on_cpu=True)
    registered = load_file(tiny_project / adapter / "adapter_model.safetensors")
    from_v0 = load_file(tmp_path / "from-v0" / "adapter_model.safetensors")
    assert registered.keys() == from_v0.keys() and all(torch.equal(registered[k], from_v0[k]) for k in registered)


def test_the_reward_model_ranks_fresh_answers_best_against_worst_where_its_heads_are_confident():
    prompts = PROMPTS[:3]
    answers = [[("fine", True), ("great", True), ("bad", False)], [("a", True), ("b", True)], [("same", True), ("same", True)]]
    rewards = [[0.1, 1.2, -0.9], [0.2, -0.1], [0.0, 0.0]]
    heads = [
        [[0.0, 0.5], [2.0, 2.5], [-1.5, -1.0]],  # every head: great beats bad by 3.5 raw
        [[1.0, -0.8], [0.0, 0.0]],  # the heads split on a against b
        [[0.0, 0.0], [0.0, 0.0]],
    ]
    rows = ranked_pairs(prompts, answers, heads, rewards, confidence=0.9)
    # Each pair carries the probability the heads give its label: the worker's label_smoothing = "auto" reads it.
    certain = 1 / (1 + math.exp(-3.5))
    assert rows == [PreferenceRow(prompts[0], "great", "bad", chosen_finished=True, rejected_finished=False, confidence=pytest.approx(certain))]
    # At 0.5 the split prompt's pair is kept when its heads lean its way on average; identical texts never.
    lenient = ranked_pairs(prompts, answers, heads, rewards, confidence=0.5)
    assert [(r.chosen, r.rejected) for r in lenient] == [("great", "bad"), ("a", "b")]


def test_a_dpo_round_on_both_pairs_trains_a_reward_model_and_names_its_human_and_ranked_pairs(tiny_project, tiny_model_dir):
    from contextlib import closing

    from peft import PeftModel

    from store import open_database
    from tests.conftest import held_back_ids, read_parquet, run_tether, set_settings, short_training, vote_on_demo_pairs
    from train.runtime.jobdir import read_job
    from ui.owner.project import load_project
    from ui.owner.round_jobs import submit_dpo

    short_training(tiny_project)
    set_settings(tiny_project, "dpo", batch_size=4, epochs=1, pairs="both", prompts=6, candidates=3, confidence=0.5)
    set_settings(tiny_project, "reward_model", trust="always")
    set_settings(tiny_project, "generation", max_new_tokens=8)
    vote_on_demo_pairs(tiny_project)

    done = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        jobs = con.execute("SELECT id, kind, status FROM jobs WHERE round = 1 ORDER BY id").fetchall()
        round_ = con.execute("SELECT status, reward_version, policy_to FROM rounds WHERE id = 1").fetchone()
        dpo_job = jobs[1][0]
        metrics = dict(con.execute("SELECT name, value FROM metrics WHERE job_id = ? AND name LIKE 'pairs%'", [dpo_job]).fetchall())
        adapter = con.execute("SELECT adapter_path FROM policies WHERE version = 1").fetchone()[0]
    assert [(kind, status) for _, kind, status in jobs] == [("reward_model", "done"), ("dpo", "done"), ("predict", "done"),
                                                       ("generate", "done"), ("generate", "done")]  # v0's held-back answers, then v1's
    assert round_ == ("done", 1, 1)
    human = len(read_parquet(tiny_project / "jobs" / str(dpo_job) / "inputs" / "preferences.parquet"))
    assert metrics["pairs_human"] == human > 0 and 0 < metrics["pairs_reward_model"] <= 6
    assert metrics["pairs"] + metrics["pairs_too_long"] == human + metrics["pairs_reward_model"]
    prompts = {r["prompt_id"] for r in read_parquet(tiny_project / "jobs" / str(dpo_job) / "inputs" / "prompts.parquet")}
    assert len(prompts) == 6 and not prompts & held_back_ids(tiny_project), "the ranked pairs must not come from held-back prompts"
    model = PeftModel.from_pretrained(tiny(tiny_model_dir)[0], str(tiny_project / adapter))
    assert any("lora_B" in name and param.abs().sum() > 0 for name, param in model.named_parameters())
    history = run_tether("rounds", "--project", str(tiny_project), check=True).stdout
    assert f"trained on {human} human pairs and {metrics['pairs_reward_model']:.0f} ranked by the reward model" in history

    # By default v1 has not yet shown that it predicts votes it never saw: DPO from v0 gets the votes alone.
    set_settings(tiny_project, "reward_model", trust="once_proven")
    project = load_project(tiny_project)
    job = submit_dpo(project, project.run, reward_version=1, policy_version=0)
    written = read_job(tiny_project / "jobs" / str(job.id))
    assert written["config"]["reward_adapter_path"] is None and set(written["inputs"]) == {"preferences"}
