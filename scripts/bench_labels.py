"""Benchmark: how much the loop learns per vote, today's defaults against the shipped ones, judge by judge.

For each judge and each arm, a fresh project on the same model with the demo prompts runs `tether
simulate` for the same rounds, with simulated annotators whose votes side with the judge
--agreement of the time on the starting policy's pairs, and the same evaluation prompts. The arms:

    today   random pairs, one reward-model head, PPO: the defaults before the label-efficiency work
    new     the shipped defaults, as `tether init` writes them ([round] optimizer = "auto")
    dpo     the shipped defaults with DPO rounds on human pairs and pairs the reward model ranks, its loss robust
            DPO at the measured flip rate ([dpo] label_smoothing = "auto")
    plain   as dpo, with plain DPO's loss ([dpo] label_smoothing = 0)
    half    the shipped defaults at half the votes a round: do they reach today's win rate with half?

One table follows: each round's judge win rate over v0 with its 95% interval, the KL to v0 on the
evaluation answers against [round] kl_budget, the votes used so far, the share of answers that
end, how closely the round's reward model follows the judge on the new policy's answers, and the
round's wall time (votes, more pairs and training; the evaluation is the benchmark's, not the
round's). Each arm's total wall time is then set against today's, measured in the same run.

Run with nothing else on the machine: two torch processes on a few cores slow each other badly.

    python scripts/bench_labels.py --eval-prompts ../shared/data/mtbench-prompts.jsonl
"""

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

from bench_arms import loop_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ui.owner.config import load_config, write_config  # noqa: E402  (the repository root, not an installed copy)

ARMS = ("today", "new", "dpo", "plain", "half")
JUDGES = ("concise", "direct", "polite")


def today(config):
    """The settings before ensembles, active pairs and RM-ranked DPO: random pairs, one head, PPO."""
    return dataclasses.replace(
        config,
        queue=dataclasses.replace(config.queue, strategy="random"),
        reward_model=dataclasses.replace(config.reward_model, heads=1),
        round=dataclasses.replace(config.round, optimizer="ppo"),
    )


def rm_ranked_dpo(config):
    return dataclasses.replace(config, round=dataclasses.replace(config.round, optimizer="dpo"),
                               dpo=dataclasses.replace(config.dpo, pairs="both"))


def plain_dpo(config):
    config = rm_ranked_dpo(config)
    return dataclasses.replace(config, dpo=dataclasses.replace(config.dpo, label_smoothing=0.0))


SETTINGS = {"today": today, "dpo": rm_ranked_dpo, "plain": plain_dpo}  # an arm's changes to the shipped settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-prompts", type=Path, required=True, help="JSONL prompt file; its first --eval-count prompts are judged.")
    parser.add_argument("--eval-count", type=int, default=24, help="Evaluation prompts to use (default 24).")
    parser.add_argument("--judges", default=",".join(JUDGES), help="Comma-separated judges: built-in, module:FUNC or PATH.py:FUNC "
                                                                  f"(default {','.join(JUDGES)}).")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"Comma-separated, of {', '.join(ARMS)} (default: all).")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="Model id or directory (default: the default model).")
    parser.add_argument("--agreement", type=float, default=0.7, help="Share of votes siding with the judge on v0's pairs (default 0.7).")
    parser.add_argument("--labels-per-round", type=int, default=96, help="Votes a round; the half arm casts half (default 96).")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds per arm (default 3).")
    parser.add_argument("--annotators", type=int, default=3, help="Simulated annotators (default 3).")
    parser.add_argument("--seed", type=int, default=0, help="Seed passed to tether simulate (default 0).")
    parser.add_argument("--workdir", type=Path, help="Where the projects and logs go (default: a new temporary directory).")
    args = parser.parse_args()

    arms, judges = args.arms.split(","), args.judges.split(",")
    if unknown := set(arms) - set(ARMS):
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    workdir, eval_file, eval_count = loop_setup(parser, args, "tether-bench-labels-")

    tether = str(Path(sys.executable).parent / "tether")  # installed beside this Python by scripts/setup.sh
    results = {}
    for judge in judges:
        for arm in arms:
            name = f"{Path(judge).stem.replace(':', '-')}-{arm}"
            project, report, log = workdir / name, workdir / f"{name}.jsonl", workdir / f"{name}.log"
            labels = args.labels_per_round // 2 if arm == "half" else args.labels_per_round
            began = time.monotonic()
            with log.open("w") as out:
                run(out, name, [tether, "init", str(project), "--model", args.model])
                if arm in SETTINGS:
                    write_config(project / "tether.toml", SETTINGS[arm](load_config(project / "tether.toml")))
                run(out, name, [tether, "prompts", "import", str(ROOT / "scripts" / "demo_prompts.jsonl"), "--project", str(project)])
                run(out, name, [tether, "simulate", "--judge", judge, "--agreement", str(args.agreement),
                                "--annotators", str(args.annotators), "--labels-per-round", str(labels), "--rounds", str(args.rounds),
                                "--seed", str(args.seed), "--eval-prompts", str(eval_file), "--report", str(report),
                                "--project", str(project)])
            config = load_config(project / "tether.toml")
            results[judge, arm] = ([json.loads(line) for line in report.read_text().splitlines()], config.round.kl_budget)
            print(f"{name}: {args.rounds} rounds in {time.monotonic() - began:.0f} s (log {log})", flush=True)

    print()
    print(f"agreement {args.agreement}, {args.annotators} annotators, {args.labels_per_round} votes a round ({args.labels_per_round // 2} "
          f"in the half arm), {eval_count} evaluation prompts, model {args.model}")
    print("judge    arm    round  optimizer  smoothing  strategy  judge win rate over v0 [95% CI]  KL to v0 (budget)  votes  ended  RM~judge  wall s")
    totals = {}
    for (judge, arm), (figures, budget) in results.items():
        votes = 0
        for r in figures:
            votes += r["votes"]
            wall = r["seconds"] - r["stages"].get("evaluation", 0)
            totals[judge, arm] = totals.get((judge, arm), 0) + wall
            follows = "" if r["reward_model_follows_judge"] is None else f"{r['reward_model_follows_judge']:.2f}"
            smoothing = "" if r.get("label_smoothing") is None else f"{r['label_smoothing']:.2f}"
            print(f"{judge:>7}  {arm:>5}  {r['round']:>5}  {r['optimizer']:>9}  {smoothing:>9}  {r['strategy']:>8}  "
                  f"{r['win_rate']:>13.1%} [{r['low']:.1%}, {r['high']:.1%}]  {r['kl_to_v0']:>8.2f} ({budget:g})  "
                  f"{votes:>5}  {r['ended']:>5.0%}  {follows:>8}  {wall:>6.0f}")
    for (judge, arm), (figures, _) in results.items():
        for r in figures:
            if r.get("why"):
                print(f"{judge} {arm} round {r['round']}: {r['why']}")
    for (judge, arm), total in totals.items():
        ratio = f", {total / totals[judge, 'today']:.2f} of today's" if (judge, "today") in totals and arm != "today" else ""
        print(f"{judge} {arm}: {len(results[judge, arm][0])} rounds took {total:.0f} s{ratio}")


def run(out, name: str, command: list[str]) -> None:
    if subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode:
        sys.exit(f"{name}: tether {command[1]} failed; see {out.name}")


if __name__ == "__main__":
    main()
