"""The app's job runner: one job at a time, oldest first, in a background thread.

It advances rounds as their jobs finish, and starts a round by itself when the scheduler in
tether.toml ([round] every_comparisons) says one is due.
"""

import threading
from typing import Any

from store import StoreError
from store.db import utcnow
from store.jobs import cancel_if_queued, next_queued
from store.rounds import scheduled_round_due
from ui.jobs import POLL_SECONDS, Run, run_job
from ui.project import Project
from ui.rounds import advance_round, start_round


class JobQueue:
    """The app's job runner: one job at a time, oldest first, in a background thread."""

    def __init__(self, project: Project, run: Run):
        self.project, self.run = project, run
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
            job = self.run(next_queued)
            if job is None:
                if self.run(scheduled_round_due, self.project.config.round.every_comparisons):
                    try:
                        start_round(self.project, self.run)
                    except StoreError:
                        pass  # the round is recorded as failed, with the reason
                    continue
                self.stopping.wait(POLL_SECONDS)
                continue

            def remember(event: dict[str, Any], job_id: int = job.id) -> None:
                self.latest_progress[job_id] = event

            job = run_job(self.project, self.run, job, cancelled=lambda: self._stop_reason(job.id), on_progress=remember)
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

