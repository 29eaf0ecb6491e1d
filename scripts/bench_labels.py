"""Benchmark: how much the loop learns per vote, judge by judge, loop by loop, and how well its predictor foresees each round.

For each judge, arm and seed, a fresh project on the same model with the demo prompts runs `tether
simulate` for the same rounds, with simulated annotators whose votes side with the judge
--agreement of the time on the starting policy's pairs, and the same evaluation prompts. A seed is
one loop: it sets the annotators' noise and the evaluation samples, and the seeds of the reward
model and of every optimiser in the project, so two seeds are two draws of the whole loop. The arms:

    today   random pairs, one reward-model head, PPO, one candidate registered whatever it is: the
            defaults before the label-efficiency work
    new     the shipped defaults, as `tether init` writes them
    dpo     the shipped defaults with DPO rounds on human pairs and pairs the reward model ranks
    plain   as dpo, with plain DPO's loss ([dpo] label_smoothing = 0)
    half    the shipped defaults at half the votes a round

Three tables follow. The rounds: each round's start and the version it served (the same where it
registered none), the judge's win rate over v0 and over the round's start with 95% intervals, the
predictor's rating of the candidate it rated best, the KL to v0 on the evaluation answers against
[round] kl_budget, the votes so far, how closely the round's reward model follows the judge on the
served version's answers (RM~judge), and the round's time by stage. The predictor: over every round
of every loop here and of --reports, the top-rated candidate's predicted win rate over the round's
start against the judge's (Spearman's rank correlation), and which rounds would have lost to their
start (the judge's win rate under 50%) and whether the predictor kept them out. The loops: per judge
and arm, the mean of the loops' last-round win rates over v0, the worst loop, and any served version
whose interval over its start lies wholly below 50%.

Run with nothing else on the machine: two torch processes on a few cores slow each other badly.

    python scripts/bench_labels.py --eval-prompts ../shared/data/mtbench-prompts.jsonl --judges direct,polite --arms new --seeds 0 1
"""

import argparse
import dataclasses
import json
import statistics
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
STAGES = ("votes", "more pairs", "reward model", "DPO", "PPO", "GRPO", "predictor", "completions", "evaluation", "judging candidates")


def today(config):
    """The settings before ensembles, active pairs, RM-ranked DPO and candidates: random pairs, one head, PPO."""
    return dataclasses.replace(
        config,
        queue=dataclasses.replace(config.queue, strategy="random"),
        reward_model=dataclasses.replace(config.reward_model, heads=1),
        round=dataclasses.replace(config.round, optimizer="ppo", candidates=1, register="best", start_from="newest"),
    )


def rm_ranked_dpo(config):
    return dataclasses.replace(config, round=dataclasses.replace(config.round, optimizer="dpo"),
                               dpo=dataclasses.replace(config.dpo, pairs="both"))


def plain_dpo(config):
    config = rm_ranked_dpo(config)
    return dataclasses.replace(config, dpo=dataclasses.replace(config.dpo, label_smoothing=0.0))


SETTINGS = {"today": today, "dpo": rm_ranked_dpo, "plain": plain_dpo}  # an arm's changes to the shipped settings


def seeded(config, seed: int):
    """The project's training seeds set to the loop's: the reward model's and every optimiser's."""
    return dataclasses.replace(config, reward_model=dataclasses.replace(config.reward_model, seed=seed),
                               ppo=dataclasses.replace(config.ppo, seed=seed), dpo=dataclasses.replace(config.dpo, seed=seed),
                               grpo=dataclasses.replace(config.grpo, seed=seed))


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
    parser.add_argument("--rounds", type=int, default=3, help="Rounds per loop (default 3).")
    parser.add_argument("--annotators", type=int, default=3, help="Simulated annotators (default 3).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="One loop of each judge and arm per seed (default 0).")
    parser.add_argument("--judge-candidates", action="store_true", help="Judge every candidate of each round (tether simulate --judge-candidates).")
    parser.add_argument("--reports", type=Path, nargs="*", default=[],
                        help="Reports of loops run before (a loop's .jsonl), added to the predictor's and the loops' tables.")
    parser.add_argument("--workdir", type=Path, help="Where the projects and logs go (default: a new temporary directory).")
    args = parser.parse_args()

    arms, judges = args.arms.split(","), args.judges.split(",")
    if unknown := set(arms) - set(ARMS):
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    if missing := [str(p) for p in args.reports if not p.is_file()]:
        parser.error(f"no such report: {', '.join(missing)}")
    workdir, eval_file, eval_count = loop_setup(parser, args, "tether-bench-labels-")

    tether = str(Path(sys.executable).parent / "tether")  # installed beside this Python by scripts/setup.sh
    loops = {}
    for judge in judges:
        for arm in arms:
            for seed in args.seeds:
                name = f"{Path(judge).stem.replace(':', '-')}-{arm}-seed{seed}"
                project, report, log = workdir / name, workdir / f"{name}.jsonl", workdir / f"{name}.log"
                labels = args.labels_per_round // 2 if arm == "half" else args.labels_per_round
                began = time.monotonic()
                with log.open("w") as out:
                    run(out, name, [tether, "init", str(project), "--model", args.model])
                    config = seeded(load_config(project / "tether.toml"), seed)
                    write_config(project / "tether.toml", SETTINGS[arm](config) if arm in SETTINGS else config)
                    run(out, name, [tether, "prompts", "import", str(ROOT / "scripts" / "demo_prompts.jsonl"), "--project", str(project)])
                    run(out, name, [tether, "simulate", "--judge", judge, "--agreement", str(args.agreement),
                                    "--annotators", str(args.annotators), "--labels-per-round", str(labels), "--rounds", str(args.rounds),
                                    "--seed", str(seed), "--eval-prompts", str(eval_file), "--report", str(report),
                                    "--project", str(project)] + ["--judge-candidates"] * args.judge_candidates)
                loops[name] = read_report(report)
                print(f"{name}: {args.rounds} rounds in {time.monotonic() - began:.0f} s (log {log})", flush=True)
    for path in args.reports:
        loops[path.stem] = read_report(path)

    print()
    print(f"agreement {args.agreement}, {args.annotators} annotators, {args.labels_per_round} votes a round ({args.labels_per_round // 2} "
          f"in the half arm), {eval_count} evaluation prompts, model {args.model}")
    print_rounds(loops)
    print_predictor(loops)
    print_loops(loops)


def read_report(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def top_candidate(figures: dict) -> dict | None:
    """The candidate the round registered, or where it registered none the one the predictor rated best."""
    rated = [c for c in figures.get("candidates", []) if c["predicted"] is not None]
    return next((c for c in rated if c["chosen"]), max(rated, key=lambda c: c["predicted"], default=None))


def print_rounds(loops: dict[str, list[dict]]) -> None:
    print("\n| loop | round | ran | start → served | judge over v0 [95% CI] | over the start | top candidate: predicted [interval] | "
          "KL to v0 | votes | RM~judge | wall s: " + ", ".join(STAGES) + " |")
    print("|---" * 10 + "|")
    for name, figures in loops.items():
        votes = 0
        for r in figures:
            votes += r["votes"]
            top = top_candidate(r)
            predicted = "" if top is None else f"{top['predicted']:.0%} [{top['low']:.0%}, {top['high']:.0%}]" + ("" if r.get("registered", True) else ", none registered")
            follows = "" if r["reward_model_follows_judge"] is None else f"{r['reward_model_follows_judge']:.2f}"
            over_start = f"{r['over_start']:.1%} [{r['over_start_low']:.1%}, {r['over_start_high']:.1%}]" if "over_start" in r else ""
            stages = ", ".join(f"{r['stages'].get(stage, 0):.0f}" for stage in STAGES)
            kl = "" if r["kl_to_v0"] is None else f"{r['kl_to_v0']:.2f}"
            print(f"| {name} | {r['round']} | {(r['optimizer'] or '').upper()} | v{r.get('start', r['policy'] - 1)} → v{r['policy']} | "
                  f"{r['win_rate']:.1%} [{r['low']:.1%}, {r['high']:.1%}] | {over_start} | {predicted} | {kl} | {votes} | "
                  f"{follows} | {r['seconds']:.0f}: {stages} |")
    for name, figures in loops.items():
        for r in figures:
            if r.get("why"):
                print(f"{name} round {r['round']}: {r['why']}")


def print_predictor(loops: dict[str, list[dict]]) -> None:
    """Every round's top candidate: what the predictor said of it against what the judge found."""
    rows = []
    for name, figures in loops.items():
        for r in figures:
            top = top_candidate(r)
            if top is not None and top["judge_over_start"] is not None:
                rows.append((name, r["round"], top, r.get("registered", True)))
    if not rows:
        return
    print("\n| loop | round | predicted win rate over the start [interval] | judge's win rate over the start | registered | lost to its start |")
    print("|---" * 6 + "|")
    for name, number, top, registered in rows:
        print(f"| {name} | {number} | {top['predicted']:.1%} [{top['low']:.1%}, {top['high']:.1%}] | {top['judge_over_start']:.1%} | "
              f"{'yes' if registered else 'no'} | {'yes' if top['judge_over_start'] < 0.5 else ''} |")
    rho = spearman([top["predicted"] for _, _, top, _ in rows], [top["judge_over_start"] for _, _, top, _ in rows])
    lost = [(name, number, registered) for name, number, top, registered in rows if top["judge_over_start"] < 0.5]
    caught = [(name, number) for name, number, registered in lost if not registered]
    print(f"{len(rows)} rounds: Spearman's rank correlation of predicted and judged {rho:.2f}; of the {len(lost)} rounds whose top "
          f"candidate lost to its start, the predictor kept out {len(caught)}" + (f" ({', '.join(f'{n} round {k}' for n, k in caught)})" if caught else ""))


def print_loops(loops: dict[str, list[dict]]) -> None:
    """Per judge and arm (a loop's name less its seed): the mean and the worst of its loops' last win rates over v0."""
    groups: dict[str, list[tuple[str, list[dict]]]] = {}
    for name, figures in loops.items():
        groups.setdefault(name.rsplit("-seed", 1)[0], []).append((name, figures))
    print()
    for group, members in groups.items():
        last = [figures[-1]["win_rate"] for _, figures in members]
        below = [f"{name} round {r['round']}" for name, figures in members for r in figures
                 if r.get("registered", True) and r.get("over_start_high", 1.0) < 0.5]
        # A loop's own time: what judging candidates beyond the served one cost is the benchmark's, not the loop's.
        wall = [sum(r["seconds"] - r["stages"].get("judging candidates", 0) for r in figures) for _, figures in members]
        print(f"{group}: {len(members)} loops, last round over v0: mean {statistics.mean(last):.1%}, worst {min(last):.1%} "
              f"({', '.join(f'{x:.1%}' for x in last)}); served versions wholly below their start: {', '.join(below) or 'none'}; "
              f"wall per loop with its evaluations {', '.join(f'{w:.0f} s' for w in wall)}")


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation, ties given their mean rank."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        ranked = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                ranked[order[k]] = (i + j) / 2
            i = j + 1
        return ranked

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    spread = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / spread if spread else 0.0


def run(out, name: str, command: list[str]) -> None:
    if subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode:
        sys.exit(f"{name}: tether {command[1]} failed; see {out.name}")


if __name__ == "__main__":
    main()
