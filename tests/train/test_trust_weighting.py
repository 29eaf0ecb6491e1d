"""A reward model on votes weighted by annotator trust, against one on plain majority votes, when one annotator of
four flips a coin: simulated annotators voting through the real queue, and the tiny model."""

import random
from contextlib import closing

import pytest

from annotate.export import preference_rows
from annotate.queue import QueueConfig
from annotate.simulate import cast_votes
from annotate.trust import project_reliability
from store import open_database
from store.db import utcnow
from store.gold import GOLD, mark_gold
from store.pref_files import NewPreference
from store.preferences import add_preference_pairs
from store.prompt_files import NewPrompt
from tests.conftest import add_pairs
from tests.train.test_reward import WORDS
from train.common.config import RewardModelConfig
from train.common.snapshot import PreferenceRow
from train.reward.lora import train_reward_model
from ui.owner.project import init_project

CONFIG = RewardModelConfig(learning_rate=3e-4, epochs=2, batch_size=8, lora_dropout=0.0, max_length=48, seed=3, heads=1, eval_share=0.0)


GOOD = {"music", "light", "green"}


def answer(prompt_id: int, k: int) -> str:
    """Six words drawn at random: the judge counts the good ones among them, so a reward model must learn three
    words' worth wherever they stand, not one closing word."""
    rng = random.Random(prompt_id * 2 + k)
    return " ".join(rng.choice(WORDS) for _ in range(6))


def good_words_judge(prompt: str, completion: str) -> float:
    return float(sum(word in GOOD for word in completion.split()))


def held_out_rows(start: int = 10_000) -> list[PreferenceRow]:
    """Pairs labelled by the noiseless judge, on prompts and answers no vote saw; none the judge scores even."""
    rows = []
    for i in range(start, start + 400):
        a, b = answer(i, 0), answer(i, 1)
        margin = good_words_judge("", a) - good_words_judge("", b)
        if margin:
            rows.append(PreferenceRow([{"role": "user", "content": f"held-out question {i}"}], *((a, b) if margin > 0 else (b, a))))
    return rows


def votes_with_a_coin_flipper(project, seed: int) -> tuple[dict, dict[bool, list[PreferenceRow]]]:
    """A fresh project's votes by three careful annotators and dee, who flips a coin: (reliability, {weighted: rows})."""
    add_pairs(project, prompts=160, texts=answer, overlap_share=0.5)
    with closing(open_database(project / "tether.duckdb")) as con:
        gold = [NewPreference(NewPrompt(row.prompt, "test"), row.chosen, row.rejected) for row in held_out_rows(start=20_000 + 1000 * seed)[:40]]
        mark_gold(con, dict.fromkeys(add_preference_pairs(con, gold, GOLD, votes_wanted=0), "a"), "operator", "op", utcnow())

        def run(fn, *args):
            return fn(con, *args)

        random.seed(seed)  # the queue's draws: pairs and sides, apart from the annotators' own
        # Careful annotators side with the judge 70% of the time on a margin of 1 (noise 1.18), more on wider ones.
        cast_votes(run, QueueConfig(strategy="random", overlap_share=0.5, gold_share=0.3), good_words_judge, 1.18,
                   ["ann", "bob", "cid", "dee"], 480, random.Random(seed + 100), coin_flippers=frozenset({"dee"}))
        return project_reliability(con), {weighted: preference_rows(con, False, weighted) for weighted in (False, True)}


@pytest.mark.deep
def test_weighting_by_trust_beats_the_plain_majority_and_flags_the_coin_flipper(tiny_model_dir, tmp_path):
    """Over several draws of the votes, since one draw's difference is within the noise of 300 held-out pairs."""
    flag_below = QueueConfig().flag_reliability_below
    accuracy, lowest, flagged = {False: [], True: []}, [], []
    for seed in range(5):
        project = tmp_path / f"p{seed}"
        init_project(project, str(tiny_model_dir))
        reliability, rows = votes_with_a_coin_flipper(project, seed)
        lowest.append(min(reliability.values(), key=lambda r: r.reliability).annotator)
        flagged.append([r.annotator for r in reliability.values() if r.reliability < flag_below])
        for weighted, train_rows in rows.items():
            metrics = train_reward_model(str(tiny_model_dir), train_rows, held_out_rows(), CONFIG, tmp_path / f"rm-{seed}-{weighted}")
            accuracy[weighted].append(metrics["eval_accuracy"])
    assert sum(accuracy[True]) > sum(accuracy[False]), accuracy
    # About 23 gold answers each tell a coin (0.5) from a careful person (0.7 to 0.8) most of the time, not always: over
    # 65 draws the coin flipper was the least reliable in 64 and the only one flagged in 55 (85%). A seed's draw is not
    # the same on every run (in one suite run seeds 0 and 1 flagged nobody, which alone flag the coin flipper): 2 of 5
    # flagged, or 4 of 5 the least reliable, each fails about one run in 450.
    assert lowest.count("dee") >= 4 and flagged.count(["dee"]) >= 2, (lowest, flagged)
