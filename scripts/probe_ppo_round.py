"""Probe for issue 46: why a simulated project's PPO rounds went as they did.

Two measures, on a project that `tether simulate` (or bench_labels.py) ran:

    implicit   for each reward model measured on the votes cast after its predecessor trained, the
               share of those votes that the round's starting policy's DPO implicit reward agrees
               with (log pi/pi_ref of the chosen answer less the rejected's; the sign is its vote),
               beside the predecessor's recorded share: which of the two predicts people better
    replay     a copy of a PPO job (its frozen prompts, reward model, starting policy and seed) run by
               this checkout's worker, its policy judged against v0 on the evaluation prompts as
               simulate judges a round

    python scripts/probe_ppo_round.py --project WORKDIR/direct-new implicit
    python scripts/probe_ppo_round.py --project WORKDIR/direct-new replay --job 11 --judge direct \\
        --eval-prompts WORKDIR/eval.jsonl --out /tmp/replay
"""

import argparse
import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from train.jobdir import input_path, read_job  # noqa: E402  (the repository root, not an installed copy)
from ui.owner.jobs import job_dir  # noqa: E402
from ui.owner.project import load_project  # noqa: E402


def completion_logprob(model, prompt_ids: list[int], completion_ids: list[int]) -> float:
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion_ids)[:, None]).sum().item()


def implicit(args) -> None:
    from peft import PeftModel

    from store.jobs import round_jobs
    from store.policies import get_policy
    from store.reward_models import get_reward_model
    from store.rounds import list_rounds
    from train.dpo import encode_pair
    from train.models import load_model
    from train.snapshot import read_preferences

    project = load_project(args.project)
    base, tokenizer = load_model(dataclasses.replace(project.config.model, device="cpu"))
    print("| round | previous RM on the new votes | starting policy's implicit reward on them |")
    print("|---|---|---|")
    for round_ in project.run(list_rounds):
        trained = [job for job in project.run(round_jobs, round_.id) if job.kind == "reward_model"]
        metrics = project.run(get_reward_model, round_.reward_version).metrics if round_.reward_version else {}
        if not trained or not metrics.get("new_votes_pairs"):
            continue
        new = set(trained[0].config["previous"]["new_pair_ids"])
        rows = [row for row in read_preferences(input_path(job_dir(project, trained[0].id), "preferences")) if row.pair_id in new]
        measured = f"{metrics['new_votes_accuracy']:.1%} of {metrics['new_votes_pairs']} (v{metrics['new_votes_from']})"
        if round_.policy_from == 0:
            print(f"| {round_.id} | {measured} | none (v0) |")
            continue
        policy = PeftModel.from_pretrained(base, str(project.root / project.run(get_policy, round_.policy_from).adapter_path)).eval()
        agree = 0.0
        for row in rows:
            pair = encode_pair(tokenizer, row)
            margin = 0.0
            for key, sign in (("chosen_ids", 1), ("rejected_ids", -1)):
                with policy.disable_adapter():
                    reference = completion_logprob(policy, pair["prompt_ids"], pair[key])
                margin += sign * (completion_logprob(policy, pair["prompt_ids"], pair[key]) - reference)
            agree += 1.0 if margin > 0 else 0.5 if margin == 0 else 0.0
        print(f"| {round_.id} | {measured} | {agree / len(rows):.1%} of {len(rows)} (v{round_.policy_from}) |", flush=True)
        base = policy.unload()


def replay(args) -> None:
    from annotate.judges import load_judge
    from annotate.simulate import judge_against
    from store.policies import get_policy
    from store.prompt_files import read_prompt_file
    from ui.owner.simulate import EVAL_PAIRS, sample_answers

    project = load_project(args.project)
    source = job_dir(project, args.job)
    if read_job(source)["kind"] != "ppo":
        raise SystemExit(f"{source}: not a PPO job")
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: name a new folder")
    args.out.mkdir(parents=True)
    shutil.copy(source / "job.json", args.out / "job.json")
    shutil.copytree(source / "inputs", args.out / "inputs")
    subprocess.run([sys.executable, "-m", "train.worker", str(args.out)], cwd=ROOT, check=True)
    for line in (args.out / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "progress":
            print(json.dumps({name: round(event[name], 3) for name in ("step", "score", "kl", "kl_to_start", "beta") if name in event}))
    prompts = [p.messages for p in read_prompt_file(args.eval_prompts, project.config.server.import_limits())]
    per_prompt = math.ceil(EVAL_PAIRS / len(prompts))
    baseline, _ = sample_answers(project, project.run(get_policy, 0), prompts, per_prompt, args.seed)
    answers, kl = sample_answers(project, args.out / "policy", prompts, per_prompt, args.seed)
    verdict = judge_against(load_judge(args.judge), prompts, [a.text for a in answers], [a.text for a in baseline])
    print(f"job {args.job} replayed: judge win rate over v0 {verdict.win_rate:.1%} [{verdict.low:.1%}, {verdict.high:.1%}], "
          f"KL to v0 {kl:.2f}, {sum(a.finished for a in answers) / len(answers):.0%} of its answers ended")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True, help="a project tether simulate ran")
    measures = parser.add_subparsers(dest="measure", required=True)
    measures.add_parser("implicit", help="the starting policy's implicit reward against the previous reward model on the new votes")
    again = measures.add_parser("replay", help="replay a PPO job with this checkout's PPO and judge it against v0")
    again.add_argument("--job", type=int, required=True, help="the PPO job's id (its folder under jobs/)")
    again.add_argument("--judge", required=True, help="the judge the project's votes followed: built-in, module:FUNC or PATH.py:FUNC")
    again.add_argument("--eval-prompts", type=Path, required=True, help="the JSONL prompt file simulate judged the rounds on")
    again.add_argument("--seed", type=int, default=0, help="simulate's --seed, for the evaluation answers (default 0)")
    again.add_argument("--out", type=Path, required=True, help="a new folder for the replayed job")
    args = parser.parse_args()
    (implicit if args.measure == "implicit" else replay)(args)


if __name__ == "__main__":
    main()
