"""Registering a trained adapter so that a crash at any instant leaves disk and database in
agreement, and putting them back in agreement when a process died anyway.

A version is registered in three steps: an intent file in the job directory names the version
directory to be; the adapter is renamed into it; one transaction writes the version's row and
marks the job done. The row is the commit point. `reconcile`, run when the app starts and before
the CLI runs a job, reads the intent files: a version directory whose row never came is set
aside under `jobs/ID/orphaned/`, never deleted, and the job is failed. Nothing else is needed,
since the version number is chosen afresh from the rows at the next ingest.
"""

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Callable

from store import Connection, transaction
from store.db import utcnow
from store.jobs import Job, fail_interrupted, record_files, registered_adapter_paths, running_job_ids
from store.queue import release_leases
from store.rounds import fail_interrupted_rounds
from train.common.files import file_digests, partial_writes, sync, sync_tree, write_durably
from ui.owner.project import Project

INTENT_FILE = "registering.json"
WORKER_PID_FILE = "worker.pid"
ORPHANED_DIR = "orphaned"
VERSION_DIRS = ("reward_models", "policies")
FEATURES_DIR = "features"  # answers' features, read once by a head's jobs (train.reward.features.FeatureCache)
# Set only by the fault-injection tests: the name of an ingest step at which this process kills itself.
KILL_AT_ENV = "TETHER_TEST_KILL_AT"


def fault_point(step: str) -> None:
    """Die here, as by kill -9, when a test asks for this step; otherwise nothing."""
    if os.environ.get(KILL_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def register_adapter(con: Connection, project: Project, job: Job, adapter: Path, target: Path, add_rows: Callable[[], None]) -> None:
    """Move the job's trained adapter to `target` (relative to the project) and run add_rows in
    one transaction with it; after a crash, `reconcile` finds what was left half done."""
    job_dir = adapter.parent
    final = project.root / target
    final.parent.mkdir(exist_ok=True)
    if final.exists():  # an unregistered leftover that reconcile has not seen yet: never overwritten
        set_aside(final, job_dir)
    write_durably(job_dir / INTENT_FILE, json.dumps({"target": str(target)}))
    fault_point("after_intent")
    # The worker synced what it built, but the row is this process's promise that the files are
    # whole: so it makes sure, whatever wrote them, and makes the new names survive a power cut too.
    sync_tree(adapter)
    digests = file_digests(adapter)  # what `tether check` holds the version's files to from now on
    adapter.rename(final)
    sync(final.parent)
    sync(final.parent.parent)  # the first version of a kind made its directory
    fault_point("after_rename")
    with transaction(con):
        add_rows()
        record_files(con, str(target), digests)
        fault_point("before_commit")
    fault_point("after_commit")
    (job_dir / INTENT_FILE).unlink()


def recover(con: Connection, project: Project) -> list[str]:
    """What the server sets right as it starts, after however the last process ended; one line for each thing done."""
    report = []
    if released := release_leases(con, utcnow()):
        report.append(f"released {released} leases left open by the last run")
    report += reconcile(con, project)
    if rounds := fail_interrupted_rounds(con, utcnow()):
        report.append(f"marked {rounds} rounds failed: the last run stopped during them")
    return report


def reconcile(con: Connection, project: Project) -> list[str]:
    """Put disk and database back in agreement after a crash; one line for each thing done or found."""
    report = []
    registered = registered_adapter_paths(con)
    jobs_root = project.root / "jobs"
    for intent in sorted(jobs_root.glob(f"*/{INTENT_FILE}")):
        target = json.loads(intent.read_text())["target"]
        if target not in registered and (project.root / target).exists():
            moved = set_aside(project.root / target, intent.parent)
            report.append(f"{target} was moved to {moved.relative_to(project.root)}: job {intent.parent.name} "
                          "stopped before registering it")
        intent.unlink()
    for kind in VERSION_DIRS:
        for path in sorted((project.root / kind).glob("v*/")):
            relative = str(path.relative_to(project.root))
            if relative not in registered:  # not from an ingest that wrote an intent: which job made it is unknown
                moved = set_aside(path, jobs_root)
                report.append(f"{relative} is not a registered version: moved to {moved.relative_to(project.root)}")
    for folder in written_folders(project.root):
        for path in partial_writes(folder):
            shutil.rmtree(path, ignore_errors=True)
            report.append(f"removed {path.relative_to(project.root)}, left by a write that was killed")
    for relative in sorted(registered):
        if not (project.root / relative).exists():
            report.append(f"{relative} is registered but missing from disk: restore it from a backup")
    running = running_job_ids(con)
    alive = [job_id for job_id in running if worker_alive(jobs_root / str(job_id))]
    for job_id in set(running) - set(alive):
        # A worker dies with its owner, but the processes a multi-GPU launcher started may not.
        for pid in stray_processes(jobs_root / str(job_id)):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # it ended, or is not ours after all: nothing to stop
                continue
            report.append(f"killed process {pid}, left over from job {job_id}")
    if failed := fail_interrupted(con, utcnow(), keep=alive):
        report.append(f"marked {failed} job{'s' if failed > 1 else ''} failed: the process running it stopped")
    return report


def written_folders(root: Path) -> list[Path]:
    """The project's folders that things are put in place in whole (train.common.files.built_beside), and may be left half
    built in by a process that was killed: the project itself, the versions' folders and the features cache's."""
    features = root / FEATURES_DIR
    return [folder for folder in (root, *(root / kind for kind in VERSION_DIRS), features, *features.glob("*/")) if folder.is_dir()]


def set_aside(path: Path, job_dir: Path) -> Path:
    """Move a directory under job_dir/orphaned/, keeping its kind and name; never onto another."""
    shelf = job_dir / ORPHANED_DIR
    shelf.mkdir(parents=True, exist_ok=True)
    destination = shelf / f"{path.parent.name}-{path.name}"
    suffix = 1
    while destination.exists():
        suffix += 1
        destination = shelf / f"{path.parent.name}-{path.name}-{suffix}"
    path.rename(destination)
    return destination


def record_worker(job_dir: Path, pid: int) -> None:
    (job_dir / WORKER_PID_FILE).write_text(str(pid))


def worker_alive(job_dir: Path) -> bool:
    """Whether the worker this job directory records still runs: a process of ours whose command line names the directory."""
    try:
        pid = int((job_dir / WORKER_PID_FILE).read_text())
    except (OSError, ValueError):
        return False
    return names_job(pid, job_dir)


def stray_processes(job_dir: Path) -> list[int]:
    """Processes of ours whose command line names this job directory: its worker and anything that worker started."""
    return [int(process.name) for process in Path("/proc").glob("[0-9]*") if names_job(int(process.name), job_dir)]


def names_job(pid: int, job_dir: Path) -> bool:
    """Whether process `pid` runs as this process's user and names the job directory on its command line.

    A process of another user is never a worker this project started, even where it names the
    directory (someone reading its log) or has the pid a worker had: it is left alone.
    """
    process = Path(f"/proc/{pid}")
    try:
        return process.stat().st_uid == os.geteuid() and str(job_dir).encode() in (process / "cmdline").read_bytes().split(b"\0")
    except OSError:  # it ended while we looked, or we may not read it
        return False

