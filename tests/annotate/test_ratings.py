"""Win rates and Bradley-Terry ratings of policy versions, from votes in a real DuckDB file."""

import math
from contextlib import closing

import pytest

from annotate.ratings import bradley_terry, head_to_head, lead_probability, measured_share, wilson_interval
from store import open_database
from store.completions import NewCompletion, NewPair, add_completions, add_pairs
from store.policies import add_policy
from store.prompt_files import NewPrompt
from store.prompts import add_prompts
from store.stats import version_games


def test_a_head_to_head_counts_each_side_and_ties_as_half():
    games = [(1, 0, "a"), (0, 1, "a"), (0, 1, "b"), (1, 0, "tie"), (0, 1, "both_bad"), (2, 0, "a")]
    result = head_to_head(games, 1, 0)
    assert (result.wins, result.losses, result.ties, result.votes) == (2, 1, 2, 5)
    assert result.rate == pytest.approx(3 / 5)
    assert result.low < 0.6 < result.high
    assert head_to_head(games, 0, 1).rate == pytest.approx(2 / 5)
    assert head_to_head(games, 3, 0).rate is None


def test_the_wilson_interval_matches_its_textbook_value():
    low, high = wilson_interval(0.8, 10)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    assert wilson_interval(1.0, 5)[1] == 1.0


def test_the_lead_probability_is_the_normal_approximation_to_the_fit_and_grows_with_the_votes():
    few = [(1, 0, "a")] * 7 + [(1, 0, "b")] * 3
    many = few * 4
    assert 0.8 < lead_probability(few, 1, 0) < 0.9 < lead_probability(many, 1, 0)
    assert lead_probability(few, 0, 1) == pytest.approx(1 - lead_probability(few, 1, 0))
    # 7 wins in 10 games and a virtual tie: odds 7.5 : 3.5 in 11 games, and the log-odds' Fisher information there.
    strength = math.log(7.5 / 3.5)
    information = 11 * (7.5 / 11) * (3.5 / 11)
    assert lead_probability(few, 1, 0) == pytest.approx(0.5 * (1 + math.erf(strength * math.sqrt(information) / math.sqrt(2))))
    # Through a chain: 2 met only 1, which met only 0; a lead over 0 carries both steps' uncertainty.
    chain = many + [(2, 1, "a")] * 28 + [(2, 1, "b")] * 12
    assert lead_probability(chain, 2, 0) > 0.99 and lead_probability(chain, 2, 0) > lead_probability(chain, 2, 1)
    assert lead_probability(chain, 3, 0) == 0.5  # a version with no games


def test_a_share_shows_its_count_and_interval_or_says_it_is_too_few_to_measure():
    assert measured_share(0.625, 40) == "62.5% of 40 pairs [47%, 76%]"
    assert measured_share(1 / 3, 6) == "too few pairs to measure (6)"
    assert measured_share(0.6, 20, "votes") == "60.0% of 20 votes [39%, 78%]"
    assert measured_share(None, 0) == "no pairs to measure on"


def test_bradley_terry_recovers_the_odds_and_the_order():
    # 1 beats 0 three times in four; with half a virtual tie each way the odds are 3.5 : 1.5.
    ratings = bradley_terry([(1, 0, "a")] * 3 + [(0, 1, "a")])
    assert ratings[0] == 1000
    assert ratings[1] - ratings[0] == pytest.approx(400 * math.log10(3.5 / 1.5), abs=1e-6)
    chain = [(1, 0, "a")] * 8 + [(0, 1, "a")] * 2 + [(2, 1, "a")] * 8 + [(1, 2, "a")] * 2
    rated = bradley_terry(chain)
    assert rated[2] > rated[1] > rated[0]
    assert bradley_terry([(1, 0, "a")] * 20)[1] == pytest.approx(1000 + 400 * math.log10(20.5 / 0.5))  # finite: the prior holds it
    assert bradley_terry([]) == {}


def test_version_games_reads_cross_version_votes_only(tmp_path):
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        add_policy(con, 0, None)
        add_policy(con, 1, "policies/v1", parent=0)
        add_prompts(con, [NewPrompt([{"role": "user", "content": "Hi"}], "test")])
        [prompt] = [row[0] for row in con.execute("SELECT id FROM prompts").fetchall()]
        old, new, old2 = add_completions(con, [NewCompletion(prompt, v, f"text {i}", 2, True, {}) for i, v in enumerate((0, 1, 0))])
        add_pairs(con, [NewPair(prompt, new.id, old.id, "cross_version"), NewPair(prompt, old.id, old2.id, "same_policy")])
        cross, same = [row[0] for row in con.execute("SELECT id FROM pairs ORDER BY id").fetchall()]
        con.executemany("INSERT INTO comparisons (pair_id, annotator, choice) VALUES (?, ?, ?)", [[cross, "ann", "a"], [same, "ann", "b"]])
        assert version_games(con) == [(1, 0, "a")]
