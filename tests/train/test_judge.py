"""The AI judge: its question in both orders, its job and CLI, and its votes kept apart from people's."""

from contextlib import closing

import pytest

from annotate.agreement import JudgeAgreement, judge_agreement
from annotate.export import export_preferences, preference_rows
from store import open_database
from store.ai_votes import AI, add_ai_votes, judge_annotator
from store.db import utcnow
from store.queue import open_pairs
from store.status import project_counts
from tests.conftest import add_pairs, run_tether, set_settings, vote_through_queue
from train.common.config import JudgeConfig, ModelConfig
from train.common.models import load_model
from train.reward.judge import Encoder, PairToJudge, judge_pairs
from ui.owner.jobs import JobError
from ui.owner.project import load_project
from ui.owner.round_jobs import submit_reward_training

LONG = " ".join(f"word{i}" for i in range(300))


@pytest.fixture(scope="module")
def tiny_judge(tiny_model_dir):
    return load_model(ModelConfig(name_or_path=str(tiny_model_dir)))


def test_swapping_a_pairs_answers_gives_the_complementary_probability(tiny_judge):
    model, tokenizer = tiny_judge
    prompt = [{"role": "user", "content": "What is a cat?"}]
    cat, car = "A small furry animal.", "A kind of car."
    pairs = [PairToJudge(prompt, cat, car), PairToJudge(prompt, car, cat)]
    forward, swapped = judge_pairs(model, tokenizer, pairs, JudgeConfig(batch_size=2), "tiny")
    assert forward.p_a == pytest.approx(1 - swapped.p_a, abs=1e-5)
    assert forward.choice != swapped.choice
    # Each order alone is the other order's reading of the swapped pair: the averaging is what cancels the bias.
    assert forward.p_a_first == pytest.approx(1 - swapped.p_a_second, abs=1e-5)


def test_a_long_question_loses_its_conversations_start_then_its_answers_ends_and_no_pair_is_dropped(tiny_judge):
    _, tokenizer = tiny_judge
    config = JudgeConfig(max_length=160)
    encoder = Encoder(tokenizer, config)
    first, second, prompt_cut, answers_cut = encoder.both_orders(PairToJudge([{"role": "user", "content": LONG}], "Yes.", "No."))
    assert prompt_cut and not answers_cut
    assert max(len(first), len(second)) <= 160
    assert "Yes." in tokenizer.decode(first) and "word299" in tokenizer.decode(first) and "word0 " not in tokenizer.decode(first)

    first, second, prompt_cut, answers_cut = encoder.both_orders(PairToJudge([{"role": "user", "content": "Hi"}], LONG, "No."))
    assert answers_cut and max(len(first), len(second)) <= 160
    assert "No." in tokenizer.decode(first), "the shorter answer is kept whole"


def test_a_judge_template_without_its_placeholders_is_refused_and_nothing_is_written(tiny_project):
    add_pairs(tiny_project, prompts=2)
    set_settings(tiny_project, "judge", template="Which is better, {answer_a} or {answer_b}? {verdict}")
    result = run_tether("judge", "--project", str(tiny_project))
    assert result.returncode == 1
    assert "tether.toml: [judge] template lacks {prompt} and has unknown {verdict}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tiny_project / "jobs").exists()
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_tether_judge_stores_ai_votes_that_leave_the_pairs_to_people(tiny_project, tiny_model_dir):
    add_pairs(tiny_project, prompts=4)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        wanting = project_counts(con).pairs_wanting_votes
        first_pair = min(p.id for p in open_pairs(con))
        con.execute("UPDATE pairs SET votes_wanted = 0 WHERE id > ?", [first_pair])  # people vote on the first pair only
        assert vote_through_queue(con, "ann") == 1
        con.execute("UPDATE pairs SET votes_wanted = 1")

    result = run_tether("judge", "--limit", "3", "--project", str(tiny_project))
    assert result.returncode == 0, result.stderr
    judge = judge_annotator(str(tiny_model_dir))
    assert f"{judge} judged 3 pairs and added 3 votes" in result.stdout
    assert "agreement with people: " in result.stdout and "on 1 pairs both voted on" in result.stdout

    again = run_tether("judge", "--project", str(tiny_project))  # only the pair it has not judged
    assert again.returncode == 0, again.stderr
    assert "judged 1 pairs and added 1 votes" in again.stdout
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        votes = con.execute("SELECT annotator, source, choice, comment FROM comparisons WHERE source = 'ai'").fetchall()
        assert len(votes) == 4 and {v[0] for v in votes} == {judge}
        assert all(v[2] in ("a", "b") and v[3].startswith("p(a better) = ") for v in votes)
        counts = project_counts(con)
        assert (counts.votes, counts.ai_votes, counts.pairs_wanting_votes) == (1, 4, wanting - 1)
        assert len(open_pairs(con)) == wanting - 1, "an AI vote does not stand for a person's"
    status = run_tether("status", "--project", str(tiny_project))
    assert f"4; {judge}: agreement with people " in status.stdout
    assert run_tether("judge", "--project", str(tiny_project)).stderr.strip().endswith("has voted on every pair already: generate new pairs first")


def test_ai_votes_are_kept_out_of_training_by_default(tiny_project):
    add_pairs(tiny_project, prompts=3)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        pairs = [p.id for p in open_pairs(con)]
        add_ai_votes(con, "ai:judge", [(pairs[0], "a", 0.8), (pairs[1], "b", 0.3), (pairs[2], "a", 0.6)], utcnow())
        assert preference_rows(con, False) == []

    project = load_project(tiny_project)
    with pytest.raises(JobError, match='set ai_votes = "include" or "weight" in \\[reward_model\\] of tether.toml to train on the AI judge'):
        submit_reward_training(project, project.run)
    assert not (tiny_project / "jobs").exists()

    set_settings(tiny_project, "reward_model", ai_votes="include")
    project = load_project(tiny_project)
    job = submit_reward_training(project, project.run)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rows = preference_rows(con, False, ai_votes="include")
    assert job.config["reward_model"]["ai_votes"] == "include"
    assert [r.pair_id for r in rows] == pairs
    assert (tiny_project / "jobs" / str(job.id) / "inputs" / "preferences.parquet").exists()


def test_where_people_voted_their_votes_alone_decide_in_training_and_export(tiny_project, tmp_path):
    add_pairs(tiny_project, prompts=2)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        people, judged_only = [p.id for p in open_pairs(con)]
        con.execute("UPDATE pairs SET votes_wanted = 0 WHERE id = ?", [judged_only])
        vote_through_queue(con, "ann", lambda assignment: ("left" if "answer 1" in assignment.left_text else "right", None, None))
        add_ai_votes(con, "ai:judge", [(people, "a", 0.9), (judged_only, "b", 0.2)], utcnow())
        rows = {r.pair_id: r for r in preference_rows(con, False, ai_votes="include")}
        assert rows[people].chosen.startswith("answer 1"), "the person chose b; the judge's 'a' does not count"
        assert rows[judged_only].chosen.startswith("answer 1")

        plain = export_preferences(con, tmp_path / "people.jsonl", "jsonl")
        with_ai = export_preferences(con, tmp_path / "with-ai.jsonl", "jsonl", include_ai=True)
    assert (plain.rows, with_ai.rows) == (1, 2)
    sources = [line.split('"source": ')[1].split(",")[0] for line in (tmp_path / "with-ai.jsonl").read_text().splitlines()]
    assert sources == ['"app"', f'"{AI}"']


def test_weighted_ai_labels_are_trusted_as_far_as_the_judge_agrees_with_people(tiny_project):
    add_pairs(tiny_project, prompts=4)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        pairs = [p.id for p in open_pairs(con)]
        con.execute("UPDATE pairs SET votes_wanted = 0 WHERE id = ?", [pairs[3]])
        vote_through_queue(con, "ann", lambda assignment: ("left" if "answer 1" in assignment.left_text else "right", None, None))
        add_ai_votes(con, "ai:judge", [(pairs[0], "b", 0.1), (pairs[1], "b", 0.2), (pairs[2], "a", 0.7), (pairs[3], "a", 0.9)], utcnow())
        rows = {r.pair_id: r for r in preference_rows(con, False, ai_votes="weight")}
    assert [rows[p].confidence for p in pairs[:3]] == [1.0, 1.0, 1.0], "people's labels are not the judge's to weigh"
    assert rows[pairs[3]].chosen.startswith("answer 0")
    assert rows[pairs[3]].confidence == pytest.approx((2 + 1) / (3 + 2)), "it agreed with people on 2 of 3 pairs"


def test_a_judges_agreement_counts_the_pairs_where_people_chose_a_side():
    judged = [("ai:x", "a", ["a"]), ("ai:x", "b", ["a", "a", "b"]), ("ai:x", "a", ["tie"]), ("ai:x", "a", ["a", "b"]),
              ("ai:y", "b", ["b"])]
    agreement = judge_agreement(judged)
    assert agreement == {"ai:x": JudgeAgreement(1, 2), "ai:y": JudgeAgreement(1, 1)}
    low, high = agreement["ai:x"].interval()
    assert low < 0.5 < high
    assert agreement["ai:x"].confidence == 0.5 and agreement["ai:y"].confidence == pytest.approx(2 / 3)
    assert JudgeAgreement(0, 10).confidence == 0.5, "a judge worse than a coin is not trusted below one"
