"""Benchmark: the loop with each optimiser on the same simulated annotators, prompts and evaluation.

For each optimiser, a fresh project on the same model with the demo prompts runs `tether simulate`
for the same rounds: the same judge, agreement (or noise), annotators, votes per round, seed and evaluation
prompts. One table follows: each round's judge win rate over v0 with its 95% interval, the judge's
mean score, the KL to v0 on the evaluation answers, and the round's wall time (votes, more pairs,
training and the new-against-old completions; the evaluation is the benchmark's, not the round's).
Each optimiser's total wall time is then set against PPO's, measured in the same run.

Run with nothing else on the machine: two torch processes on a few cores slow each other badly.

    python scripts/bench_loop.py --eval-prompts ../shared/data/mtbench-prompts.jsonl
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench_arms import loop_setup

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZERS = ("ppo", "dpo", "grpo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-prompts", type=Path, required=True, help="JSONL prompt file; its first --eval-count prompts are judged.")
    parser.add_argument("--eval-count", type=int, default=24, help="Evaluation prompts to use (default 24).")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="Comma-separated, PPO first for the ratio (default: all).")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="Model id or directory (default: the default model).")
    parser.add_argument("--judge", default="concise", help="Built-in judge, module:FUNC or PATH.py:FUNC (default concise).")
    parser.add_argument("--agreement", type=float, default=0.7, help="Share of votes siding with the judge on v0's pairs (default 0.7).")
    parser.add_argument("--noise", type=float, help="T in tether simulate: sigmoid((judge(A) - judge(B)) / T); overrides --agreement.")
    parser.add_argument("--annotators", type=int, default=3, help="Simulated annotators (default 3).")
    parser.add_argument("--labels-per-round", type=int, default=96, help="Votes cast in each round (default 96).")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds per optimiser (default 3).")
    parser.add_argument("--seed", type=int, default=0, help="Seed passed to tether simulate (default 0).")
    parser.add_argument("--workdir", type=Path, help="Where the projects and logs go (default: a new temporary directory).")
    args = parser.parse_args()

    optimizers = args.optimizers.split(",")
    if unknown := set(optimizers) - set(OPTIMIZERS):
        parser.error(f"unknown optimizers: {', '.join(sorted(unknown))}")
    workdir, eval_file, eval_count = loop_setup(parser, args, "tether-bench-loop-")

    noise = ["--noise", str(args.noise)] if args.noise is not None else ["--agreement", str(args.agreement)]
    rounds = {}
    for optimizer in optimizers:
        project, report, log = workdir / optimizer, workdir / f"{optimizer}.jsonl", workdir / f"{optimizer}.log"
        tether = [str(Path(sys.executable).parent / "tether")]  # installed beside this Python by scripts/setup.sh
        began = time.monotonic()
        with log.open("w") as out:
            for command in (
                [*tether, "init", str(project), "--model", args.model],
                [*tether, "prompts", "import", str(ROOT / "scripts" / "demo_prompts.jsonl"), "--project", str(project)],
                [*tether, "simulate", "--judge", args.judge, *noise, "--annotators", str(args.annotators),
                 "--labels-per-round", str(args.labels_per_round), "--rounds", str(args.rounds), "--seed", str(args.seed),
                 "--optimizer", optimizer, "--eval-prompts", str(eval_file), "--report", str(report), "--project", str(project)],
            ):
                if subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode:
                    sys.exit(f"{optimizer}: tether {command[1]} failed; see {log}")
        rounds[optimizer] = [json.loads(line) for line in report.read_text().splitlines()]
        print(f"{optimizer}: {args.rounds} rounds in {time.monotonic() - began:.0f} s (log {log})", flush=True)

    print()
    print(f"judge {args.judge}, {' '.join(noise).lstrip('-')}, {args.annotators} annotators, {args.labels_per_round} votes a round, "
          f"{eval_count} evaluation prompts, model {args.model}")
    print("optimizer  round  judge win rate over v0 [95% CI]   mean score  KL to v0  answers ended  wall s")
    totals = {}
    for optimizer, figures in rounds.items():
        for r in figures:
            wall = r["seconds"] - r["stages"].get("evaluation", 0)
            kl = "" if r["kl_to_v0"] is None else f"{r['kl_to_v0']:.2f}"
            totals[optimizer] = totals.get(optimizer, 0) + wall
            print(f"{optimizer:>9}  {r['round']:>5}  {r['win_rate']:>13.1%} [{r['low']:.1%}, {r['high']:.1%}]  "
                  f"{r['mean_score']:>10.3f}  {kl:>8}  {r['ended']:>13.0%}  {wall:>6.0f}")
    for optimizer, total in totals.items():
        ratio = f", {total / totals['ppo']:.2f} of PPO's" if "ppo" in totals and optimizer != "ppo" else ""
        print(f"{optimizer}: {len(rounds[optimizer])} rounds took {total:.0f} s{ratio}")


if __name__ == "__main__":
    main()
