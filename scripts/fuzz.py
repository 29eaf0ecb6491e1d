"""Fuzzer of the whole surface: every function the app serves, the control route, sign-in and files, called by every
kind of caller with values drawn by Hypothesis, while honest annotators vote beside it.

The endpoints come from the running app itself: each function in Gradio's /config (named or private, called by name and
by its index, as a browser's queue does), each action of the control route's table (ui.owner.control), the sign-in and
the file routes; a new view is fuzzed without anyone adding it here. Each call is made as nobody, with a signed-out
session, as a disabled account, with an operator's expired session, as an annotator or as an operator (the control
route: with no token, a wrong one, or the server's own), with values drawn for its inputs' components: valid ones (a
radio's choices, a number in range, a real pair's token: one never served, another annotator's, one already answered),
JSON of any other type for any input (null, true and false, numbers, lists, objects, long text), alone among valid
values or beside others, missing and extra fields, huge and empty text, NUL and odd Unicode, NaN, infinities and
negative numbers, paths that climb out. One call in ten replays the latest call the app accepted, as it was sent: a
vote, skip or ranking sent again must store nothing more.

Each call holds the honest annotators back, waits until the server writes nothing of its own (a job an accepted call
started, a round the schedule started), and reads the database (every table's rows, hashed) and the project folder
before and after it: a refused call must change neither, and a caller with no account or no role for the function
must change nothing whatever the answer. Then a concurrent phase calls without holding them back. At the end: no 5xx
answer, no traceback in the server's log (a refusal is one line), every honest vote acknowledged is stored and none
refused, and the process's peak memory and CPU per call (server and clients together: an upper bound on the server's).
The exit status is 1 if any check failed.

    .venv/bin/python scripts/fuzz.py --calls 3000               # the long run; figures in BENCHMARKS.md
    .venv/bin/python scripts/fuzz.py --calls 200 --annotators 2  # a quick look

The project is on the tests' tiny random Llama; the server runs in this process, so that its database can be read
between calls (DuckDB lets one process open it).
"""

import argparse
import asyncio
import inspect
import json
import math
import os
import random
import resource
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter, defaultdict
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
from hypothesis import HealthCheck, given, seed, settings, strategies as st
from hypothesis.errors import HypothesisDeprecationWarning

from bench_serve import free_port
from soak import PASSWORD, GradioSession, Tally, annotate, annotator_name, check_database, make_project, tiny_model
from store.db import utcnow
from store.jobs import next_queued, running_job_ids
from store.rounds import running_round, scheduled_round_due
from store.users import add_user
from ui.owner import control
from ui.owner.auth import hash_password
from ui.owner.project import load_project
from ui.owner.server import Server
from ui.web.app import launch

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("nobody", "signed out", "disabled", "expired", "annotator", "operator")
# Who calls the app's functions: an account whose role reaches a function's handler more often than one refused at the
# door, which refuses it whatever it sends.
CALLERS = ROLES + ("annotator", "operator", "operator", "operator")
NO_ACCOUNT = ("nobody", "signed out", "disabled", "expired", "no token", "wrong token")
CONTROL_ROLES = ("no token", "wrong token", "token")
# What an annotator may change: the queue's functions. Any other function changes nothing unless an operator calls it.
ANNOTATOR_CALLS = {"next_pair", "skip", "rank", "vote_left", "vote_right", "vote_tie", "vote_both_bad"}
# What a vote, skip or ranking writes: sent again, it must write none of it again.
ANSWER_TABLES = {"comparisons", "skips", "rankings"}
# The fuzzer's accounts: named "hostile..." so that soak.check_database tells their votes from the honest annotators'.
FUZZ_ANNOTATOR, FUZZ_OPERATOR, DISABLED, SIGNED_OUT = "hostile-annotator", "hostile-operator", "hostile-disabled", "hostile-signed-out"
EXPIRED = "hostile-expired"  # an operator whose session outlived [server] session_hours
# Left alone between calls: the server's own files, and what a round or an export writes for the operator who asked.
OWN_FILES = {control.SERVER_FILE}


@dataclass(frozen=True)
class Endpoint:
    name: str  # the api_name, "control:<action>", "login", "upload" or "file"
    inputs: tuple[dict, ...] = ()  # Gradio: each input's component (type and props)
    fn_index: int | None = None
    private: bool = False


@dataclass(frozen=True)
class Call:
    """A Gradio call the app accepted, kept to send again as it was: a replay."""
    endpoint: Endpoint
    role: str
    sent: Any
    by_index: bool


@dataclass
class Figures:
    answers: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # endpoint -> outcome -> calls
    failures: list[str] = field(default_factory=list)
    calls: int = 0
    server_errors: int = 0  # answers 5xx, or none
    refused_writes: int = 0  # calls that changed the state they had no right to change: refused, or with no account
    other_typed: int = 0  # calls whose inputs were each of its component's type but one, JSON of another type


# ---- the surface, as the app describes it ----

def endpoints(config: dict) -> list[Endpoint]:
    components = {c["id"]: {"type": c["type"], "props": c.get("props", {})} for c in config["components"]}
    found = [Endpoint(d.get("api_name") or f"fn{d['id']}", tuple(components[i] for i in d["inputs"]), d["id"],
                      d.get("api_visibility") == "private")
             for d in config["dependencies"] if d.get("backend_fn")]
    actions = sorted(control.ACTIONS) + sorted(control.SERVER_ACTIONS) + ["no-such-action"]
    return found + [Endpoint(f"control:{a}") for a in actions] + [Endpoint("login"), Endpoint("upload"), Endpoint("file")]


# ---- values ----

ODD_TEXT = ["", "\x00", "a\x00b", "\u202e\u0000\ufeff", "💥" * 50, "../../../../etc/passwd", "<script>alert(1)</script>",
            "' OR 1=1; --", "\n".join(["refused forged: a line of the caller's"] * 3)]
HUGE = 1_000_000  # characters of the huge text: over [server] max_request_kb, which the app must refuse whole
LONG = 20_000  # characters of a long text that fits in [server] max_request_kb, so that it reaches the handler
TOKEN_CHOICES = 64  # more than the tokens a call is offered: the honest annotators' and the fuzzer's latest
NUMBERS = [0, -1, 2**63, -(2**63), 1e308, -1e308, math.nan, math.inf, -math.inf, 0.5]


def odd_text() -> st.SearchStrategy:
    return st.sampled_from(ODD_TEXT) | st.integers(1, HUGE).map(lambda n: "x" * n)


def other_json() -> st.SearchStrategy:
    """JSON of any type, whatever the input, each type as often: null, true or false, a number (a float, an integer, one
    at the edges), text (short, odd, long or huge), or a list or an object of such values. What a client other than
    the app's page may send."""
    scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.sampled_from(NUMBERS), st.text(max_size=40), odd_text())
    nested = st.recursive(scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                          max_leaves=8)
    return st.one_of(st.none(), st.booleans(), st.floats() | st.integers() | st.sampled_from(NUMBERS),
                     st.text(max_size=40) | odd_text() | st.integers(LONG // 2, LONG).map(lambda n: "y" * n),
                     st.lists(nested, max_size=4), st.dictionaries(st.text(max_size=8), nested, max_size=4))


def token_of(tokens: list[str]) -> st.SearchStrategy:
    """One of the pairs' tokens, by an index whose bounds stay the same as the tokens grow between calls: Hypothesis
    replays its draws, and refuses a strategy whose bounds changed on a path it took before."""
    return st.integers(0, TOKEN_CHOICES - 1).map(lambda i: tokens[i % len(tokens)] if tokens else "")


def value_for(component: dict, tokens: list[str]) -> st.SearchStrategy:
    """A value of the component's type, or JSON of any other."""
    return st.one_of(typed_value(component, tokens), typed_value(component, tokens), other_json())


def typed_value(component: dict, tokens: list[str]) -> st.SearchStrategy:
    """A value of the component's type, as the page sends: most often a valid one (a radio's choices, a pair's token)."""
    kind, props = component["type"], component["props"]
    choices = [c[1] if isinstance(c, (list, tuple)) else c for c in props.get("choices") or []]
    valid = {
        "textbox": st.text(max_size=60) | token_of(tokens) | odd_text(),
        "radio": st.sampled_from(choices or [None]),
        "dropdown": st.sampled_from(choices or [None]),
        "number": st.integers(-3, 50) | st.sampled_from(NUMBERS),
        "slider": st.floats(props.get("minimum") or 0, props.get("maximum") or 100) | st.sampled_from(NUMBERS),
        "checkbox": st.booleans(),
        "file": st.none() | st.builds(lambda p: {"path": p, "meta": {"_type": "gradio.FileData"}, "orig_name": "prompts.jsonl"},
                                      st.sampled_from(["/etc/passwd", "../tether.toml", "tether.duckdb", "/proc/self/environ"])),
    }.get(kind, st.nothing())
    return valid


def control_args(action: str) -> st.SearchStrategy:
    """Arguments of the control route's action: of the types it takes (accounts of the fuzzer's own, never an honest
    annotator's, whose password a valid call would change), or anything at all."""
    function = control.ACTIONS.get(action)
    if function is None:
        return st.lists(other_json(), max_size=4)
    kinds = {
        str: st.sampled_from([FUZZ_ANNOTATOR, DISABLED, SIGNED_OUT, "annotator", "operator", "owner", "backups/b1", "/proc/b"])
             | st.text(alphabet="abcxyz-/.", max_size=12) | odd_text(),
        int: st.integers() | st.sampled_from([0, -1, 2**63]),
        bool: st.booleans(),
    }
    typed = st.tuples(*[kinds.get(p.annotation, other_json()) for p in list(inspect.signature(function).parameters.values())[2:]]).map(list)
    return typed | st.lists(other_json(), max_size=5) | other_json()


@st.composite
def gradio_data(draw, endpoint: Endpoint, tokens: list[str]) -> tuple[Any, str]:
    """A call's data and its shape: each input as value_for draws it; or each of its component's type but one, JSON of
    another type, so that the handler meets it past the inputs before it; or too few inputs, too many, or no list."""
    shape = draw(st.sampled_from(["as is"] * 4 + ["one of another type"] * 2 + ["missing", "extra", "not a list"]))
    if shape == "one of another type" and endpoint.inputs:
        data = [draw(typed_value(c, tokens)) for c in endpoint.inputs]
        data[draw(st.integers(0, len(data) - 1))] = draw(other_json())
        return data, shape
    data = [draw(value_for(c, tokens)) for c in endpoint.inputs]
    if shape == "missing" and data:
        return data[:-1], shape
    if shape == "extra":
        return data + [draw(other_json())], shape
    if shape == "not a list":
        return draw(other_json()), shape
    return data, "as is"


# ---- calls ----

def as_json(body: Any, headers: dict | None = None) -> dict:
    """A JSON body as a client may send it: with NaN and Infinity, which Python's json reads and httpx will not write."""
    return {"content": json.dumps(body), "headers": (headers or {}) | {"Content-Type": "application/json"}}


class Callers:
    """One HTTP client per kind of caller, each with its own session cookie."""

    def __init__(self, url: str, control_token: str):
        self.control_token = control_token
        self.own_tokens: list[str] = []  # the pairs the queue served the fuzzer's annotator, to vote on out of order
        self.served: str | None = None
        self.annotating = False  # whether the call in flight is one of the annotate view's
        self.accepted: Call | None = None  # the latest call the app accepted from an account, to replay
        self.clients = {role: httpx.Client(base_url=url, timeout=120) for role in ROLES}
        # Sign-ins and control calls carry no session: a client of their own, its cookies cleared after each call. One
        # client for all: httpx loads a certificate store for each client it makes, about 30 ms of CPU.
        self.sessionless = httpx.Client(base_url=url, timeout=120)
        for role, name in [("signed out", SIGNED_OUT), ("disabled", DISABLED), ("expired", EXPIRED), ("annotator", FUZZ_ANNOTATOR),
                           ("operator", FUZZ_OPERATOR)]:
            signed = self.clients[role].post("/login", data={"username": name, "password": PASSWORD})
            assert signed.status_code == 200, (name, signed.status_code, signed.text)
        self.clients["signed out"].get("/logout")

    def close(self) -> None:
        for client in [*self.clients.values(), self.sessionless]:
            client.close()

    def gradio(self, role: str, endpoint: Endpoint, data: Any, by_index: bool) -> str:
        """The outcome: 'completed', 'refused' (the app's or Gradio's error), 'refused in words' (the annotate view's
        message line), or 'HTTP <code>'."""
        self.served = None
        self.annotating = endpoint.name in ANNOTATOR_CALLS
        outcome = self._gradio(self.clients[role], endpoint, data, by_index)
        if self.served and role == "annotator" and self.annotating:
            self.own_tokens.append(self.served)
        if outcome == "completed" and role in ("annotator", "operator"):
            self.accepted = Call(endpoint, role, data, by_index)
        return outcome

    def _gradio(self, client: httpx.Client, endpoint: Endpoint, data: Any, by_index: bool) -> str:
        if by_index:
            session = uuid.uuid4().hex
            joined = client.post("/gradio_api/queue/join", **as_json({"data": data, "fn_index": endpoint.fn_index,
                                                                     "session_hash": session, "event_data": None, "trigger_id": None}))
            if joined.status_code != 200:
                return f"HTTP {joined.status_code}"
            return self._stream(client, f"/gradio_api/queue/data?session_hash={session}", queue=True)
        queued = client.post(f"/gradio_api/call/{endpoint.name}", **as_json({"data": data}))
        if queued.status_code != 200:
            return f"HTTP {queued.status_code}"
        return self._stream(client, f"/gradio_api/call/{endpoint.name}/{queued.json()['event_id']}", queue=False)

    def _stream(self, client: httpx.Client, path: str, queue: bool) -> str:
        with client.stream("GET", path) as stream:
            if stream.status_code != 200:
                return f"HTTP {stream.status_code}"
            event = None
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and not queue and event in ("complete", "error"):
                    return self._answered(event == "complete", json.loads(line.removeprefix("data: ")))
                elif line.startswith("data: ") and queue:
                    message = json.loads(line.removeprefix("data: "))
                    if message.get("msg") == "process_completed":
                        return self._answered(message.get("success"), (message.get("output") or {}).get("data"))
                    if message.get("msg") == "close_stream":
                        break
        return "no answer"

    def _answered(self, completed: bool, output: Any) -> str:
        if not completed:
            return "refused"
        if self.annotating and isinstance(output, list) and len(output) > 5 and output[5]:
            return "refused in words"  # the annotate view's events are unqueued: it refuses in its message line
        if isinstance(output, list) and output and isinstance(output[0], str) and output[0]:
            self.served = output[0]  # where the call was one of the queue's, its view's first output: the pair's token
        return "completed"

    def control(self, role: str, action: str, body: Any) -> str:
        token = {"no token": None, "wrong token": "not-the-token", "token": self.control_token}[role]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answer = self._sessionless(control.ROUTE.format(action=action), **as_json(body, headers))
        return "completed" if answer.status_code == 200 else f"HTTP {answer.status_code}"

    def login(self, name: Any, password: Any) -> str:
        answer = self._sessionless("/login", data={"username": str(name), "password": str(password)})
        return "completed" if answer.status_code == 200 else f"HTTP {answer.status_code}"

    def _sessionless(self, path: str, **request) -> httpx.Response:
        try:
            return self.sessionless.post(path, **request)
        finally:
            self.sessionless.cookies.clear()

    def upload(self, role: str, content: bytes, name: str) -> str:
        answer = self.clients[role].post("/gradio_api/upload", files={"files": (name, content)})
        return "completed" if answer.status_code == 200 else f"HTTP {answer.status_code}"

    def file(self, role: str, path: str) -> str:
        answer = self.clients[role].get(f"/gradio_api/file={path}")
        return "completed" if answer.status_code == 200 else f"HTTP {answer.status_code}"


# ---- the state a refused call must leave alone ----

def fingerprint(server: Server) -> tuple:
    def tables(con) -> dict:
        names = [name for (name,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY table_name").fetchall()]
        return {name: con.execute(f'SELECT count(*), sum(hash("{name}")) FROM "{name}"').fetchall()[0] for name in names}

    root = server.project.root
    files = {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
             if p.is_file() and p.name not in OWN_FILES and not p.name.startswith("tether.duckdb")}
    return server.db(tables), files


def wait_until_quiet(server: Server, seconds: float = 600) -> None:
    """Until the server writes nothing of its own (twice in a row): no job queued or running, no round running, and no
    round the schedule is due to start. A job an accepted call started, or a round the votes made due, writes as it goes."""
    def busy(con) -> bool:
        return (next_queued(con) is not None or bool(running_job_ids(con)) or running_round(con) is not None
                or scheduled_round_due(con, server.project.config.round.every_comparisons))

    deadline, idle = time.monotonic() + seconds, 0
    while idle < 2 and time.monotonic() < deadline:
        idle = 0 if server.db(busy) else idle + 1
        time.sleep(0.2)


def expire_sessions(server: Server, account: str) -> None:
    """Age the account's sessions past [server] session_hours, as if that long had passed since it signed in."""
    sessions = server.sessions
    with sessions._lock:
        for token, (name, signed_in_at) in list(sessions._sessions.items()):
            if name == account:
                sessions._sessions[token] = name, signed_in_at - sessions.max_age


def changed(before: tuple, after: tuple) -> str:
    tables = sorted(t for t in set(before[0]) | set(after[0]) if before[0].get(t) != after[0].get(t))
    files = sorted(f for f in set(before[1]) | set(after[1]) if before[1].get(f) != after[1].get(f))
    return ", ".join([f"table {t}" for t in tables] + [f"file {f}" for f in files])


# ---- the run ----

@contextmanager
def server_log(path: Path) -> Iterator[None]:
    """The server's log (this process's stderr) into `path` while the app serves."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("a") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


class Honest:
    """Honest annotators voting in a thread of their own (soak.annotate), each vote made while holding `lock`."""

    def __init__(self, url: str, annotators: int, lock: threading.Lock):
        self.tally, self.lock = Tally(), lock
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.sessions = [LockedSession(url, annotator_name(i), lock) for i in range(annotators)]
        self.tasks = [asyncio.run_coroutine_threadsafe(annotate(s, self.tally, math.inf, (0.05, 0.3)), self.loop) for s in self.sessions]

    def tokens(self) -> list[str]:
        return [token for token, _ in self.tally.acknowledged[-20:]]

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for session in self.sessions:
            asyncio.run_coroutine_threadsafe(session.close(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


class LockedSession(GradioSession):
    def __init__(self, url: str, name: str, lock: threading.Lock):
        super().__init__(url, name)
        self.lock = lock

    async def call(self, api_name: str, data: list) -> list:
        await asyncio.to_thread(self.lock.acquire)
        try:
            return await super().call(api_name, data)
        finally:
            self.lock.release()


def fuzz(server: Server, callers: Callers, surface: list[Endpoint], honest: Honest, figures: Figures, calls: int,
         hold: bool, run_seed: int) -> None:
    """`calls` calls drawn by Hypothesis, and after about one in ten of them the latest accepted call replayed; with
    `hold`, each alone (the honest annotators wait) and the state compared."""
    lock = honest.lock if hold else threading.Lock()
    # Whether to replay is drawn apart from Hypothesis: its draws must not depend on what the app happened to accept.
    replays = random.Random(run_seed)

    def alone(call: Callable[[], str]) -> tuple[str, tuple | None, tuple | None]:
        with lock:
            if hold:
                wait_until_quiet(server)
            before = fingerprint(server) if hold else None
            outcome = call()
            return outcome, before, fingerprint(server) if hold else None

    def judge(endpoint: Endpoint, role: str, sent: Any, outcome: str, before: tuple | None, after: tuple | None,
              replayed: bool) -> None:
        figures.calls += 1
        figures.answers[endpoint.name + (" (replayed)" if replayed else "")][outcome] += 1
        if figures.calls % 100 == 0:
            print(f"{figures.calls} calls, {len(figures.failures)} failures", flush=True)
        where = f"{endpoint.name}{' replayed' if replayed else ''} as {role} with {repr(sent)[:160]}"
        if outcome.startswith("HTTP 5") or outcome == "no answer":
            figures.server_errors += 1
            figures.failures.append(f"{where}: {outcome}")
        if role in NO_ACCOUNT and outcome == "completed" and endpoint.name not in ("login", "file", "upload"):
            figures.failures.append(f"{where}: completed for a caller with no account")
        if endpoint.name == "file" and outcome == "completed":
            figures.failures.append(f"{where}: served a file of the project or the machine")
        if hold and (difference := changed(before, after)):
            may_write = outcome == "completed" and (
                role == "operator" or role == "token" or role == "annotator" and endpoint.name in ANNOTATOR_CALLS)
            # A refused vote, skip or ranking shows the pair to answer instead: leasing it is the one write allowed.
            serves_instead = outcome == "refused in words" and difference == "table assignments"
            if not may_write and not serves_instead:
                figures.refused_writes += 1
                figures.failures.append(f"{where} ({outcome}) changed {difference}")
            if replayed and {f"table {t}" for t in ANSWER_TABLES} & set(difference.split(", ")):
                figures.failures.append(f"{where} ({outcome}) stored an answer again: changed {difference}")

    @seed(run_seed)
    @settings(max_examples=calls, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=["generate"])
    @given(st.data())
    def one_call(data: st.DataObject) -> None:
        endpoint = data.draw(st.sampled_from(surface))
        tokens = honest.tokens() + callers.own_tokens[-5:] + [uuid.uuid4().hex]
        if endpoint.name.startswith("control:"):
            role = data.draw(st.sampled_from(CONTROL_ROLES))
            sent = data.draw(control_args(endpoint.name.removeprefix("control:")))
            call = lambda: callers.control(role, endpoint.name.removeprefix("control:"), sent)
        elif endpoint.name == "login":
            role = "nobody"
            sent = (data.draw(st.sampled_from([FUZZ_OPERATOR, DISABLED, "nobody"]) | odd_text()), data.draw(st.text(max_size=30) | odd_text()))
            call = lambda: callers.login(*sent)
        elif endpoint.name == "upload":
            role = data.draw(st.sampled_from(ROLES))
            sent = (data.draw(st.binary(max_size=2000)), data.draw(st.sampled_from(ODD_TEXT[:7] + ["p.jsonl"])))
            call = lambda: callers.upload(role, *sent)
        elif endpoint.name == "file":
            role = data.draw(st.sampled_from(ROLES))
            sent = data.draw(st.sampled_from(["/etc/passwd", str(server.project.root / "tether.toml"), str(server.project.database_path),
                                              "../../tether.toml", str(server.project.root / control.SERVER_FILE)]))
            call = lambda: callers.file(role, sent)
        else:
            role = data.draw(st.sampled_from(CALLERS))
            sent, shape = data.draw(gradio_data(endpoint, tokens))
            figures.other_typed += shape == "one of another type"
            by_index = endpoint.private or data.draw(st.booleans())
            call = lambda: callers.gradio(role, endpoint, sent, by_index)
        judge(endpoint, role, sent, *alone(call), replayed=False)
        if (accepted := callers.accepted) and replays.random() < 0.1:
            replayed = lambda: callers.gradio(accepted.role, accepted.endpoint, accepted.sent, accepted.by_index)
            judge(accepted.endpoint, accepted.role, accepted.sent, *alone(replayed), replayed=True)

    one_call()


def make_fuzz_project(root: Path, annotators: int, pairs: int):
    project = make_project(root, tiny_model(root.parent / "tiny-llama"), pairs, annotators, 0)
    password_hash = hash_password(PASSWORD)
    with closing(project.connect()) as con:
        for name, role in [(FUZZ_ANNOTATOR, "annotator"), (FUZZ_OPERATOR, "operator"), (DISABLED, "annotator"), (SIGNED_OUT, "annotator"),
                           (EXPIRED, "operator")]:
            add_user(con, name, role, password_hash, "fuzz", utcnow())
    return project


def run(args: argparse.Namespace, work: Path) -> tuple[Figures, dict]:
    project = make_fuzz_project(work / "project", args.annotators, args.pairs)
    log = work / "server.log"
    figures = Figures()
    with server_log(log):
        server = Server(load_project(project.root))
        port = free_port()
        app = launch(server, "127.0.0.1", port, prevent_thread_lock=True)
        url = f"http://127.0.0.1:{port}/"
        callers = honest = None
        try:
            callers = Callers(url, server.control_token)
            server.control_action("set_disabled", DISABLED, True, "fuzz")  # after its sign-in: a session of a disabled account
            expire_sessions(server, EXPIRED)
            honest = Honest(url, args.annotators, threading.Lock())
            config = callers.clients["operator"].get("/config").json()
            surface = [e for e in endpoints(config) if not args.only or e.name in args.only.split(",")]
            cpu = resource.getrusage(resource.RUSAGE_SELF)
            began = time.monotonic()
            held = args.calls * 2 // 3
            fuzz(server, callers, surface, honest, figures, held, True, args.seed)
            fuzz(server, callers, surface, honest, figures, args.calls - held, False, args.seed + 1)
            seconds = time.monotonic() - began
            used = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            if honest is not None:
                honest.stop()
            if callers is not None:
                callers.close()
            app.close()
            server.close()
    verdict = check_database(project.database_path, honest.tally.acknowledged)
    lines = log.read_text(errors="replace").splitlines()
    resources = {
        "seconds": seconds, "endpoints": len(surface), "gradio functions": sum(e.fn_index is not None for e in surface),
        "cpu ms per call": 1000 * (used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime) / max(figures.calls, 1),
        "peak resident MB": used.ru_maxrss / 1024, "log lines": len(lines),
        "refusal lines": sum(line.startswith("refused ") for line in lines),
        "tracebacks": sum(line.startswith("Traceback") for line in lines),
        "replays": sum(sum(answers.values()) for name, answers in figures.answers.items() if name.endswith("(replayed)")),
        "annotate view refusals in words": sum(figures.answers.get(name, Counter())["refused in words"] for name in ANNOTATOR_CALLS),
        "honest votes acknowledged": len(set(honest.tally.acknowledged)), "honest votes stored": verdict.stored,
        "honest votes lost": len(verdict.missing), "honest votes refused": sum(honest.tally.refused.values()),
        "honest errors": sum(honest.tally.errors.values()), "duplicates": verdict.duplicates,
        "server errors": figures.server_errors, "writes by refused calls": figures.refused_writes,
        "calls with one input of another type": figures.other_typed,
    }
    if resources["tracebacks"]:
        first = next(i for i, line in enumerate(lines) if line.startswith("Traceback"))
        figures.failures.append("traceback in the server's log:\n" + "\n".join(lines[max(0, first - 3):first + 25]))
    for name in ("honest votes lost", "honest votes refused", "honest errors", "duplicates"):
        if resources[name]:
            figures.failures.append(f"{name}: {resources[name]} ({dict(honest.tally.refused) | dict(honest.tally.errors)})")
    return figures, resources


def print_report(figures: Figures, resources: dict) -> None:
    outcomes = sorted({o for answers in figures.answers.values() for o in answers})
    width = max(len(name) for name in figures.answers)
    print(f"{'endpoint':<{width}} {'calls':>6} " + " ".join(f"{o:>10}" for o in outcomes))
    for name, answers in sorted(figures.answers.items()):
        print(f"{name:<{width}} {sum(answers.values()):>6} " + " ".join(f"{answers.get(o, 0):>10}" for o in outcomes))
    for name, value in resources.items():
        print(f"{name}: {value:.1f}" if isinstance(value, float) else f"{name}: {value}")
    print(f"calls: {figures.calls}; failures (must be 0): {len(figures.failures)}")
    for failure in figures.failures[:30]:
        print(f"  {failure}")


def main() -> None:
    # The honest annotators draw from `random` in their own thread while Hypothesis draws calls: not its business here.
    warnings.filterwarnings("ignore", category=HypothesisDeprecationWarning)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000, help="calls drawn, two thirds each alone, one third beside the votes; about one in ten is then replayed besides")
    parser.add_argument("--annotators", type=int, default=4, help="honest annotators voting throughout")
    parser.add_argument("--pairs", type=int, default=400, help="pairs in the project for the honest annotators")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis's seed for the calls drawn")
    parser.add_argument("--only", help="fuzz only these endpoints, comma-separated (names as the report gives them)")
    parser.add_argument("--workdir", type=Path, help="keep the project and the server's log here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-fuzz-") as tmp:
        work = (args.workdir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        os.chdir(work)  # where a backup to a relative path the fuzzer drew lands
        figures, resources = run(args, work)
    print_report(figures, resources)
    sys.exit(1 if figures.failures else 0)


if __name__ == "__main__":
    main()
