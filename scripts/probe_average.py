"""Is the average of a round's candidates better than the candidates, by the judge?

For each round of a loop that bench_labels.py ran with --judge-candidates, the round's candidates
(trained from one start on the same votes, with other seeds) are averaged into one adapter
(train.adapters.average_adapters), which answers the evaluation prompts with the bench's seed and
is judged against the round's start, as every candidate was. Printed per round: each candidate's
judge win rate over the start (from the report), the average's, and the share of the mean update
the rank cut keeps; then over all rounds the average's mean and worst beside the candidates'.

    .venv/bin/python scripts/probe_average.py --projects /work/runs/x/direct-new-seed0 \
        --reports /work/runs/x/direct-new-seed0.jsonl --judge direct --eval-prompts /work/runs/x/eval.jsonl
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def kept_share(folders: list[Path], averaged: Path) -> float:
    """The share of the candidates' mean update (squared Frobenius norm, over every module) the averaged adapter holds."""
    import torch
    from safetensors.torch import load_file

    weights = [load_file(str(f / "adapter_model.safetensors")) for f in folders]
    cut = load_file(str(averaged / "adapter_model.safetensors"))
    whole = kept = 0.0
    for key in (k for k in cut if "lora_A" in k):
        b_key = key.replace("lora_A", "lora_B")
        mean = sum(w[b_key] @ w[key] for w in weights) / len(weights)
        whole += mean.square().sum().item()
        kept += (cut[b_key] @ cut[key]).square().sum().item()
    return kept / whole if whole else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--projects", type=Path, nargs="+", required=True, help="Projects bench_labels.py ran.")
    parser.add_argument("--reports", type=Path, nargs="+", required=True, help="Each project's report (.jsonl), in the same order.")
    parser.add_argument("--judge", required=True, help="The loop's judge (built-in or module:FUNC).")
    parser.add_argument("--eval-prompts", type=Path, required=True, help="The loop's evaluation prompts (eval.jsonl in its work directory).")
    parser.add_argument("--eval-samples", type=int, default=8, help="Answers per evaluation prompt, as the loop's (default 8).")
    parser.add_argument("--seed", type=int, default=0, help="The loop's evaluation sampling seed (default 0).")
    args = parser.parse_args()
    if len(args.reports) != len(args.projects):
        parser.error("give one report for each project, in the same order")
    from annotate.judges import load_judge
    from annotate.simulate import judge_against
    from store.policies import get_policy
    from store.prompt_files import read_prompt_file
    from train.adapters import average_adapters
    from ui.owner.jobs import job_dir
    from ui.owner.project import load_project
    from ui.owner.simulate import sample_answers

    judge = load_judge(args.judge)
    prompts = [p.messages for p in read_prompt_file(args.eval_prompts)]
    texts = lambda answers: [a.text for a in answers]  # noqa: E731
    averages, bests, means, worsts = [], [], [], []
    for path, report in zip(args.projects, args.reports):
        project = load_project(path)
        starts = {}
        for line in report.read_text().splitlines():
            round_ = json.loads(line)
            judged = [c for c in round_["candidates"] if c["judge_over_start"] is not None]
            if len(judged) < 2 or len(judged) != len(round_["candidates"]):
                continue
            start = round_["start"]
            if start not in starts:
                starts[start] = sample_answers(project, project.run(get_policy, start), prompts, args.eval_samples, args.seed)[0]
            # The registered candidate's adapter moved into policies/ when it was registered.
            folders = [project.root / project.run(get_policy, round_["policy"]).adapter_path if c["chosen"]
                       else job_dir(project, c["job"]) / "policy" for c in judged]
            with tempfile.TemporaryDirectory() as scratch:
                averaged = Path(scratch) / "average"
                average_adapters(folders, averaged)
                answers, kl = sample_answers(project, averaged, prompts, args.eval_samples, args.seed)
                kept = kept_share(folders, averaged)
            rate = judge_against(judge, prompts, texts(answers), texts(starts[start])).win_rate
            rates = [c["judge_over_start"] for c in judged]
            averages.append(rate), bests.append(max(rates)), means.append(statistics.mean(rates)), worsts.append(min(rates))
            print(f"{path.name} round {round_['round']} from v{start}: candidates "
                  + ", ".join(f"{c['judge_over_start']:.1%} (KL {c['kl_to_v0']:.1f})" for c in judged)
                  + f"; their average {rate:.1%} (KL {kl:.1f}), rank cut keeps {kept:.1%} of the mean update", flush=True)
    if averages:
        print(f"{len(averages)} rounds, judge win rate over the start: average of the candidates mean {statistics.mean(averages):.1%}, "
              f"worst {min(averages):.1%}; the candidates' mean {statistics.mean(means):.1%}, worst {min(worsts):.1%}, "
              f"best's mean {statistics.mean(bests):.1%}")


if __name__ == "__main__":
    main()
