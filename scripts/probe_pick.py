"""Probe: where a reward model's best-of-N pick ranks by the judge, and why.

On --samples answers of v0 to each evaluation prompt (the seed the loop's evaluation uses), each reward-model version
of a project scores every answer, each kind it holds (a head, a LoRA), and the judge scores them too. For each way of
picking one answer a prompt, the judge's rank of the pick among its prompt's answers (1: the judge's best, 0: its
worst, ties share; a random pick averages 0.5):

    mean          the heads' mean, the reward
    conservative  the mean less --penalty times the heads' spread, as PPO and GRPO score with [ppo] uncertainty_penalty
    least spread  the answer the heads agree on most
    longest / shortest

Beside them, within each prompt (each score less its prompt's mean), the Pearson correlation with the judge of the
mean, of the spread and of the length, and of the mean with the length; the share of the judge's pairs it ties; and
the evidence's prior precision of a head (at the cap, 1e12, the votes sent it to the prior: it learnt nothing).

    python scripts/probe_pick.py --project curve/direct-loop-seed0 --judge direct \\
        --eval-prompts ../shared/data/mtbench-prompts.jsonl
"""

import argparse
import json
import sys
from pathlib import Path

from bench_rm_votes import pick_rank, within_prompt_correlation

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotate.judges import load_judge  # noqa: E402  (the repository root, not an installed copy)
from annotate.simulate import last_user_message  # noqa: E402
from store.policies import get_policy  # noqa: E402
from store.prompt_files import read_prompt_file  # noqa: E402
from store.reward_models import list_reward_models  # noqa: E402
from ui.owner.project import load_project  # noqa: E402
from ui.owner.simulate import sample_answers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True, help="A project with reward models (a loop's, say).")
    parser.add_argument("--judge", required=True, help="Built-in judge, module:FUNC or PATH.py:FUNC.")
    parser.add_argument("--eval-prompts", type=Path, required=True, help="JSONL prompt file; its first --eval-count prompts are used.")
    parser.add_argument("--eval-count", type=int, default=48, help="Evaluation prompts (default 48).")
    parser.add_argument("--samples", type=int, default=8, help="v0's answers to each prompt (default 8).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of v0's answers (default 0, as the loop's evaluation).")
    parser.add_argument("--penalty", type=float, default=1.0, help="Spread subtracted from the mean in the conservative pick (default 1.0).")
    parser.add_argument("--versions", type=int, nargs="*", help="Reward-model versions (default: all).")
    args = parser.parse_args()

    from train.common.models import resolve_model_path
    from train.reward.head import EVIDENCE_CAP
    from train.reward.layout import STEERING_FILE
    from train.reward.versions import load_reward_model

    project = load_project(args.project)
    prompts = [p.messages for p in read_prompt_file(args.eval_prompts, project.config.server.import_limits())][: args.eval_count]
    answers, _ = sample_answers(project, project.run(get_policy, 0), prompts, args.samples, args.seed, kl=False)
    asked = [prompts[i // args.samples] for i in range(len(answers))]
    judge = load_judge(args.judge)
    judged = [judge(last_user_message(p), a.text) for p, a in zip(asked, answers)]
    lengths = [float(a.token_count) for a in answers]
    print(f"{len(answers)} answers of v0 to {len(prompts)} prompts; the judge ties {tie_share(judged, args.samples):.1%} of its pairs "
          f"within a prompt; length correlates {within_correlation(lengths, judged, args.samples):+.2f} with the judge")
    print("\n| reward model | kind | votes | alpha | mean | conservative | least spread | longest | shortest | r(mean, judge) "
          "| r(spread, judge) | r(mean, length) |")
    print("|---" * 12 + "|")
    path = resolve_model_path(project.config.model.name_or_path)
    for rm in sorted(project.run(list_reward_models), key=lambda rm: rm.version):
        if args.versions and rm.version not in args.versions:
            continue
        version_dir = project.root / rm.adapter_path
        steering = json.loads((version_dir / STEERING_FILE).read_text())["kind"] if (version_dir / STEERING_FILE).exists() else None
        kinds = [d for d in ("head", "lora") if (version_dir / d).is_dir()] or [None]
        for kind in kinds:
            model = load_reward_model(path, version_dir / kind if kind else version_dir, project.config.model)
            mean, spread = model.score_with_uncertainty(asked, [a.text for a in answers], project.config.reward_model.batch_size * 2)
            metrics = json.loads((version_dir / kind / "metrics.json").read_text()) if kind else rm.metrics
            alpha = metrics.get("alpha")
            picks = {
                "mean": mean,
                "conservative": [m - args.penalty * s for m, s in zip(mean, spread)],
                "least spread": [-s for s in spread],
                "longest": lengths,
                "shortest": [-n for n in lengths],
            }
            ranks = " | ".join(f"{pick_rank(by, judged, args.samples):.3f}" for by in picks.values())
            name = kind or "one kind"
            print(f"| v{rm.version} | {name}{' (steers)' if kind and kind == steering else ''} | {rm.metrics.get('pairs_train', '')} "
                  f"| {'' if alpha is None else f'{alpha:.3g}'}{' (cap)' if alpha is not None and alpha >= EVIDENCE_CAP else ''} | {ranks} "
                  f"| {within_correlation(mean, judged, args.samples):+.2f} | {within_correlation(spread, judged, args.samples):+.2f} "
                  f"| {within_correlation(mean, lengths, args.samples):+.2f} |")
    print("\n(rank: the judge's rank of the pick among its prompt's answers, 0.5 for a random pick)")


def within_correlation(xs: list[float], ys: list[float], size: int) -> float:
    return within_prompt_correlation(xs, ys, [i // size for i in range(len(xs))])


def tie_share(judged: list[float], size: int) -> float:
    pairs = [(a, b) for start in range(0, len(judged), size) for i, a in enumerate(judged[start : start + size])
             for b in judged[start + i + 1 : start + size]]
    return sum(a == b for a, b in pairs) / len(pairs)


if __name__ == "__main__":
    main()
