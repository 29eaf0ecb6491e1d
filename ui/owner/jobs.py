"""Queuing and running jobs as the database's owner: write the job directory, start the worker, follow its events,
and have its result taken in (ui.owner.ingest). Used by the app's job queue and by the CLI; what each job is given
is decided where it is asked for (ui.owner.round, for a round's jobs and their commands).

`run(fn, *args)` runs a store function on the database: the app's one-writer `Server.db`, or
`Project.run` in the CLI, which opens the database for just that call.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Concatenate, ParamSpec, Protocol, TypeVar

import pyarrow as pa
from tqdm import tqdm

from store import Connection, StoreError
from store.ai_votes import judge_annotator, pairs_to_judge
from store.completions import completions_to_score
from store.db import utcnow
from store.jobs import Job, add_job, add_metrics, finish_job, get_job, set_progress, start_job
from store.pref_files import read_preference_file
from store.reward_models import RewardModel, get_reward_model
from train.common.snapshot import PreferenceRow
from train.runtime.job_configs import JobConfig, JobConfigError, JudgeJob, ScoreJob, checked, job_config_json
from train.runtime.jobdir import ALLOCATOR_ENV, LOG_FILE, OWNER_PID_ENV, log_tail, read_events, read_result, write_job
from ui.owner.ingest import INGESTERS
from ui.owner.project import Project, job_dir
from ui.owner.recovery import reconcile, record_worker

P = ParamSpec("P")
T = TypeVar("T")


class Run(Protocol):
    """Runs a store function on the database, given its arguments after the connection: `run(get_job, 3)`."""

    def __call__(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...


POLL_SECONDS = 0.5

WORKER_ENV = "TETHER_WORKER"  # "here": run_here runs jobs in its own process


class JobError(StoreError):
    """A job that cannot be queued as asked."""


def submit(project: Project, run: Run, config: JobConfig, inputs: dict[str, pa.Table], round_id: int | None = None) -> Job:
    """Queue a job of config's kind with its frozen inputs, its directory written; refused, with nothing queued, where
    its config does not read back as the worker will read it (the field named), or this machine cannot run it."""
    from train.common.errors import ModelError
    from train.runtime.hardware import check_runs_here

    try:  # before the job exists: a job this machine cannot run is refused, not queued to fail
        check_runs_here(project.config.model)
    except ModelError as e:
        raise JobError(str(e)) from None
    check_gpus(project)
    try:
        config = checked(config)
    except JobConfigError as e:
        raise JobError(str(e)) from None
    job = run(add_job, config.kind, job_config_json(config), round_id)
    directory = job_dir(project, job.id)
    try:
        write_job(directory, config, inputs)
    except OSError as e:
        run(finish_job, job.id, "failed", utcnow(), f"cannot write {directory}: {e}")
        raise JobError(f"cannot write the job directory {directory}: {e}") from None
    return job


def check_gpus(project: Project) -> None:
    """Refuse [worker] gpus over the GPUs this machine has, or beside a [model] device that names one GPU."""
    import torch

    processes, gpus = project.config.worker.processes(), project.config.worker.gpus
    if processes > 1 and processes > torch.cuda.device_count():
        raise JobError(f"[worker] gpus = {gpus} asks for {processes} GPUs and this machine has {torch.cuda.device_count()}: "
                       "set gpus = 1, or \"all\"")
    if processes > 1 and project.config.model.device.startswith("cuda:"):
        raise JobError(f'[worker] gpus = {gpus} gives each process its own GPU, and [model] device = '
                       f'"{project.config.model.device}" names one: set device = "auto"')


def worker_command(directory: Path, processes: int) -> list[str]:
    """The command that runs a job: the worker alone, or one worker process per GPU under accelerate launch."""
    worker = ["-m", "train.worker", str(directory)]
    if processes == 1:
        return [sys.executable, *worker]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", *worker]


def run_job(
    project: Project,
    run: Run,
    job: Job,
    cancelled: Callable[[], str | None] = lambda: None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    command: list[str] | None = None,
    here: bool = False,
) -> Job:
    """Run the worker to its end, following its progress; ingest its result or record its failure.

    `cancelled()` returns why the job must stop now, or None to go on. It is asked once more after
    the worker exits, so a job cancelled as its worker finished is cancelled, its result never
    taken; a cancel asked for after that finds the job done. `command` runs the job directory's
    worker some other way than [worker] gpus says (worker_command). `here` runs the worker's code
    in this process instead (run_here says when), with no progress until it ends and no cancelling.
    """
    directory = job_dir(project, job.id)
    if not run(start_job, job.id):  # cancelled while it waited in the queue
        return run(get_job, job.id)
    returncode = _run_worker_here(directory) if here else _run_worker_process(project, run, job, directory, cancelled, on_progress, command)
    if returncode is None:
        return run(get_job, job.id)
    result = read_result(directory)
    if returncode == 0 and result is not None:
        run(INGESTERS[job.kind], job, directory, result, project)
        run(add_metrics, job.id, [(0, result["peak_memory"])])
    else:
        run(finish_job, job.id, "failed", utcnow(), f"the worker exited with code {returncode}:\n{log_tail(directory)}")
    return run(get_job, job.id)


def _run_worker_process(
    project: Project, run: Run, job: Job, directory: Path, cancelled: Callable[[], str | None],
    on_progress: Callable[[dict[str, Any]], None] | None, command: list[str] | None,
) -> int | None:
    """Start the job's worker process and follow it to its exit code; None once the job is cancelled and its worker killed."""
    with (directory / LOG_FILE).open("w") as log:
        # Its own session, so cancelling can kill the worker and anything it started. No
        # preexec_fn: Python code between fork and exec in a threaded server can deadlock, so the
        # worker itself exits when this process is gone (OWNER_PID_ENV) and lowers its priority.
        # PYTHONSAFEPATH, inherited by every process accelerate launch starts, keeps the working
        # directory off sys.path: a signal.py or json.py where tether was run would otherwise
        # shadow the standard library in the worker.
        worker = subprocess.Popen(
            # The predictor samples a few dozen answers a policy: one process does it.
            command or worker_command(directory, 1 if job.kind == "predict" else project.config.worker.processes()),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=(ALLOCATOR_ENV if project.config.worker.release_memory else {}) | os.environ
            | {"PYTHONSAFEPATH": "1", OWNER_PID_ENV: str(os.getpid())},
        )
    try:
        record_worker(directory, worker.pid)
        offset = 0
        while True:
            exited = worker.poll() is not None
            events, offset = read_events(directory, offset)
            progress = [e for e in events if "progress" in e]
            if progress:
                run(set_progress, job.id, progress[-1]["progress"])
                if on_progress:
                    on_progress(progress[-1])
            if reason := cancelled():
                _stop(worker)
                run(finish_job, job.id, "cancelled", utcnow(), reason)
                return None
            if exited:
                return worker.returncode
            time.sleep(POLL_SECONDS)
    except BaseException:  # whoever catches this fails the job: its worker must not run on unwatched
        _stop(worker)
        raise


def _run_worker_here(directory: Path) -> int:
    """The worker's code in this process, its output to the job's log: the exit code a worker process would give."""
    from train import worker

    with (directory / LOG_FILE).open("w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            return worker.run(directory)
        except Exception:  # as a worker process would die of it: its traceback in the log
            traceback.print_exc()
            return 1


def run_here(project: Project, job: Job, label: str) -> Job:
    """Run a job's worker from this process, with a progress bar, after setting right what a process that died left.

    With TETHER_WORKER=here in the environment (and one worker process) the worker's code runs in this
    very process: a breakpoint in it is reached, and a caller that has imported torch already (the test
    suite) skips a worker's start of 6 to 8 s. The app always starts worker processes.
    """
    for line in project.run(reconcile, project):
        print(line, file=sys.stderr)
    here = os.environ.get(WORKER_ENV) == "here" and project.config.worker.processes() == 1
    with tqdm(total=100, desc=label, unit="%", bar_format="{l_bar}{bar}| {elapsed}") as bar:
        return run_job(project, project.run, job, on_progress=lambda e: bar.update(round(100 * e["progress"]) - bar.n), here=here)


def run_to_end(project: Project, job: Job, label: str) -> Job:
    """run_here, and a job that did not finish becomes a JobError naming its reason."""
    job = run_here(project, job, label)
    if job.status != "done":
        raise JobError(f"job {job.id} {job.status}: {job.error}")
    return job


def _stop(worker: subprocess.Popen) -> None:
    """Kill the worker and whatever it started (accelerate's processes), and reap it."""
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group has exited already
        pass
    worker.wait()


# Jobs outside rounds


def submit_scoring(project: Project, run: Run, version: int | None = None) -> Job:
    """Queue scoring every policy completion with a reward model (the newest by default)."""
    reward_model = run(get_reward_model, version)
    rows = run(completions_to_score)
    if not rows:
        raise JobError("the project has no completions to score: generate some with `tether generate`")
    table = pa.Table.from_pylist([{"completion_id": i, "prompt": prompt, "text": text} for i, prompt, text in rows])
    config = ScoreJob(model=project.config.model, reward_model=project.config.reward_model, reward_version=reward_model.version,
                      reward_adapter_path=str(project.root / reward_model.adapter_path))
    return submit(project, run, config, {"completions": table})


def submit_judging(project: Project, run: Run, limit: int | None = None, read: Run | None = None) -> Job:
    """Queue the AI judge ([judge]) on the pairs it has not voted on, in pair order, at most `limit` of them.
    `read` reads the pairs beside the writer, as for submit_reward_training."""
    model = project.config.judge_model()
    annotator = judge_annotator(model.name_or_path)
    pairs = (read or run)(pairs_to_judge, annotator, limit)
    if not pairs:
        raise JobError(f"{annotator} has voted on every pair already: generate new pairs first")
    table = pa.Table.from_pylist(
        [{"pair_id": p.pair_id, "prompt": json.dumps(p.prompt), "text_a": p.text_a, "text_b": p.text_b} for p in pairs]
    )
    return submit(project, run, JudgeJob(model=model, judge=project.config.judge, annotator=annotator), {"pairs": table})


def evaluate_reward_model(project: Project, version: RewardModel, data_file: Path, on_scored: Callable[[int], Any]) -> Any:
    """A reward model's pairwise accuracy on a preference file (a train.reward.scores.PairwiseResult), scored in this process."""
    from train.common.models import resolve_model_path  # torch and transformers take seconds to import
    from train.reward.versions import load_reward_model

    preferences = read_preference_file(data_file, project.config.server.import_limits())
    rows = [PreferenceRow(p.prompt.messages, p.chosen, p.rejected) for p in preferences]
    if not rows:
        raise JobError(f"{data_file} holds no preference pairs")
    base = project.config.model
    reward_model = load_reward_model(resolve_model_path(base.name_or_path), project.root / version.adapter_path, base)
    return reward_model.pairwise_accuracy(rows, project.config.reward_model.batch_size * 2, on_scored=on_scored)
