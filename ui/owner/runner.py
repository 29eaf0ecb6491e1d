"""The app's job runner: one job at a time, oldest first, in a background thread.

It advances rounds as their jobs finish, and starts a round by itself when the scheduler in
tether.toml ([round] every_comparisons) says one is due.
"""

import sys
import threading
import traceback
from typing import Any, Callable

from store import StoreError
from store.db import utcnow
from store.jobs import Job, cancel_if_queued, finish_job, get_job, next_queued
from store.rounds import scheduled_round_due
from train.runtime.jobdir import log_tail
from ui.owner.jobs import POLL_SECONDS, Run, run_job
from ui.owner.project import Project, job_dir
from ui.owner.round import advance_round, start_round


class JobQueue:
    """The app's job runner: one job at a time, oldest first, in a background thread."""

    def __init__(self, project: Project, run: Run, read: Run, on_done: Callable[[Job], None]):
        self.project, self.run, self.read, self.on_done = project, run, read, on_done
        self.cancel_requested: set[int] = set()
        self.latest_progress: dict[int, dict[str, Any]] = {}  # job id -> the worker's newest progress event
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="tether-jobs", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Cancel the running job, if any, and wait until its worker is gone."""
        self.stopping.set()
        self.thread.join(timeout=30)

    def cancel(self, job_id: int) -> None:
        """A queued job is cancelled at once; a running one as soon as the runner looks."""
        self.cancel_requested.add(job_id)
        self.run(cancel_if_queued, job_id, utcnow())

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self._run_next()
            except Exception:  # a fault outside any one job (the database, the scheduler): report it, and go on
                print(f"the job runner met an error and goes on:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                self.stopping.wait(POLL_SECONDS)

    def _run_next(self) -> None:
        job = self.run(next_queued)
        if job is None:
            if self.run(scheduled_round_due, self.project.config.round.every_comparisons):
                try:
                    start_round(self.project, self.run, read=self.read)
                except StoreError:
                    pass  # recorded as failed with the reason, or refused before it began: nothing to train on yet
                return
            self.stopping.wait(POLL_SECONDS)
            return

        def remember(event: dict[str, Any], job_id: int = job.id) -> None:
            self.latest_progress[job_id] = event

        try:
            job = run_job(self.project, self.run, job, cancelled=lambda: self._stop_reason(job.id), on_progress=remember)
        except Exception as e:  # a corrupt events line, a missing job directory, a failed ingest: this job fails, not the runner
            print(f"job {job.id} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            error = f"{type(e).__name__}: {' '.join(str(e).split())}"
            self.run(finish_job, job.id, "failed", utcnow(), f"{error}\n{log_tail(job_dir(self.project, job.id))}".strip())
            job = self.run(get_job, job.id)
        if job.status == "done":
            self.on_done(job)
        if job.round is not None:
            try:
                advance_round(self.project, self.run, job)
            except StoreError:
                pass  # advance_round has recorded why the round failed, for the operator to see

    def _stop_reason(self, job_id: int) -> str | None:
        if job_id in self.cancel_requested:
            return "cancelled by an operator"
        if self.stopping.is_set():
            return "the server stopped"
        return None

