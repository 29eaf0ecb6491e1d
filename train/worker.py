"""The worker: runs one job from its directory, never touching the database.

    python -m train.worker JOB_DIR

It reads job.json and the frozen inputs, reports progress to events.jsonl, writes its
artifacts into the directory and, last, result.json. A worker that dies leaves no result.json,
and the owner marks the job failed with the tail of worker.log.

Under `accelerate launch` (the owner starts it so when [worker] gpus is over 1) every process
runs this same code on its share: generation and scoring split the prompts, reward-model
training and PPO split each batch (train.runtime.distributed). Only the first process writes events,
artifacts and result.json, and only once every process has finished; a process that fails makes
`accelerate launch` stop the others and exit non-zero, so the job fails.

Every worker process exits when the process that started the job (the app or a `tether`
command, named by TETHER_OWNER_PID) is gone, even by kill -9, rather than train on unwatched.

With TETHER_WORKER=here, a `tether` command runs its jobs through `run` in its own process instead
(ui.owner.jobs.run_here): a debugger's breakpoint is reached, and the tests skip a worker's start.
"""

import contextlib
import dataclasses
import json
import math
import os
import resource
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from train.common.config import DPOConfig, ModelConfig, RewardModelConfig, data_seed
from train.common.errors import ModelError
from train.common.snapshot import read_preferences, read_rankings
from train.runtime import distributed
from train.runtime.job_configs import (DPOJob, GenerateJob, GRPOJob, JobConfig, JobConfigError, JudgeJob, PPOJob, PredictJob,
                                       RewardModelJob, ScoreJob, parse_job_config)
from train.runtime.jobdir import JOB_FILE, OWNER_PID_ENV, Events, input_path, read_job, write_result


def whole_share(events: Events, done: int, share: int, whole: int) -> None:
    """Progress over the whole job, from this process's share of it; only the first process's is written.

    The shares differ by at most one item, so the first process's fraction stands for every process's.
    """
    events.emit("progress", done=round(whole * done / share), total=whole, progress=done / share)


def run_generate(job_dir: Path, config: GenerateJob, events: Events) -> dict[str, Any]:
    """Sample completions for the frozen prompts, scored by the reward model at config.reward_adapter_path when
    given; write completions.parquet."""
    from train.common.models import decode_steps_for, load_model
    from train.policy.generate import PromptTooLong, generate

    prompts = pq.read_table(input_path(job_dir, "prompts")).to_pylist()
    mine = distributed.shard(prompts)
    generation = config.generation
    if generation.seed is not None:  # each process its own draws, on its own prompts
        generation = dataclasses.replace(generation, seed=generation.seed + distributed.rank())
    steps = decode_steps_for(len(mine) * generation.per_prompt, generation.batch_size, generation.max_new_tokens)
    model, tokenizer = load_model(config.model, config.policy_adapter_path, steps)
    events.emit("started", total=len(prompts) * generation.per_prompt)

    def progress(done: int, total: int) -> None:
        whole_share(events, done, total, len(prompts) * generation.per_prompt)

    try:
        generated = generate(
            model, tokenizer, [json.loads(prompts[i]["messages"]) for i in mine], generation, progress=False, on_progress=progress
        )
    except PromptTooLong as e:
        raise ModelError(f"prompt {prompts[mine[e.index]]['prompt_id']} {e}") from None
    distributed.report_share(len(generated), "completions")
    rows = [
        {"order": mine[g.prompt_index], "prompt_id": prompts[mine[g.prompt_index]]["prompt_id"], "text": g.text,
         "token_count": g.token_count, "finished": g.finished}
        for g in generated
    ]
    if config.reward_adapter_path:
        del model  # the reward model loads the base again: one at a time
        messages = [json.loads(prompts[mine[g.prompt_index]]["messages"]) for g in generated]
        scored = _scores(config.model, config.reward_model, config.reward_adapter_path, messages, [g.text for g in generated])
        for row, (reward, heads) in zip(rows, scored):
            row |= {"reward": reward, "reward_heads": heads}
    rows = distributed.gather(rows)
    if distributed.is_main():
        rows.sort(key=lambda row: row.pop("order"))  # stable: a prompt's completions keep their order
        pq.write_table(pa.Table.from_pylist(rows), job_dir / "completions.parquet")
    return {"completions": "completions.parquet"}


def run_reward_model(job_dir: Path, config: RewardModelJob, events: Events) -> dict[str, Any]:
    """Train a reward model of [reward_model] kind on the frozen preferences, and rankings where frozen beside them;
    write it to reward_model/ (train.reward.versions.fit_reward_model says what each kind makes there)."""
    from train.common.models import resolve_model_path
    from train.reward.versions import fit_reward_model
    from train.reward.votes import split_by_prompt

    reward = config.reward_model
    rows = read_preferences(input_path(job_dir, "preferences"))
    if input_path(job_dir, "rankings").exists():  # [reward_model] rankings = "plackett_luce"
        rows += read_rankings(input_path(job_dir, "rankings"))
    train_rows, eval_rows = split_by_prompt(rows, reward.eval_share)
    events.emit("started", rows_train=len(train_rows), rows_eval=len(eval_rows), reward_model=reward.kind)
    base = config.model
    metrics = fit_reward_model(
        resolve_model_path(base.name_or_path), base, reward, train_rows, eval_rows, job_dir / "reward_model",
        config.warm_start, config.previous, Path(config.features_cache) if config.features_cache else None,
        lambda update: events.emit("progress", **update),
    )
    return {"adapter": "reward_model", "metrics": metrics}


def _scores(base: ModelConfig, reward: RewardModelConfig, adapter_path: str, prompts: list, texts: list[str],
            on_scored: Callable[[int], None] | None = None):
    """(reward, each head's raw score) of each text, by the reward model at `adapter_path`."""
    import torch

    from train.common.models import resolve_model_path
    from train.reward.scores import reward_and_uncertainty
    from train.reward.versions import load_reward_model

    reward_model = load_reward_model(resolve_model_path(base.name_or_path), Path(adapter_path), base)
    scored = []
    step = reward.batch_size * 8  # report progress every few batches
    for start in range(0, len(texts), step):
        raw = reward_model.raw_scores(prompts[start : start + step], texts[start : start + step], reward.batch_size * 2)
        rewards = reward_and_uncertainty(reward_model.normalization.apply(torch.tensor(raw, dtype=torch.float64)))[0]
        scored += zip(rewards.tolist(), raw)
        if on_scored is not None:
            on_scored(len(scored))
    return scored


def run_score(job_dir: Path, config: ScoreJob, events: Events) -> dict[str, Any]:
    """Score the frozen completions with a reward model; write scores.parquet (the reward and each head's raw score)."""
    table = pq.read_table(input_path(job_dir, "completions")).to_pylist()
    rows = [table[i] for i in distributed.shard(table)]
    events.emit("started", total=len(table))
    scored = _scores(config.model, config.reward_model, config.reward_adapter_path, [json.loads(r["prompt"]) for r in rows], [r["text"] for r in rows],
                     lambda done: whole_share(events, done, len(rows), len(table)))
    distributed.report_share(len(scored), "completions scored")
    scores = distributed.gather([
        {"completion_id": r["completion_id"], "reward": reward, "reward_heads": heads} for r, (reward, heads) in zip(rows, scored)
    ])
    if distributed.is_main():
        pq.write_table(pa.Table.from_pylist(scores), job_dir / "scores.parquet")
    return {"scores": "scores.parquet"}


def run_ppo(job_dir: Path, config: PPOJob, events: Events) -> dict[str, Any]:
    """PPO from the frozen policy on the frozen prompts against a reward model; write policy/."""
    from train.common.models import load_model
    from train.policy.ppo import train_ppo

    ppo = config.ppo
    prompts = [json.loads(r["messages"]) for r in pq.read_table(input_path(job_dir, "prompts")).to_pylist()]
    model, tokenizer = load_model(config.model, decode_steps=ppo.steps * ppo.max_new_tokens)  # a batch a step
    events.emit("started", prompts=len(prompts), total_steps=ppo.steps)

    def step(stats: dict[str, Any]) -> None:
        events.emit("progress", **stats, progress=stats["step"] / stats["total_steps"])

    policy_dir = Path(config.policy_adapter_path) if config.policy_adapter_path else None
    result = train_ppo(
        model, tokenizer, prompts, Path(config.reward_adapter_path), ppo, job_dir / "policy", policy_dir, step
    )
    return {"adapter": "policy", "steps": result["steps"]}


def run_dpo(job_dir: Path, config: DPOJob, events: Events) -> dict[str, Any]:
    """DPO from the frozen policy (from v0 with [dpo] refit) on the frozen preferences and, given a reward model, on
    pairs it ranks among the policy's answers to the frozen prompts; write policy/."""
    from train.common.device import device
    from train.common.models import load_model
    from train.policy.dpo import train_dpo

    dpo = config.dpo
    human = read_preferences(input_path(job_dir, "preferences"))
    base = config.model
    # A refit trains a new adapter from v0; the ranked pairs are still the start's answers, as the round serves it.
    policy_dir = Path(config.policy_adapter_path) if config.policy_adapter_path and not dpo.refit else None
    ranked = _ranked_pairs(job_dir, config, dpo, base, events) if config.reward_adapter_path else []
    model, tokenizer = load_model(base)
    events.emit("started", pairs=len(human) + len(ranked), pairs_human=len(human), pairs_reward_model=len(ranked))

    def step(stats: dict[str, Any]) -> None:
        events.emit("progress", **stats, progress=stats["step"] / stats["total_steps"])

    result = train_dpo(model, tokenizer, human + ranked, dpo, job_dir / "policy", policy_dir, step, on_cpu=device(base).type == "cpu")
    return {"adapter": "policy", "steps": result["steps"], "pairs": result["pairs"], "pairs_too_long": result["pairs_too_long"],
            "pairs_human": len(human), "pairs_reward_model": len(ranked), "label_smoothing": result["label_smoothing"]}


def _ranked_pairs(job_dir: Path, config: DPOJob, dpo: DPOConfig, base: ModelConfig, events: Events) -> list:
    """The policy's dpo.candidates answers to each frozen prompt, ranked by the reward model: train.policy.dpo.ranked_pairs."""
    from train.common.models import decode_steps_for, load_model
    from train.policy.dpo import ranked_pairs
    from train.policy.generate import generate

    prompts = [json.loads(r["messages"]) for r in pq.read_table(input_path(job_dir, "prompts")).to_pylist()]
    generation = dataclasses.replace(config.generation, per_prompt=dpo.candidates, seed=data_seed(dpo))
    steps = decode_steps_for(len(prompts) * dpo.candidates, generation.batch_size, generation.max_new_tokens)
    model, tokenizer = load_model(base, config.policy_adapter_path, steps)
    generated = generate(model, tokenizer, prompts, generation, progress=False,
                         on_progress=lambda done, total: events.emit("progress", done=done, total=total, progress=done / total))
    del model  # the reward model loads the base again: one at a time
    scored = _scores(base, config.reward_model, config.reward_adapter_path, [prompts[g.prompt_index] for g in generated], [g.text for g in generated])
    answers, heads, rewards = ([[] for _ in prompts] for _ in range(3))
    for g, (reward, raw) in zip(generated, scored):
        answers[g.prompt_index].append((g.text, g.finished))
        heads[g.prompt_index].append(raw)
        rewards[g.prompt_index].append(reward)
    return ranked_pairs(prompts, answers, heads, rewards, dpo.confidence)


def run_grpo(job_dir: Path, config: GRPOJob, events: Events) -> dict[str, Any]:
    """GRPO from the frozen policy on the frozen prompts against a reward model; write policy/."""
    from train.common.device import device
    from train.common.models import load_model
    from train.policy.grpo import train_grpo
    from train.reward.versions import read_reward_adapter

    grpo = config.grpo
    prompts = [json.loads(r["messages"]) for r in pq.read_table(input_path(job_dir, "prompts")).to_pylist()]
    base = config.model
    model, tokenizer = load_model(base)
    reward = read_reward_adapter(Path(config.reward_adapter_path))  # rides on the policy's base: one copy of it
    events.emit("started", prompts=len(prompts), total_steps=grpo.steps)

    def step(stats: dict[str, Any]) -> None:
        events.emit("progress", **stats, progress=stats["step"] / stats["total_steps"])

    policy_dir = Path(config.policy_adapter_path) if config.policy_adapter_path else None
    result = train_grpo(model, tokenizer, prompts, reward, grpo, job_dir / "policy", policy_dir, step, on_cpu=device(base).type == "cpu")
    return {"adapter": "policy", "steps": result["steps"]}


def run_predict(job_dir: Path, config: PredictJob, events: Events) -> dict[str, Any]:
    """Predict each candidate's win rate over the round's start (train.policy.predict), or with config.average only their
    average's (train.policy.adapters.average_adapters, saved in "average"), the one the round registers: the start and each
    policy predicted answer the frozen prompts, and the reward model at config.reward_adapter_path scores them."""
    import torch

    from train.common.models import decode_steps_for, load_model
    from train.policy.adapters import average_adapters, scale_adapter
    from train.policy.generate import generate, kl_to_base
    from train.policy.predict import predict
    from train.reward.layout import read_normalization, steering_dir
    from train.reward.scores import reward_and_uncertainty

    prompts = [json.loads(r["messages"]) for r in pq.read_table(input_path(job_dir, "prompts")).to_pylist()]
    generation, base = config.generation, config.model
    jobs, adapters = [c.job for c in config.candidates], [c.adapter_path for c in config.candidates]
    if config.average:  # the candidates are the average's parts, not choices: sampling them would tell nothing used
        average_adapters([Path(path) for path in adapters], job_dir / "average")
        jobs, adapters = [None], [str(job_dir / "average")]  # None: the average
    adapters = [config.start_adapter_path] + adapters
    steps = decode_steps_for(len(prompts) * generation.per_prompt, generation.batch_size, generation.max_new_tokens)
    events.emit("started", policies=len(adapters), prompts=len(prompts), answers=generation.per_prompt)

    def sample(i: int, adapter: str | None):
        model, tokenizer = load_model(base, adapter, steps)
        generated = generate(model, tokenizer, prompts, generation, progress=False,
                             on_progress=lambda done, total: events.emit("progress", progress=0.9 * (i + done / total) / len(adapters)))
        kl = kl_to_base(model, tokenizer, prompts, generated, generation.temperature, generation.batch_size) if adapter else 0.0
        return generated, kl  # the model goes with this frame: one policy's base at a time

    def cut_and_sample(i: int, adapter: str, share: float):
        cut = job_dir / f"within-budget-{i}"
        shutil.rmtree(cut, ignore_errors=True)  # a second cut replaces the first
        scale_adapter(Path(adapter), cut, share)
        return sample(i, str(cut))

    answers, kls, cuts = [], [], {}  # cuts: {policy: (the share of its step kept, the whole step's KL)}
    for i, adapter in enumerate(adapters):
        generated, kl = sample(i, adapter)
        if i and config.kl_budget and kl > config.kl_budget:
            # Past the budget: the same step from v0, shortened to where a KL that grows with the square of the share
            # kept would land inside (KL's gradient at v0 is zero). On the default model it mostly grew so or faster:
            # 1.5 and 2 times a step read 2.3 and 3.6 times its KL, and a cut in proportion, to 0.16, kept 0.013 of it;
            # but 0.69 and 0.81 of two steps kept 0.54 and 0.73 of theirs, just past the allowance (scripts/
            # BENCHMARKS.md). So the cut is measured again, and one still past is cut once more, at the power its two
            # readings give (KL as share ** power); only a cut measured inside the budget is registered.
            whole, target = kl, KL_BUDGET_TARGET * config.kl_budget
            share = math.sqrt(target / whole)
            generated, kl = cut_and_sample(i, adapter, share)
            if kl > config.kl_budget:
                power = max(1.0, math.log(kl / whole) / math.log(share))
                share = (target / whole) ** (1 / power)
                generated, kl = cut_and_sample(i, adapter, share)
            cuts[i] = (share, whole)
        kls.append(kl)
        answers.append(generated)
    asked = [prompts[a.prompt_index] for group in answers for a in group]
    texts = [a.text for group in answers for a in group]
    raw = torch.tensor([heads for _, heads in _scores(base, config.reward_model, config.reward_adapter_path, asked, texts)], dtype=torch.float64)
    normalised = read_normalization(steering_dir(Path(config.reward_adapter_path))).apply(raw)  # (policies x P x N, K)
    reward, spread = reward_and_uncertainty(normalised)
    policies = [None] + jobs  # None: the start, or the average
    per_policy = len(prompts) * generation.per_prompt
    pq.write_table(pa.Table.from_pylist([  # what the predictor saw, to read again
        {"job": policies[i // per_policy], "average": config.average and i >= per_policy, "prompt_index": a.prompt_index, "text": a.text,
         "finished": a.finished, "reward": r, "uncertainty": u, "heads": h}
        for i, (a, r, u, h) in enumerate(zip([a for group in answers for a in group], reward.tolist(), spread.tolist(), normalised.tolist()))
    ]), job_dir / "answers.parquet")
    scores = normalised.reshape(len(adapters), len(prompts), generation.per_prompt, -1)  # (policies, P, N, K)
    predictions = [
        {"job": job, "adapter": f"within-budget-{i}" if i in cuts else None} | dataclasses.asdict(
            predict(scores[i], scores[0], answers[i], kls[i], config.confidence, config.draws, config.seed, *cuts.get(i, (1.0, None))))
        for i, job in enumerate(jobs, start=1)
    ]
    events.emit("progress", progress=1.0)
    start = answers[0]
    return {"predictions": predictions, "answers": "answers.parquet", "average": "average" if config.average else None,
            "start": {"ended": sum(a.finished for a in start) / len(start), "mean_reward": scores[0].mean().item()}}


# Where a policy past [round] kl_budget is pulled back to, as a share of the budget: its KL after the cut is measured
# again on fresh answers, and a little room keeps that measurement's noise from putting it over.
KL_BUDGET_TARGET = 0.9


def run_judge(job_dir: Path, config: JudgeJob, events: Events) -> dict[str, Any]:
    """Ask the judge model about each frozen pair, in both orders; write judgements.parquet (each pair's
    probability that a is better, both orders together and each alone)."""
    from train.common.models import load_model
    from train.reward.judge import PairToJudge, judge_pairs

    table = pq.read_table(input_path(job_dir, "pairs")).to_pylist()
    pairs = [table[i] for i in distributed.shard(table)]
    judge = config.model
    model, tokenizer = load_model(judge)  # no adapter: with [judge] model unset, the starting policy
    events.emit("started", total=len(table))
    judgements = judge_pairs(
        model, tokenizer, [PairToJudge(json.loads(p["prompt"]), p["text_a"], p["text_b"]) for p in pairs], config.judge,
        judge.name_or_path, lambda done, total: whole_share(events, done, total, len(table)),
    )
    distributed.report_share(len(judgements), "pairs judged")
    rows = distributed.gather([
        {"pair_id": p["pair_id"], "choice": j.choice, "p_a": j.p_a, "p_a_first": j.p_a_first, "p_a_second": j.p_a_second,
         "prompt_cut": j.prompt_cut, "answers_cut": j.answers_cut}
        for p, j in zip(pairs, judgements)
    ])
    if distributed.is_main():
        pq.write_table(pa.Table.from_pylist(rows), job_dir / "judgements.parquet")
    return {"judgements": "judgements.parquet"}


RUNNERS: dict[str, Callable[[Path, Any, Events], dict[str, Any]]] = {  # by kind, each given that kind's JobConfig
    "generate": run_generate,
    "reward_model": run_reward_model,
    "score": run_score,
    "ppo": run_ppo,
    "dpo": run_dpo,
    "grpo": run_grpo,
    "judge": run_judge,
    "predict": run_predict,
}


# The worker gives way to its owner for the CPU: where the owner is the app, annotators are answered
# before a training step runs, so their view does not slow while a job trains.
NICENESS = 10
OWNER_POLL_SECONDS = 0.5


def exit_with_owner(owner: int) -> None:
    """Exit as soon as process `owner` is no longer an ancestor of this one: it has ended, and this process was
    handed to another parent. The owner is the parent, or under `accelerate launch` the launcher's parent.

    A thread that looks, because the kernel's parent-death signal (prctl) covers a direct parent
    only, and setting it between fork and exec in the owner (preexec_fn) can deadlock a threaded
    server. Looking at the ancestors rather than at a pid's liveness is safe from pid reuse, and
    the first look also catches an owner that died before this process started.
    """
    def watch() -> None:
        while owner in _ancestors():
            time.sleep(OWNER_POLL_SECONDS)
        print(f"error: the process that started this job ({owner}) is gone: stopping", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


def _ancestors() -> list[int]:
    """The pids of this process's parent, its parent's parent, and so on."""
    found, pid = [], os.getppid()
    while pid > 0:
        found.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # it ended while we looked
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's pid, after the command name, which may hold ")"
    return found


def peak_memory() -> dict[str, float]:
    """This process's peak resident memory, and on a GPU the most PyTorch's allocator held there, in GB: what
    train.runtime.memory's estimate of the job is checked against."""
    peak = {"peak_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # kilobytes on Linux
    import torch

    if torch.cuda.is_available():
        peak["peak_gpu_memory_gb"] = torch.cuda.max_memory_reserved() / 2**30
    return peak


def read_config(job_dir: Path) -> JobConfig:
    """The job's config, once its inputs are checked against their hashes; a JobConfigError names a field that does not
    parse."""
    job = read_job(job_dir)
    return parse_job_config(job["kind"], job["config"])


def run(job_dir: Path, config: JobConfig | None = None) -> int:
    """Run the job in `job_dir` (its config read already, where given) in this process; the worker's exit code (1 for a
    ModelError or a config that does not parse, said in one line)."""
    events = Events(job_dir, enabled=distributed.is_main())
    try:
        config = config or read_config(job_dir)
        result = RUNNERS[config.kind](job_dir, config, events)
    except JobConfigError as e:
        print(f"error: {job_dir / JOB_FILE}: {e}", file=sys.stderr)
        return 1
    except ModelError as e:  # a problem with the model or its input, said in one line
        print(f"error: {e}", file=sys.stderr)
        return 1
    distributed.wait_for_everyone()  # result.json says the whole job is done, every process's part of it
    if distributed.is_main():
        result["peak_memory"] = peak_memory()
        print("peak memory: " + ", ".join(f"{name} {gb:.2f} GB" for name, gb in result["peak_memory"].items()), file=sys.stderr)
        write_result(job_dir, result)
        events.emit("finished")
    distributed.wait_for_everyone()  # no process leaves, to fail or not, before result.json is on disk
    return 0


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(argv) == 2 else 2)
    if owner := os.environ.get(OWNER_PID_ENV):
        exit_with_owner(int(owner))
    os.nice(NICENESS)
    try:
        job_dir = Path(argv[1])
        config = None
        with contextlib.suppress(JobConfigError):  # run() says why, in one line
            config = read_config(job_dir)  # once: it hashes every input file
        if config is None or config.model.quantization == "none":
            # PEFT imports bitsandbytes to make any LoRA layer, wherever it is installed, and bitsandbytes compiles its
            # kernels as it is imported: 4.5 s of CPU (torch's compiler's import) in a job that never quantises. A
            # module set to None is one Python treats as absent (importlib.util.find_spec gives None), so PEFT leaves
            # it alone. Only in a worker process of its own: where jobs run in their caller's process (the tests), a
            # later job may quantise.
            sys.modules.setdefault("bitsandbytes", None)
        code = run(job_dir, config)
    finally:
        distributed.close()
    if distributed.world_size() > 1:
        # The job's files are written and the process group is left, yet the interpreter's teardown still aborted a
        # finished two-process job in CI now and then ("terminate called without an active exception", gloo's
        # threads): it has nothing left to do, so the process ends without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv)
