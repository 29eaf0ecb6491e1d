"""The AI judge (`tether judge`) against the human choice on Anthropic HH preference pairs.

Each pair of an HH file is put to the judge, train.reward.judge.judge_pairs as the worker runs it, with the
chosen answer in place A for a random half of the pairs and in place B for the rest, so that a
judge leaning to one place gains nothing on its single-order agreement. Reported: the agreement
with the human choice of the judge's vote (both orders' log-odds averaged) and of the first order
alone, each with its 95% Wilson interval; how often a single order picked the first-placed answer
(0.5 without position bias); how often the two orders picked the same answer; the baseline that
always picks the longer answer; and seconds per pair, the model's load left out.

    python scripts/bench_judge.py --pairs 300
"""

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HH_FILE = ROOT.parent / "shared" / "data" / "hh-rlhf-harmless-1800.jsonl.gz"


def main() -> None:
    from annotate.ratings import wilson_interval
    from store.pref_files import read_preference_file
    from train.common.config import DEFAULT_MODEL, JudgeConfig, ModelConfig
    from train.common.models import load_model
    from train.reward.judge import PairToJudge, judge_pairs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=HH_FILE, help="Preference file: Anthropic HH or TRL format [default: the shared HH pairs].")
    parser.add_argument("--pairs", type=int, default=300, help="Judge the first N pairs of the file.")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="The judge: a Hugging Face model id or local directory.")
    parser.add_argument("--batch-size", type=int, default=JudgeConfig.batch_size, help="Questions per forward pass.")
    parser.add_argument("--max-length", type=int, default=JudgeConfig.max_length, help="Longest question, in tokens.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of which pairs get the chosen answer in place A.")
    options = parser.parse_args()

    preferences = read_preference_file(options.data)[: options.pairs]
    chosen_first = [random.Random(options.seed + i).random() < 0.5 for i in range(len(preferences))]
    pairs = [PairToJudge(p.prompt.messages, *((p.chosen, p.rejected) if first else (p.rejected, p.chosen)))
             for p, first in zip(preferences, chosen_first)]
    model, tokenizer = load_model(ModelConfig(name_or_path=options.model))
    config = JudgeConfig(batch_size=options.batch_size, max_length=options.max_length)
    started = time.perf_counter()
    judgements = judge_pairs(model, tokenizer, pairs, config, options.model)
    seconds = time.perf_counter() - started

    def share(hits: list[bool]) -> str:
        rate = sum(hits) / len(hits)
        low, high = wilson_interval(rate, len(hits))
        return f"{rate:.1%} [{low:.1%}, {high:.1%}]"

    both = [(j.p_a > 0.5) == first for j, first in zip(judgements, chosen_first)]
    single = [(j.p_a_first > 0.5) == first for j, first in zip(judgements, chosen_first)]
    first_place = [j.p_a_first > 0.5 for j in judgements] + [j.p_a_second < 0.5 for j in judgements]
    consistent = [(j.p_a_first > 0.5) == (j.p_a_second > 0.5) for j in judgements]
    longer = [len(p.chosen) > len(p.rejected) for p in preferences if len(p.chosen) != len(p.rejected)]
    print(f"{options.model} as judge on the first {len(pairs)} pairs of {options.data.name}; "
          f"max_length {config.max_length}, batch {config.batch_size}, {sum(j.prompt_cut for j in judgements)} conversations cut, "
          f"{sum(j.answers_cut for j in judgements)} pairs' answers cut")
    rows = [
        ("agreement with the human choice, both orders (the judge's vote)", share(both)),
        ("agreement, first order alone", share(single)),
        ("single-order questions answered with the first-placed answer", share(first_place)),
        ("pairs whose two orders picked the same answer", share(consistent)),
        (f"baseline: the longer answer ({len(longer)} pairs of unequal length)", share(longer)),
        ("seconds per pair (two questions)", f"{seconds / len(pairs):.3f}"),
    ]
    print("| measure | value [95% Wilson interval] |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
