"""A reward model's quality from N simulated votes: which design learns most from a few noisy votes.

The default model answers each prompt 8 times (the CPU profile's sampling); the prompts (the demo
prompts and MT-bench's) are split into training and held-out prompts. Both, and every answer's
hidden states at every layer (mean over the response and at its closing EOS), are cached once in
TETHER_CACHE. Then, for every built-in judge, N in --votes and --draws draws: N votes on pairs of
answers to the training prompts, cast through simulate's noise at --agreement (the T at which votes
on those pairs side with the judge that often, ties being coin flips; where ties put that out of
reach, the T for the pairs the judge tells apart). As the queue serves them, --overlap-share of the
pairs get two votes: a pair is resolved by its majority (a split one left out), and the flip rate
measured from those pairs' agreement gives each label its confidence, as a project does. Each arm
fits a reward model on them and is scored on the held-out prompts' answers against the noiseless judge:

    RM~judge   the within-prompt Pearson correlation of its scores with the judge's (both less their
               prompt's mean), over every held-out answer
    accuracy   the share of held-out pairs the judge does not tie that it orders as the judge does
    pick       the judge's rank of the answer a best-of-8 pick keeps among its held-out prompt's 8 (1: the judge's
               best, 0: its worst, ties share; a random pick averages 0.5), picking by the heads' mean (the reward);
               for a head arm also by the conservative reward, the mean less one spread of the heads (PPO's and
               GRPO's at uncertainty_penalty = 1), with the shipped 4 heads and with 64, and by the least spread
    at cap     a head arm's share of fits whose evidence sent the prior's precision to its cap (1e12): the
               votes showed it no signal, and its heads are draws of the prior

each as the mean over draws and its spread (standard deviation), with the fit's seconds and the
arm's peak resident memory (each arm runs in its own process, the cached features loaded).

The arms: `head` (Tether's default: layers 0, 0.2, 0.4, 0.6 of the depth averaged over the answer,
the prior by the evidence, Laplace draws, the flip rate in the likelihood), and beside it
`head-plain` (every label taken as certain), `head-cv` (the prior by cross-validation),
`head-bootstrap` (heads fitted to resamplings), `head-last-layer` (the last layer alone) and
`head-last-token` (the last layer at the closing EOS, where a LoRA reward model reads); `lora` (the
LoRA reward model with its defaults) and `lora-distilled` (the same, fitted to the votes and as many
more pairs labelled by the head, each as sure as the head is). `ceiling` takes no votes: a ridge
regression of the judge's own scores of every training answer on the head's features, its penalty
chosen on the held-out answers, bounds what any linear reward on those features could show.

    python scripts/bench_rm_votes.py             # the head arms, every judge, N and draw
    python scripts/bench_rm_votes.py --arms lora,lora-distilled --votes 96,288 --judges direct,polite
    python scripts/bench_rm_votes.py --report      # the table of every fit recorded so far
"""

import argparse
import hashlib
import json
import math
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEMO_PROMPTS = ROOT / "scripts" / "demo_prompts.jsonl"
MTBENCH_PROMPTS = ROOT.parent / "shared" / "data" / "mtbench-prompts.jsonl"
ANSWERS_PER_PROMPT = 8
HELD_OUT_SHARE = 1 / 3


@dataclass
class Answers:
    """The cached answers and their states: prompts[i]'s answers are texts[i * 8 : (i + 1) * 8]."""

    prompts: list  # chat messages
    held_out: list[bool]  # per prompt
    texts: list[str]
    states: object  # torch.Tensor (answers, 2, layers + 1, H): pooling ("mean", "last"), hidden-state layer


def cache_file(model_path: str, generation, max_length: int, prompts: list) -> Path:
    from train.common.models import cache_dir

    key = json.dumps([model_path, asdict(generation), max_length, prompts, ANSWERS_PER_PROMPT], sort_keys=True)
    return cache_dir() / "bench_rm_votes" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"


def load_answers(seed: int) -> Answers:
    """The prompts, their answers and the answers' states: from the cache, or sampled and read once (minutes)."""
    import torch

    from store.prompt_files import read_prompt_file
    from train.common.config import Hardware, ModelConfig
    from train.common.models import load_model, resolve_model_path
    from train.policy.generate import generate
    from train.reward.features import POOLINGS, pooled_states
    from ui.owner.config import settings_for

    config, _ = settings_for(Hardware("cpu", "bench", 0), ModelConfig())
    prompts = [p.messages for path in (DEMO_PROMPTS, MTBENCH_PROMPTS) for p in read_prompt_file(path)]
    generation = replace(config.generation, per_prompt=ANSWERS_PER_PROMPT, seed=seed)
    max_length = config.reward_model.max_length
    path = cache_file(resolve_model_path(config.model.name_or_path), generation, max_length, prompts)
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    held_out = [False] * len(prompts)
    for i in order[: round(len(prompts) * HELD_OUT_SHARE)]:
        held_out[i] = True
    if path.exists():
        cached = torch.load(path)
        return Answers(prompts, held_out, cached["texts"], cached["states"])
    print(f"sampling {ANSWERS_PER_PROMPT} answers to each of {len(prompts)} prompts, once, into {path}", file=sys.stderr)
    model, tokenizer = load_model(config.model)
    texts = [g.text for g in generate(model, tokenizer, prompts, generation)]
    asked = [prompts[i // ANSWERS_PER_PROMPT] for i in range(len(texts))]
    layers = tuple(range(model.config.num_hidden_layers + 1))
    states = pooled_states(model, tokenizer, asked, texts, layers, POOLINGS, max_length, config.reward_model.batch_size * 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"texts": texts, "states": states}, partial)
    partial.rename(path)
    return Answers(prompts, held_out, texts, states)


@dataclass(frozen=True)
class Vote:
    prompt: int
    chosen: int  # answer index
    rejected: int
    confidence: float  # the probability its label is right, from the flip rate measured on the overlapped pairs


def training_pairs(answers: Answers) -> list[tuple[int, int, int]]:
    """(prompt, answer, answer) for every two answers to a training prompt."""
    return [(p, p * ANSWERS_PER_PROMPT + a, p * ANSWERS_PER_PROMPT + b) for p, held in enumerate(answers.held_out) if not held
            for a in range(ANSWERS_PER_PROMPT) for b in range(a + 1, ANSWERS_PER_PROMPT)]


def draw_votes(pairs: list[tuple[int, int, int]], scores: list[float], noise: float, votes: int, rng: random.Random,
               overlap_share: float, overlap_votes: int) -> tuple[list[Vote], float]:
    """`votes` votes through simulate's noise, on random pairs of which overlap_share want overlap_votes votes (as
    the queue serves them); each pair resolved by its majority, a split pair left out, each label's confidence from
    the flip rate measured on the overlapped pairs as the project measures it. The votes and that flip rate."""
    from annotate.agreement import flip_rate, majority_confidence
    from annotate.judges import prefers_first

    cast, order = [], iter(rng.sample(pairs, len(pairs)))
    while len(cast) < votes:
        prompt, a, b = next(order)
        wanted = overlap_votes if rng.random() < overlap_share else 1
        choices = ["a" if prefers_first(scores[a] - scores[b], noise, rng) else "b" for _ in range(min(wanted, votes - len(cast)))]
        cast.append((prompt, a, b, choices))
    flip = flip_rate([choices for *_, choices in cast])
    resolved = []
    for prompt, a, b, choices in cast:
        for_a = choices.count("a")
        if for_a * 2 != len(choices):
            winner, loser = (a, b) if for_a * 2 > len(choices) else (b, a)
            resolved.append(Vote(prompt, winner, loser, majority_confidence(max(for_a, len(choices) - for_a),
                                                                         min(for_a, len(choices) - for_a), flip.rate)))
    return resolved, flip.rate


def within_prompt_correlation(rewards: list[float], judged: list[float], groups: list[int]) -> float:
    """Pearson correlation of the two after each loses its prompt's mean."""
    def centred(values):
        means = {}
        for g, v in zip(groups, values):
            means.setdefault(g, []).append(v)
        return [v - statistics.fmean(means[g]) for g, v in zip(groups, values)]

    xs, ys = centred(rewards), centred(judged)
    spread = math.sqrt(sum(x * x for x in xs) * sum(y * y for y in ys))
    return 0.0 if spread == 0 else sum(x * y for x, y in zip(xs, ys)) / spread


def held_out_accuracy(rewards: list[float], judged: list[float], groups: list[int]) -> float:
    """The share of pairs of answers to one prompt, untied by the judge, that the rewards order as the judge does; a tie
    in reward counts half."""
    right = total = 0
    for i in range(len(rewards)):
        for j in range(i + 1, len(rewards)):
            if groups[i] == groups[j] and judged[i] != judged[j]:
                total += 1
                agreement = (rewards[i] - rewards[j]) * (judged[i] - judged[j])
                right += 1 if agreement > 0 else 0.5 if agreement == 0 else 0
    return right / total


# The arms. A head arm is (layers as fractions of the depth, pooling, prior, posterior, whether it takes the flip rate).
HEAD_ARMS = {
    "head": ((0, 0.2, 0.4, 0.6), "mean", "evidence", "laplace", True),
    "head-plain": ((0, 0.2, 0.4, 0.6), "mean", "evidence", "laplace", False),
    "head-cv": ((0, 0.2, 0.4, 0.6), "mean", "cv", "laplace", True),
    "head-bootstrap": ((0, 0.2, 0.4, 0.6), "mean", "evidence", "bootstrap", True),
    "head-last-layer": ((1,), "mean", "evidence", "laplace", True),
    "head-last-token": ((1,), "last", "evidence", "laplace", True),
}
ARMS = (*HEAD_ARMS, "lora", "lora-distilled", "ceiling")
HEADS = 4  # [reward_model] heads


def arm_features(name: str, answers: Answers):
    """(answers, D): every answer's features as the head arm `name` reads them."""
    from train.reward.features import POOLINGS, layer_indices

    fractions, pooling, *_ = HEAD_ARMS[name]
    layers = list(layer_indices(fractions, answers.states.shape[2] - 1))
    return answers.states[:, POOLINGS.index(pooling), layers].flatten(1)


def head_arm(name: str, answers: Answers, scored=None, heads: int = HEADS):
    """fit(votes) -> the held-out answers' (or `scored`'s) raw scores, (answers, heads), and the prior's precision."""
    import torch

    from train.reward.head import fit_head

    _, _, prior, posterior, noise_aware = HEAD_ARMS[name]
    features = arm_features(name, answers)
    held = list(scored) if scored is not None else held_out_answers(answers)

    def fit(votes: list[Vote]):
        confidence = torch.tensor([v.confidence if noise_aware else 1.0 for v in votes])
        head = fit_head(features[[v.chosen for v in votes]], features[[v.rejected for v in votes]], confidence,
                        [v.prompt for v in votes], heads, prior, posterior)
        return head.raw_scores(features[held]), head.alpha

    return fit


def head_picks(fitted, many, truth: list[float]) -> tuple[list[float], dict]:
    """From a head arm's fit (its scores and prior precision) and the same fit with 64 heads, the held-out answers'
    rewards (the heads' mean) and the pick ranks and cap that run_arm records."""
    from train.reward.head import EVIDENCE_CAP

    (scores, alpha), (many, _) = fitted, many
    mean, spread = scores.mean(dim=1), scores.std(dim=1)
    by = {"pick_conservative": mean - spread, "pick_conservative_64": many.mean(dim=1) - many.std(dim=1), "pick_least_spread": -spread}
    return mean.tolist(), {**{k: pick_rank(v.tolist(), truth, ANSWERS_PER_PROMPT) for k, v in by.items()}, "at_cap": alpha >= EVIDENCE_CAP}


def pick_rank(by: list[float], judged: list[float], size: int) -> float:
    """The judge's mean rank of the answer `by` rates highest in each prompt's `size` consecutive answers (ties in `by`
    broken at random, a fixed seed), each rank the share of the prompt's other answers the judge puts below it, ties
    counted half."""
    rng, ranks = random.Random(0), []
    for start in range(0, len(by), size):
        scores, judge = by[start : start + size], judged[start : start + size]
        best = max(scores)
        pick = rng.choice([i for i, s in enumerate(scores) if s == best])
        others = [j for i, j in enumerate(judge) if i != pick]
        ranks.append(sum(1.0 if judge[pick] > j else 0.5 if judge[pick] == j else 0.0 for j in others) / len(others))
    return sum(ranks) / len(ranks)


def ceiling_arm(answers: Answers, scores: list[float]):
    """fit(votes) -> the held-out answers' rewards from no votes at all: a ridge regression of the judge's own scores of
    every training answer on the head's features, its penalty the best of a grid on the held-out answers themselves.
    An upper bound on what a linear reward on those features can show of the judge, with votes or without."""
    import torch

    features = arm_features("head", answers).double()
    held = held_out_answers(answers)
    train = [i for i in range(len(answers.texts)) if not answers.held_out[i // ANSWERS_PER_PROMPT]]
    features = (features - features[train].mean(dim=0)) / features[train].std(dim=0).clamp(min=1e-6)
    x, y = features[train], torch.tensor([scores[i] for i in train], dtype=torch.float64)
    truth, groups = [scores[i] for i in held], [i // ANSWERS_PER_PROMPT for i in held]
    fits = [(features[held] @ torch.linalg.solve(x.T @ x + penalty * torch.eye(x.shape[1], dtype=torch.float64), x.T @ (y - y.mean()))).tolist()
            for penalty in (1.0, 10.0, 100.0, 1e3, 1e4, 1e5)]
    best = max(fits, key=lambda rewards: within_prompt_correlation(rewards, truth, groups))
    return lambda votes: best


def lora_arm(answers: Answers, distilled: bool = False):
    """fit(votes) -> the held-out answers' rewards, for today's LoRA reward model with its defaults; `distilled`, for it
    fitted to the votes and as many more pairs of the training prompts' answers labelled by the head ("head"), each as
    sure as the head is (CrowdBT's loss with the head's probability as the label's: a soft label), so that the LoRA model
    is held towards the head where the votes say nothing."""
    import tempfile

    import torch

    from train.common.config import DEFAULT_MODEL, RewardModelConfig
    from train.common.models import resolve_model_path
    from train.common.snapshot import PreferenceRow
    from train.reward.lora import train_reward_model
    from train.reward.versions import load_reward_model

    model_path = resolve_model_path(DEFAULT_MODEL)
    config = RewardModelConfig(eval_share=0.0)  # held out here: the held-out prompts' answers
    held = held_out_answers(answers)
    head_scores = head_arm("head", answers, scored=range(len(answers.texts))) if distilled else None
    pairs = training_pairs(answers)

    def fit(votes: list[Vote]) -> list[float]:
        rows = [PreferenceRow(answers.prompts[v.prompt], answers.texts[v.chosen], answers.texts[v.rejected]) for v in votes]
        if head_scores is not None:
            rewards = head_scores(votes)[0].mean(dim=1).tolist()
            voted = {(v.prompt, min(v.chosen, v.rejected), max(v.chosen, v.rejected)) for v in votes}
            extra = random.Random(len(votes)).sample([p for p in pairs if p not in voted], len(votes))
            for prompt, a, b in extra:
                p_a = torch.sigmoid(torch.tensor(rewards[a] - rewards[b])).item()
                better, worse = (a, b) if p_a >= 0.5 else (b, a)
                rows.append(PreferenceRow(answers.prompts[prompt], answers.texts[better], answers.texts[worse], confidence=max(p_a, 1 - p_a)))
        with tempfile.TemporaryDirectory() as scratch:
            train_reward_model(model_path, rows, [], config, Path(scratch) / "rm")
            reward_model = load_reward_model(model_path, Path(scratch) / "rm")
            return reward_model.score([answers.prompts[i // ANSWERS_PER_PROMPT] for i in held], [answers.texts[i] for i in held],
                                      config.batch_size * 2)

    return fit


def held_out_answers(answers: Answers) -> list[int]:
    return [i for i in range(len(answers.texts)) if answers.held_out[i // ANSWERS_PER_PROMPT]]


def judged(answers: Answers, judge_name: str) -> list[float]:
    from annotate.judges import BUILT_IN
    from annotate.simulate import last_user_message

    judge = BUILT_IN[judge_name]
    return [judge(last_user_message(answers.prompts[i // ANSWERS_PER_PROMPT]), text) for i, text in enumerate(answers.texts)]


def noise_for(pairs: list[tuple[int, int, int]], scores: list[float], agreement: float) -> float:
    """simulate's noise T for the training pairs at `agreement` (on the pairs the judge tells apart)."""
    from annotate.simulate import noise_for_agreement

    return noise_for_agreement([scores[a] - scores[b] for _, a, b in pairs], agreement)


def run_arm(name: str, args: argparse.Namespace) -> None:
    """One arm over every judge, N and draw, in this (child) process: a JSON line per fit, then its own summary."""
    answers = load_answers(args.seed)
    pairs, held = training_pairs(answers), held_out_answers(answers)
    groups = [i // ANSWERS_PER_PROMPT for i in held]
    lora = name.startswith("lora")
    draws = args.lora_draws if lora else 1 if name == "ceiling" else args.draws
    fit = lora_arm(answers, distilled=name == "lora-distilled") if lora else head_arm(name, answers) if name in HEAD_ARMS else None
    fit_many = head_arm(name, answers, heads=64) if name in HEAD_ARMS else None
    for judge_name in args.judges.split(","):
        scores = judged(answers, judge_name)
        if name == "ceiling":  # fitted to each judge's own scores
            fit = ceiling_arm(answers, scores)
        noise = noise_for(pairs, scores, args.agreement)
        truth = [scores[i] for i in held]
        for votes in map(int, (args.lora_votes if lora else args.votes).split(",")):
            for draw in range(draws):
                cast, flip = draw_votes(pairs, scores, noise, votes, random.Random(f"{args.seed}-{judge_name}-{votes}-{draw}"),
                                        args.overlap_share, 2)
                started = time.perf_counter()
                fitted = fit(cast)
                seconds = time.perf_counter() - started  # the shipped fit's alone, not the 64 heads' beside it
                rewards, picks = head_picks(fitted, fit_many(cast), truth) if fit_many else (fitted, {})
                print(json.dumps({"judge": judge_name, "votes": votes, "draw": draw, "flip_rate": flip, "seconds": seconds,
                                  "correlation": within_prompt_correlation(rewards, truth, groups),
                                  "accuracy": held_out_accuracy(rewards, truth, groups),
                                  "pick": pick_rank(rewards, truth, ANSWERS_PER_PROMPT), **picks}), flush=True)


def measure(name: str, args: argparse.Namespace) -> tuple[list[dict], float]:
    """Run an arm in a child process: its fits, and its peak resident memory in GB; each fit appended to args.results
    as it ends, so that a run cut short keeps what it measured."""
    import os

    command = [sys.executable, __file__, "--arm", name, "--judges", args.judges, "--votes", args.votes, "--draws", str(args.draws),
               "--lora-draws", str(args.lora_draws), "--lora-votes", args.lora_votes, "--agreement", str(args.agreement), "--seed", str(args.seed),
               "--overlap-share", str(args.overlap_share)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    fits = []
    for line in child.stdout:
        fits.append(json.loads(line))
        print(f"  {name} {fits[-1]['judge']} N={fits[-1]['votes']} draw {fits[-1]['draw']}: RM~judge {fits[-1]['correlation']:.3f}, "
              f"{fits[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
        with args.results.open("a") as results:
            results.write(json.dumps({"arm": name, **fits[-1]}) + "\n")
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"the {name} arm failed (wait status {status})")
    peak_gb = usage.ru_maxrss / 2**20
    with args.results.open("a") as results:
        results.write(json.dumps({"arm": name, "peak_gb": peak_gb}) + "\n")
    return fits, peak_gb


def recorded(path: Path) -> dict[str, tuple[list[dict], float]]:
    """The arms' fits and peaks as a run appended them to `path`, several runs' together."""
    results: dict[str, tuple[list[dict], float]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        fits, peak = results.get(row["arm"], ([], 0.0))
        results[row["arm"]] = (fits + [row], peak) if "judge" in row else (fits, max(peak, row["peak_gb"]))
    return results


def summary_table(results: dict[str, tuple[list[dict], float]], judges: list[str], votes: list[int]) -> list[str]:
    def spread(values: list[float]) -> str:
        return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"

    def picks(fits: list[dict]) -> str:
        if "pick" not in fits[0]:  # recorded before the picks were
            return " | | | | |"
        if "pick_conservative" not in fits[0]:
            return f" {statistics.fmean(f['pick'] for f in fits):.3f} | | | | |"
        ranks = " | ".join(f"{statistics.fmean(f[key] for f in fits):.3f}"
                           for key in ("pick", "pick_conservative", "pick_conservative_64", "pick_least_spread"))
        return f" {ranks} | {sum(f['at_cap'] for f in fits)} of {len(fits)} |"

    lines = ["| judge | votes | arm | draws | RM~judge (mean ± sd) | held-out accuracy | pick: mean | mean - spread, 4 heads "
             "| 64 heads | least spread | at cap | fit s | peak GB |",
             "|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for judge_name in judges:
        for n in votes:
            for name, (fits, peak) in results.items():
                mine = [f for f in fits if f["judge"] == judge_name and f["votes"] == n]
                if mine:
                    lines.append(f"| {judge_name} | {n} | {name} | {len(mine)} | {spread([f['correlation'] for f in mine])} | "
                                 f"{spread([f['accuracy'] for f in mine])} |{picks(mine)} {statistics.fmean(f['seconds'] for f in mine):.2f} | {peak:.2f} |")
    return lines


def main() -> None:
    from annotate.judges import BUILT_IN

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judges", default=",".join(BUILT_IN), help="comma-separated built-in judges [default: all]")
    parser.add_argument("--votes", default="48,96,288,864", help="comma-separated numbers of votes [default: 48,96,288,864]")
    parser.add_argument("--draws", type=int, default=5, help="draws of the votes for each judge and N [default: 5]")
    parser.add_argument("--lora-draws", type=int, default=1,
                        help="draws for the LoRA arms, whose fits take minutes where a head's take a second [default: 1]")
    parser.add_argument("--lora-votes", default="96,288", help="comma-separated numbers of votes for the LoRA arms [default: 96,288]")
    parser.add_argument("--arms", default=",".join(HEAD_ARMS),
                        help=f"comma-separated arms, of {', '.join(ARMS)} [default: the heads'; a LoRA arm takes 6 to 15 minutes a fit here]")
    parser.add_argument("--agreement", type=float, default=0.7, help="share of votes siding with the judge [default: 0.7]")
    parser.add_argument("--overlap-share", type=float, default=0.2,
                        help="share of pairs voted on twice, as [queue] overlap_share, to measure the flip rate [default: 0.2]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the answers, the split and the votes [default: 0]")
    parser.add_argument("--results", type=Path, default=Path("bench_rm_votes.jsonl"),
                        help="JSON Lines file each fit is appended to as it ends [default: bench_rm_votes.jsonl]")
    parser.add_argument("--report", action="store_true", help="print the table of what --results holds, and run nothing")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        return run_arm(args.arm, args)
    if args.report:
        results = recorded(args.results)
        judges = sorted({f["judge"] for fits, _ in results.values() for f in fits}, key=list(BUILT_IN).index)
        votes = sorted({f["votes"] for fits, _ in results.values() for f in fits})
        return print("\n".join(summary_table(results, judges, votes)))
    unknown = set(args.arms.split(",")) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {', '.join(sorted(unknown))}: choose from {', '.join(ARMS)}")
    started = time.perf_counter()
    answers = load_answers(args.seed)
    pairs = training_pairs(answers)
    judges = args.judges.split(",")
    print(f"{len(answers.texts)} answers to {len(answers.prompts)} prompts ({sum(answers.held_out)} held out); "
          f"votes at agreement {args.agreement} on pairs of the {len(pairs)} of the training prompts")
    for judge_name in judges:
        scores = judged(answers, judge_name)
        noise = noise_for(pairs, scores, args.agreement)
        ties = sum(scores[a] == scores[b] for _, a, b in pairs) / len(pairs)
        print(f"  {judge_name}: T = {noise:.3g}; the judge ties {ties:.0%} of the training pairs")
    results = {name: measure(name, args) for name in args.arms.split(",")}
    print("\n".join(summary_table(results, judges, [int(n) for n in args.votes.split(",")])))
    print(f"each fit is in {args.results}; --report prints the table of every run there")
    print(f"in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
