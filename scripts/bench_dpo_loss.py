"""Benchmark: DPO's losses on the same votes (robust, plain, with the chosen's likelihood), by replaying a project's DPO rounds.

A project that `tether simulate` (or bench_labels.py) ran holds each DPO round's frozen pairs: the
votes it trained on, each with the probability its label is right. This replays those rounds from
v0 once for each arm, every arm continuing its own adapter on the same pairs with the job's own
settings and seed, and judges each round's policy against v0 on the evaluation prompts as simulate
does (the same answers per prompt and seed, so v0's answers are simulate's). The arms:

    job     each round's [dpo] label_smoothing as its job had it ('auto': robust DPO at the rows' flip rate)
    plain   0: plain DPO
    NUMBER  robust DPO at that label smoothing
    NAME=VALUE[+NAME=VALUE...]  the job's settings with each [dpo] NAME set to its VALUE: sft_weight=1 (the chosen
            answers' likelihood beside the loss), seed=1 (another initialisation, and batch
            order where the job set no data_seed), data_seed=1 (another batch order),
            batch_size=16+epochs=3, ...

Pairs a reward model ranked inside a job are not frozen, so a round that had them replays its votes
alone, and says so. The replay stops at the first round that was not DPO. Each round learns the
pairs of its job that the arm's rounds before it have not: a loop whose DPO refit from v0 on every
vote ([dpo] refit) replays as the chain of rounds that each learnt only its new votes. With --union
each arm trains once instead, from v0 on every replayed round's pairs together (a pair once), with
the first round's settings: what a refit of the last round on the same pairs would serve.
--last-only judges only an arm's last round. With --candidates K each step trains K candidates, the
job's data_seed plus CANDIDATE_SEED_STRIDE times each candidate's number, as a round's candidates, and
judges their average (train.policy.adapters.average_adapters), as [round] register = "average" serves it.

    python scripts/bench_dpo_loss.py --project WORKDIR/direct-new --judge direct --eval-prompts WORKDIR/eval.jsonl
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotate.judges import load_judge  # noqa: E402  (the repository root, not an installed copy)
from annotate.simulate import judge_against  # noqa: E402
from store.policies import get_policy  # noqa: E402
from store.prompt_files import read_prompt_file  # noqa: E402
from train.common.config import DPOConfig, data_seed  # noqa: E402
from train.runtime.jobdir import input_path, read_job  # noqa: E402
from ui.owner.project import job_dir, load_project  # noqa: E402
from ui.owner.round_jobs import CANDIDATE_SEED_STRIDE  # noqa: E402
from ui.owner.simulate import EVAL_PAIRS, sample_answers  # noqa: E402


def dpo_rounds(project) -> list[tuple[int, int]]:
    """(round, DPO job) for each round from the first, up to the first round that ran no DPO job."""
    rows = project.run(lambda con: con.execute(
        "SELECT r.id, min(j.id) FILTER (WHERE j.kind = 'dpo' AND j.status = 'done') FROM rounds r "
        "LEFT JOIN jobs j ON j.round = r.id GROUP BY r.id ORDER BY r.id").fetchall())
    rounds = []
    for round_id, job_id in rows:
        if job_id is None:
            break
        rounds.append((round_id, job_id))
    return rounds


def arm_settings(arm: str) -> dict:
    """What an arm changes in a DPO job's [dpo] settings."""
    if arm == "job":
        return {}
    try:
        if "=" in arm:
            settings = {name: _value(value) for name, value in (setting.split("=", 1) for setting in arm.split("+"))}
        else:
            settings = {"label_smoothing": 0.0 if arm == "plain" else float(arm)}
        DPOConfig(**settings)  # a misspelt name or a value out of range stops here
    except (TypeError, ValueError) as e:
        raise SystemExit(f"arm {arm!r}: {e}") from None
    return settings


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a word, such as label_smoothing=auto


def replay_round(project, job_ids: list[int], changes: dict, previous: Path | None, out_dir: Path, learnt: set[int],
                 candidates: int) -> dict:
    """Train one arm's next adapter from `previous` on the jobs' frozen pairs, each pair once and none in `learnt` (which
    takes them in); the first job's settings but what the arm changes. With several candidates, their average."""
    from train.common.config import ModelConfig
    from train.common.models import load_model
    from train.common.snapshot import read_preferences
    from train.policy.adapters import average_adapters
    from train.policy.dpo import train_dpo

    folders = [job_dir(project, job_id) for job_id in job_ids]
    configs = [read_job(folder)["config"] for folder in folders]
    config = configs[0]
    settings = config["dpo"] | changes
    rows = []
    for folder in folders:
        for row in read_preferences(input_path(folder, "preferences")):
            if row.pair_id not in learnt:
                learnt.add(row.pair_id)
                rows.append(row)
    started = time.monotonic()
    if candidates == 1:
        result = train_dpo(*load_model(ModelConfig(**config["model"])), rows, DPOConfig(**settings), out_dir, previous, on_cpu=True)
    else:
        parts = [out_dir.with_name(f"{out_dir.name}-candidate-{k}") for k in range(candidates)]
        for k, part in enumerate(parts):
            seeded = DPOConfig(**settings | {"data_seed": data_seed(DPOConfig(**settings)) + CANDIDATE_SEED_STRIDE * k})
            result = train_dpo(*load_model(ModelConfig(**config["model"])), rows, seeded, part, previous, on_cpu=True)
        average_adapters(parts, out_dir)
    return {"pairs": result["pairs"], "label_smoothing": result["label_smoothing"], "seconds": time.monotonic() - started,
            "ranked_left_out": any(c.get("reward_version") is not None for c in configs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True, help="a project whose rounds ran DPO (tether simulate made it)")
    parser.add_argument("--judge", required=True, help="the judge the project's votes followed: built-in, module:FUNC or PATH.py:FUNC")
    parser.add_argument("--eval-prompts", type=Path, required=True, help="the JSONL prompt file simulate judged the rounds on")
    parser.add_argument("--arms", default="job,plain", help="comma-separated: job, plain, a label smoothing or [dpo] settings as NAME=VALUE+... (default job,plain)")
    parser.add_argument("--rounds", type=int, help="replay only the first this many DPO rounds (default: all)")
    parser.add_argument("--union", action="store_true", help="train each arm once, from v0 on the replayed rounds' pairs together")
    parser.add_argument("--last-only", action="store_true", help="judge only each arm's last round")
    parser.add_argument("--candidates", type=int, default=1, help="train this many candidates a step and judge their average (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="simulate's --seed, for the evaluation answers (default 0)")
    parser.add_argument("--workdir", type=Path, required=True, help="where each arm's adapters go")
    args = parser.parse_args()

    project = load_project(args.project)
    judge = load_judge(args.judge)
    prompts = [p.messages for p in read_prompt_file(args.eval_prompts, project.config.server.import_limits())]
    per_prompt = math.ceil(EVAL_PAIRS / len(prompts))
    arms = {arm: arm_settings(arm) for arm in args.arms.split(",")}  # a misspelt setting stops here, before any answers
    rounds = dpo_rounds(project)[: args.rounds]
    if not rounds:
        raise SystemExit(f"{args.project}: its first round ran no DPO job: nothing to replay")
    print(f"replaying {len(rounds)} DPO rounds of {args.project}; {len(prompts)} evaluation prompts, {per_prompt} answers each",
          flush=True)
    baseline, _ = sample_answers(project, project.run(get_policy, 0), prompts, per_prompt, args.seed)
    # Each step of the replay: its name in the table and the DPO jobs whose pairs it trains on.
    steps = [(f"1-{len(rounds)}", [job for _, job in rounds])] if args.union else [(str(n), [job]) for n, (_, job) in enumerate(rounds, start=1)]
    table = []
    for arm, changes in arms.items():
        previous, learnt = None, set()
        for number, job_ids in steps:
            out_dir = args.workdir / f"{arm}-round-{number}"
            trained = replay_round(project, job_ids, changes, previous, out_dir, learnt, args.candidates)
            previous = out_dir
            if args.last_only and number != steps[-1][0]:
                continue
            answers, kl = sample_answers(project, out_dir, prompts, per_prompt, args.seed)
            verdict = judge_against(judge, prompts, [a.text for a in answers], [a.text for a in baseline])
            row = {"arm": arm, "round": number, "jobs": job_ids, **trained, "win_rate": verdict.win_rate, "low": verdict.low,
                   "high": verdict.high, "kl_to_v0": kl, "ended": sum(a.finished for a in answers) / len(answers)}
            print(json.dumps(row), flush=True)
            table.append(row)
    print("\n| arm | round | pairs | label smoothing | judge win rate over v0 [95% CI] | KL to v0 | ended | DPO s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        note = " (its ranked pairs left out)" if r["ranked_left_out"] else ""
        print(f"| {r['arm']} | {r['round']} | {r['pairs']}{note} | {r['label_smoothing']:.2f} | {r['win_rate']:.1%} "
              f"[{r['low']:.1%}, {r['high']:.1%}] | {r['kl_to_v0']:.2f} | {r['ended']:.0%} | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
