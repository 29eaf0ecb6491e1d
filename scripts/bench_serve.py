"""Annotators served by a real `tether serve`: votes/s, latency and server CPU per vote, 10k to 1M pairs.

For each size in --pairs (one pair per prompt, a fifth of them wanting two votes) the script starts
`tether serve`, signs in --annotators annotators, then runs a closed loop (each votes on the pair
in the last reply as soon as it comes, for --closed-seconds: what the server can take) and an open
loop (each waits U(3, 10) s before each vote, for --open-seconds: the clients set the rate, and the
latency is what a person waits from a vote to the next pair, which comes in the vote's reply).
At --main-pairs, the size the targets name, one real Chromium annotator also votes by key press
during the open loop, each press timed in the page from keydown to the next pair painted; and the
open loop runs again on a project with the tests' tiny model while the operator keeps a
reward-model job queued or running. The ceiling is DuckDB's rate of single-row INSERT
transactions into `comparisons`.

The annotators are coroutines here speaking Gradio's HTTP API with httpx: one POST
/gradio_api/run/NAME per vote, as a browser sends an unqueued event. A vote counts when its reply
has an empty message line; refusals are counted apart. Server CPU is the server process's
utime+stime (all threads; not a job's worker) over the load phase; client CPU is this process's,
as % of a core, since clients and server share the machine.

Projects are built through the store once per size (1M pairs take minutes) and cached under
--cache (git-ignored); each run votes in a temporary copy, with the accounts added there.

    .venv/bin/python scripts/bench_serve.py
    .venv/bin/python scripts/bench_serve.py --pairs 2000 --main-pairs 2000 --annotators 8 \\
        --closed-seconds 10 --open-seconds 15 --browser-votes 5        # a quick check
"""

import argparse
import asyncio
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

from annotate.pairs import add_completions_with_pairs
from annotate.queue import QueueConfig
from annotate.simulate import cast_votes
from store import open_database, transaction
from store.completions import NewCompletion
from store.db import utcnow
from store.prompt_files import NewPrompt
from store.prompts import add_prompts
from store.users import add_user
from ui.owner.auth import hash_password
from ui.owner.project import DATABASE_FILE, init_project

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "password-123"
OPERATOR, BROWSER = "operator", "browser"
VOTES = ("vote_left", "vote_right", "vote_tie", "vote_both_bad")
STRENGTHS = (None, "slightly better", "much better")
HUMAN_PACE = (3.0, 10.0)  # seconds an open-loop annotator waits before each vote
BUILD_CHUNK = 50_000  # prompts per transaction while building: bounded memory, and a progress line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def annotator_name(i: int) -> str:
    return f"annotator{i:02d}"


# ---- projects ----

def cached_project(cache: Path, pairs: int, with_model: bool = False) -> Path:
    """The cached project of this size, built first if missing (under another name until complete)."""
    path = cache / f"{'tiny-model-' if with_model else ''}pairs-{pairs}"
    if not path.exists():
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        project = init_project(partial, tiny_model(cache / "tiny-llama") if with_model else None)
        started = time.monotonic()
        with closing(project.connect()) as con:
            for first in range(0, pairs, BUILD_CHUNK):
                size = min(BUILD_CHUNK, pairs - first)
                add_prompts(con, [NewPrompt([{"role": "user", "content": f"question {i}"}], "bench") for i in range(first, first + size)])
                ids = sorted(row[0] for row in con.execute("SELECT id FROM prompts ORDER BY id DESC LIMIT ?", [size]).fetchall())
                completions = [NewCompletion(pid, 0, f"answer {k} to question {pid}", 5, True, {}) for pid in ids for k in range(2)]
                add_completions_with_pairs(con, completions, QueueConfig(overlap_share=0.2))
                print(f"\rbuilding {path.name}: {first + size:,} of {pairs:,} pairs, {time.monotonic() - started:.0f} s", end="", flush=True)
        print()
        partial.rename(path)
    return path


def tiny_model(path: Path) -> str:
    """The tests' 2-layer random Llama with a ChatML tokenizer (made once): a reward-model job on it takes seconds."""
    if not path.exists():
        sys.path.insert(0, str(ROOT))  # tests/ is no installed package
        from tests.conftest import CHATML, save_tiny_llama, train_tokenizer

        tokenizer = train_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos_token="<|im_end|>",
                                    pad_token="<|endoftext|>", chat_template=CHATML)
        save_tiny_llama(path, tokenizer)
    return str(path.resolve())


def coin_judge(prompt: str, text: str) -> float:
    """A judge to whom every answer is as good: a noiseless simulated annotator flips a coin."""
    return 0.0


def copy_project(cached: Path, root: Path, annotators: int, seed_votes: int = 0) -> Path:
    """A copy to vote in, with annotator00.., the browser's account and an operator, and `seed_votes` votes
    by simulated annotators flipping a coin (a reward-model job needs some to train on)."""
    shutil.copytree(cached, root)
    password_hash = hash_password(PASSWORD)  # one hash for all: each sign-in still verifies it
    names = [annotator_name(i) for i in range(annotators)]
    with closing(open_database(root / DATABASE_FILE)) as con:
        for name in [*names, BROWSER, OPERATOR]:
            add_user(con, name, "operator" if name == OPERATOR else "annotator", password_hash, "bench_serve", utcnow())
        cast_votes(lambda fn, *args: fn(con, *args), QueueConfig(), coin_judge, 0.0, names, seed_votes, random.Random())
    return root


# ---- the server ----

class ServeProcess:
    """`tether serve` for the length of a `with` block; stopped with SIGINT, killed if it lingers."""

    def __init__(self, project: Path):
        self.project, self.port = project, free_port()
        self.url, self.log = f"http://127.0.0.1:{self.port}", project / "serve.log"

    def __enter__(self) -> "ServeProcess":
        tether = Path(sys.executable).parent / "tether"
        # Its own session: a Ctrl-C in the terminal reaches only this script, which stops the server once.
        with self.log.open("w") as log:
            self.process = subprocess.Popen([str(tether), "serve", "--project", str(self.project), "--port", str(self.port)],
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 600  # a big project's queue takes a while to load
            while self.process.poll() is None and time.monotonic() < deadline:
                try:
                    httpx.get(self.url, timeout=2)
                    return self
                except httpx.TransportError:
                    time.sleep(0.2)
            raise RuntimeError(f"tether serve did not start; the end of its log:\n{self.log.read_text()[-3000:]}")
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc) -> None:
        if exc and exc[0] is not None:
            print(f"the end of the server's log:\n{self.log.read_text()[-3000:]}", file=sys.stderr)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # the app shuts down cleanly on it
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # A job's worker dies with its server, a moment later; one that outlives it is still this run's to end.
        time.sleep(0.5)
        found = subprocess.run(["pgrep", "-f", f"train\\.worker {self.project}/jobs/"], capture_output=True, text=True)
        for pid in found.stdout.split():
            os.kill(int(pid), signal.SIGKILL)

    def cpu_seconds(self) -> float:
        """User plus system CPU of the server so far, all its threads, from /proc (Linux)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- annotators over Gradio's HTTP API ----

class AppError(Exception):
    """An HTTP error reply: a gr.Error is a 500 with {"error": message}; a signed-out call a 401."""


class Session:
    """What a browser tab holds: a sign-in cookie, a session_hash, and the view last shown."""

    def __init__(self, url: str, name: str):
        self.name = name
        # Generous: 64 sign-ins at once, an scrypt hash each, on a small machine.
        # keepalive_expiry under uvicorn's 5 s: a connection it has closed is never reused (a ReadError otherwise).
        self.http = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=10), limits=httpx.Limits(keepalive_expiry=2))
        # Fixed for the session, as in a browser: without one Gradio rebuilds every component's config per request.
        self.session_hash = secrets.token_hex(6)
        self.view: list = []  # [token, prompt, left, right, progress, message, strength, comment]

    async def sign_in(self) -> None:
        response = await self.http.post("/login", data={"username": self.name, "password": PASSWORD})
        if response.status_code != 200:
            raise RuntimeError(f"sign-in refused for {self.name}: {response.status_code} {response.text[:200]}")

    async def call(self, api_name: str, data: list) -> list:
        response = await self.http.post(f"/gradio_api/run/{api_name}", json={"data": data, "session_hash": self.session_hash})
        if response.status_code != 200:
            raise AppError(f"{api_name}: HTTP {response.status_code} {response.text[:200]}")
        return response.json()["data"]


@dataclass
class Training:
    """What the operator saw of the reward-model jobs during a phase."""

    polls: int = 0
    polls_running: int = 0  # polls that found a job running
    queued: int = 0
    refusals: Counter = field(default_factory=Counter)


@dataclass
class Row:
    """A load phase, one line of the table."""

    pairs: int
    load: str
    annotators: str
    votes: int = 0
    vote_ms: list[float] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)  # replies with a message instead of a stored vote, by message
    errors: Counter = field(default_factory=Counter)  # HTTP error replies, by text
    out_of_pairs: int = 0  # annotators who were served no pair, and stopped
    seconds: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    browser: "BrowserAnnotator | None" = None
    training: Training | None = None
    stop_at: float = 0.0  # when the annotators stop, once the browser (if any) is done too
    done: list = field(default_factory=list)  # tasks they wait for: the browser's

    def over(self) -> bool:
        return time.monotonic() >= self.stop_at and all(task.done() for task in self.done)

    async def pause(self, seconds: float) -> None:
        """Sleep, but not past the end: an annotator idling after it would stretch the wall time."""
        if all(task.done() for task in self.done):
            seconds = min(seconds, max(0.0, self.stop_at - time.monotonic()))
        await asyncio.sleep(seconds)

    def latency(self, q: int) -> float:
        return percentile(self.vote_ms, q) if self.vote_ms else float("nan")

    @property
    def votes_per_s(self) -> float:
        return self.votes / self.seconds

    @property
    def server_ms_per_vote(self) -> float:
        return 1000 * self.server_cpu / self.votes if self.votes else float("nan")


async def vote_loop(session: Session, row: Row, paced: bool) -> None:
    """Vote on the pair on screen (after a human pause when paced) and take the next from the reply, until the end."""
    while not row.over():
        if not session.view[0]:  # no pair waiting for this annotator
            row.out_of_pairs += 1
            return
        if paced:
            await row.pause(random.uniform(*HUMAN_PACE))
            if row.over():
                return
        start = time.perf_counter()
        try:
            view = await session.call(random.choice(VOTES), [session.view[0], random.choice(STRENGTHS), ""])
        except AppError as e:
            row.errors[str(e)] += 1
            session.view = await session.call("next_pair", [])
            continue
        row.vote_ms.append((time.perf_counter() - start) * 1000)
        if view[5]:  # refused (the lease ran out, not yours...): the reply shows a pair and says why
            row.refused[view[5]] += 1
        else:
            row.votes += 1
        session.view = view


async def run_phase(server: ServeProcess, sessions: list[Session], row: Row, seconds: float, paced: bool,
                    browser: "BrowserAnnotator | None" = None, operator: Session | None = None) -> Row:
    row.stop_at, row.browser = time.monotonic() + seconds, browser
    start, client_cpu, server_cpu = time.perf_counter(), time.process_time(), server.cpu_seconds()
    async with asyncio.TaskGroup() as group:  # one failing cancels the others
        if browser:
            row.done.append(group.create_task(browser.vote_by_keys()))
        if operator:
            group.create_task(keep_training(operator, row))
        for session in sessions:
            group.create_task(vote_loop(session, row, paced))
    row.seconds = time.perf_counter() - start
    row.client_cpu, row.server_cpu = time.process_time() - client_cpu, server.cpu_seconds() - server_cpu
    row.votes += browser.stored if browser else 0  # served like the others: they count in votes/s and CPU per vote
    return row


# ---- a reward-model job training meanwhile ----

async def job_statuses(operator: Session) -> list[str]:
    table = (await operator.call("jobs", []))[0]
    return [status for _, kind, status, *_ in table["data"] if kind == "reward_model"]


async def start_training(operator: Session) -> None:
    """Queue a job, then wait (a minute at most) until its worker runs, so the phase starts with one training."""
    await operator.call("train_reward_model", [False])
    deadline = time.monotonic() + 60
    while "running" not in await job_statuses(operator) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


async def keep_training(operator: Session, row: Row) -> None:
    """Queue another job whenever none is queued or running; count the polls that found one running."""
    while not row.over():
        statuses = await job_statuses(operator)
        row.training.polls += 1
        row.training.polls_running += "running" in statuses
        if not {"queued", "running"} & set(statuses):
            try:
                await operator.call("train_reward_model", [False])
                row.training.queued += 1
            except AppError as e:  # nothing new to train on, say
                row.training.refusals[str(e)] += 1
        await row.pause(2)


# ---- a real browser ----

# Installed in the page: timestamps the keydown (capture phase, before the app's own listener clicks
# the button), then the first moment the prompt and both sides all show new text; requestAnimationFrame
# then setTimeout lands just after that frame is painted. Only the app's .tether-text is compared:
# Gradio's (transparent) status tracker in the same elements changes its text while a call is out.
PAINT_TIMER_JS = r"""() => {
  const ids = ["prompt", "side-a", "side-b"];
  const texts = () => ids.map(id => [...document.querySelectorAll(`#${id} .tether-text`)].map(e => e.textContent).join("\n"));
  const votes = () => Number((document.getElementById("progress").innerText.match(/(\d+) votes? today/) || [0, -1])[1]);
  const state = window.benchPaint = {shown: [], pressed: null, before: null, votes};
  window.addEventListener("keydown", () => { state.pressed = performance.now(); state.before = texts(); }, true);
  const observer = new MutationObserver(() => {
    if (state.pressed === null || !texts().every((text, i) => text && text !== state.before[i])) return;
    const pressed = state.pressed;
    state.pressed = null;
    requestAnimationFrame(() => setTimeout(() => state.shown.push({ms: performance.now() - pressed, votes: votes()}), 0));
  });
  for (const id of ids) observer.observe(document.getElementById(id), {childList: true, subtree: true, characterData: true});
}"""


class BrowserAnnotator:
    """Chromium, signed in through the login form, voting by key press ('1': A is better, '2': B)."""

    def __init__(self, url: str, votes: int):
        self.url, self.votes = url, votes
        self.paint_ms: list[float] = []
        self.stored = self.refused = self.no_new_pair = 0
        self.browser = None

    async def __aenter__(self) -> "BrowserAnnotator":
        from playwright.async_api import async_playwright  # only when asked for: a test dependency

        self.playwright = await async_playwright().start()
        try:
            self.browser = await self.playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            self.page = await self.browser.new_page(viewport={"width": 1280, "height": 900})
            self.page.set_default_timeout(60_000)
            await self.page.goto(self.url)
            await self.page.get_by_label("username").fill(BROWSER)
            await self.page.get_by_label("password").fill(PASSWORD)
            await self.page.get_by_role("button", name="Login").click()
            await self.page.locator("#side-a .tether-text").wait_for()
            await self.page.evaluate(PAINT_TIMER_JS)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        if self.browser:
            await self.browser.close()
        await self.playwright.stop()

    async def vote_by_keys(self) -> None:
        """Press a vote key, wait for the next pair painted, keep its time and whether the vote count went up."""
        for _ in range(self.votes):
            await self.page.evaluate("document.activeElement && document.activeElement.blur()")  # keys go to the page
            seen, votes = await self.page.evaluate("[benchPaint.shown.length, benchPaint.votes()]")
            await self.page.keyboard.press(random.choice("12"))
            try:
                await self.page.wait_for_function(f"benchPaint.shown.length > {seen}", timeout=10_000)
            except Exception:  # playwright's TimeoutError: no new pair came
                self.no_new_pair += 1
                await self.page.evaluate("benchPaint.pressed = null")
                continue
            shown = await self.page.evaluate(f"benchPaint.shown[{seen}]")
            self.paint_ms.append(shown["ms"])
            self.stored += shown["votes"] == votes + 1
            self.refused += shown["votes"] != votes + 1  # a refusal shows another pair and says why
            await asyncio.sleep(1)


# ---- the runs ----

async def load_server(server: ServeProcess, args: argparse.Namespace, pairs: int, browser: bool, training: bool) -> list[Row]:
    """Sign everyone in (not measured), then the closed and open loops, or the open loop with a job training."""
    sessions = [Session(server.url, annotator_name(i)) for i in range(args.annotators)]
    operator = Session(server.url, OPERATOR)
    n, rows = str(args.annotators), []
    try:
        # A few at a time: the server counts sign-ins in flight from one address against its per-address limit.
        signing_in = asyncio.Semaphore(8)

        async def sign_in(session: Session) -> None:
            async with signing_in:
                await session.sign_in()

        await asyncio.gather(*(sign_in(s) for s in [*sessions, operator]))
        for session, view in zip(sessions, await asyncio.gather(*(s.call("next_pair", []) for s in sessions))):
            session.view = view
        if training:
            await start_training(operator)
            row = Row(pairs, "open loop + RM job", n, training=Training())
            return [await run_phase(server, sessions, row, args.open_seconds, paced=True, operator=operator)]
        rows.append(await run_phase(server, sessions, Row(pairs, "closed loop", n), args.closed_seconds, paced=False))
        if not browser:
            return rows + [await run_phase(server, sessions, Row(pairs, "open loop", n), args.open_seconds, paced=True)]
        async with BrowserAnnotator(server.url, args.browser_votes) as chromium:  # signed in before the phase too
            row = Row(pairs, "open loop + browser", f"{n}+1")
            return rows + [await run_phase(server, sessions, row, args.open_seconds, paced=True, browser=chromium)]
    finally:
        for session in [*sessions, operator]:
            await session.http.aclose()


def insert_ceiling(path: Path, rows: int) -> float:
    """Rows/s of single-row INSERTs into comparisons, each in its own transaction."""
    with closing(open_database(path)) as con:
        now = datetime.now()
        start = time.perf_counter()
        for i in range(rows):
            with transaction(con):
                con.execute(
                    """
                    INSERT INTO comparisons (pair_id, annotator, choice, strength, comment, elapsed_ms, client_token, source, created_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                    [i, "annotator00", "a", None, None, 1000, f"token-{i}", "app", now],
                )
        return rows / (time.perf_counter() - start)


# ---- the report ----

def print_table(rows: list[Row], ceiling: float, jobs: Counter) -> None:
    print(f"\n{'pairs':>9}  {'load':<19} {'annot.':>6} {'votes':>6} {'refused':>7} {'votes/s':>7} {'of ceiling':>10} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'server CPU ms/vote':>18} {'server CPU %':>12} {'client CPU %':>12}")
    for r in rows:
        share = f"{r.votes_per_s / ceiling:.4f}" if r.load == "closed loop" else ""
        print(f"{r.pairs:>9,}  {r.load:<19} {r.annotators:>6} {r.votes:>6} {sum(r.refused.values()):>7} {r.votes_per_s:>7.1f} "
              f"{share:>10} {r.latency(50):>7.1f} {r.latency(99):>7.1f} {r.server_ms_per_vote:>18.2f} "
              f"{100 * r.server_cpu / r.seconds:>12.0f} {100 * r.client_cpu / r.seconds:>12.0f}")
    print(f"ceiling: {ceiling:,.0f} rows/s (raw DuckDB single-row INSERT transactions into comparisons)")
    for r in rows:
        for message, n in (r.refused + r.errors).most_common(3):
            print(f"  {r.pairs:,} {r.load}: {n} x {message[:150]}")
        if r.out_of_pairs:
            print(f"  {r.pairs:,} {r.load}: {r.out_of_pairs} annotators ran out of pairs")
        if b := r.browser:
            figures = f"p50 {percentile(b.paint_ms, 50):.0f} ms, p95 {percentile(b.paint_ms, 95):.0f} ms" if b.paint_ms else "none"
            print(f"browser at {r.pairs:,} pairs, {len(b.paint_ms)} key presses, keydown to the next pair painted: {figures} "
                  f"({b.stored} votes stored, {b.refused} refused, {b.no_new_pair} presses showed no new pair)")
        if t := r.training:
            print(f"reward-model job running during the phase: {'yes' if t.polls_running else 'NO'} (running in "
                  f"{t.polls_running} of {t.polls} polls); {t.queued} more queued in the phase; jobs at the end: {dict(jobs)}; "
                  "a job's worker process is not in the server CPU figures")
            for message, n in t.refusals.most_common(2):
                print(f"  {n} x train_reward_model refused: {message[:150]}")


def print_targets(rows: list[Row], main: int) -> None:
    closed = {r.pairs: r for r in rows if r.load == "closed loop"}
    opened = [r for r in rows if r.load in ("open loop", "open loop + browser")]
    with_job = next((r for r in rows if r.load == "open loop + RM job"), None)
    browser_ms = next((r.browser.paint_ms for r in rows if r.browser), [])
    at_main, smallest, largest = closed.get(main), closed[min(closed)], closed[max(closed)]

    def check(target: str, value: float | None, good, unit: str) -> None:
        verdict = "not measured" if value is None else "met" if good(value) else "NOT met"
        print(f"  {target:<62} {'' if value is None else f'{value:.1f} {unit}':>14}  {verdict}")

    print(f"\ntargets ({os.cpu_count()} CPUs, shared by the server, the clients and the browser):")
    check(f"server CPU per vote cycle <= 15 ms at {main:,} pairs (closed loop)",
          at_main and at_main.server_ms_per_vote, lambda v: v <= 15, "ms")
    check("open loop p99 < 50 ms (worst size)", max((r.latency(99) for r in opened), default=None), lambda v: v < 50, "ms")
    check("open loop p99 < 50 ms with the reward-model job", with_job and with_job.latency(99), lambda v: v < 50, "ms")
    check(f"closed loop >= 100 votes/s at {main:,} pairs", at_main and at_main.votes_per_s, lambda v: v >= 100, "votes/s")
    check(f"CPU/vote growth <= 2x from {smallest.pairs:,} to {largest.pairs:,} pairs (closed loop)",
          largest.server_ms_per_vote / smallest.server_ms_per_vote if largest is not smallest else None, lambda v: v <= 2, "x")
    check("browser p95 < 150 ms (keydown to next pair painted)",
          percentile(browser_ms, 95) if browser_ms else None, lambda v: v < 150, "ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="10000,100000,1000000", help="comma-separated project sizes, in pairs")
    parser.add_argument("--main-pairs", type=int, default=100000,
                        help="one of --pairs: the size the targets name, where the browser and the reward-model job run")
    parser.add_argument("--annotators", type=int, default=64, help="annotators voting at once, each its own session")
    parser.add_argument("--closed-seconds", type=float, default=20, help="length of each closed-loop phase")
    parser.add_argument("--open-seconds", type=float, default=60, help="length of each open-loop phase")
    parser.add_argument("--browser", action=argparse.BooleanOptionalAction, default=True,
                        help="one Chromium annotator voting by key press in the open loop at --main-pairs")
    parser.add_argument("--browser-votes", type=int, default=40, help="key presses the browser annotator makes")
    parser.add_argument("--training", action=argparse.BooleanOptionalAction, default=True,
                        help="the open loop at --main-pairs once more, with a reward-model job training")
    parser.add_argument("--seed-votes", type=int, default=200, help="votes stored before that run, for the job to train on")
    parser.add_argument("--insert-rows", type=int, default=2000, help="rows for the raw DuckDB insert ceiling")
    parser.add_argument("--cache", type=Path, default=ROOT / ".bench" / "serve-projects", help="where built projects are kept")
    args = parser.parse_args()
    sizes = [int(n) for n in args.pairs.split(",")]
    if args.main_pairs not in sizes:
        parser.error(f"--main-pairs {args.main_pairs} is not one of --pairs {args.pairs}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so `finally` blocks stop the server on kill too
    signal.signal(signal.SIGINT, signal.default_int_handler)  # started as `cmd &`, SIGINT would be ignored

    args.cache.mkdir(parents=True, exist_ok=True)
    rows, jobs = [], Counter()
    with tempfile.TemporaryDirectory(prefix="tether-bench-serve-") as tmp:
        ceiling = insert_ceiling(Path(tmp) / "ceiling.duckdb", args.insert_rows)
        print(f"raw DuckDB: {ceiling:,.0f} single-row INSERT transactions/s", flush=True)
        runs = [(pairs, False) for pairs in sizes] + [(args.main_pairs, True)] * args.training
        for pairs, training in runs:
            cached = cached_project(args.cache, pairs, with_model=training)
            root = copy_project(cached, Path(tmp) / f"{cached.name}-run", args.annotators, args.seed_votes if training else 0)
            with ServeProcess(root) as server:
                browser = args.browser and pairs == args.main_pairs and not training
                found = asyncio.run(load_server(server, args, pairs, browser, training))
            if training:
                with closing(open_database(root / DATABASE_FILE)) as con:
                    jobs = Counter(dict(con.execute("SELECT status, count(*) FROM jobs WHERE kind = 'reward_model' GROUP BY status").fetchall()))
            rows += found
            print(" · ".join(f"{pairs:,} {r.load}: {r.votes} votes, {r.votes_per_s:.1f}/s" for r in found), flush=True)
    print_table(rows, ceiling, jobs)
    print_targets(rows, args.main_pairs)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted: servers stopped, temporary copies removed")
