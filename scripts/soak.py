"""Soak test: annotators vote at human pace against a real `tether serve` for a set time, while
the server is killed with kill -9 and restarted every few minutes and a reward-model job trains.

The script builds a project (the tests' tiny random Llama unless --model, synthetic pairs, the
annotators and one operator), starts `tether serve` on a free port and runs every annotator as a
coroutine in this process, speaking Gradio's HTTP API with httpx (gradio_client costs too much
CPU per client to run dozens beside the server). Each annotator signs in, then: waits a few
seconds, votes on the pair on its screen, and gets the next pair in the vote's reply. A vote is
acknowledged when that reply comes back without a refusal; a vote whose reply was lost to a kill
is sent again, with the same token, once the server answers and the annotator has signed in
again, as a browser would. The operator keeps one reward-model job queued or running at all
times. With --hostile, that many more annotators sign in and, throughout, send votes that are
malformed (numbers and lists where text belongs, an oversized comment) or cross-site (a real pair's
token, with another site's Origin, as a forged form would). At the end the server is stopped cleanly
and the database is checked against what was acknowledged; the exit status is 1 if an acknowledged
vote is missing, any vote is doubled, an honest vote was refused, or a hostile request was accepted.

    .venv/bin/python scripts/soak.py --annotators 32 --minutes 20 --restart-every 240 --hostile 1
    .venv/bin/python scripts/soak.py --annotators 8 --minutes 3 --restart-every 60    # a quick check
"""

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from annotate.pairs import add_completions_with_pairs
from bench_serve import free_port, percentile
from store import open_database
from store.completions import NewCompletion
from store.db import utcnow
from store.prompt_files import NewPrompt
from store.prompts import add_prompts
from store.users import add_user
from ui.owner.auth import hash_password
from ui.owner.project import Project, ProjectError, init_project

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "password-123"
OPERATOR = "operator"
CHOICES = ("left", "right", "tie", "both_bad")
STRENGTHS = (None, "slightly better", "much better")
RETRY_SECONDS = 0.5  # between attempts to reach a server that is down or starting
JOB_RETRY_SECONDS = 30  # after the app refuses to queue a reward-model job (too few new votes)
JOB_POLL_SECONDS = 5
# The error the app records for a job whose worker died with the server (store.jobs.fail_interrupted).
INTERRUPTED = "the process running it stopped"
HOSTILE_SECONDS = 0.5  # between a hostile annotator's requests
FORGED_ORIGIN = "https://evil.example"


# ---- the project ----

def tiny_model(path: Path) -> str:
    """The tests' 2-layer random Llama with a ChatML tokenizer: a reward-model job on it takes seconds."""
    sys.path.insert(0, str(ROOT))  # tests/ is no installed package
    from tests.conftest import CHATML, save_tiny_llama, train_tokenizer

    tokenizer = train_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos_token="<|im_end|>",
                                pad_token="<|endoftext|>", chat_template=CHATML)
    save_tiny_llama(path, tokenizer)
    return str(path)


def annotator_name(i: int) -> str:
    return f"annotator{i:02d}"


def hostile_name(i: int) -> str:
    return f"hostile{i:02d}"


def make_project(root: Path, model: str, pairs: int, annotators: int, hostile: int) -> Project:
    """A project on `model` with one pair of synthetic completions per prompt (the project's own
    overlap share wants two votes on some), annotator00.., hostile00.. and one operator."""
    project = init_project(root, model)
    password_hash = hash_password(PASSWORD)  # one hash for all: sign-in still verifies it per client
    with closing(project.connect()) as con:
        add_prompts(con, [NewPrompt([{"role": "user", "content": f"question {i}"}], "soak") for i in range(pairs)])
        ids = [row[0] for row in con.execute("SELECT id FROM prompts ORDER BY id").fetchall()]
        completions = [NewCompletion(pid, 0, f"answer {k} to question {pid}", 5, True, {}) for pid in ids for k in range(2)]
        add_completions_with_pairs(con, completions, project.config.queue)
        for name in [annotator_name(i) for i in range(annotators)] + [hostile_name(i) for i in range(hostile)] + [OPERATOR]:
            add_user(con, name, OPERATOR if name == OPERATOR else "annotator", password_hash, "soak", utcnow())
    return project


# ---- the server ----

class ServeProcess:
    """`tether serve` in a child process, which can be killed with SIGKILL and started again on the same port."""

    def __init__(self, project: Path, port: int):
        self.project, self.port = project, port
        self.url = f"http://127.0.0.1:{port}"
        self.log = project / "serve.log"  # appended to across restarts
        self.process: subprocess.Popen | None = None

    async def start(self) -> None:
        tether = Path(sys.executable).parent / "tether"
        with self.log.open("a") as log:
            # Unbuffered, so what the server printed before a kill -9 reaches the log. Its own
            # session, so a Ctrl-C in the terminal reaches only this script, which then stops the
            # server with one SIGTERM: a second signal would cut its clean shutdown short.
            self.process = subprocess.Popen(
                [str(tether), "serve", "--project", str(self.project), "--port", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"}, start_new_session=True,
            )
        deadline = time.monotonic() + 120
        async with httpx.AsyncClient(timeout=2) as http:
            while True:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tether serve did not start; the end of {self.log}:\n{self.log.read_text()[-3000:]}")
                try:
                    await http.get(self.url)
                    return
                except httpx.TransportError:
                    await asyncio.sleep(0.2)

    async def kill(self) -> int:
        """kill -9 the server, then any job worker it leaves behind; returns how many workers were left."""
        self.process.kill()
        self.process.wait()
        with self.log.open("a") as log:
            log.write(f"\n---- soak: killed with SIGKILL at {time.strftime('%H:%M:%S')} ----\n")
        # Workers die with the server (train.worker.exit_with_owner), within a second. One that
        # lives on would keep its job 'running' after the restart with nobody to ingest its result.
        deadline = time.monotonic() + 5
        while self.workers() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        survivors = self.workers()
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        return len(survivors)

    def stop(self) -> None:
        """Stop as a service manager does (SIGTERM), so the database is closed cleanly."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in self.workers():
            os.kill(pid, signal.SIGKILL)

    def workers(self) -> list[int]:
        """Worker processes of this project's jobs (`python -m train.worker PROJECT/jobs/ID`)."""
        pattern = f"train\\.worker {re.escape(str(self.project / 'jobs'))}/"
        found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]


# ---- Gradio over plain HTTP ----

class ServerGone(Exception):
    """No answer: the connection failed or was cut, or the server failed outside the app."""

    def __init__(self, message: str, reached: bool):
        super().__init__(message)
        self.reached = reached  # whether the call may have run: it got through before the answer was lost


class SignedOut(Exception):
    """The server does not know this session's cookie: it restarted since the sign-in."""


class Refused(Exception):
    """The app answered with an error (gr.Error)."""


class GradioSession:
    """One browser's session: a sign-in cookie, and calls by api_name through Gradio's /call protocol.

    A call is two requests: POST /gradio_api/call/NAME {"data": [...]} queues it and returns an
    event id; GET /gradio_api/call/NAME/ID streams server-sent events until `complete` (the
    outputs) or `error`.
    """

    def __init__(self, url: str, name: str):
        self.name = name
        # Generous: after a restart every annotator signs in at once, each an scrypt hash on two CPUs.
        self.http = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=5))

    async def sign_in(self) -> None:
        """Sign in, waiting for the server if it is down; a wrong password is an error."""
        while True:
            self.http.cookies.clear()  # a restarted server names its cookie afresh
            try:
                response = await self.http.post("/login", data={"username": self.name, "password": PASSWORD})
            except httpx.TransportError:
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if response.status_code == 200:
                return
            if response.status_code < 500:
                raise RuntimeError(f"sign-in refused for {self.name}: {response.status_code} {response.text}")
            await asyncio.sleep(RETRY_SECONDS)

    async def call(self, api_name: str, data: list) -> list:
        queued = None
        try:
            queued = await self.http.post(f"/gradio_api/call/{api_name}", json={"data": data})
            self._check(queued, reached=False)
            event_id = queued.json()["event_id"]
            async with self.http.stream("GET", f"/gradio_api/call/{api_name}/{event_id}") as stream:
                self._check(stream, reached=True)
                event = None
                async for line in stream.aiter_lines():
                    if line.startswith("event: "):
                        event = line.removeprefix("event: ")
                    elif line.startswith("data: ") and event == "complete":
                        return json.loads(line.removeprefix("data: "))
                    elif line.startswith("data: ") and event == "error":
                        raise Refused(_error_text(json.loads(line.removeprefix("data: "))))
        except httpx.TransportError as e:  # refused, reset, timed out
            reached = queued is not None or not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
            raise ServerGone(f"{type(e).__name__}: {e}", reached) from None
        raise ServerGone("the event stream ended without a result", reached=True)

    async def call_until_answered(self, api_name: str, data: list) -> list:
        """Call, signing in again and retrying while the server is down; Refused still comes through."""
        while True:
            try:
                return await self.call(api_name, data)
            except SignedOut:
                await self.sign_in()
            except ServerGone:
                await asyncio.sleep(RETRY_SECONDS)

    def _check(self, response: httpx.Response, reached: bool) -> None:
        if response.status_code == 401:
            raise SignedOut()
        if response.status_code != 200:
            raise ServerGone(f"HTTP {response.status_code} from {response.url.path}", reached)

    async def close(self) -> None:
        await self.http.aclose()


def _error_text(data) -> str:
    # A gr.Error arrives as {"error": message, ...}; Gradio's own failures as a bare string.
    return str(data.get("error") if isinstance(data, dict) else data)


# ---- what happened, counted as it happens ----

@dataclass
class Tally:
    acknowledged: list[tuple[str, str]] = field(default_factory=list)  # (token, annotator) of each acknowledged vote
    vote_ms: list[float] = field(default_factory=list)  # votes answered at the first try, until the next pair was in hand
    next_ms: list[float] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)  # votes answered with a message or an error instead of stored, by message
    errors: Counter = field(default_factory=Counter)  # calls answered with an error, by message
    cut_off: int = 0  # votes whose answer was lost to a kill after they got through, sent again
    cut_off_acknowledged: int = 0
    unreached: int = 0  # votes sent while the server was down or had restarted, sent again
    restarts: int = 0
    restart_seconds: list[float] = field(default_factory=list)  # from the kill until the server answered again
    surviving_workers: int = 0  # job workers still alive 5 s after their server was killed
    job_refusals: Counter = field(default_factory=Counter)
    job_status: dict[int, str] = field(default_factory=dict)  # reward-model job id -> status, as last seen
    hostile_refused: Counter = field(default_factory=Counter)  # hostile requests refused, by kind
    hostile_accepted: Counter = field(default_factory=Counter)  # hostile requests the app acted on, by kind
    seconds: float = 0.0  # wall time of the voting
    client_cpu_seconds: float = 0.0  # CPU time of this process meanwhile: all the clients together


# ---- the actors ----

async def pause(seconds: float, deadline: float) -> None:
    """Sleep `seconds`, or until the deadline if that comes first."""
    await asyncio.sleep(max(0.0, min(seconds, deadline - time.monotonic())))


async def annotate(session: GradioSession, tally: Tally, deadline: float, pace: tuple[float, float]) -> None:
    """Sign in, then vote on each pair after a human pause, until the deadline."""
    await session.sign_in()
    view = await next_pair(session, tally)
    while time.monotonic() < deadline:
        token = view[0]
        if not token:  # no pair waiting: look again later
            await pause(10, deadline)
            view = await next_pair(session, tally)
            continue
        await pause(random.uniform(*pace), deadline)
        if time.monotonic() >= deadline:
            break
        view = await vote(session, token, tally)


async def next_pair(session: GradioSession, tally: Tally) -> list:
    while True:
        start = time.perf_counter()
        try:
            view = await session.call_until_answered("next_pair", [])
        except Refused as e:  # not expected: the server's log has the details
            tally.errors[f"next_pair: {e}"] += 1
            await asyncio.sleep(5)
            continue
        tally.next_ms.append((time.perf_counter() - start) * 1000)
        return view


async def vote(session: GradioSession, token: str, tally: Tally) -> list:
    """Vote on the pair `token` and return the next pair.

    When the reply is lost (the server died), the same vote is sent again once the server answers
    and the annotator has signed in again: the server stores a token once, so a vote stored before
    the kill is answered as stored, and one that was not is stored now if its pair is still this
    annotator's. A refusal, then, drops it.
    """
    api_name, data = f"vote_{random.choice(CHOICES)}", [token, random.choice(STRENGTHS), ""]
    start = time.perf_counter()
    cut_off = False
    try:
        view = await session.call(api_name, data)
        tally.vote_ms.append((time.perf_counter() - start) * 1000)
    except (ServerGone, SignedOut) as e:
        cut_off = isinstance(e, ServerGone) and e.reached
        tally.cut_off += cut_off
        tally.unreached += not cut_off
        try:
            view = await session.call_until_answered(api_name, data)
        except Refused as refusal:
            tally.errors[f"vote (sent again): {refusal}"] += 1  # its lease may have ended with the server: not an honest refusal
            return await next_pair(session, tally)
    except Refused as e:
        tally.refused[f"vote: {e}"] += 1
        return await next_pair(session, tally)
    message = view[5]
    if message:  # the app's refusals (not yours, expired, retired) come back as the view's message line
        tally.refused[message] += 1
    else:
        tally.acknowledged.append((token, session.name))
        tally.cut_off_acknowledged += cut_off
    return view


def hostile_requests(token: str) -> list[tuple[str, dict, list]]:
    """(kind, extra headers, data) of each request a hostile annotator sends for the pair `token`."""
    return [
        ("token as a number", {}, [12345, None, ""]),
        ("token as a list", {}, [[token], None, ""]),
        ("strength as a dict", {}, [token, {"much": True}, ""]),
        ("comment as a list", {}, [token, None, ["a", 1]]),
        ("comment of 1 MB", {}, [token, None, "x" * 2**20]),
        ("cross-site vote", {"Origin": FORGED_ORIGIN, "Sec-Fetch-Site": "cross-site"}, [token, None, ""]),
    ]


async def attack(session: GradioSession, tally: Tally, deadline: float) -> None:
    """As a hostile annotator: hold a real pair and send malformed or cross-site votes on it, until the deadline.

    A request counts as refused when the app answers with an HTTP error, an error event or a message
    in the view's refusal line; as accepted when it answers with a new pair and no message.
    """
    await session.sign_in()
    while time.monotonic() < deadline:
        try:
            token = (await session.call_until_answered("next_pair", []))[0]
        except Refused:
            token = ""
        for kind, headers, data in hostile_requests(token or "no-pair"):
            await pause(HOSTILE_SECONDS, deadline)
            if time.monotonic() >= deadline:
                return
            try:
                response = await session.http.post("/gradio_api/call/vote_left", json={"data": data}, headers=headers)
                if response.status_code == 401:
                    await session.sign_in()  # the server restarted: this request reached nobody
                    continue
                if response.status_code != 200:
                    tally.hostile_refused[kind] += 1
                    continue
                event_id = response.json()["event_id"]
                answer = await session.http.get(f"/gradio_api/call/vote_left/{event_id}", headers=headers)
            except httpx.TransportError:
                await asyncio.sleep(RETRY_SECONDS)  # the server is down
                continue
            complete = re.search(r"^event: complete\ndata: (.*)$", answer.text, re.M)
            view = json.loads(complete.group(1)) if complete else None
            if view is None or view[5]:
                tally.hostile_refused[kind] += 1
            else:
                tally.hostile_accepted[kind] += 1


async def keep_training(session: GradioSession, tally: Tally, deadline: float) -> None:
    """As the operator: whenever no reward-model job is queued or running, queue another."""
    await session.sign_in()
    while time.monotonic() < deadline:
        try:
            table = (await session.call_until_answered("jobs", []))[0]
            for job_id, kind, status, *_ in table["data"]:
                if kind == "reward_model":
                    tally.job_status[int(job_id)] = status
            if not any(status in ("queued", "running") for status in tally.job_status.values()):
                await session.call_until_answered("train_reward_model", [False])
        except Refused as e:  # too few new resolved votes yet, most likely
            tally.job_refusals[str(e)] += 1
            await pause(JOB_RETRY_SECONDS, deadline)
            continue
        await pause(JOB_POLL_SECONDS, deadline)


async def restart_periodically(server: ServeProcess, tally: Tally, every: float, started: float, deadline: float) -> None:
    """kill -9 the server at every multiple of `every` seconds from the start, and start it again at once on the
    same port. The kills keep to that clock, so a slow restart on a busy machine does not push the later ones past
    the deadline."""
    for kill_at in itertools.count(started + every, every):
        await pause(kill_at - time.monotonic(), deadline)
        if time.monotonic() >= deadline:
            return
        killed = time.monotonic()
        tally.surviving_workers += await server.kill()
        await server.start()
        tally.restarts += 1
        tally.restart_seconds.append(time.monotonic() - killed)


async def report_progress(tally: Tally, started: float, deadline: float) -> None:
    while time.monotonic() < deadline:
        await pause(60, deadline)
        jobs = Counter(tally.job_status.values())
        print(f"{(time.monotonic() - started) / 60:5.1f} min: {len(tally.acknowledged):6d} votes acknowledged, "
              f"{sum(tally.refused.values())} refused, {tally.cut_off + tally.unreached} sent again, {tally.restarts} restarts, "
              f"reward-model jobs {dict(sorted(jobs.items()))}", flush=True)


async def soak(server: ServeProcess, tally: Tally, args: argparse.Namespace) -> None:
    await server.start()
    started, cpu = time.monotonic(), time.process_time()
    deadline = started + args.minutes * 60
    sessions = [GradioSession(server.url, annotator_name(i)) for i in range(args.annotators)]
    operator = GradioSession(server.url, OPERATOR)
    hostile = [GradioSession(server.url, hostile_name(i)) for i in range(args.hostile)]
    try:
        # A TaskGroup: if one fails (the server does not come back), the others are cancelled.
        # The timeout ends a run that hangs (a server that answers nothing) instead of waiting forever.
        async with asyncio.timeout(args.minutes * 60 + 300), asyncio.TaskGroup() as group:
            for session in sessions:
                group.create_task(annotate(session, tally, deadline, args.vote_seconds))
            for session in hostile:
                group.create_task(attack(session, tally, deadline))
            group.create_task(keep_training(operator, tally, deadline))
            group.create_task(restart_periodically(server, tally, args.restart_every, started, deadline))
            group.create_task(report_progress(tally, started, deadline))
    finally:
        for session in [*sessions, operator, *hostile]:
            await session.close()
        tally.seconds, tally.client_cpu_seconds = time.monotonic() - started, time.process_time() - cpu


# ---- the verdict, from the database ----

@dataclass
class Verdict:
    stored: int
    missing: list[tuple[str, str]]
    duplicate_tokens: int
    duplicate_votes: int  # (annotator, pair) voted more than once
    over_voted_pairs: int  # more votes than the pair wanted
    stored_unacknowledged: int
    stored_by_hostile: int  # votes of the hostile annotators, who never send a well-formed same-site vote
    jobs: list[tuple[int, str, str | None]]  # reward-model jobs: id, status, error

    @property
    def duplicates(self) -> int:
        return self.duplicate_tokens + self.duplicate_votes + self.over_voted_pairs


def check_database(path: Path, acknowledged: list[tuple[str, str]]) -> Verdict:
    with closing(open_database(path)) as con:
        votes = con.execute("SELECT client_token, annotator, pair_id FROM comparisons WHERE source = 'app'").fetchall()
        by_hostile = con.execute("SELECT count(*) FROM comparisons WHERE annotator LIKE 'hostile%'").fetchone()[0]
        over_voted = con.execute(
            """
            SELECT count(*) FROM pairs p
            JOIN (SELECT pair_id, count(*) AS n FROM comparisons WHERE source <> 'ai' GROUP BY pair_id) c ON c.pair_id = p.id  -- as the queue counts
            WHERE c.n > p.votes_wanted
            """
        ).fetchone()[0]
        jobs = con.execute("SELECT id, status, error FROM jobs WHERE kind = 'reward_model' ORDER BY id").fetchall()
    stored = {(token, annotator) for token, annotator, _ in votes if not annotator.startswith("hostile")}
    acknowledged_set = set(acknowledged)
    return Verdict(
        stored=len(votes) - by_hostile,
        missing=[vote for vote in acknowledged_set if vote not in stored],
        duplicate_tokens=sum(n - 1 for n in Counter(token for token, _, _ in votes).values()),
        duplicate_votes=sum(n - 1 for n in Counter((annotator, pair_id) for _, annotator, pair_id in votes).values()),
        over_voted_pairs=over_voted,
        stored_unacknowledged=len(stored - acknowledged_set),
        stored_by_hostile=by_hostile,
        jobs=jobs,
    )


def print_report(tally: Tally, verdict: Verdict, args: argparse.Namespace) -> None:
    interrupted = [job_id for job_id, status, error in verdict.jobs if status == "failed" and (error or "").startswith(INTERRUPTED)]
    recovered = [job_id for job_id in interrupted if any(j > job_id and status == "done" for j, status, _ in verdict.jobs)]
    other_failures = [(job_id, error) for job_id, status, error in verdict.jobs if status == "failed" and job_id not in interrupted]
    statuses = Counter(status for _, status, _ in verdict.jobs)
    rows = [
        ("votes acknowledged", len(set(tally.acknowledged))),
        ("votes stored", verdict.stored),
        ("acknowledged votes missing (must be 0)", len(verdict.missing)),
        ("duplicates (must be 0)", verdict.duplicates),
        ("  same token stored twice", verdict.duplicate_tokens),
        ("  same annotator and pair twice", verdict.duplicate_votes),
        ("  pairs with more votes than wanted", verdict.over_voted_pairs),
        ("votes stored, never acknowledged", verdict.stored_unacknowledged),
        ("honest votes refused by the app (must be 0)", sum(tally.refused.values())),
        ("hostile requests refused", sum(tally.hostile_refused.values())),
        ("hostile requests accepted (must be 0)", sum(tally.hostile_accepted.values())),
        ("votes stored from hostile annotators (must be 0)", verdict.stored_by_hostile),
        ("votes cut off by a kill, sent again", tally.cut_off),
        ("  of them acknowledged", tally.cut_off_acknowledged),
        ("votes that found the server down or new, sent again", tally.unreached),
        ("CPU of the clients (this script), % of a core", f"{100 * tally.client_cpu_seconds / tally.seconds:.0f}"),
        ("restarts (kill -9)", tally.restarts),
        ("seconds from kill to answering, max", f"{max(tally.restart_seconds, default=0):.1f}"),
        ("job workers outliving their server", tally.surviving_workers),
        (f"vote latency p50 / p99 (ms, {len(tally.vote_ms)} calls)", _latency(tally.vote_ms)),
        (f"next_pair latency p50 / p99 (ms, {len(tally.next_ms)} calls)", _latency(tally.next_ms)),
        ("reward-model jobs", len(verdict.jobs)),
        ("  done", statuses["done"]),
        ("  failed by a restart", len(interrupted)),
        ("  of them recovered (a later job done)", len(recovered)),
        ("  failed otherwise", len(other_failures)),
        ("  cancelled (by the stop at the end)", statuses["cancelled"]),
    ]
    print(f"\n{args.annotators} annotators and {args.hostile} hostile, {args.minutes:g} min, "
          f"kill -9 every {args.restart_every:g} s, {os.cpu_count()} CPUs")
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value:>12}")
    for message, n in (tally.refused + tally.errors + tally.job_refusals).most_common(8):
        print(f"  {n:5d} x {message[:150]}")
    for job_id, error in other_failures[:3]:
        print(f"job {job_id} failed: {(error or '').splitlines()[0][:200]}")
    for kind, n in (tally.hostile_accepted + tally.hostile_refused).most_common():
        print(f"  hostile {kind}: {tally.hostile_refused[kind]} refused, {tally.hostile_accepted[kind]} accepted")
    for token, annotator in verdict.missing[:5]:
        print(f"missing: {annotator}'s vote {token}")


def _latency(values: list[float]) -> str:
    return f"{percentile(values, 50):.0f} / {percentile(values, 99):.0f}" if values else "n/a"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--annotators", type=int, default=32, help="annotators voting at once, each its own session")
    parser.add_argument("--minutes", type=float, default=20, help="how long the annotators vote")
    parser.add_argument("--restart-every", type=float, default=240, help="seconds between kill -9 restarts of the server")
    parser.add_argument("--hostile", type=int, default=0, help="hostile annotators sending malformed and cross-site votes throughout")
    parser.add_argument("--pairs", type=int, help="pairs in the project (default: enough for every annotator at the fastest pace)")
    parser.add_argument("--vote-seconds", default="3,10",
                        help="LOW,HIGH: each annotator waits a uniformly drawn time in this range before each vote")
    parser.add_argument("--project", type=Path, help="create the project here and keep it (default: a temporary directory)")
    parser.add_argument("--model", help="the project's model, a directory or Hugging Face id (default: a tiny random Llama, made in the project)")
    args = parser.parse_args()
    args.vote_seconds = tuple(float(s) for s in args.vote_seconds.split(","))
    if args.pairs is None:
        args.pairs = int(args.annotators * args.minutes * 60 / args.vote_seconds[0]) + args.annotators
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so `finally` blocks stop the server on kill too
    # Started as `cmd &`, this process ignores SIGINT; a handler is not inherited.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    with tempfile.TemporaryDirectory(prefix="tether-soak-") as tmp:
        root = args.project or Path(tmp) / "project"
        root.mkdir(parents=True, exist_ok=True)
        try:
            project = make_project(root, args.model or tiny_model(root / "tiny-llama"), args.pairs, args.annotators, args.hostile)
        except ProjectError as e:
            sys.exit(str(e))
        print(f"project {project.root}: {args.pairs} pairs, {args.annotators} annotators; server log in serve.log", flush=True)
        server = ServeProcess(project.root, free_port())
        tally = Tally()
        try:
            asyncio.run(soak(server, tally, args))
        except KeyboardInterrupt:
            sys.exit("interrupted: the server is stopped and no verdict is given")
        finally:
            server.stop()
        verdict = check_database(project.database_path, tally.acknowledged)
        print_report(tally, verdict, args)
    if verdict.missing or verdict.duplicates or tally.refused or tally.hostile_accepted or verdict.stored_by_hostile:
        sys.exit(1)


if __name__ == "__main__":
    main()
