"""A round's stage moves only along store.rounds.TRANSITIONS: every allowed move is made, every other refused."""

from collections import deque
from contextlib import closing

import duckdb
import pytest

from store import StoreError, open_database
from store.db import migrate, utcnow
from store.rounds import FINISHED, TRANSITIONS, Stage, add_round, allowed, get_round, move_round, set_choice
from store.schema import MIGRATIONS

RUNNING = [stage for stage in Stage if stage not in FINISHED]


def test_the_transition_table():
    assert TRANSITIONS == {
        Stage.REWARD_MODEL: (Stage.CANDIDATES,),
        Stage.CANDIDATES: (Stage.CANDIDATES, Stage.PREDICTOR, Stage.DONE),
        Stage.PREDICTOR: (Stage.START_ANSWERS, Stage.PAIRS, Stage.DONE),
        Stage.START_ANSWERS: (Stage.PAIRS,),
        Stage.PAIRS: (Stage.DONE,),
    }
    assert set(TRANSITIONS) == set(RUNNING)


def path_to(stage: Stage) -> list[Stage]:
    """The shortest run of allowed moves from a new round's first stage to `stage`."""
    paths, queue = {Stage.REWARD_MODEL: []}, deque([Stage.REWARD_MODEL])
    while queue:
        at = queue.popleft()
        for to in Stage:
            if allowed(at, to) and to not in paths:
                paths[to] = paths[at] + [to]
                queue.append(to)
    return paths[stage]


@pytest.mark.parametrize("stage", list(Stage))
def test_from_each_stage_every_allowed_move_is_made_and_every_other_refused(tmp_path, stage):
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        for to in Stage:
            con.execute("DELETE FROM rounds")
            round_ = add_round(con, 0, None, "dpo")
            for step in path_to(stage):  # the set-up itself walks allowed moves only
                assert move_round(con, round_.id, step, utcnow())
            assert get_round(con, round_.id).stage is stage
            if stage in FINISHED:  # a finished round stays as it is, whatever is asked
                assert not move_round(con, round_.id, to, utcnow())
                assert get_round(con, round_.id).stage is stage
            elif to in TRANSITIONS[stage] or to in (Stage.FAILED, Stage.CANCELLED):
                assert move_round(con, round_.id, to, utcnow(), "why" if to in FINISHED else None)
                moved = get_round(con, round_.id)
                assert moved.stage is to
                assert moved.status == (to.value if to in FINISHED else "running")
                assert (moved.finished_at is not None) == (to in FINISHED)
            else:
                with pytest.raises(StoreError, match=f"cannot go from stage {stage} to {to}"):
                    move_round(con, round_.id, to, utcnow())
                assert get_round(con, round_.id).stage is stage


def test_a_round_given_its_reward_model_starts_at_its_candidates(tmp_path):
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        assert add_round(con, 0, None).stage is Stage.REWARD_MODEL
        move_round(con, 1, Stage.FAILED, utcnow())
        assert add_round(con, 0, 3).stage is Stage.CANDIDATES


def test_the_choice_of_auto_is_a_field_and_keeps_the_note(tmp_path):
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        round_ = add_round(con, 0, None, "auto", "reward model v1 reused")
        assert not round_.chosen_by_auto
        set_choice(con, round_.id, "dpo", "DPO on the votes, as reward model v1 does not steer the loop yet")
        chosen = get_round(con, round_.id)
        assert (chosen.optimizer, chosen.chosen_by_auto) == ("dpo", True)
        assert chosen.note == "reward model v1 reused; DPO on the votes, as reward model v1 does not steer the loop yet"


def test_rounds_of_an_older_database_get_their_stage_and_choice(tmp_path):
    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    migrate(con, [m for m in MIGRATIONS if m.version <= 12])
    con.execute("""INSERT INTO rounds (status, policy_from, comparisons_at_start, optimizer, note) VALUES
                   ('done', 0, 0, 'dpo', 'auto: DPO on the votes'), ('failed', 1, 0, 'ppo', NULL), ('running', 1, 0, 'ppo', NULL),
                   ('running', 1, 0, 'ppo', NULL)""")
    con.execute("""INSERT INTO jobs (kind, status, config, round) VALUES
                   ('reward_model', 'done', '{}', 3), ('predict', 'done', '{}', 3), ('generate', 'queued', '{"policy_version": 1}', 3),
                   ('ppo', 'running', '{}', 4)""")
    migrate(con)
    assert [(r.stage, r.chosen_by_auto) for r in map(lambda i: get_round(con, i), range(1, 5))] == [
        (Stage.DONE, True), (Stage.FAILED, False), (Stage.START_ANSWERS, False), (Stage.CANDIDATES, False)]
    con.close()
