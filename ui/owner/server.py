"""The server: the project, the database's one connection (this process is the one writer), the live
queue in memory with its group commit, the job runner, and sign-in.

Every read and write goes through `Server.db`, which serialises them on one connection. The web
views call this, never storage; `Refused` says why the caller may not do what it asked.
"""

import dataclasses
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from annotate.export import export_preferences
from annotate.queue import Action, LiveQueue, Outcome
from store import StoreError
from store.db import NotSaved, utcnow
from store.jobs import Job
from store.prompt_files import read_prompt_file
from store.prompts import ImportResult, add_prompts
from store.rounds import Stage, current_job_id, move_round, running_round
from store.users import User, get_user, set_password_hash
from ui.owner import control
from ui.owner.auth import Sessions, SignInGuard
from ui.owner.config import ConfigError, set_setting
from ui.owner.project import CONFIG_FILE, Project
from ui.owner.recovery import recover
from ui.owner.runner import JobQueue


class Refused(StoreError):
    """The caller may not do this now: not signed in, disabled, not an operator, or nothing to act on."""


@dataclass
class _Arrival:
    action: Action
    result: tuple[Outcome, int, int] | BaseException | None = None


class Server:
    """The project, its database connection (this process is the one writer) and sign-in."""

    def __init__(self, project: Project):
        self.project = project
        self.con = project.connect()
        self.lock = threading.Lock()
        self.settings_lock = threading.Lock()  # one change of tether.toml at a time
        for line in self.db(recover, project):
            print(line)
        self.queue = self.db(LiveQueue.load, project.config.queue, utcnow())
        self.arrivals: deque[_Arrival] = deque()  # annotators' actions waiting for the writer
        self.exports = Path(tempfile.mkdtemp(prefix="tether-exports-"))
        self.sign_in = SignInGuard(self._password_hash, self._replace_hash, project.config.server.sign_in_limits())
        self.control_token = secrets.token_urlsafe(32)  # what `tether` commands show to act through this server
        self.sessions = Sessions(project.config.server.session_hours * 3600)  # the web server's, once serving
        self.users: dict[str, User] = {}  # accounts met so far; an account's change drops it (account_changed)
        self.jobs = JobQueue(project, self.db, self.snapshot, on_done=self._job_done)
        self.jobs.start()

    def db(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a store function on the app's connection, one at a time."""
        with self.lock:
            return fn(self.con, *args)

    def annotate(self, action: Action) -> tuple[Outcome, int, int]:
        """Do an annotator's action on the queue; return its outcome, and their votes today and pairs left after it.

        Group commit: the actions that arrive while the writer is busy wait together, and the next
        thread to take the lock does them all in one transaction. DuckDB spends a millisecond or two
        of CPU on each statement, so under load a vote costs a fraction of that, and every vote is
        still committed before its reply.
        """
        arrival = _Arrival(action)
        self.arrivals.append(arrival)
        with self.lock:
            if arrival.result is None:  # no earlier holder of the lock took it in
                self._act([self.arrivals.popleft() for _ in range(len(self.arrivals))], utcnow())
        if isinstance(arrival.result, BaseException):
            raise arrival.result
        return arrival.result

    def _act(self, batch: list[_Arrival], now: datetime) -> None:
        """Do a batch in one transaction, under the lock, and give each arrival its result.

        A batch that fails is done again one action at a time, so that only the action at fault
        (or each one, when the disk is full) fails, and no one else's vote is lost with it.
        """
        try:
            outcomes = self.queue.act(self.con, [a.action for a in batch], now)
        except Exception as e:
            if len(batch) > 1:
                for one in batch:
                    self._act([one], now)
            else:
                batch[0].result = e
            return
        except BaseException as e:  # each waiting thread must get a result, or it would wait for its batch again
            for a in batch:
                a.result = NotSaved(f"the database could not save this: {type(e).__name__}")
            raise
        for a, outcome in zip(batch, outcomes):
            name = a.action.annotator
            a.result = outcome, self.queue.votes_today(name, now), self.queue.pairs_left(name, now)

    def snapshot(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a store function on a connection of its own, beside the writer: for long reads of one snapshot."""
        with self.lock:
            con = self.con.cursor()
        try:
            return fn(con, *args)
        finally:
            con.close()

    def check_queue(self) -> dict[str, dict[str, Any]]:
        """The queue held in memory against one rebuilt from the database now: the parts that differ, if any."""
        with self.lock:
            now = utcnow()
            held = self.queue.state(now)
            rebuilt = LiveQueue.load(self.con, self.project.config.queue, now).state(now)
        return {part: {"held": held[part], "rebuilt": rebuilt[part]} for part in held if held[part] != rebuilt[part]}

    def _job_done(self, job: Job) -> None:
        """Bring the queue in memory up to date with what a finished job stored."""
        if job.kind == "generate":
            self.db(self.queue.add_new_pairs, utcnow())
        elif job.kind == "score":
            self.db(self.queue.reorder, utcnow())

    def cancel_round(self) -> int:
        """Cancel the running round and its current job; return the round's id."""
        round_ = self.db(running_round)
        if round_ is None:
            raise Refused("No round is running.")
        # The round first, so the job queue does not go on to its next job.
        self.db(move_round, round_.id, Stage.CANCELLED, utcnow(), "cancelled by an operator")
        if (job_id := self.db(current_job_id, round_.id)) is not None:
            self.jobs.cancel(job_id)
        return round_.id

    def set_schedule(self, every: int) -> None:
        """Change [round] every_comparisons in tether.toml, its one line, then here."""
        with self.settings_lock:
            try:
                self.project.config_text = set_setting(
                    self.project.root / CONFIG_FILE, self.project.config_text, "round", "every_comparisons", every
                )
            except ConfigError as e:
                raise Refused(str(e)) from None
            config = self.project.config
            config.round = dataclasses.replace(config.round, every_comparisons=every)

    def control_action(self, action: str, *args: Any) -> Any:
        """Run one of control.ACTIONS here: for `tether` commands sent to this server, and for the Accounts view.

        The backup reads a snapshot of its own beside the writer, so votes go on while it copies;
        an account an action changed must sign in again.
        """
        run = self.snapshot if action in control.SNAPSHOT_ACTIONS else self.db
        result = run(lambda con: control.ACTIONS[action](con, self.project, *args))
        if action in control.ACCOUNT_ACTIONS:
            self.account_changed(args[0])
        return result

    def import_prompts(self, path: str | Path) -> ImportResult:
        """Add the prompts of a file; a bad row adds nothing.

        The file is read and checked before the writer's lock is taken, so that votes go on
        meanwhile; only the one transaction that adds the prompts holds it.
        """
        prompts = read_prompt_file(Path(path), self.project.config.server.import_limits())
        return self.db(add_prompts, prompts)

    def export(self, fmt: str, include_ties: bool, min_agreement: float | None) -> Path:
        """Export the votes into a new folder of their own (see export_folder); return the file or directory written.
        It reads a snapshot beside the writer, so that votes go on while it writes."""
        out = self.export_folder() / ("preferences" if fmt == "hf" else f"preferences.{fmt}")
        self.snapshot(export_preferences, out, fmt, include_ties, min_agreement)
        return out

    def account_changed(self, name: str) -> None:
        """After a new password, a disable or an enable: the account must sign in again wherever it is signed in.

        Its sessions end, for Gradio's own routes (uploads, downloads) as for Tether's; a call
        already on its way when it was disabled is refused with the reason (`user`).
        """
        self.sessions.end(name)
        self.users.pop(name, None)
        user = self.db(get_user, name)
        if user is not None and user.disabled:  # its leases ended in the database; here too, so its pairs are served to others
            self.db(lambda con: self.queue.release(name, utcnow()))

    def _password_hash(self, name: str) -> str | None:
        user = self.db(get_user, name)
        return user.password_hash if user and not user.disabled else None

    def _replace_hash(self, name: str, password_hash: str) -> None:
        self.db(set_password_hash, name, password_hash, name, utcnow(), "password hash upgraded at sign-in")

    def user(self, name: str | None) -> User:
        """The signed-in user, checked on the server for every call: a disabled account's sessions end at once."""
        user = self.users.get(name) if name else None
        if user is None and name and (user := self.db(get_user, name)):
            self.users[name] = user
        if user is None:
            raise Refused("Sign in first.")
        if user.disabled:
            raise Refused("This account is disabled: ask an operator.")
        return user

    def operator(self, name: str | None) -> User:
        user = self.user(name)
        if user.role != "operator":
            raise Refused("Only operators may do this.")
        return user

    def close(self) -> None:
        control.withdraw(self.project)
        self.jobs.stop()
        shutil.rmtree(self.exports, ignore_errors=True)
        with self.lock:
            self.con.close()

    def export_folder(self) -> Path:
        """A new folder for one export, after removing those older than [server] export_seconds."""
        oldest = time.time() - self.project.config.server.export_seconds
        for folder in self.exports.iterdir():
            if folder.stat().st_mtime < oldest:
                shutil.rmtree(folder, ignore_errors=True)
        return Path(tempfile.mkdtemp(dir=self.exports))
