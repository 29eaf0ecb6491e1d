"""Benchmark: pairs against rankings of K answers, as the reward model's fit to the judge per minute of annotator time.

Each arm is a project on the same model with the same answers: --answers answers from the starting
policy to each training prompt, sampled once and stored in every arm, which groups them as its
[queue] answers_per_task says (K = 2: pairs; K = 4: tasks of four answers to rank, each a vote on
its six pairs). The baseline, K = 2, runs in the same invocation. Simulated annotators, whose
votes side with the judge --agreement of the time on these answers' pairs, answer through the
queue as people do (a ranking: Plackett-Luce with the judge's score / T as utilities, so each two
answers are ordered as a vote on them would be) until each budget of annotator minutes is spent;
a reward model is then trained on the arm's votes (a ranking as its pairs; with 'pl' after K, as
one Plackett-Luce item) and scored on --eval-answers fresh answers to each held-out prompt: the
Pearson correlation of its scores with the noiseless judge's within each prompt
(ui.owner.simulate.reward_model_follows_judge).

Annotator time is counted, not measured: a person needs, for a pair or a task of K answers,

    seconds = K * read + words / wpm * 60 + (K - 1) * decide

where words counts the prompt once and every answer, read (default 2 s) is the time to take in an
answer beyond reading its words, wpm (default 250) is the reading speed, and decide (default 3 s)
is the time to place each answer after the first: a pair costs one decision, a ranking of K
costs K - 1. Change them with --read-seconds, --wpm and --decide-seconds.

Run with nothing else on the machine; on the default model and 2 CPU cores it takes hours:

    python scripts/bench_ranking.py --workdir /tmp/bench-ranking
"""

import argparse
import dataclasses
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotate.judges import load_judge  # noqa: E402  (the repository root, not an installed copy, for these imports)
from annotate.pairs import add_completions_with_pairs
from annotate.simulate import cast_votes, last_user_message, noise_for_agreement, within_prompt_margins
from store.completions import NewCompletion
from store.policies import get_policy
from store.prompt_files import read_prompt_file
from store.prompts import add_prompts, prompt_ids
from store.rankings import answered_texts
from store.reward_models import get_reward_model
from ui.owner.config import load_config, write_config
from ui.owner.jobs import run_to_end
from ui.owner.project import init_project, load_project
from ui.owner.round_jobs import submit_reward_training
from ui.owner.simulate import reward_model_follows_judge, sample_answers


@dataclasses.dataclass(frozen=True)
class Reading:
    """How long a person takes over a pair or a task: the formula in this script's docstring."""

    read: float = 2.0  # seconds to take in each answer, beyond reading its words
    wpm: float = 250.0  # reading speed, words a minute
    decide: float = 3.0  # seconds to place each answer after the first

    def seconds(self, prompt_messages: str, answers: list[str]) -> float:
        words = len(last_user_message(json.loads(prompt_messages)).split()) + sum(len(a.split()) for a in answers)
        return len(answers) * self.read + words / self.wpm * 60 + (len(answers) - 1) * self.decide


def annotator_minutes(project, reading: Reading) -> tuple[float, int]:
    """The minutes the arm's simulated annotators would have taken as people, and how many pairs and tasks they answered."""
    answered = project.run(answered_texts, "simulate")
    return sum(reading.seconds(messages, texts) for messages, texts in answered) / 60, len(answered)


def spend(project, minutes: float, reading: Reading, judge, noise: float, annotators: list[str], rng: random.Random) -> None:
    """Answer through the queue until the arm's annotators have spent `minutes`, or nothing is left to answer.

    Each call answers half of what the time left would hold at the mean time so far, so an early run of short
    answers does not carry the arm far past its budget: it ends at most one answer over."""
    while True:
        spent, answered = annotator_minutes(project, reading)
        if spent >= minutes:
            return
        each = spent / answered if answered else None
        labels = max(1, int((minutes - spent) / each / 2)) if each else 1
        if cast_votes(project.run, project.config.queue, judge, noise, annotators, labels, rng).cast == 0:
            print(f"  the queue ran dry at {spent:.1f} annotator minutes", flush=True)
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=Path, default=ROOT / "scripts" / "demo_prompts.jsonl",
                        help="JSONL prompt file; its last --eval-count prompts are held out (default: the demo prompts).")
    parser.add_argument("--eval-count", type=int, default=12, help="Held-out prompts the reward model is scored on (default 12).")
    parser.add_argument("--eval-answers", type=int, default=8, help="Answers to each held-out prompt (default 8).")
    parser.add_argument("--answers", type=int, default=8, help="Answers to each training prompt, shared by the arms (default 8).")
    parser.add_argument("--k", default="2,4,4pl", help="Comma-separated arms: each a [queue] answers_per_task, and with 'pl' after it "
                        "rankings fitted whole ([reward_model] rankings = plackett_luce) rather than as pairs; the first is the "
                        "baseline (default 2,4,4pl).")
    parser.add_argument("--minutes", default="10,20,40", help="Comma-separated annotator-minute budgets, rising (default 10,20,40).")
    parser.add_argument("--judge", default="concise", help="Built-in judge, module:FUNC or PATH.py:FUNC (default concise).")
    parser.add_argument("--agreement", type=float, default=0.7, help="Share of votes siding with the judge (default 0.7).")
    parser.add_argument("--annotators", type=int, default=3, help="Simulated annotators (default 3).")
    parser.add_argument("--read-seconds", type=float, default=Reading.read, help="Seconds per answer beyond its words (default 2).")
    parser.add_argument("--wpm", type=float, default=Reading.wpm, help="Reading speed in words a minute (default 250).")
    parser.add_argument("--decide-seconds", type=float, default=Reading.decide, help="Seconds per answer placed after the first (default 3).")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="Model id or directory (default: the default model).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the answers and the simulated annotators (default 0).")
    parser.add_argument("--workdir", type=Path, help="Where the projects go (default: a new temporary directory).")
    args = parser.parse_args()

    arms, budgets = [k.strip() for k in args.k.split(",")], sorted(float(m) for m in args.minutes.split(","))
    if bad := [k for k in arms if not k.removesuffix("pl").isdigit() or not 2 <= int(k.removesuffix("pl")) <= 6]:
        parser.error(f"--k {bad[0]!r}: each arm is a number of answers from 2 to 6, with 'pl' after it for Plackett-Luce")
    reading = Reading(args.read_seconds, args.wpm, args.decide_seconds)
    judge = load_judge(args.judge)
    prompts = read_prompt_file(args.prompts)
    if len(prompts) <= args.eval_count:
        parser.error(f"{args.prompts} has {len(prompts)} prompts: more than --eval-count {args.eval_count} are needed")
    held_out = prompts[-args.eval_count :]
    prompts = prompts[: -args.eval_count]
    train_prompts, eval_prompts = [p.messages for p in prompts], [p.messages for p in held_out]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tether-bench-ranking-"))
    workdir.mkdir(parents=True, exist_ok=True)

    base = init_project(workdir / "base", args.model)
    base.run(add_prompts, prompts)
    v0 = base.run(get_policy, None)
    began = time.monotonic()
    answers, _ = sample_answers(base, v0, train_prompts, args.answers, args.seed)
    eval_answers, _ = sample_answers(base, v0, eval_prompts, args.eval_answers, args.seed + 1)
    print(f"work directory {workdir}; sampled {len(answers)} training and {len(eval_answers)} held-out answers in "
          f"{time.monotonic() - began:.0f} s", flush=True)
    texts = [a.text for a in answers]
    noise = noise_for_agreement(within_prompt_margins(judge, train_prompts, texts), args.agreement)
    ids = base.run(prompt_ids, [p.content_hash for p in prompts])
    completions = [
        NewCompletion(ids[prompts[a.prompt_index].content_hash], v0.version, a.text, a.token_count, a.finished, {}) for a in answers
    ]

    results = []
    for arm in arms:
        k, rankings = int(arm.removesuffix("pl")), "plackett_luce" if arm.endswith("pl") else "pairs"
        root = workdir / f"k{arm}"
        shutil.copytree(workdir / "base", root)
        config = load_config(root / "tether.toml")
        write_config(root / "tether.toml", dataclasses.replace(config, queue=dataclasses.replace(config.queue, answers_per_task=k),
                                                               reward_model=dataclasses.replace(config.reward_model, rankings=rankings)))
        project = load_project(root)
        project.run(add_completions_with_pairs, completions, project.config.queue)
        rng, names = random.Random(args.seed), [f"simulated-{i}" for i in range(1, args.annotators + 1)]
        for minutes in budgets:
            spend(project, minutes, reading, judge, noise, names, rng)
            spent, answered = annotator_minutes(project, reading)
            began = time.monotonic()
            run_to_end(project, submit_reward_training(project, project.run), f"K={arm}, {minutes:g} minutes")
            reward_model = project.run(get_reward_model, None)
            follows = reward_model_follows_judge(project, reward_model.version, judge, eval_prompts, eval_answers)
            results.append({"k": arm, "budget": minutes, "minutes": spent, "answered": answered,
                            "pairs": reward_model.metrics["pairs_train"] + reward_model.metrics["pairs_eval"],
                            "rankings": reward_model.metrics["rankings_train"],
                            "eval_accuracy": reward_model.metrics["eval_accuracy"], "follows": follows,
                            "train_seconds": time.monotonic() - began})
            print(json.dumps(results[-1]), flush=True)

    print()
    print(f"judge {args.judge}, agreement {args.agreement} (noise T = {noise:.3g}), {args.annotators} annotators, "
          f"{args.answers} answers to each of {len(train_prompts)} training prompts, model {args.model}")
    print(f"seconds = K * {reading.read:g} + words / {reading.wpm:g} * 60 + (K - 1) * {reading.decide:g}")
    print("K is the answers to a task, 'pl' fitted Plackett-Luce; pairs: trained as pairs and held-out pairs; rankings: trained whole")
    print("   K  budget min  spent min  answered  pairs  rankings  RM held-out acc  RM~judge  RM~judge per minute  vs K=" + arms[0])
    baseline = {r["budget"]: r for r in results if r["k"] == arms[0]}
    for r in results:
        follows = "n/a" if r["follows"] is None else f"{r['follows']:.3f}"
        per_minute = "n/a" if r["follows"] is None else f"{r['follows'] / r['minutes']:.4f}"
        base_follows = baseline[r["budget"]]["follows"]
        ratio = "n/a" if r["follows"] is None or not base_follows else f"{r['follows'] / base_follows:.2f}"
        accuracy = "n/a" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.1%}"
        print(f"{r['k']:>4}  {r['budget']:>10g}  {r['minutes']:>9.1f}  {r['answered']:>8}  {r['pairs']:>5}  {r['rankings']:>8}  {accuracy:>15}  "
              f"{follows:>8}  {per_minute:>19}  {ratio:>6}")


if __name__ == "__main__":
    main()
