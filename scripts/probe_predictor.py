"""Does the round's predictor flatter a candidate that learnt the same votes as its reward model?

The predictor rates each candidate against the round's start by a reward model trained on every
vote, the very votes the candidate learnt: where both learnt the same noise, the reward model could
rate the candidate up for it. Cross-fitting measures how much. For each DPO round of a project that
`tether simulate` (or bench_labels.py) ran, the round's new votes (its DPO job's pairs) are split in
two halves by pair, A and B, and
- two candidates train from the round's start, one on each half, with the round's settings;
- two head reward models train on every vote of the round's snapshot but one half: R_notA, R_notB;
- the start and both candidates answer the predictor's held-back prompts, once, with the round's seed;
- each candidate is rated by both: by the model that saw its half (in-sample, as the predictor rates a
  candidate) and by the one that did not (out of sample).
By symmetry, with no flattery the in-sample rating is no higher than the out-of-sample one on
average over rounds and halves; the mean difference, with its standard error, is the flattery.
With --judge, each half-candidate is also judged against the start on evaluation prompts.

With --reports, it reads instead what each round's predictor saw (its job's answers.parquet: every
answer's reward and uncertainty) and rates each candidate again at other uncertainty penalties,
beside the judge's verdict in the loop's report (`tether simulate --report`, with
--judge-candidates for every candidate): Spearman's rank correlation of each with the judge.

    .venv/bin/python scripts/probe_predictor.py --projects /work/runs/*/direct-new-seed0 --judge direct --eval-prompts eval.jsonl
"""

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rounds_of(project) -> list[dict]:
    """Each done round with a DPO candidate and a predictor: its start, reward-model job, first DPO job and predictor job."""
    from store.jobs import round_jobs
    from store.rounds import list_rounds

    found = []
    for round_ in project.run(list_rounds):
        jobs = project.run(round_jobs, round_.id)
        dpo = next((j for j in jobs if j.kind == "dpo" and j.status == "done"), None)
        predict = next((j for j in jobs if j.kind == "predict" and j.status == "done"), None)
        reward = next((j for j in jobs if j.kind == "reward_model" and j.status == "done"), None)
        if dpo and predict and reward:
            found.append({"round": round_.id, "start": round_.policy_from, "dpo": dpo, "predict": predict, "reward": reward})
    return found


def run_job(directory: Path, kind: str, config: dict, inputs: dict) -> Path:
    """A job of the worker's, run in this process on the given inputs; its directory."""
    from train import worker
    from train.jobdir import write_job

    shutil.rmtree(directory, ignore_errors=True)
    write_job(directory, kind, config, inputs)
    if worker.run(directory) != 0:
        raise SystemExit(f"the {kind} job in {directory} failed")
    return directory


def cross_fit(project, found: dict, scratch: Path, judge, eval_prompts: list, eval_samples: int, seed: int) -> list[dict]:
    """The two half-candidates of one round, each rated in-sample and out of sample, and judged when a judge is given."""
    import pyarrow.parquet as pq

    from annotate.simulate import judge_against
    from train.config import GenerationConfig, ModelConfig
    from train.generate import generate, kl_to_base
    from train.jobdir import input_path
    from train.models import load_model, resolve_model_path
    from train.predict import predict
    from train.reward_model import load_reward_model
    from ui.owner.jobs import job_dir

    dpo_dir, reward_dir, predict_dir = (job_dir(project, found[k].id) for k in ("dpo", "reward", "predict"))
    learnt = pq.read_table(input_path(dpo_dir, "preferences"))
    snapshot = pq.read_table(input_path(reward_dir, "preferences"))
    pair_ids = sorted(learnt.column("pair_id").to_pylist())
    halves = {"A": set(pair_ids[0::2]), "B": set(pair_ids[1::2])}
    candidates, rewards = {}, {}
    for half, ids in halves.items():
        rows = learnt.filter(_mask(learnt, ids))
        candidates[half] = run_job(scratch / f"dpo-{half}", "dpo", found["dpo"].config, {"preferences": rows}) / "policy"
        others = snapshot.filter(_mask(snapshot, ids, keep=False))
        config = found["reward"].config | {"previous": None, "warm_start": None}
        rewards[half] = run_job(scratch / f"rm-not{half}", "reward_model", config, {"preferences": others}) / "reward_model"

    predictor = found["predict"].config
    prompts = [json.loads(r["messages"]) for r in pq.read_table(input_path(predict_dir, "prompts")).to_pylist()]
    generation = GenerationConfig(**predictor["generation"])
    base = ModelConfig(**predictor["model"])
    policies = {"start": predictor["start_adapter_path"], **{half: str(path) for half, path in candidates.items()}}
    answers, kls = {}, {}
    for name, adapter in policies.items():
        model, tokenizer = load_model(base, adapter)
        answers[name] = generate(model, tokenizer, prompts, generation, progress=False)
        kls[name] = kl_to_base(model, tokenizer, prompts, answers[name], generation.temperature, generation.batch_size) if adapter else 0.0
        del model
    scores = {}
    for half, path in rewards.items():
        reward_model = load_reward_model(resolve_model_path(base.name_or_path), path, base)
        for name, group in answers.items():
            raw = torch.tensor(reward_model.raw_scores([prompts[a.prompt_index] for a in group], [a.text for a in group]), dtype=torch.float64)
            scores[half, name] = reward_model.normalization.apply(raw).reshape(len(prompts), generation.per_prompt, -1)  # (P, N, K)
        del reward_model
    results = []
    for half in halves:
        other = "B" if half == "A" else "A"
        # R_notB saw half A: it rates candidate A in-sample; R_notA did not.
        rated = {kind: predict(scores[model, half], scores[model, "start"], answers[half], kls[half], predictor["confidence"],
                               predictor["draws"], predictor["seed"])
                 for kind, model in (("in_sample", other), ("out_of_sample", half))}
        judged = None
        if judge is not None:
            evaluation = dataclasses.replace(generation, per_prompt=eval_samples, seed=seed)
            texts = {}
            for name in ("start", half):
                model, tokenizer = load_model(base, policies[name])
                texts[name] = [a.text for a in generate(model, tokenizer, eval_prompts, evaluation, progress=False)]
                del model
            judged = judge_against(judge, eval_prompts, texts[half], texts["start"]).win_rate
        results.append({"round": found["round"], "half": half, "pairs": len(halves[half]),
                        **{f"{kind}": dataclasses.asdict(p) for kind, p in rated.items()}, "judge_over_start": judged})
    return results


def _mask(table, ids: set[int], keep: bool = True):
    import pyarrow as pa

    return pa.array([(pid in ids) == keep for pid in table.column("pair_id").to_pylist()])


def rescore(project_dir: Path, report: Path, penalties: list[float]) -> list[dict]:
    """Each judged candidate of a loop's rounds, its predicted win rate recomputed from what its predictor saw (each
    answer's reward, the heads' mean, and uncertainty, their spread) with the reward less each penalty times the spread."""
    import pyarrow.parquet as pq

    from store.jobs import round_jobs
    from store.rounds import list_rounds
    from train.predict import win_rate
    from ui.owner.jobs import job_dir
    from ui.owner.project import load_project

    project = load_project(project_dir)
    figures = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    rows = []
    for round_, r in zip(project.run(list_rounds), figures):
        predictor = next((j for j in project.run(round_jobs, round_.id) if j.kind == "predict" and j.status == "done"), None)
        answers = job_dir(project, predictor.id) / "answers.parquet" if predictor else None
        if answers is None or not answers.exists():
            continue
        seen = pq.read_table(answers).to_pylist()
        prompts = len({a["prompt_index"] for a in seen})

        def rewards(job, penalty: float):
            return torch.tensor([a["reward"] - penalty * a["uncertainty"] for a in seen if a["job"] == job], dtype=torch.float64).reshape(prompts, -1)

        for candidate in r["candidates"]:
            if candidate["judge_over_start"] is not None:
                rated = {k: win_rate(rewards(candidate["job"], k), rewards(None, k)).item() for k in penalties}
                rows.append({"loop": project_dir.name, "round": r["round"], "job": candidate["job"], "judge": candidate["judge_over_start"],
                             "kl_to_v0": candidate["kl_to_v0"], "rated": rated})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--projects", type=Path, nargs="+", required=True, help="Projects that tether simulate ran, with DPO rounds.")
    parser.add_argument("--reports", type=Path, nargs="+", help="Each project's simulate report, in order: rate the judged candidates again "
                                                                "from what the predictor saw, at each --penalties, instead of cross-fitting.")
    parser.add_argument("--penalties", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0],
                        help="With --reports: the uncertainty penalties to rate at (default 0 0.5 1 2).")
    parser.add_argument("--judge", help="Also judge each half-candidate against the start with this judge (built-in or module:FUNC).")
    parser.add_argument("--eval-prompts", type=Path, help="With --judge: the JSONL prompts to judge on.")
    parser.add_argument("--eval-samples", type=int, default=8, help="With --judge: answers per evaluation prompt (default 8).")
    parser.add_argument("--seed", type=int, default=0, help="With --judge: the evaluation's sampling seed (default 0).")
    parser.add_argument("--out", type=Path, help="Append each half-candidate's figures here, one JSON object per line.")
    args = parser.parse_args()
    if args.judge and not args.eval_prompts:
        parser.error("--judge needs --eval-prompts")
    from tqdm import tqdm

    from annotate.judges import load_judge
    from store.prompt_files import read_prompt_file
    from ui.owner.project import load_project

    if args.reports:
        if len(args.reports) != len(args.projects):
            parser.error("give one report for each project, in the same order")
        from bench_labels import spearman

        rows = [row for path, report in zip(args.projects, args.reports) for row in rescore(path, report, args.penalties)]
        for row in rows:
            print(f"{row['loop']} round {row['round']} job {row['job']}: judge {row['judge']:.1%}; rated "
                  + ", ".join(f"{rate:.1%} at {penalty:g}" for penalty, rate in row["rated"].items()))
        for penalty in args.penalties:
            print(f"penalty {penalty:g}: Spearman's rank correlation with the judge over {len(rows)} candidates "
                  f"{spearman([r['rated'][penalty] for r in rows], [r['judge'] for r in rows]):.2f}")
        return
    judge = load_judge(args.judge) if args.judge else None
    eval_prompts = [p.messages for p in read_prompt_file(args.eval_prompts)] if args.eval_prompts else []
    results = []
    work = [(path, found) for path in args.projects for found in rounds_of(load_project(path))]
    for path, found in tqdm(work, desc="rounds", unit="round"):
        project = load_project(path)
        scratch = path / "probe-predictor" / f"round-{found['round']}"
        for row in cross_fit(project, found, scratch, judge, eval_prompts, args.eval_samples, args.seed):
            row["project"] = str(path)
            results.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    differences = [r["in_sample"]["win_rate"] - r["out_of_sample"]["win_rate"] for r in results]
    if len(differences) > 1:
        mean, error = statistics.mean(differences), statistics.stdev(differences) / len(differences) ** 0.5
        print(f"{len(differences)} half-candidates: in-sample less out-of-sample predicted win rate {mean:+.3f} (standard error {error:.3f})")


if __name__ == "__main__":
    main()
