"""Benchmark: a reward model trained on votes weighted by annotator trust, against one on plain majority votes,
when one annotator of four votes at random.

Four simulated annotators vote through the real queue on pairs of the shared HH file: three side
with the judge --agreement of the time, one flips a coin. Gold pairs, answered by the noiseless
judge, are mixed in at --gold-share, and a share of pairs get two votes, as [queue] overlap_share
asks. Each annotator's reliability is then estimated (annotate.trust), and a reward model is
trained on the same votes twice: [reward_model] weight_by_trust off, then on. Both are scored on
held-out HH pairs labelled by the noiseless judge. The figures are accuracies, not times, so
other work on the machine slows the run without changing them.

    python scripts/bench_trust.py --model HuggingFaceTB/SmolLM2-135M-Instruct
"""

import argparse
import random
import sys
import tempfile
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotate.export import preference_rows  # noqa: E402  (the repository root, not an installed copy)
from annotate.judges import load_judge  # noqa: E402
from annotate.queue import QueueConfig  # noqa: E402
from annotate.ratings import wilson_interval  # noqa: E402
from annotate.simulate import cast_votes, noise_for_agreement  # noqa: E402
from annotate.trust import project_reliability  # noqa: E402
from store import open_database  # noqa: E402
from store.db import utcnow  # noqa: E402
from store.gold import GOLD, mark_gold  # noqa: E402
from store.pref_files import read_preference_file  # noqa: E402
from store.preferences import add_preference_pairs  # noqa: E402
from train.common.config import RewardModelConfig  # noqa: E402
from train.common.snapshot import PreferenceRow  # noqa: E402

HH_FILE = ROOT.parent / "shared" / "data" / "hh-rlhf-harmless-1800.jsonl.gz"
ANNOTATORS = ["ann", "bob", "cid", "dee"]
COIN_FLIPPER = "dee"


def judged(judge, preference) -> tuple[str, float]:
    """The noiseless judge's answer on a preference ('a' is its chosen reply) and its margin a - b."""
    prompt = preference.prompt.messages[-1]["content"]
    margin = judge(prompt, preference.chosen) - judge(prompt, preference.rejected)
    return ("a" if margin > 0 else "b"), margin


def simulate(options: argparse.Namespace, judge, pool: list, gold: list, seed: int) -> tuple[int, dict, dict[bool, list]]:
    """One draw of the simulated votes in a fresh database: (votes cast, reliability, {weighted: training rows})."""
    random.seed(seed + 1)  # the queue's draws, apart from the annotators'
    overlapped = int(len(pool) * options.overlap_share)
    queue = QueueConfig(strategy="random", gold_share=options.gold_share, overlap_share=options.overlap_share)
    noise = noise_for_agreement([judged(judge, p)[1] for p in pool], options.agreement)
    with tempfile.TemporaryDirectory(prefix="bench-trust-") as scratch, closing(open_database(Path(scratch) / "t.duckdb")) as con:
        def run(fn, *args):
            return fn(con, *args)

        add_preference_pairs(con, pool[:overlapped], "bench", votes_wanted=2)
        add_preference_pairs(con, pool[overlapped:], "bench", votes_wanted=1)
        gold_ids = add_preference_pairs(con, gold, GOLD, votes_wanted=0)
        mark_gold(con, {pair: judged(judge, p)[0] for pair, p in zip(gold_ids, gold)}, "operator", "bench", utcnow())
        votes = cast_votes(run, queue, judge, noise, ANNOTATORS, len(pool), random.Random(seed), coin_flippers=frozenset({COIN_FLIPPER}))
        return votes.cast, project_reliability(con), {weighted: preference_rows(con, False, weighted) for weighted in (False, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="Base model id or directory.")
    parser.add_argument("--judge", default="concise", help="Judge the annotators side with (a built-in name, module:FUNC or PATH.py:FUNC).")
    parser.add_argument("--agreement", type=float, default=0.7, help="How often the careful annotators side with the judge.")
    parser.add_argument("--votes", type=int, default=240, help="Votes cast in all, gold answers included.")
    parser.add_argument("--gold", type=int, default=40, help="Gold pairs.")
    parser.add_argument("--gold-share", type=float, default=0.2, help="[queue] gold_share.")
    parser.add_argument("--overlap-share", type=float, default=0.3, help="[queue] overlap_share: pairs that get two votes.")
    parser.add_argument("--eval-pairs", type=int, default=200, help="Held-out HH pairs the reward models are scored on.")
    parser.add_argument("--max-length", type=int, default=128, help="[reward_model] max_length.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flag-trials", type=int, default=0,
                        help="Draw the votes this many more times, without training, and count who was flagged each time.")
    parser.add_argument("--no-train", action="store_true", help="Stop after the votes and the reliability: no reward models.")
    options = parser.parse_args()

    from train.common.models import resolve_model_path
    from train.reward.lora import train_reward_model

    judge = load_judge(options.judge)
    preferences = read_preference_file(HH_FILE)
    random.Random(options.seed).shuffle(preferences)
    held_out = [p for p in preferences[: options.eval_pairs * 2] if judged(judge, p)[1] != 0][: options.eval_pairs]
    gold = [p for p in preferences[options.eval_pairs * 2 :][: options.gold * 2] if judged(judge, p)[1] != 0][: options.gold]
    pool = preferences[options.eval_pairs * 2 + options.gold * 2 :][: options.votes]
    cast, reliability, rows = simulate(options, judge, pool, gold, options.seed)

    print(f"{cast} votes by {len(ANNOTATORS)} annotators ({COIN_FLIPPER} at random), judge {options.judge}, careful annotators at "
          f"agreement {options.agreement}; {len(gold)} gold pairs at gold_share {options.gold_share}; model {options.model}\n")
    print("| annotator | reliability | measured on votes | gold right |")
    print("|---|---|---|---|")
    for r in reliability.values():
        print(f"| {r.annotator}{' (random)' if r.annotator == COIN_FLIPPER else ''} | {r.reliability:.2f} | {r.informative_votes} | "
              f"{r.gold_correct} / {r.gold_answered} |")
    if options.flag_trials:
        below = QueueConfig().flag_reliability_below
        flags = [simulate(options, judge, pool, gold, options.seed + 1 + trial)[1] for trial in range(options.flag_trials)]
        coin = sum(r[COIN_FLIPPER].reliability < below for r in flags)
        careful = sum(any(r[a].reliability < below for a in ANNOTATORS if a != COIN_FLIPPER) for r in flags)
        print(f"\nOver {options.flag_trials} more draws of the votes: {COIN_FLIPPER} flagged in {coin}; a careful annotator flagged "
              f"in {careful} (flag_reliability_below = {below})")

    if options.no_train:
        return
    eval_rows = [PreferenceRow(p.prompt.messages, *((p.chosen, p.rejected) if judged(judge, p)[0] == "a" else (p.rejected, p.chosen)))
                 for p in held_out]
    model_path = resolve_model_path(options.model)
    config = RewardModelConfig(max_length=options.max_length, seed=options.seed, eval_share=0.0)
    print("\n| votes | training pairs | held-out accuracy against the judge (95% interval) | train s |")
    print("|---|---|---|---|")
    for weighted, train_rows in rows.items():
        with tempfile.TemporaryDirectory(prefix="bench-trust-rm-") as scratch:
            metrics = train_reward_model(model_path, train_rows, eval_rows, config, Path(scratch) / "rm")
        accuracy = metrics["eval_accuracy"]
        low, high = wilson_interval(accuracy, len(eval_rows))
        name = "weighted by trust" if weighted else "majority, unweighted"
        print(f"| {name} | {len(train_rows)} | {accuracy:.1%} ({low:.1%} to {high:.1%}) | {metrics['train_seconds']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
