"""Judging a round fairly and undoing it: the length-controlled win rate, the warnings when people rate
a new version below its parent or the reward model stops agreeing with them, and rollback."""

import re
from contextlib import closing
from pathlib import Path

import pytest

from annotate.ratings import head_to_head, length_controlled
from store import StoreError
from store.completions import NewCompletion, NewPair, add_completions, add_pairs
from store.db import utcnow
from store.jobs import add_job, add_metrics, finish_job
from store.policies import Policy, add_policy, get_policy
from store.prompt_files import NewPrompt
from store.prompts import add_prompts
from store.reward_models import add_reward_model
from store.rounds import add_round, list_rounds, set_policy_to
from tests.conftest import complete_round, run_tether, set_settings
from ui.owner.history import describe, round_history, round_summary, round_warnings
from ui.owner.project import Project, init_project, load_project
from ui.owner.rollback import roll_back
from ui.owner.round import start_round

NEW, OLD, TIE = "new", "old", "tie"


def oriented(new_tokens: int, old_tokens: int, winner: str, flip: bool) -> tuple[int, int, str, int, int]:
    """A vote of v1 against v0, with v1's answer as A, or as B when flipped."""
    choice = {NEW: "a", OLD: "b", TIE: "tie"}[winner]
    if flip:
        return 0, 1, {"a": "b", "b": "a"}.get(choice, choice), old_tokens, new_tokens
    return 1, 0, choice, new_tokens, old_tokens


def length_votes(longer_wins: int, shorter_wins: int) -> list[tuple[int, int, str, int, int]]:
    """50 votes: v1 answers at twice v0's length in 40, at half in 10; v1 wins the given numbers of each."""
    longer = [oriented(60, 30, NEW if i < longer_wins else OLD, i % 2 == 1) for i in range(40)]
    shorter = [oriented(30, 60, NEW if i < shorter_wins else OLD, i % 2 == 1) for i in range(10)]
    return longer + shorter


def test_a_version_that_wins_only_by_being_longer_is_even_at_equal_length():
    votes = length_votes(longer_wins=36, shorter_wins=1)  # the longer answer wins 9 times in 10, whichever it is
    raw = head_to_head([v[:3] for v in votes], 1, 0)
    controlled = length_controlled(votes, 1, 0)
    assert raw.rate == pytest.approx(0.74)
    assert controlled.rate == pytest.approx(0.5, abs=0.03) and controlled.length_effect > 1
    assert controlled.low < 0.5 < controlled.high and controlled.votes == 50
    assert length_controlled(votes, 0, 1).rate == pytest.approx(1 - controlled.rate)


def test_a_version_better_at_any_length_stays_ahead_at_equal_length():
    votes = length_votes(longer_wins=36, shorter_wins=9)  # v1 wins 9 times in 10, longer or shorter
    controlled = length_controlled(votes, 1, 0)
    assert controlled.rate == pytest.approx(0.9, abs=0.03) and abs(controlled.length_effect) < 0.2
    assert controlled.low > 0.7


def test_length_control_counts_ties_half_and_stays_finite_when_one_side_won_every_vote():
    ties = [oriented(40, 40, TIE, i % 2 == 1) for i in range(10)]
    assert length_controlled(ties, 1, 0).rate == pytest.approx(0.5)
    swept = length_controlled([oriented(40 + i, 40, NEW, False) for i in range(10)], 1, 0)
    assert 0.9 < swept.rate < 1 and swept.high < 1
    assert length_controlled(ties, 2, 0) is None  # no votes between those two


def project_with_round(root: Path, votes: list[tuple[int, int, str]], score_gain: float | None = None) -> Project:
    """A project whose round 1 took v0 to v1 with reward model v1, and one vote per (v1 tokens, v0 tokens, winner)."""
    project = init_project(root)
    with closing(project.connect()) as con:
        add_prompts(con, [NewPrompt([{"role": "user", "content": f"Question {i}?"}], "test") for i in range(len(votes))])
        prompt_ids = [row[0] for row in con.execute("SELECT id FROM prompts ORDER BY id").fetchall()]
        add_policy(con, 1, "policies/v1", parent=0, round=1)
        add_reward_model(con, 1, "snapshot", "reward_models/v1", {"eval_accuracy": 0.7})
        round_ = add_round(con, 0, 1)
        if score_gain is not None:
            job = add_job(con, "ppo", {"ppo": {"steps": 2}}, round_.id)
            add_metrics(con, job.id, [(1, {"score": 0.0, "kl": 0.0}), (2, {"score": score_gain, "kl": 0.1})])
            finish_job(con, job.id, "done", utcnow())
        set_policy_to(con, round_.id, 1)
        complete_round(con, round_.id)
        for i, (prompt, (new_tokens, old_tokens, winner)) in enumerate(zip(prompt_ids, votes)):
            new, old = add_completions(con, [
                NewCompletion(prompt, 1, f"the new answer number {i}", new_tokens, True, {}),
                NewCompletion(prompt, 0, f"an old reply, the {i}th", old_tokens, True, {}),
            ])
            a, b = (old, new) if i % 2 else (new, old)
            add_pairs(con, [NewPair(prompt, a.id, b.id, "cross_version")])
            choice = "tie" if winner == TIE else "a" if (winner == NEW) == (a is new) else "b"
            pair_id = con.execute("SELECT max(id) FROM pairs").fetchone()[0]
            con.execute("INSERT INTO comparisons (pair_id, annotator, choice) VALUES (?, 'ann', ?)", [pair_id, choice])
    return project


def test_the_round_history_gives_the_raw_and_length_controlled_win_rate_from_the_stored_votes(tmp_path):
    votes = [(60, 30, NEW if i < 36 else OLD) for i in range(40)] + [(30, 60, NEW if i < 1 else OLD) for i in range(10)]
    project = project_with_round(tmp_path / "project", votes)
    summary = round_summary(project.run, 1)
    assert summary.win_rate.rate == pytest.approx(0.74)
    assert summary.length_controlled.rate == pytest.approx(0.5, abs=0.03) and summary.length_controlled.votes == 50
    row = describe(summary)
    assert row["win rate"].startswith("74% [") and row["length-controlled"].startswith("51% [") and row["votes"] == 50
    assert row["RM on new votes"] == ""  # no later reward model has measured v1's yet


def test_dpos_margin_and_accuracy_are_its_means_over_every_step_not_its_last_batchs(tmp_path):
    """45 pairs in batches of 4 leave a last batch of 1: its 0% said nothing of the other 44."""
    project = project_with_round(tmp_path / "project", [(20, 20, NEW)])
    with closing(project.connect()) as con:
        job = add_job(con, "dpo", {"dpo": {"batch_size": 4}}, 1)
        add_metrics(con, job.id, [(1, {"margin": 0.1, "accuracy": 0.25}), (2, {"margin": 0.3, "accuracy": 0.75}),
                                  (3, {"margin": -0.4, "accuracy": 0.0})])
        finish_job(con, job.id, "done", utcnow())
    summary = round_summary(project.run, 1)
    assert summary.margin == pytest.approx(0.0) and summary.pair_accuracy == pytest.approx(1 / 3)


def test_people_rating_the_new_version_below_its_parent_is_a_warning_that_names_the_version_to_roll_back_to(tmp_path):
    project = project_with_round(tmp_path / "project", [(20, 20, NEW if i < 4 else OLD) for i in range(16)], score_gain=0.8)
    warnings = round_warnings(project.run, round_history(project.run), "newest")
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("round 1 (v1 from v0): people rate v1 below v0: it won 25% [")
    assert "of 16 votes against v0, Bradley-Terry rating 823 against v0's 1000" in warnings[0]  # 1000 + 400 log10(4.5 / 12.5)
    assert "although the reward model's score rose by 0.80 during PPO" in warnings[0]
    assert warnings[1].startswith("people rate the newest policy v1 (823) below v0 (1000): ") and "roll back to v0 (`tether rollback 0`" in warnings[1]
    # With [round] start_from = "best" the next round goes back by itself.
    assert round_warnings(project.run, round_history(project.run), "best")[1].endswith(
        'below v0 (1000): the next round starts from v0 ([round] start_from = "best")')


def test_a_lead_of_a_few_votes_names_no_version_to_go_back_to(tmp_path):
    """4 wins in 12 rate v1 below v0 with 86% confidence, under the 90% asked: the round is flagged, v0 is not named."""
    project = project_with_round(tmp_path / "project", [(20, 20, NEW if i < 4 else OLD) for i in range(12)])
    warnings = round_warnings(project.run, round_history(project.run), "newest")
    assert [w.split(": ")[1] for w in warnings] == ["people rate v1 below v0"]


@pytest.mark.parametrize("votes", [
    [(20, 20, NEW if i < 8 else OLD) for i in range(12)],  # people prefer v1
    [(20, 20, OLD)] * 9,  # v1 lost every vote, but too few to tell
])
def test_no_warning_when_people_prefer_the_new_version_or_have_cast_too_few_votes(tmp_path, votes):
    project = project_with_round(tmp_path / "project", votes, score_gain=0.8)
    assert round_warnings(project.run, round_history(project.run), "newest") == []


@pytest.mark.parametrize("accuracy, pairs, warned", [(0.40, 20, True), (0.60, 20, False), (0.40, 9, False)])
def test_a_reward_model_that_disagrees_with_the_new_votes_is_a_warning(tmp_path, accuracy, pairs, warned):
    project = project_with_round(tmp_path / "project", [(20, 20, NEW if i < 8 else OLD) for i in range(12)])
    with closing(project.connect()) as con:
        add_reward_model(con, 2, "snapshot-2", "reward_models/v2", {"new_votes_accuracy": None, "new_votes_pairs": None})  # trained from scratch
        add_reward_model(con, 3, "snapshot-3", "reward_models/v3", {"new_votes_accuracy": accuracy, "new_votes_pairs": pairs})
    summary = round_summary(project.run, 1)
    assert (summary.new_votes_accuracy, summary.new_votes_pairs) == (accuracy, pairs)
    assert describe(summary)["RM on new votes"] == {20: f"{accuracy:.1%} of 20 votes [", 9: "too few votes to measure (9)"}[pairs] + \
        {(0.4, 20): "22%, 61%]", (0.6, 20): "39%, 78%]"}.get((accuracy, pairs), "")
    warnings = round_warnings(project.run, [summary], "newest")
    expected = f"round 1 (v1 from v0): reward model v1 agrees with people on only {accuracy:.0%} of the {pairs} votes"
    assert [w for w in warnings if w.startswith(expected)] == ([warnings[0]] if warned else []), warnings
    assert len(warnings) == int(warned)


def write_adapter(directory: Path, content: bytes) -> None:
    (directory / "nested").mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(content)
    (directory / "nested" / "adapter_config.json").write_text('{"r": 8}')


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def two_versions(tmp_path) -> Project:
    """v1 and v2 after v0, each with an adapter of plain files, a reward model, and prompts for PPO."""
    project = init_project(tmp_path / "project")
    with closing(project.connect()) as con:
        add_prompts(con, [NewPrompt([{"role": "user", "content": f"Question {i}?"}], "test") for i in range(8)])
        add_policy(con, 1, "policies/v1", parent=0)
        add_policy(con, 2, "policies/v2", parent=1)
        add_reward_model(con, 1, "snapshot", "reward_models/v1", {})
    write_adapter(project.root / "policies" / "v1", bytes(range(256)) * 4)
    write_adapter(project.root / "policies" / "v2", b"the abandoned one")
    return project


def test_rollback_registers_a_copy_of_the_chosen_version_and_the_next_round_starts_from_it(two_versions):
    project = two_versions
    policy = roll_back(project, project.run, 1)
    assert (policy.version, policy.adapter_path) == (3, "policies/v3")
    assert files(project.root / "policies" / "v3") == files(project.root / "policies" / "v1")
    assert sorted(p.name for p in (project.root / "policies").iterdir()) == ["v1", "v2", "v3"]  # no hidden copy left
    with closing(project.connect()) as con:
        rows = con.execute("SELECT version, parent, adapter_path, rollback_from FROM policies ORDER BY version").fetchall()
    assert rows == [(0, None, None, None), (1, 0, "policies/v1", None), (2, 1, "policies/v2", None), (3, 1, "policies/v3", 2)]
    assert project.run(get_policy, None).version == 3

    _, job = start_round(project, project.run, reward_version=1, optimizer="ppo")
    assert job.kind == "ppo" and job.config["policy_version"] == 3
    assert job.config["policy_adapter_path"] == str(project.root / "policies" / "v3")
    with pytest.raises(StoreError, match="round 1 is running"):
        roll_back(project, project.run, 0)
    refused = run_tether("rollback", "0", "--project", str(project.root))
    assert refused.returncode == 1 and refused.stderr == "Error: round 1 is running: wait for it or cancel it before rolling back\n"
    assert project.run(get_policy, None).version == 3


def test_tether_rollback_to_the_starting_model_copies_nothing_and_refuses_the_newest(two_versions):
    project = two_versions
    done = run_tether("rollback", "0", "--project", str(project.root))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "policy v3 is a copy of v0: the next round and `tether ppo` start from it\n"
    assert project.run(get_policy, None) == Policy(3, None)
    newest = run_tether("rollback", "3", "--project", str(project.root))
    assert newest.returncode == 1 and "v3 is already the newest policy" in newest.stderr
    missing = run_tether("rollback", "7", "--project", str(project.root))
    assert missing.returncode == 1 and "no policy version 7" in missing.stderr


def test_a_version_registered_while_the_adapter_was_copied_fails_the_rollback_and_its_copy_is_removed(two_versions):
    project = two_versions
    calls = []

    def run(fn, *args):
        """The project's own run, with PPO registering v3 right after the rollback was planned."""
        result = project.run(fn, *args)
        if not calls:
            project.run(add_policy, 3, "policies/ppo-v3", 2)
        calls.append(fn.__name__)
        return result

    with pytest.raises(StoreError, match="the policies changed while the adapter was copied"):
        roll_back(project, run, 1)
    assert calls == ["plan_rollback", "_remove_copy"]  # the registration raised
    assert sorted(p.name for p in (project.root / "policies").iterdir()) == ["v1", "v2"]
    with closing(project.connect()) as con:
        assert con.execute("SELECT version, adapter_path FROM policies WHERE version > 2").fetchall() == [(3, "policies/ppo-v3")]


def vote_between(project: Project, new: int, old: int, new_wins: int, votes: int) -> None:
    """`votes` votes on pairs of a `new` and an `old` answer to the project's prompts, `new` winning the first new_wins."""
    with closing(project.connect()) as con:
        prompts = [row[0] for row in con.execute("SELECT id FROM prompts ORDER BY id").fetchall()]
        for i in range(votes):
            prompt = prompts[i % len(prompts)]
            a, b = add_completions(con, [NewCompletion(prompt, new, f"answer {i} of v{new}", 9, True, {}),
                                         NewCompletion(prompt, old, f"answer {i} of v{old}", 9, True, {})])
            add_pairs(con, [NewPair(prompt, a.id, b.id, "cross_version")])
            pair_id = con.execute("SELECT max(id) FROM pairs").fetchone()[0]
            con.execute("INSERT INTO comparisons (pair_id, annotator, choice) VALUES (?, 'ann', ?)", [pair_id, "a" if i < new_wins else "b"])


@pytest.mark.parametrize("start_from", ["best", "newest"])
def test_when_people_rate_the_newest_version_below_its_start_the_next_round_starts_from_the_start(two_versions, start_from):
    """[round] start_from = "best" (the default): v2 lost 4 of 16 votes to v1, the version it started from, so the
    round registers a copy of v1 as v3 and starts from it, and says so; "newest" starts from v2 all the same."""
    project = two_versions
    vote_between(project, new=2, old=1, new_wins=4, votes=16)
    set_settings(project.root, "round", start_from=start_from)
    project = load_project(project.root)
    _, job = start_round(project, project.run, reward_version=1, optimizer="ppo")
    [round_] = project.run(list_rounds)
    if start_from == "newest":
        assert (job.config["policy_version"], round_.policy_from, round_.note) == (2, 2, None)
        return
    assert job.config["policy_version"] == 3 and round_.policy_from == 3
    assert job.config["policy_adapter_path"] == str(project.root / "policies" / "v3")
    assert files(project.root / "policies" / "v3") == files(project.root / "policies" / "v1")
    assert re.fullmatch(r'starts from v1, which people rate above the newest, v2, with 9\d% confidence \(\[round\] start_from = '
                        r'"best"\): a copy of it is v3', round_.note), round_.note


def test_a_lead_of_a_few_votes_does_not_move_the_start(two_versions):
    vote_between(two_versions, new=2, old=1, new_wins=4, votes=12)  # 86% sure that v1 is better: not enough
    _, job = start_round(two_versions, two_versions.run, reward_version=1, optimizer="ppo")
    assert job.config["policy_version"] == 2 and two_versions.run(list_rounds)[0].note is None
