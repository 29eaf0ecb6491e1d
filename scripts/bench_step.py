"""Benchmark: how far a round's votes are worth moving the policy. Each version of a loop's project, its step from v0
scaled to --shares of it (its LoRA update scaled, as [round] kl_budget's pull-back cuts it), judged against v0.

A share of 1 is the version as the loop served it, the baseline each share is read against: if a cut keeps the full
step's win rate at a fraction of its KL, a round on that many votes may move the policy less and lose nothing, and a
draw that pulled the wrong way costs less; if a longer step (a share above 1) wins more, the round stopped short. Each point on --eval-count prompts, --eval-samples answers each, with the
loop's evaluation seed, so v0's answers are the loop's (kept in the work directory, as bench_curve.py keeps them).

Run with nothing else on the machine, and not on a project a loop still runs on (DuckDB lets one process open it).

    python scripts/bench_step.py --project curve/direct-loop-seed0 --judge direct \\
        --eval-prompts ../shared/data/mtbench-prompts.jsonl --workdir curve
"""

import argparse
import json
import sys
import time
from pathlib import Path

from bench_arms import loop_setup
from bench_curve import evaluate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from store.policies import get_policy, policy_versions  # noqa: E402  (the repository root, not an installed copy)
from train.policy.adapters import scale_adapter  # noqa: E402
from ui.owner.project import load_project  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True, help="A loop's project (scripts/bench_curve.py's, say).")
    parser.add_argument("--judge", required=True, help="Built-in judge, module:FUNC or PATH.py:FUNC.")
    parser.add_argument("--eval-prompts", type=Path, required=True, help="JSONL prompt file; its first --eval-count prompts are judged.")
    parser.add_argument("--eval-count", type=int, default=48, help="Evaluation prompts (default 48).")
    parser.add_argument("--eval-samples", type=int, default=8, help="Answers to each evaluation prompt (default 8: 384 judged pairs).")
    parser.add_argument("--seed", type=int, default=0, help="The evaluation's seed (default 0, as the loop's).")
    parser.add_argument("--versions", type=int, nargs="*", help="Policy versions (default: every one with a step from v0).")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="Shares of each step from v0 (default 0.5 1 2).")
    parser.add_argument("--workdir", type=Path, help="Where the cut adapters, v0's answers and points.jsonl go (default: a new temporary directory).")
    args = parser.parse_args()
    if any(share <= 0 for share in args.shares):
        parser.error("--shares: each above 0")

    project = load_project(args.project)
    steps = {v: path for v in project.run(policy_versions) if (path := project.run(get_policy, v).adapter_path)}  # not v0, nor a copy of it
    versions = args.versions or list(steps)
    if stray := set(versions) - set(steps):
        parser.error(f"--versions {', '.join(map(str, sorted(stray)))}: no step from v0 to scale (v0, a copy of it, or none)")
    workdir, eval_file, _ = loop_setup(parser, args, "tether-bench-step-")
    points_file = workdir / f"step-{args.project.name}.jsonl"
    votes = project.run(votes_before)
    print("\n| version | votes it trained on | share of its step | win rate over v0 [95% CI] | KL to v0 | ended | s |")
    print("|---" * 7 + "|", flush=True)
    for version in versions:
        adapter = project.root / steps[version]
        for share in sorted(args.shares):
            began = time.monotonic()
            cut = workdir / f"step-{args.project.name}-v{version}-{share:g}"
            if not (cut / "policy").exists():
                scale_adapter(adapter, cut / "policy", share)
            point = evaluate(args.project, args.judge, cut, eval_file, args.eval_samples, args.seed)
            point.update(version=version, share=share, votes=votes.get(version), seconds=time.monotonic() - began)
            with points_file.open("a", encoding="utf-8") as f:
                f.write(json.dumps(point) + "\n")
            print(f"| v{version} | {point['votes']} | {share:g} | {point['win_rate']:.1%} [{point['low']:.1%}, {point['high']:.1%}] "
                  f"| {point['kl_to_v0']:.2f} | {point['ended']:.0%} | {point['seconds']:.0f} |", flush=True)
    print(f"points in {points_file}")


def votes_before(con) -> dict[int, int]:
    """Each version's votes: those cast before the round that trained it began."""
    return dict(con.execute("SELECT p.version, r.comparisons_at_start FROM policies p JOIN rounds r ON r.id = p.round").fetchall())


if __name__ == "__main__":
    main()
