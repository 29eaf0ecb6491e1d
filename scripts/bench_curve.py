"""Benchmark: the learning curve, the judge's win rate over v0 against the votes cast, for the loop and for what a
user would do instead.

On each judge and seed, simulated annotators side with the judge --agreement of the time on v0's pairs (`tether
simulate`). The arms:

    loop            the shipped defaults, in rounds of --round-votes (the README's 96, 192, 576: each round twice the
                    votes before it): one loop to the largest of --votes, read after each round, gives every smaller
                    point
    loop:VARIANT    the same with one design choice changed (LOOP_VARIANTS), to judge a change to the loop on the curve;
                    a loop in rounds other than the README's is its own arm too, named with them (loop@96,96,96,576)
    offline-trl     the largest of --votes all cast on v0's answers, `tether export`, then TRL's DPOTrainer with a LoRA
                    on the first N of them, for each N of --votes; twice: with TRL's and PEFT's defaults (trl-defaults)
                    and with the LoRA rank, learning rate, beta and epochs of Tether's [dpo] (tether-settings). The
                    stronger of the two is the anchor
    offline-tether  the same votes, one Tether round from v0, at the largest of --votes only: the loop's effect told
                    from its trainer's

Every point is judged on --eval-count prompts, --eval-samples answers each (384 pairs by default), against v0's
answers to them, with the same seed in every arm; beside it the KL to v0 on those answers, the share that ended and
the wall time. An offline arm's points are appended to WORKDIR/points.jsonl (or --points) as each ends, a loop's to its report as
each round ends (and to the points file when the run ends): run again with the same --workdir and what is there
already is skipped, so a long run goes on later from where it stopped (a loop from its last done round). Then a table, by judge, arm and vote count, of the mean over
seeds, the worst seed and each seed's figures (a loop cut off short counts with the rounds it has), and with --plot a
PNG of the curves.

Run with nothing else on the machine: two torch processes on a few cores slow each other badly.

    python scripts/bench_curve.py --eval-prompts ../shared/data/mtbench-prompts.jsonl --judges direct,polite \\
        --seeds 0 1 --workdir curve --plot scripts/curve.png
"""

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench_arms import loop_setup
from bench_labels import run, seeded

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ui.owner.config import load_config, write_config  # noqa: E402  (the repository root, not an installed copy)

ARMS = ("loop", "offline-trl", "offline-tether")
TRL_SETTINGS = ("trl-defaults", "tether-settings")
README_ROUND_VOTES = "96,192,576"
# A loop with one design choice off its shipped default, as {section: {setting: value}} of tether.toml.
LOOP_VARIANTS = {
    "random-pairs": {"queue": {"strategy": "random"}},  # against the shipped 'active' choice of pairs by the heads' disagreement
    # A round's KL to v0 held to 0.02 nats a vote: 1.9 at 96 votes, half what the served round 1s took (4.1 and 6.1 by
    # the predictor), 5.8 at 288 and 17 at 864, near the whole budget: it bites where the votes are fewest.
    "kl-by-votes": {"round": {"kl_per_vote": 0.02}},
    # The reward model steers from round 1 (its ranked DPO pairs, the active queue), not once it has predicted held-out
    # votes above chance: at 70% agreement that proof takes about 300 votes, while the head's best-of-8 pick on v0's
    # answers ranked 0.68 by `direct` from 96 (bench_rm_votes.py).
    "trust-always": {"reward_model": {"trust": "always"}},
    # The same at the random queue's generation cost: a prompt's pairs are matched from as many answers as a random pick
    # samples, most disputed first (annotate.pairs.most_disputed), not each chosen from 4 answers. On 21 training prompts a
    # round wants 4 to 23 pairs of each, so the matching still chooses; trust-always's queue took 1,760 s of its 6,055.
    "trust-always-matched": {"reward_model": {"trust": "always"}, "queue": {"candidates": 2}},
}
ARM_NAMES = (*ARMS, *(f"offline-trl:{setting}" for setting in TRL_SETTINGS), *(f"loop:{variant}" for variant in LOOP_VARIANTS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-prompts", type=Path, required=True, help="JSONL prompt file; its first --eval-count prompts are judged.")
    parser.add_argument("--eval-count", type=int, default=48, help="Evaluation prompts (default 48).")
    parser.add_argument("--eval-samples", type=int, default=8, help="Answers to each evaluation prompt (default 8: 384 judged pairs).")
    parser.add_argument("--judges", default="direct,polite", help="Comma-separated judges: built-in, module:FUNC or PATH.py:FUNC (default direct,polite).")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"Comma-separated, of {', '.join(ARM_NAMES)} (default: the first three, all).")
    parser.add_argument("--votes", default="96,288,864", help="Vote counts to read the curve at (default 96,288,864).")
    parser.add_argument("--round-votes", default=README_ROUND_VOTES,
                        help="Votes cast before each of the loop's rounds, the last for every round after (default 96,192,576, as the README recommends).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="One draw of every arm per seed (default 0 1).")
    parser.add_argument("--agreement", type=float, default=0.7, help="Share of votes siding with the judge on v0's pairs (default 0.7).")
    parser.add_argument("--annotators", type=int, default=3, help="Simulated annotators (default 3).")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="Model id or directory (default: the default model).")
    parser.add_argument("--prompts", type=Path, default=ROOT / "scripts" / "demo_prompts.jsonl", help="The projects' training prompts (default: the demo's).")
    parser.add_argument("--workdir", type=Path, help="Where the projects, logs and points.jsonl go; the same again to go on (default: a new temporary directory).")
    parser.add_argument("--points", type=Path, help="Where the offline arms' points are appended (default: WORKDIR/points.jsonl); "
                        "a file kept with the repository lets another machine go on without the arms done.")
    parser.add_argument("--plot", type=Path, help="Also draw the curves, with their intervals, to this PNG (needs matplotlib).")
    args = parser.parse_args()

    arms, judges = args.arms.split(","), args.judges.split(",")
    if unknown := set(arms) - set(ARM_NAMES):
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    votes = sorted(int(v) for v in args.votes.split(","))
    try:
        sizes = [int(v) for v in args.round_votes.split(",")]
    except ValueError:
        parser.error(f"--round-votes {args.round_votes!r}: give whole numbers, comma-separated")
    if min(sizes) < 1:
        parser.error(f"--round-votes {args.round_votes!r}: every round casts at least 1 vote")
    schedule = ",".join(map(str, sizes))
    totals = round_totals(sizes, max(votes))
    if missing := [v for v in votes if v not in totals]:
        parser.error(f"--votes {', '.join(map(str, missing))}: the loop is read after a round, and its rounds end at {', '.join(map(str, totals))} votes")
    workdir, eval_file, _ = loop_setup(parser, args, "tether-bench-curve-")
    points_file = args.points or workdir / "points.jsonl"
    done = {(p["judge"], p["seed"], p["arm"], p["votes"]) for p in read_points(points_file)}
    bench = Bench(args, workdir, eval_file, votes, totals, schedule)
    for judge in judges:
        for seed in args.seeds:
            for arm in arms:
                if is_loop(arm):  # its report is its record, a round at a time
                    if all((judge, seed, bench.loop_arm(arm), n) in done for n in totals):
                        print(f"{judge} seed {seed} {arm}: in {points_file} already", flush=True)
                    else:
                        bench.loop(judge, seed, arm)
                    continue
                names = [f"{arm}:{setting}" for setting in TRL_SETTINGS] if arm == "offline-trl" else [arm]
                for name in names:
                    counts = [max(votes)] if arm == "offline-tether" else votes
                    if not (wanted := [n for n in counts if (judge, seed, name, n) not in done]):
                        print(f"{judge} seed {seed} {name}: in {points_file} already", flush=True)
                        continue
                    for n in wanted:  # each point recorded as it ends
                        began = time.monotonic()
                        point = bench.offline_tether(judge, seed) if arm == "offline-tether" else bench.offline_trl(judge, seed, name.split(":")[1], n)
                        with points_file.open("a", encoding="utf-8") as f:
                            f.write(json.dumps({"judge": judge, "seed": seed, "arm": name, **point}) + "\n")
                        print(f"{judge} seed {seed} {name} at {n} votes: {point['win_rate']:.1%} in {time.monotonic() - began:.0f} s", flush=True)
    loops = [arm for arm in arms if is_loop(arm)]
    points = read_points(points_file)
    recorded = {(p["judge"], p["seed"], p["arm"], p["votes"]) for p in points}
    new = [p for judge in judges for seed in args.seeds for arm in loops for p in bench.loop_points(judge, seed, arm)
           if (judge, seed, p["arm"], p["votes"]) not in recorded]
    with points_file.open("a", encoding="utf-8") as f:  # the loops' rounds too, so the file alone holds the curve
        f.writelines(json.dumps(p) + "\n" for p in new)
    points += new
    print_table(points, votes)
    if args.plot:
        plot(points, votes, args.plot)


class Bench:
    """The projects of one run: a loop per judge and seed, and the votes on v0 that the offline arms share."""

    def __init__(self, args: argparse.Namespace, workdir: Path, eval_file: Path, votes: list[int], totals: list[int], schedule: str):
        self.args, self.workdir, self.eval_file, self.votes = args, workdir, eval_file, votes
        self.totals = totals  # the votes cast by the end of each of the loop's rounds
        self.schedule = schedule  # --round-votes, normalised
        self.tether = str(Path(sys.executable).parent / "tether")  # installed beside this Python by scripts/setup.sh

    def new_project(self, name: str, seed: int, log, variant: dict[str, dict] | None = None) -> Path:
        project = self.workdir / name
        if project.exists():  # an arm cut off before it ended: it starts again
            shutil.rmtree(project)
        run(log, name, [self.tether, "init", str(project), "--model", self.args.model])
        config = seeded(load_config(project / "tether.toml"), seed)
        for section, settings in (variant or {}).items():
            config = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **settings)})
        write_config(project / "tether.toml", config)
        run(log, name, [self.tether, "prompts", "import", str(self.args.prompts), "--project", str(project)])
        return project

    def simulate(self, log, name: str, project: Path, judge: str, seed: int, votes: str, rounds: int, report: Path,
                 baseline: int | None = None) -> None:
        run(log, name, [self.tether, "simulate", *([] if baseline is None else ["--baseline", str(baseline)]),
                        "--judge", judge, "--agreement", str(self.args.agreement),
                        "--annotators", str(self.args.annotators), "--labels-per-round", votes, "--rounds", str(rounds),
                        "--seed", str(seed), "--eval-prompts", str(self.eval_file), "--eval-samples", str(self.args.eval_samples),
                        "--report", str(report), "--project", str(project)])

    def loop_arm(self, arm: str) -> str:
        """A loop arm's name in the points: with its rounds where they are not the README's."""
        return arm if self.schedule == README_ROUND_VOTES else f"{arm}@{self.schedule}"

    def loop_files(self, judge: str, seed: int, arm: str) -> tuple[str, Path, Path]:
        """A loop's name, its report (a line a round) and the file holding its set-up's seconds."""
        name = f"{stem(judge)}-{self.loop_arm(arm).replace(':', '-').replace('@', '-rounds-').replace(',', '-')}-seed{seed}"
        return name, self.workdir / f"{name}.jsonl", self.workdir / f"{name}-set-up.txt"

    def loop(self, judge: str, seed: int, arm: str) -> None:
        """One loop to the largest of --votes. A loop cut off goes on from its last done round (`tether simulate
        --baseline 0` on the same project), its rounds' figures appended to the same report as each ends."""
        name, report, set_up_file = self.loop_files(judge, seed, arm)
        project = self.workdir / name
        with (self.workdir / f"{name}.log").open("a") as log:
            if not set_up_file.exists():
                report.unlink(missing_ok=True)
                began = time.monotonic()
                self.new_project(name, seed, log, LOOP_VARIANTS.get(arm.partition(":")[2]))
                set_up_file.write_text(f"{time.monotonic() - began:.1f}\n")
            done = len(read_points(report))
            if done < (rounds := len(self.totals)):
                if done:
                    print(f"{name}: going on after round {done}", flush=True)
                began = time.monotonic()
                self.simulate(log, name, project, judge, seed, self.args.round_votes, rounds - done, report, baseline=0)
                print(f"{judge} seed {seed} {arm}: {rounds - done} rounds in {time.monotonic() - began:.0f} s, with v0's evaluation "
                      "and the last round's votes", flush=True)
            else:
                print(f"{judge} seed {seed} {arm}: its {done} rounds in {report} already", flush=True)

    def loop_points(self, judge: str, seed: int, arm: str) -> list[dict]:
        """A loop's points, one a round done so far, each with the wall time since the loop began."""
        _, report, set_up_file = self.loop_files(judge, seed, arm)
        if not set_up_file.exists():
            return []
        points, wall = [], float(set_up_file.read_text())
        for r in read_points(report):
            wall += r["seconds"]
            points.append({"judge": judge, "seed": seed, "arm": self.loop_arm(arm), "votes": self.totals[r["round"] - 1],
                           "win_rate": r["win_rate"], "low": r["low"], "high": r["high"], "pairs": r["pairs"], "kl_to_v0": r["kl_to_v0"], "ended": r["ended"], "seconds": wall, "served": r["policy"],
                           "over_start_high": r["over_start_high"] if r["registered"] else None,
                           "stages": r["stages"], "votes_cast": r["votes"]})
        return points

    def offline_votes(self, judge: str, seed: int) -> tuple[Path, list[dict], float]:
        """The project whose votes are all on v0's answers, as many as the largest of --votes; its votes in the order
        they were cast (`tether export --include-ties`, a row each), and the seconds it took. Made once per judge and
        seed, for every offline arm."""
        name = f"{stem(judge)}-offline-seed{seed}"
        project, export = self.workdir / name, self.workdir / f"{name}-votes.jsonl"
        timing = self.workdir / f"{name}-seconds.txt"
        if not timing.exists():
            export.unlink(missing_ok=True)
            began = time.monotonic()
            with (self.workdir / f"{name}.log").open("w") as log:
                project = self.new_project(name, seed, log)
                self.simulate(log, name, project, judge, seed, str(max(self.votes)), 0, self.workdir / f"{name}-report.jsonl")
                run(log, name, [self.tether, "export", "--format", "jsonl", "--include-ties", "--out", str(export), "--project", str(project)])
            timing.write_text(f"{time.monotonic() - began:.1f}\n")
        rows = sorted((json.loads(line) for line in export.read_text().splitlines() if line.strip()), key=lambda row: row["time"])
        return project, rows, float(timing.read_text())

    def offline_trl(self, judge: str, seed: int, setting: str, n: int) -> dict:
        project, rows, collecting = self.offline_votes(judge, seed)
        pairs = first_votes_as_pairs(rows, n)
        out = self.workdir / f"{stem(judge)}-{setting}-seed{seed}-{n}"
        began = time.monotonic()
        train_with_trl(project, pairs, out, setting, seed)
        trained = time.monotonic() - began
        point = evaluate(project, judge, out, self.eval_file, self.args.eval_samples, seed)
        return {"votes": n, "pairs_trained": len(pairs), **point, "seconds": collecting + trained + point.pop("evaluating"),
                "training_seconds": trained}

    def offline_tether(self, judge: str, seed: int) -> dict:
        project, rows, collecting = self.offline_votes(judge, seed)
        name = f"{stem(judge)}-offline-seed{seed}"
        copy = self.workdir / f"{stem(judge)}-offline-tether-seed{seed}"
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(project, copy)  # the TRL arms read the votes project; the round adds to its copy
        began = time.monotonic()
        with (self.workdir / f"{name}-tether-round.log").open("w") as log:
            run(log, name, [self.tether, "round", "--project", str(copy)])
        trained = time.monotonic() - began
        point = evaluate(copy, judge, None, self.eval_file, self.args.eval_samples, seed)
        return {"votes": max(self.votes), "votes_exported": len(rows), **point, "seconds": collecting + trained + point.pop("evaluating"), "training_seconds": trained}


def first_votes_as_pairs(rows: list[dict], n: int) -> list[dict]:
    """The first n votes as TRL's conversational preference rows, one a pair by the majority of its votes among
    them; a pair whose votes split evenly, or went tie or both-bad, is left out, as `tether export` leaves it."""
    by_pair: dict[int, list[dict]] = defaultdict(list)
    for row in rows[:n]:
        by_pair[row["pair_id"]].append(row)
    pairs = []
    for votes in by_pair.values():
        a, b = (sum(v["choice"] == side for v in votes) for side in ("a", "b"))
        if a != b and max(a, b) * 2 > len(votes):
            first = votes[0]
            chosen, rejected = (first["completion_a"], first["completion_b"]) if a > b else (first["completion_b"], first["completion_a"])
            pairs.append({"prompt": first["prompt"], "chosen": chosen, "rejected": rejected})
    return pairs


def train_with_trl(project: Path, pairs: list[dict], out: Path, setting: str, seed: int) -> None:
    """What a user would write: the exported pairs, TRL's DPOTrainer and a PEFT LoRA on the project's base model."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from train.common.models import resolve_model_path

    config = load_config(project / "tether.toml")
    path = resolve_model_path(config.model.name_or_path)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        tokenizer.pad_token = "<|endoftext|>"  # as Tether sets it: a pad apart from the end of a turn
    on_gpu = torch.cuda.is_available()
    # TRL defaults to bf16, which transformers refuses on a CPU; a user there sets use_cpu, and so does this arm
    common = {"output_dir": str(out / "trainer"), "seed": seed, "report_to": [], "save_strategy": "no", "logging_steps": 10,
              "use_cpu": not on_gpu, "bf16": on_gpu and torch.cuda.is_bf16_supported()}
    if setting == "trl-defaults":
        lora, trl = LoraConfig(task_type="CAUSAL_LM"), DPOConfig(**common)
    else:
        dpo = config.dpo
        lora = LoraConfig(task_type="CAUSAL_LM", r=dpo.lora_r, lora_alpha=dpo.lora_alpha, lora_dropout=0.0, target_modules="all-linear")
        trl = DPOConfig(**common, learning_rate=dpo.learning_rate, beta=dpo.beta, num_train_epochs=dpo.epochs,
                        per_device_train_batch_size=dpo.batch_size, lr_scheduler_type="linear")
    trainer = DPOTrainer(model=model, args=trl, train_dataset=Dataset.from_list(pairs), processing_class=tokenizer, peft_config=lora)
    trainer.train()
    trainer.model.save_pretrained(out / "policy")


def evaluate(project_dir: Path, judge: str, adapter: Path | None, eval_file: Path, samples: int, seed: int) -> dict:
    """The judge's win rate over v0 of a TRL adapter (adapter/policy) or, with none, of the project's newest version;
    on the evaluation prompts with the seed the loop's evaluation uses, so v0's answers are the same in every arm."""
    from annotate.judges import load_judge
    from annotate.simulate import judge_against
    from store.policies import get_policy
    from ui.owner.project import load_project
    from store.prompt_files import read_prompt_file
    from ui.owner.simulate import sample_answers

    began = time.monotonic()
    project = load_project(project_dir)
    prompts = [p.messages for p in read_prompt_file(eval_file, project.config.server.import_limits())]
    policy = adapter / "policy" if adapter is not None else project.run(get_policy, None)
    answers, kl = sample_answers(project, policy, prompts, samples, seed)
    baseline_file = eval_file.parent / f"v0-answers-seed{seed}-{len(prompts)}x{samples}.json"  # the same in every arm: sampled once
    if not baseline_file.exists():
        baseline, _ = sample_answers(project, project.run(get_policy, 0), prompts, samples, seed, kl=False)
        baseline_file.write_text(json.dumps([a.text for a in baseline]))
    verdict = judge_against(load_judge(judge), prompts, [a.text for a in answers], json.loads(baseline_file.read_text()))
    return {"win_rate": verdict.win_rate, "low": verdict.low, "high": verdict.high, "pairs": verdict.pairs, "kl_to_v0": kl,
            "ended": sum(a.finished for a in answers) / len(answers), "evaluating": time.monotonic() - began}


def round_totals(sizes: list[int], upto: int) -> list[int]:
    """The votes cast by the end of each round, each round's `sizes` (the last repeating), to `upto` or just past it."""
    totals = []
    while not totals or totals[-1] < upto:
        totals.append((totals[-1] if totals else 0) + sizes[min(len(totals), len(sizes) - 1)])
    return totals


def is_loop(arm: str) -> bool:
    return arm.partition("@")[0].partition(":")[0] == "loop"  # the shipped loop or a variant of it, in any rounds


def read_points(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def stem(judge: str) -> str:
    return Path(judge).stem.replace(":", "-")


def curves(points: list[dict], votes: list[int]) -> dict[tuple[str, str], dict[int, list[dict]]]:
    """By judge and arm (TRL's stronger setting as `offline-trl`, per judge and vote count of `votes` by the mean over
    seeds), the points at each vote count, a seed each."""
    table: dict[tuple[str, str], dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        table[(p["judge"], p["arm"])][p["votes"]].append(p)
    for judge in {j for j, _ in table}:
        settings = [(judge, f"offline-trl:{s}") for s in TRL_SETTINGS if (judge, f"offline-trl:{s}") in table]
        for n in votes:
            runs = [table[key][n] for key in settings if table[key][n]]
            if runs:
                table[(judge, "offline-trl")][n] = max(runs, key=lambda seeds: statistics.mean(p["win_rate"] for p in seeds))
    return table


def print_table(points: list[dict], votes: list[int]) -> None:
    print("\n| judge | arm | votes | win rate over v0: mean over seeds | worst seed | each seed [95% CI] | KL to v0 | ended | wall s |")
    print("|---" * 9 + "|")
    for (judge, arm), by_votes in sorted(curves(points, votes).items()):
        for n in votes:
            seeds = sorted(by_votes.get(n, []), key=lambda p: p["seed"])
            if not seeds:
                continue
            rates = [p["win_rate"] for p in seeds]
            each = ", ".join(f"{p['win_rate']:.1%} [{p['low']:.1%}, {p['high']:.1%}]" for p in seeds)
            kl = ", ".join("" if p["kl_to_v0"] is None else f"{p['kl_to_v0']:.1f}" for p in seeds)
            ended = ", ".join(f"{p['ended']:.0%}" for p in seeds)
            wall = ", ".join(f"{p['seconds']:.0f}" for p in seeds)
            print(f"| {judge} | {arm} | {n} | {statistics.mean(rates):.1%} | {min(rates):.1%} | {each} | {kl} | {ended} | {wall} |")
    below = [f"{p['judge']} {p['arm']} seed {p['seed']} at {p['votes']} votes (v{p['served']})" for p in points
             if is_loop(p["arm"]) and p.get("over_start_high") is not None and p["over_start_high"] < 0.5]
    print(f"loop versions served whose win rate over their start lies wholly below 50%: {', '.join(below) or 'none'}")


def plot(points: list[dict], votes: list[int], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        sys.exit("--plot needs matplotlib: .venv/bin/pip install -e '.[bench]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    table = curves(points, votes)
    judges = sorted({judge for judge, _ in table})
    figure, axes = plt.subplots(1, len(judges), figsize=(5 * len(judges), 4), squeeze=False, sharey=True)
    for ax, judge in zip(axes[0], judges):
        # The loops, offline-tether and offline-trl by its anchor (its settings apart are in the table)
        for arm in sorted(a for j, a in table if j == judge and (":" not in a or is_loop(a))):
            counts = sorted(table[(judge, arm)])  # the loop's after every round
            means = [statistics.mean(p["win_rate"] for p in table[(judge, arm)][n]) for n in counts]
            lows = [min(p["low"] for p in table[(judge, arm)][n]) for n in counts]
            highs = [max(p["high"] for p in table[(judge, arm)][n]) for n in counts]
            ax.plot(counts, means, marker="o", label=arm)
            ax.fill_between(counts, lows, highs, alpha=0.15)
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--")
        ax.set(title=f"judge: {judge}", xlabel="votes cast", xscale="log", xlim=(votes[0] / 1.2, votes[-1] * 1.2))
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(votes))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([str(n) for n in votes]))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.legend()
    axes[0][0].set_ylabel("judge's win rate over v0")
    figure.suptitle("The mean over seeds; the band spans the seeds' 95% intervals", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
