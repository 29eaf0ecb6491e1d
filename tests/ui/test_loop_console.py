"""The operator's loop console: rounds started, watched, cancelled and scheduled through a real app server."""

import re
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from gradio_client import Client

from store import open_database
from store.completions import NewCompletion, NewPair, add_completions, add_pairs
from store.db import utcnow
from store.jobs import add_job, add_metrics, finish_job
from store.policies import add_policy
from store.prompt_files import NewPrompt
from store.prompts import add_prompts
from store.rounds import add_round, set_policy_to
from tests.conftest import DEMO_PROMPTS, RunningServer, add_users, app_client, complete_round, run_tether, set_settings, short_training, vote_every_pair
from ui.owner.history import round_history, round_warnings
from ui.web.loop import CURVES

PASSWORD = "password-123"


@contextmanager
def loop_app(project: Path, ppo_steps: int = 1, reward_epochs: int = 1) -> Iterator[tuple[Client, Client]]:
    """A running app on a project whose v0 pairs all have a vote: (an operator's client, an annotator's)."""
    short_training(project)
    set_settings(project, "ppo", steps=ppo_steps)
    set_settings(project, "reward_model", epochs=reward_epochs)
    set_settings(project, "queue", overlap_share=0.0)  # every pair wants one vote: after ours, only a round's pairs are left
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(project), check=True)
    run_tether("generate", "--project", str(project), check=True)
    vote_every_pair(project)
    add_users(project, {"ann": "annotator", "olga": "operator"}, PASSWORD)
    server = RunningServer(project)
    try:
        yield app_client(server.url, "olga", PASSWORD), app_client(server.url, "ann", PASSWORD)
    finally:
        server.stop()


def wait_for_no_round(operator: Client, seen: set[str], timeout: float = 300) -> str:
    """Poll the round status line as the app's timer does, collecting what it showed, until no round runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = operator.predict(api_name="/round_status")
        seen.add(status)
        if status.startswith("No round running"):
            return status
        time.sleep(0.3)
    raise AssertionError(f"the round did not finish: {status}")


def round_jobs(seen: set[str], round_id: int) -> set[str]:
    """The job kinds the status line named for a round; between two jobs it says "queuing its next step"."""
    return {s.split(": ")[1].split(" (job")[0] for s in seen if s.startswith(f"Round {round_id} ") and " (job " in s}


def test_an_operator_runs_a_round_in_the_app_and_sees_its_steps_history_and_ratings(tiny_project):
    with loop_app(tiny_project, ppo_steps=3) as (operator, annotator):
        started = operator.predict(None, "ppo", api_name="/start_round")
        assert started == "Started round 1: its first job is 2 (reward model)."  # job 1 generated the v0 pairs
        seen: set[str] = set()
        wait_for_no_round(operator, seen)
        assert {"reward model", "PPO"} <= round_jobs(seen, 1), seen

        history, settings, scores, warnings, _, shown, samples, candidates, reward_choices, *plots = operator.predict(None, api_name="/rounds")
        newest = newest_round(history, settings)
        assert [newest[k] for k in ("round", "status", "policy", "reward model")] == [1, "done", "v0 → v1", "v1 (head)"]
        # One candidate, registered whatever the predictor said ([round] register = "best" in tiny_project).
        assert candidates["visible"] and candidates["label"] == "Candidates of round 1, from v0"
        [candidate] = [dict(zip(candidates["value"]["headers"], row)) for row in candidates["value"]["data"]]
        assert candidate["optimiser"] == "PPO" and candidate["verdict"].startswith("registered, rated best: ")
        assert re.fullmatch(r"PPO \d+% \[\d+%, \d+%\] registered", newest["candidates, predicted win rate over the start"])
        assert warnings.startswith("reward model v1: a head on the base's frozen features (kind \"head\"); it does not steer the loop yet")
        # The round's KL to v0 is the registered candidate's on the predictor's answers, the measure the budget holds;
        # KL to the parent is PPO's on its training batch at its last step.
        assert newest["KL to v0"] == f"{candidate['KL to v0']:.2f}" and newest["KL to parent at PPO's last step"] != ""
        assert newest["responses ended in training"].endswith("%")  # the share of PPO's responses that ended
        assert newest["optimizer and settings"].startswith("PPO: steps 3,")
        assert shown["value"] == 1 and shown["choices"] == [["1", 1]]
        assert reward_choices["choices"][1:] == [["v1", 1]]  # after "a new one"
        assert samples["visible"] and samples["label"] == "Responses sampled at PPO's latest step, round 1"
        assert len(samples["value"]["data"]) == 3 and all(row[0] == 3 and row[1] for row in samples["value"]["data"])
        curves = shown_curves(plots)
        assert list(curves) == list(CURVES["ppo"].values())
        for title, points in curves.items():
            assert [step for step, _ in points] == [1, 2, 3], title
        assert curves["KL to the starting model (v0)"][0][1] == 0.0  # the policy is the reference at the first step
        assert all(0 <= share <= 1 for _, share in curves["Share of responses that ended"])

        # The annotator is served the new-against-old pairs; their votes become the round's win rate.
        votes = 0
        token = annotator.predict(api_name="/next_pair")[0]
        while token and votes < 50:
            token = annotator.predict(token, None, "", api_name="/vote_left")[0]
            votes += 1
        history, settings, scores, _, rating_curve, *_ = operator.predict(None, api_name="/rounds")
        newest = newest_round(history, settings)
        assert newest["votes"] == votes > 0
        assert newest["win rate [95% CI]"].endswith("]") and newest["length-controlled [95% CI]"].endswith("]")
        assert {row[0] for row in scores["data"]} == {"v0", "v1"}
        # Each version on the learning curve: v1 after the votes on v0's pairs it learnt from, at its rating.
        curve = {version: (cast, rating) for version, cast, rating in rating_curve["data"]}
        assert curve["v0"][0] == 0 and curve["v1"][0] > 0, curve
        assert {version: rating for version, (_, rating) in curve.items()} == {version: rating for version, rating in scores["data"]}


@pytest.mark.deep
def test_an_operator_runs_a_dpo_round_in_the_app_and_sees_its_curves(tiny_project):
    set_settings(tiny_project, "dpo", pairs="human")  # on the votes alone; the round's predictor still needs a reward model
    with loop_app(tiny_project) as (operator, _):
        with pytest.raises(Exception, match="optimizer must be one of|not in the list of choices"):
            operator.predict(None, "sgd", api_name="/start_round")
        assert operator.predict(None, "dpo", api_name="/start_round") == "Started round 1: its first job is 2 (reward model)."
        seen: set[str] = set()
        wait_for_no_round(operator, seen)
        assert {"DPO", "predictor", "completions"} <= round_jobs(seen, 1), seen

        history, settings, _, _, _, shown, samples, _, _, *plots = operator.predict(None, api_name="/rounds")
        newest = newest_round(history, settings)
        assert [newest[k] for k in ("round", "status", "policy", "reward model")] == [1, "done", "v0 → v1", "v1 (head)"]
        assert newest["optimizer and settings"].startswith("DPO: pairs human, beta 0.1, votes new, epochs 1,")
        assert newest["optimizer and settings"].endswith(" human pairs and 0 ranked by the reward model")
        assert shown["value"] == 1 and not samples["visible"]  # DPO samples nothing while it trains: no table
        curves = shown_curves(plots)
        assert list(curves) == list(CURVES["dpo"].values())
        steps = [step for step, _ in curves["DPO loss"]]
        assert steps == list(range(1, len(steps) + 1))
        assert curves["DPO loss"][0][1] == pytest.approx(0.6931, abs=1e-3)  # log 2: the reference is the base
        for title, points in curves.items():
            assert [step for step, _ in points] == steps, title


def test_a_scheduled_round_with_too_few_pairs_is_not_started_and_the_loop_view_says_why(tiny_project):
    """[round] every_comparisons and [round] min_pairs in the app: a round is due once enough votes came in, but DPO on
    the votes would have fewer pairs than min_pairs to learn: the scheduler records no round and trains no reward model,
    and the status line says why and when it tries again; the start button refuses for the same reason."""
    set_settings(tiny_project, "dpo", pairs="human")
    set_settings(tiny_project, "round", min_pairs=1000, optimizer="dpo")  # what a scheduled round runs
    reason = (r"DPO on the votes would train policy v0 on (\d+) pairs it has not learnt outside the held-back prompts, "
              r"fewer than \[round\] min_pairs = 1000: collect votes on the pairs `tether generate` makes")
    with loop_app(tiny_project) as (operator, _):
        assert operator.predict(api_name="/round_status") == "No round running; the scheduler is off."
        assert operator.predict(3, api_name="/set_schedule") == "A round starts every 3 new comparisons."
        # Every v0 pair was voted on before the app started, so those votes already count: a round is due.
        deadline = time.monotonic() + 60
        while "no round started" not in (status := operator.predict(api_name="/round_status")) and time.monotonic() < deadline:
            time.sleep(0.2)
        waiting = re.fullmatch(r"No round running; the scheduler starts a round every 3 new comparisons, but no round "
                               rf"started: {reason}; next try in 5 s\.", status)
        assert waiting and int(waiting.group(1)) > 0, status
        with pytest.raises(Exception, match=reason):
            operator.predict(None, "dpo", api_name="/start_round")
        assert operator.predict(0, api_name="/set_schedule") == "The scheduler is off."
        assert operator.predict(api_name="/round_status") == "No round running; the scheduler is off."
    assert "every_comparisons = 0" in (tiny_project / "tether.toml").read_text()
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM rounds").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM jobs WHERE kind <> 'generate'").fetchone() == (0,)


def shown_curves(plots: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The Loop view's visible plots: their titles, and (step, value) points."""
    return {plot["label"]: [tuple(row) for row in plot["value"]["data"]] for plot in plots if plot.get("visible", True)}


def newest_round(history: dict, settings: dict) -> dict:
    """The newest round's row of the round table, with its row of the settings table."""
    return dict(zip(history["headers"], history["data"][0])) | dict(zip(settings["headers"], settings["data"][0]))


def test_cancelling_a_round_stops_its_job_and_queues_nothing_after_it(tiny_project):
    with loop_app(tiny_project, reward_epochs=50) as (operator, _):  # training long enough to cancel
        operator.predict(None, "ppo", api_name="/start_round")
        deadline = time.monotonic() + 120
        while "running" not in operator.predict(api_name="/round_status") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert operator.predict(api_name="/cancel_round") == "Cancelled round 1."
        wait_for_no_round(operator, set())
        time.sleep(2)  # a queue that wrongly went on would have queued PPO by now
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rounds = con.execute("SELECT status, error FROM rounds").fetchall()
        jobs = con.execute("SELECT kind, status FROM jobs WHERE round = 1").fetchall()
    assert rounds == [("cancelled", "cancelled by an operator")]
    assert jobs == [("reward_model", "cancelled")]


def test_warnings_name_people_preferring_the_old_policy_while_reward_rose_and_drift_in_length_and_repetition(tmp_path):
    from ui.owner.project import init_project

    project = init_project(tmp_path / "project")
    with closing(project.connect()) as con:
        add_prompts(con, [NewPrompt([{"role": "user", "content": f"Question {i}?"}], "test") for i in range(12)])
        prompt_ids = [row[0] for row in con.execute("SELECT id FROM prompts ORDER BY id").fetchall()]
        add_policy(con, 1, "policies/v1", parent=0, round=1)
        round_ = add_round(con, 0, None)
        job = add_job(con, "ppo", {"ppo": {"steps": 3}}, round_.id)
        for step, score in enumerate([-0.5, 0.2, 0.9], start=1):
            add_metrics(con, job.id, [(step, {"score": score, "kl": 0.1 * step})])
        finish_job(con, job.id, "done", utcnow())
        set_policy_to(con, round_.id, 1)
        complete_round(con, round_.id)
        old = add_completions(con, [NewCompletion(p, 0, f"A short answer about topic {p}.", 8, True, {}) for p in prompt_ids])
        new = add_completions(con, [NewCompletion(p, 1, "great great great " * 10, 31, False, {}) for p in prompt_ids])
        add_pairs(con, [NewPair(p, a.id, b.id, "cross_version") for p, a, b in zip(prompt_ids, new, old)])
        for pair_id in range(1, 13):  # every vote for the old policy's answer (b)
            con.execute("INSERT INTO comparisons (pair_id, annotator, choice) VALUES (?, 'ann', 'b')", [pair_id])

    warnings = round_warnings(project.run, round_history(project.run), "newest")
    assert len(warnings) == 4, warnings
    assert "people rate v1 below v0: it won 0% [" in warnings[0] and "of 12 votes against v0" in warnings[0]
    assert "although the reward model's score rose by 1.40 during PPO: a sign of reward hacking" in warnings[0]
    assert "drifted in length, 8 to 31 tokens" in warnings[1]
    assert "repeated phrases rose from 0% to" in warnings[2]
    assert "roll back to v0 (`tether rollback 0`" in warnings[3]

    with closing(project.connect()) as con:  # the same round where people liked the new answers: only the drift is left
        con.execute("UPDATE comparisons SET choice = 'a'")
    assert [w.split(": ")[1][:9] for w in round_warnings(project.run, round_history(project.run), "newest")] == ["responses", "repeated "]


def test_an_operator_rolls_back_in_the_app_and_an_annotator_cannot(tiny_project):
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        add_policy(con, 1, "policies/v1", parent=0)
    (tiny_project / "policies" / "v1").mkdir(parents=True)
    (tiny_project / "policies" / "v1" / "adapter_model.safetensors").write_bytes(b"weights of v1")
    add_users(tiny_project, {"ann": "annotator", "olga": "operator"}, PASSWORD)
    server = RunningServer(tiny_project)
    try:
        annotator = app_client(server.url, "ann", PASSWORD)
        with pytest.raises(Exception, match="Only operators may do this"):
            annotator.predict(0, api_name="/rollback")
        operator = app_client(server.url, "olga", PASSWORD)
        assert operator.predict(0, api_name="/rollback") == "Rolled back: policy v2 is a copy of v0, and the next round starts from it."
        with pytest.raises(Exception, match="v2 is already the newest policy"):
            operator.predict(2, api_name="/rollback")
    finally:
        server.stop()
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT version, parent, adapter_path, rollback_from FROM policies WHERE version = 2").fetchall() == [(2, 0, None, 1)]
