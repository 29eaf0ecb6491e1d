"""Reward-model training as a job: snapshot, worker, registration, and a worker killed mid-run."""

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from gradio_client import Client

from annotate.queue import preference_spread
from store import open_database
from store.prompts import prompts_to_generate
from store.reward_models import RewardModel
from train.common.config import RewardModelConfig
from train.common.snapshot import PreferenceRow, read_preferences
from train.runtime.jobdir import read_job
from ui.owner.project import load_project
from ui.owner.round_jobs import is_held_back, steers, submit_generation

from tests.conftest import DEMO_PROMPTS, RunningServer, add_pairs, add_users, app_client, run_tether, score_with_plain_peft, set_settings, toy_preferences, wait_for, worker_pids


@contextmanager
def training_app(project: Path, tmp_path: Path, prompts: int, **reward_settings) -> Iterator[tuple[Client, Client]]:
    """A running server on a project with 40 imported comparisons and `prompts` pairs to vote on:
    (an operator's client, an annotator's client)."""
    set_settings(project, "reward_model", **reward_settings)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(project), check=True)
    add_pairs(project, prompts=prompts)
    add_users(project, {"ann": "annotator", "olga": "operator"}, "password-123")
    server = RunningServer(project)
    try:
        yield app_client(server.url, "olga", "password-123"), app_client(server.url, "ann", "password-123")
    finally:
        server.stop()


def test_rm_train_registers_a_lora_version_with_its_snapshot_and_metrics(tiny_project, tiny_model_dir, tmp_path):
    set_settings(tiny_project, "reward_model", kind="lora")
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(tiny_project), check=True)
    refused = run_tether("rm", "train", "--project", str(tiny_project))
    assert refused.returncode == 1 and "no resolved comparisons" in refused.stderr  # imported data only on request

    trained = run_tether("rm", "train", "--include-imported", "--project", str(tiny_project))
    assert trained.returncode == 0, trained.stderr
    assert trained.stdout.startswith('reward model v1, a LoRA reward model (kind "lora"): held-out accuracy')

    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        version, snapshot, adapter_path, metrics = con.execute("SELECT version, snapshot, adapter_path, metrics FROM reward_models").fetchone()
        recorded = con.execute("SELECT rows, path FROM snapshots WHERE hash = ?", [snapshot]).fetchone()
        job = con.execute("SELECT status, progress FROM jobs WHERE kind = 'reward_model'").fetchone()
    metrics = json.loads(metrics)
    assert (version, adapter_path, job) == (1, "reward_models/v1", ("done", 1.0))
    assert recorded[0] == 40 and (tiny_project / recorded[1]).exists()
    assert metrics["pairs_train"] + metrics["pairs_eval"] == 40 and metrics["truncated"] == 0
    assert (tiny_project / "reward_models" / "v1" / "adapter_config.json").exists()
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        curves = con.execute("SELECT name, count(*) FROM metrics WHERE name IN ('loss', 'train_accuracy') GROUP BY name").fetchall()
    assert dict(curves) == {"loss": metrics["steps"], "train_accuracy": metrics["steps"]}

    evaluated = run_tether("rm", "eval", "--data", str(tmp_path / "prefs.jsonl"), "--project", str(tiny_project))
    assert evaluated.returncode == 0, evaluated.stderr
    assert "reward model v1 on" in evaluated.stdout and "of 40 pairs" in evaluated.stdout

    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    # v1 has not yet predicted votes it never saw, so by default ([reward_model] trust = "once_proven") the
    # 'active' queue still pairs at random: two answers a pair, none scored.
    run_tether("generate", "--limit", "3", "--project", str(tiny_project), check=True)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*), count(reward) FROM completions WHERE policy_version = 0").fetchone() == (6, 0)
        before = con.execute("SELECT max(id) FROM completions").fetchone()[0]
    # Trusted from the first version, the 'active' queue has generation sample 4 answers for each pair
    # wanted, score them, and pair the two its heads disagree on most.
    set_settings(tiny_project, "reward_model", trust="always")
    run_tether("generate", "--limit", "3", "--project", str(tiny_project), check=True)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        sampled = con.execute("SELECT id, prompt_id, reward, reward_heads FROM completions WHERE policy_version = 0 AND id > ? ORDER BY id", [before]).fetchall()
        pairs = con.execute("SELECT prompt_id, completion_a, completion_b FROM pairs WHERE strategy = 'same_policy' AND completion_a > ?", [before]).fetchall()
    assert len(sampled) == 12 and all(reward is not None and len(heads) == 4 for _, _, reward, heads in sampled)
    heads = {cid: h for cid, _, _, h in sampled}
    assert len(pairs) == 3
    for prompt, a, b in pairs:
        answers = [cid for cid, pid, _, _ in sampled if pid == prompt]
        most = max(preference_spread(heads[x], heads[y]) for i, x in enumerate(answers) for y in answers[i + 1 :])
        assert preference_spread(heads[a], heads[b]) == pytest.approx(most)
    scored = run_tether("rm", "score", "--project", str(tiny_project))
    assert scored.returncode == 0, scored.stderr
    assert scored.stdout.strip() == "stored rewards from reward model v1 on 18 completions"  # the 6 unscored ones too
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rewards = con.execute(
            "SELECT p.messages, c.text, c.reward FROM completions c JOIN prompts p ON p.id = c.prompt_id "
            "WHERE c.policy_version IS NOT NULL AND c.id > ? ORDER BY c.id", [before]
        ).fetchall()
        imported = con.execute("SELECT count(reward) FROM completions WHERE policy_version IS NULL").fetchone()[0]
        unscored = con.execute("SELECT count(*) FROM completions WHERE policy_version = 0 AND reward IS NULL").fetchone()[0]
    assert len(rewards) == 12 and imported == 0 and unscored == 0
    assert [r for *_, r in rewards] == pytest.approx([r for _, _, r, _ in sampled], abs=1e-5)  # as generation scored them

    # The stored rewards are what plain transformers + peft give from the saved version, in a fresh process.
    cases = [(json.loads(messages), text) for messages, text, _ in rewards]
    plain = score_with_plain_peft(tiny_model_dir, tiny_project / "reward_models" / "v1", cases, tmp_path)
    assert [p["normalised"] for p in plain] == pytest.approx([r for *_, r in rewards], abs=1e-4)

    # A round's answers to the held-back prompts, kept for new-against-old pairs: [round] per_prompt of them, unpaired,
    # not the 4 a pair the reward model would choose from.
    project = load_project(tiny_project)
    held_back = [p for p in project.run(prompts_to_generate, 0, None) if is_held_back(p, project.config.round.held_back_share)]
    job = submit_generation(project, project.run, per_prompt=2, policy_version=0, prompts=held_back)
    assert job.config["generation"]["per_prompt"] == 2 and job.config["pairs_per_prompt"] is None
    assert job.config["unpaired_prompts"] == [p.id for p in held_back] != []


def reward_versions(project: Path) -> dict[int, dict]:
    with closing(open_database(project / "tether.duckdb")) as con:
        return {version: json.loads(metrics) for version, metrics in con.execute("SELECT version, metrics FROM reward_models").fetchall()}


def test_a_reward_model_steers_once_the_version_it_continued_predicted_new_votes_better_than_chance():
    def measured(accuracy: float | None, pairs: int | None) -> RewardModel:
        return RewardModel(2, "hash", "reward_models/v2", {"new_votes_accuracy": accuracy, "new_votes_pairs": pairs})

    once_proven = RewardModelConfig()
    assert once_proven.trust == "once_proven"
    assert not steers(measured(None, None), once_proven)  # a first version: nothing measured yet
    assert not steers(measured(0.564, 78), once_proven)  # 44 of 78: the 95% Wilson lower bound is 0.454
    assert steers(measured(0.68, 78), once_proven)  # 53 of 78: 0.570
    assert not steers(measured(0.7, 10), once_proven)  # 7 of 10: 0.397, too few votes to tell
    assert steers(measured(None, None), RewardModelConfig(trust="always"))
    with pytest.raises(ValueError, match="trust must be one of"):
        RewardModelConfig(trust="sometimes")


@pytest.mark.deep  # the warm start itself is in the quick tier: tests/train/test_reward.py
def test_the_next_rm_train_warm_starts_on_the_new_votes_and_measures_the_old_version_on_them(tiny_project, tiny_model_dir, tmp_path):
    from train.reward.versions import load_reward_model
    from train.reward.votes import split_by_prompt

    def rm_train() -> subprocess.CompletedProcess:
        return run_tether("rm", "train", "--include-imported", "--project", str(tiny_project))

    set_settings(tiny_project, "reward_model", kind="lora")
    run_tether("import-prefs", str(toy_preferences(tmp_path / "first.jsonl")), "--project", str(tiny_project), check=True)
    assert rm_train().returncode == 0
    v1 = reward_versions(tiny_project)[1]
    assert (v1["warm_start_from"], v1["pairs_new"], v1["pairs_replayed"]) == (None, v1["pairs_train"], 0)

    run_tether("import-prefs", str(toy_preferences(tmp_path / "more.jsonl", 20, start=40)), "--project", str(tiny_project), check=True)
    trained = rm_train()
    assert trained.returncode == 0, trained.stderr
    v2 = reward_versions(tiny_project)[2]
    first, second = (snapshot_rows(tiny_project, job) for job in (1, 2))
    new_pair_ids = read_job(tiny_project / "jobs" / "2")["config"]["warm_start"]["new_pair_ids"]
    assert len(second) == 60 and sorted(new_pair_ids) == sorted({r.pair_id for r in second} - {r.pair_id for r in first})
    assert len(new_pair_ids) == 20
    train, held = split_by_prompt(second, eval_share=0.1)
    new_train = [r for r in train if r.pair_id in new_pair_ids]
    assert v2["warm_start_from"] == 1 and v2["pairs_new"] == len(new_train) > 0
    assert v2["pairs_replayed"] == min(v1["pairs_train"], len(new_train))  # replay = 1.0
    assert (v2["pairs_train"], v2["pairs_eval"]) == (len(train), len(held))
    assert v2["new_votes_pairs"] == 20 and 0 <= v2["new_votes_accuracy"] <= 1

    # v2 is a plain PEFT adapter, scored alike by Tether and by transformers + peft alone.
    cases = [(r.prompt, reply) for r in second[38:42] for reply in (r.chosen, r.rejected)]
    plain = score_with_plain_peft(tiny_model_dir, tiny_project / "reward_models" / "v2", cases, tmp_path)
    ours = load_reward_model(str(tiny_model_dir), tiny_project / "reward_models" / "v2").score([c[0] for c in cases], [c[1] for c in cases])
    assert [p["normalised"] for p in plain] == pytest.approx(ours, abs=1e-4)

    again = rm_train()  # no new votes: nothing to continue on
    assert again.returncode == 1 and "no new resolved comparisons since reward model v2" in again.stderr
    assert "Traceback" not in again.stderr

    set_settings(tiny_project, "reward_model", warm_start=False)
    assert rm_train().returncode == 0
    v3 = reward_versions(tiny_project)[3]
    assert (v3["warm_start_from"], v3["pairs_new"], v3["pairs_replayed"], v3["new_votes_accuracy"]) == (None, len(train), 0, None)
    assert read_job(tiny_project / "jobs" / "3")["config"]["warm_start"] is None  # the refused run queued no job


def snapshot_rows(project: Path, job_id: int) -> list[PreferenceRow]:
    return read_preferences(project / "jobs" / str(job_id) / "inputs" / "preferences.parquet")


@pytest.mark.worker_process
def test_a_worker_killed_mid_training_registers_nothing(tiny_project, tmp_path):
    set_settings(tiny_project, "reward_model", kind="lora", epochs=50, batch_size=2)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(tiny_project), check=True)
    tether = Path(sys.executable).parent / "tether"
    cli = subprocess.Popen([str(tether), "rm", "train", "--include-imported", "--project", str(tiny_project)], stderr=subprocess.PIPE, text=True)
    events = tiny_project / "jobs" / "1" / "events.jsonl"
    deadline = time.monotonic() + 120
    while not (events.exists() and '"step"' in events.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    [pid] = worker_pids(tiny_project, 1)
    os.kill(pid, signal.SIGKILL)
    _, stderr = cli.communicate(timeout=60)
    assert cli.returncode == 1 and "job 1 failed: the worker exited with code -9" in stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM reward_models").fetchone()[0] == 0
        assert con.execute("SELECT status FROM jobs").fetchone() == ("failed",)
    assert not (tiny_project / "reward_models").exists()


@pytest.mark.deep
def test_a_worker_killed_mid_training_under_the_app_fails_with_its_log_and_annotators_are_still_served(tiny_project, tmp_path):

    with training_app(tiny_project, tmp_path, prompts=10, kind="lora", epochs=50, batch_size=2) as (operator, annotator):
        assert operator.predict(True, api_name="/train_reward_model").startswith("Queued job 1")
        wait_for(lambda: (row := operator.predict(api_name="/jobs")["data"][0])[2] == "running" and row[4])  # training steps run
        [pid] = worker_pids(tiny_project, 1)
        os.kill(pid, signal.SIGKILL)
        failed = wait_for(lambda: (row := operator.predict(api_name="/jobs")["data"][0])[2] == "failed" and row)
        assert failed[7] == "the worker exited with code -9:"
        tail = operator.predict(1, api_name="/job_log").strip()
        assert tail and tail in (tiny_project / "jobs" / "1" / "worker.log").read_text()  # the operator sees the worker's log tail
        versions, _, _, _ = operator.predict(None, api_name="/reward_models")
        assert not any(row and row[0] for row in versions["data"])  # no version listed
        view = annotator.predict(api_name="/next_pair")
        assert view[5] == "" and annotator.predict(view[0], None, "", api_name="/vote_left")[5] == ""  # still serving
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM reward_models").fetchone()[0] == 0
        assert con.execute("SELECT status FROM jobs").fetchone() == ("failed",)
        assert con.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 40 + 1  # the imported ones and the vote
    assert not (tiny_project / "reward_models").exists()


@pytest.mark.deep  # a load: the quick tier serves annotators beside a job in test_jobs.py
def test_while_a_reward_model_trains_annotators_are_served_and_operators_see_progress(tiny_project, tmp_path):
    with training_app(tiny_project, tmp_path, prompts=30, kind="lora", epochs=4, batch_size=4) as (operator, annotator):
        assert operator.predict(True, api_name="/train_reward_model").startswith("Queued job 1")
        seen, steps_seen, votes = set(), set(), 0
        token = annotator.predict(api_name="/next_pair")[0]
        deadline = time.monotonic() + 300
        while (job := operator.predict(api_name="/jobs")["data"][0])[2] in ("queued", "running") and time.monotonic() < deadline:
            seen.add(job[3])
            if job[2] == "running" and job[4]:
                steps_seen.add(job[4])
                assert float(job[5]) > 0  # the step's loss
            view = annotator.predict(token, None, "", api_name="/vote_left")
            votes += view[5] == ""
            token = view[0]
        assert job[2] == "done", job
        assert len({p for p in seen if not p.endswith(" 0%")}) >= 2  # progress moved while the annotator voted
        assert len(steps_seen) >= 2 and all("/" in s for s in steps_seen)  # and so did the step
        assert votes >= 5
        versions, _, run, curves = operator.predict(None, api_name="/reward_models")
        assert versions["data"][0][0] == 1 and run["value"] == 1
        steps = {curve: [row[0] for row in curves["data"] if row[2] == curve] for curve in ("loss", "batch accuracy")}
        assert steps["loss"] == steps["batch accuracy"] == list(range(1, len(steps["loss"]) + 1))  # one point per step
        assert len(steps["loss"]) >= 2


def test_with_plackett_luce_each_ranking_trains_whole_its_pairs_stay_out_and_a_warm_start_takes_the_new_rankings(tiny_project):
    import random

    from annotate.judges import concise
    from annotate.simulate import cast_votes
    from train.common.snapshot import RankingRow, read_rankings
    from train.reward.votes import split_by_prompt
    from ui.owner.jobs import run_to_end
    from ui.owner.project import load_project
    from ui.owner.round_jobs import submit_reward_training

    set_settings(tiny_project, "queue", answers_per_task=4)
    set_settings(tiny_project, "reward_model", kind="lora", rankings="plackett_luce", batch_size=4, epochs=1)
    add_pairs(tiny_project, prompts=12, answers_per_task=4, texts=lambda prompt, k: f"reply {prompt} " + "word " * (k + 1))
    add_pairs(tiny_project, prompts=4)  # plain pairs beside the tasks
    project = load_project(tiny_project)

    def rank(tasks: int) -> None:
        project.run(lambda con: cast_votes(lambda fn, *args: fn(con, *args), project.config.queue, concise, 0.0, ["sim"], tasks,
                                           random.Random(tasks)))

    rank(6)
    first = run_to_end(project, submit_reward_training(project, project.run), "first")
    job_dir = tiny_project / "jobs" / str(first.id)
    pairs, rankings = read_preferences(job_dir / "inputs" / "preferences.parquet"), read_rankings(job_dir / "inputs" / "rankings.parquet")
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        task_pairs = {row[0] for row in con.execute("SELECT id FROM pairs WHERE task IS NOT NULL OR answers IS NOT NULL").fetchall()}
        stored = con.execute("SELECT count(*) FROM rankings").fetchone()[0]
        voted_plain = con.execute("SELECT count(DISTINCT pair_id) FROM comparisons WHERE pair_id NOT IN (SELECT unnest(?))",
                                  [sorted(task_pairs)]).fetchone()[0]
        metrics = json.loads(con.execute("SELECT metrics FROM reward_models WHERE version = 1").fetchone()[0])
    assert len(rankings) == stored and not any(row.pair_id in task_pairs for row in pairs) and len(pairs) == voted_plain
    assert [len(r.texts) for r in rankings] == [4] * stored and all(r.ranks == [1, 2, 3, 4] for r in rankings)
    train, held = split_by_prompt(pairs + rankings, RewardModelConfig().eval_share)
    held_rankings = sum(isinstance(row, RankingRow) for row in held)
    assert metrics["rankings_train"] == stored - held_rankings > 0  # each ranking one item
    assert (metrics["pairs_train"], metrics["pairs_eval"]) == (len(train) - metrics["rankings_train"], 6 * held_rankings + len(held) - held_rankings)

    rank(3)
    second = run_to_end(project, submit_reward_training(project, project.run), "second")
    warm = read_job(tiny_project / "jobs" / str(second.id))["config"]["warm_start"]
    latest = read_rankings(tiny_project / "jobs" / str(second.id) / "inputs" / "rankings.parquet")
    assert warm["version"] == 1 and sorted(warm["new_ranking_ids"]) == sorted({r.ranking_id for r in latest} - {r.ranking_id for r in rankings})
    assert len(warm["new_ranking_ids"]) > 0


PLAIN_HEAD_SCORER = """
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

base, head_dir, cases = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
tokenizer = AutoTokenizer.from_pretrained(base)
model = AutoModelForCausalLM.from_pretrained(base).eval()
spec = json.load(open(f"{head_dir}/metrics.json"))["features"]
head, norm = load_file(f"{head_dir}/head.safetensors"), json.load(open(f"{head_dir}/reward_normalization.json"))
scores = []
with torch.no_grad():
    for prompt, response in cases:
        prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        states = model(torch.tensor([(list(prompt_ids) + response_ids)[-spec["max_length"]:]]), output_hidden_states=True).hidden_states
        features = torch.cat([states[layer][0, -len(response_ids):].mean(dim=0) for layer in spec["layers"]])  # the answer's mean
        raw = (head["weight"] @ features + head["bias"]).tolist()  # each head's
        scores.append(sum((r - m) / s for r, m, s in zip(raw, norm["mean"], norm["std"])) / len(raw))
assert not any(name.split(".")[0] in ("train", "store", "annotate", "ui") for name in sys.modules)
print(json.dumps(scores))
"""


def test_rm_train_fits_a_head_on_features_read_once_measures_the_last_head_on_new_votes_and_scores_as_plain_transformers_do(
        tiny_project, tiny_model_dir, tmp_path):
    def rm_train() -> dict:
        trained = run_tether("rm", "train", "--include-imported", "--project", str(tiny_project))
        assert trained.returncode == 0, trained.stderr
        assert trained.stdout.startswith('reward model v'), trained.stdout
        assert 'a head on the base\'s frozen features (kind "head"): held-out accuracy' in trained.stdout
        versions = reward_versions(tiny_project)
        return versions[max(versions)]

    run_tether("import-prefs", str(toy_preferences(tmp_path / "first.jsonl")), "--project", str(tiny_project), check=True)
    v1 = rm_train()
    assert (v1["kind"], v1["pairs_train"] + v1["pairs_eval"], v1["features_read"], v1["features_cached"]) == ("head", 40, 80, 0)
    assert v1["new_votes_accuracy"] is None and 0.5 < v1["label_confidence"] < 1  # imports, each right with 1 - the flip rate
    assert (tiny_project / "reward_models" / "v1" / "head.safetensors").exists()
    assert not (tiny_project / "reward_models" / "v1" / "adapter_config.json").exists()
    assert len(list((tiny_project / "features").glob("*/*.parquet"))) == 1

    run_tether("import-prefs", str(toy_preferences(tmp_path / "more.jsonl", 20, start=40)), "--project", str(tiny_project), check=True)
    v2 = rm_train()
    assert (v2["features_read"], v2["features_cached"]) == (40, 80)  # only the new answers are read
    assert (v2["new_votes_from"], v2["new_votes_pairs"]) == (1, 20) and 0 <= v2["new_votes_accuracy"] <= 1
    v3 = rm_train()  # no new votes: a head fits again in a second, and v1's record on the votes it never saw stands
    assert (v3["features_read"], v3["new_votes_from"], v3["new_votes_pairs"]) == (0, 1, 20)

    evaluated = run_tether("rm", "eval", "--data", str(tmp_path / "more.jsonl"), "--project", str(tiny_project))
    assert evaluated.returncode == 0 and "reward model v3 on" in evaluated.stdout and "of 20 pairs" in evaluated.stdout

    # Trusted from the first version, the 'active' queue samples 4 answers for each pair wanted, and the head's 4
    # posterior draws pick the two they disagree on most.
    set_settings(tiny_project, "reward_model", trust="always")
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    run_tether("generate", "--limit", "3", "--project", str(tiny_project), check=True)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        sampled = con.execute("SELECT id, prompt_id, reward_heads FROM completions WHERE policy_version = 0 ORDER BY id").fetchall()
        pairs = con.execute("SELECT prompt_id, completion_a, completion_b FROM pairs WHERE strategy = 'same_policy'").fetchall()
    assert len(sampled) == 12 and all(len(heads) == 4 for *_, heads in sampled) and len(pairs) == 3
    heads = {cid: h for cid, _, h in sampled}
    for prompt, a, b in pairs:
        answers = [cid for cid, pid, _ in sampled if pid == prompt]
        most = max(preference_spread(heads[x], heads[y]) for i, x in enumerate(answers) for y in answers[i + 1 :])
        assert preference_spread(heads[a], heads[b]) == pytest.approx(most)

    scored = run_tether("rm", "score", "--project", str(tiny_project))
    assert scored.returncode == 0, scored.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rewards = con.execute("SELECT p.messages, c.text, c.reward FROM completions c JOIN prompts p ON p.id = c.prompt_id "
                              "WHERE c.policy_version = 0 ORDER BY c.id").fetchall()
    # A head is a plain safetensors file on the base's hidden states: plain transformers score it alike, in a fresh process.
    script = tmp_path / "plain_head_scorer.py"
    script.write_text(PLAIN_HEAD_SCORER)
    plain = subprocess.run([sys.executable, str(script), str(tiny_model_dir), str(tiny_project / "reward_models" / "v3")],
                           input=json.dumps([(json.loads(m), t) for m, t, _ in rewards]), capture_output=True, text=True, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout.splitlines()[-1]) == pytest.approx([r for *_, r in rewards], abs=1e-4)


def test_auto_steers_with_the_model_more_accurate_on_votes_neither_saw_and_switches_when_the_other_overtakes():
    from train.reward.versions import choose_steering

    def measured(accuracy: float, pairs: int = 40) -> dict:
        return {"eval_accuracy": accuracy, "pairs_eval": pairs}

    rounds = [(measured(0.62), measured(0.55)), (measured(0.64), measured(0.64)), (measured(0.66), measured(0.71))]
    assert [choose_steering(head, lora)[0] for head, lora in rounds] == ["head", "head", "lora"]  # a tie keeps the head
    assert "71.0% for the LoRA model on 40 held-out votes" in choose_steering(*rounds[2])[1]
    assert choose_steering({"eval_accuracy": None, "pairs_eval": 0}, {"eval_accuracy": None, "pairs_eval": 0})[0] == "head"


def test_with_kind_auto_a_version_holds_both_models_and_the_one_steering_json_names_scores(tiny_project, tiny_model_dir, tmp_path):
    from train.reward.versions import choose_steering
    from train.reward.versions import load_reward_model

    set_settings(tiny_project, "reward_model", kind="auto", batch_size=4, epochs=1)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(tiny_project), check=True)
    trained = run_tether("rm", "train", "--include-imported", "--project", str(tiny_project))
    assert trained.returncode == 0, trained.stderr
    version = tiny_project / "reward_models" / "v1"
    head, lora = (json.loads((version / kind / "metrics.json").read_text()) for kind in ("head", "lora"))
    steering, why = choose_steering(head, lora)
    assert json.loads((version / "steering.json").read_text()) == {"kind": steering, "why": why}
    assert f'(kind "auto": {why})' in trained.stdout and reward_versions(tiny_project)[1]["steering"] == steering

    prompts, texts = [[{"role": "user", "content": "Question 1: what do you like?"}]] * 2, ["I like cats.", "No."]
    for kind in (steering, {"head": "lora", "lora": "head"}[steering]):  # the version scores as the model steering.json names
        (version / "steering.json").write_text(json.dumps({"kind": kind, "why": "set by the test"}))
        assert load_reward_model(str(tiny_model_dir), version).score(prompts, texts) == pytest.approx(
            load_reward_model(str(tiny_model_dir), version / kind).score(prompts, texts))
