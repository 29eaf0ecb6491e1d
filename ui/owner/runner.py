"""The app's job runner: one job at a time, oldest first, in a background thread.

It advances rounds as their jobs finish, and starts a round by itself when the scheduler in
tether.toml ([round] every_comparisons) says one is due.
"""

import sys
import threading
import time
import traceback
from typing import Any, Callable

from store import StoreError
from store.db import utcnow
from store.jobs import Job, cancel_if_queued, finish_job, get_job, next_queued
from store.rounds import comparisons_made, scheduled_round_due
from train.runtime.jobdir import log_tail
from ui.owner.jobs import POLL_SECONDS, Run, run_job
from ui.owner.project import Project, job_dir
from ui.owner.round import advance_round, start_round


class RetryWait:
    """How long the scheduler waits to try again after start_round refused a round it says is due.

    What refused it ("no resolved comparisons to train on yet") holds until something changes, and a try reads every
    vote: tried again at once, a refused round was tried 24 times a second on a 2-core machine, reading the votes 5,700
    times a minute; with the wait, 16 times. The wait doubles with each refusal in a row, from FIRST_SECONDS up to
    LAST_SECONDS; comparisons that came in since the refusal end it, once FIRST_SECONDS are over.
    """

    FIRST_SECONDS = 5
    LAST_SECONDS = 300

    def __init__(self) -> None:
        self.seconds = 0  # the wait after the last refusal; 0 where none is held
        self.since = 0.0  # when the last refusal came (time.monotonic())
        self.comparisons = 0  # comparisons made by then

    def refused(self, now: float, comparisons: int) -> int:
        """Begin the wait after a refusal at `now`, with `comparisons` made by then; its seconds."""
        self.seconds = min(2 * self.seconds or self.FIRST_SECONDS, self.LAST_SECONDS)
        self.since, self.comparisons = now, comparisons
        return self.seconds

    def over(self, now: float, comparisons: Callable[[], int]) -> bool:
        """Whether the scheduler may try at `now`; `comparisons` counts those made, asked only within a wait."""
        waited = now - self.since
        if not self.seconds or waited >= self.seconds:
            return True
        if waited >= self.FIRST_SECONDS and comparisons() != self.comparisons:
            self.seconds = 0  # new votes may be what was missing: the doubling starts over
            return True
        return False

    def reset(self) -> None:
        self.seconds = 0


class JobQueue:
    """The app's job runner: one job at a time, oldest first, in a background thread."""

    def __init__(self, project: Project, run: Run, read: Run, on_done: Callable[[Job], None]):
        self.project, self.run, self.read, self.on_done = project, run, read, on_done
        self.cancel_requested: set[int] = set()
        self.latest_progress: dict[int, dict[str, Any]] = {}  # job id -> the worker's newest progress event
        self.stopping = threading.Event()
        self.scheduler_waiting: str | None = None  # why the scheduler's round did not start, and when it tries again
        self.retry_wait = RetryWait()
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
            if not self._start_scheduled_round():
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

    def _start_scheduled_round(self) -> bool:
        """Start the round the scheduler says is due, unless it waits after a refusal; whether one started."""
        if not self.run(scheduled_round_due, self.project.config.round.every_comparisons):
            # A round runs (started here or by an operator), or the scheduler is off or not due: no refusal holds.
            self.retry_wait.reset()
            self.scheduler_waiting = None
            return False
        if not self.retry_wait.over(time.monotonic(), lambda: self.run(comparisons_made)):
            return False
        try:
            start_round(self.project, self.run, read=self.read)
        except StoreError as e:  # refused before it began ("no resolved comparisons to train on yet"), or recorded as failed
            wait = self.retry_wait.refused(time.monotonic(), self.run(comparisons_made))
            self.scheduler_waiting = f"no round started: {' '.join(str(e).split())}; next try in {wait} s"
            return False
        self.retry_wait.reset()
        self.scheduler_waiting = None
        return True

    def _stop_reason(self, job_id: int) -> str | None:
        if job_id in self.cancel_requested:
            return "cancelled by an operator"
        if self.stopping.is_set():
            return "the server stopped"
        return None

