"""Votes per second through a real `tether serve`, against DuckDB's raw single-row insert rate.

For each client count N the script builds a fresh project (pairs without a model, N
annotators), starts `tether serve` on a free port and lets N threads, each its own
gradio_client signed in as its own annotator, cast --votes votes between them. Each client
alternates: /next_pair (which returns the pair already on its screen), then a vote. Prints
votes/s over the voting phase and p50/p99 latency of both calls. As a ceiling, the same run
times single-row INSERTs into `comparisons`, one transaction each, on a fresh database, and
each N's votes/s is printed as a share of it. The clients share the machine with the server,
so the CPU each takes per vote (its /next_pair call included) is printed too.

    .venv/bin/python scripts/bench_serve.py --clients 1,16,64 --votes 400
"""

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import closing
from datetime import datetime
from pathlib import Path

from gradio_client import Client

from annotate.pairs import add_completions_with_pairs
from annotate.queue import QueueConfig
from store import open_database, transaction
from store.db import utcnow
from store.completions import NewCompletion
from store.prompt_files import NewPrompt
from store.prompts import add_prompts
from store.users import add_user
from ui.auth import hash_password
from ui.project import init_project

PASSWORD = "password-123"
CHOICES = ("left", "right", "tie", "both_bad")


def make_project(root: Path, pairs: int, annotators: int) -> None:
    """A project with one pair per prompt (one vote wanted each) and annotator00..; no model needed."""
    project = init_project(root)
    password_hash = hash_password(PASSWORD)  # one hash for all: sign-in still verifies it per client
    with closing(project.connect()) as con:
        add_prompts(con, [NewPrompt([{"role": "user", "content": f"question {i}"}], "bench") for i in range(pairs)])
        ids = [row[0] for row in con.execute("SELECT id FROM prompts ORDER BY id").fetchall()]
        completions = [NewCompletion(pid, 0, f"answer {k} to question {pid}", 5, True, {}) for pid in ids for k in range(2)]
        add_completions_with_pairs(con, completions, QueueConfig(overlap_share=0))
        for i in range(annotators):
            add_user(con, f"annotator{i:02d}", "annotator", password_hash, "bench_serve", utcnow())


class Server:
    """`tether serve` in a child process, stopped with SIGINT (as Ctrl-C does) on leaving the block."""

    def __init__(self, project: Path, port: int):
        self.url = f"http://127.0.0.1:{port}/"
        self.log = project / "serve.log"
        tether = Path(sys.executable).parent / "tether"
        self.process = subprocess.Popen(
            [str(tether), "serve", "--project", str(project), "--port", str(port)],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )

    def __enter__(self) -> "Server":
        try:
            deadline = time.monotonic() + 60
            while True:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tether serve did not start:\n{self.log.read_text()}")
                try:
                    urllib.request.urlopen(self.url, timeout=1)
                    return self
                except OSError:
                    time.sleep(0.2)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tickets:
    """The votes still to cast, shared by all clients."""

    def __init__(self, count: int):
        self.left, self.lock = count, threading.Lock()

    def take(self) -> bool:
        with self.lock:
            self.left -= 1
            return self.left >= 0


class Annotator(threading.Thread):
    """Signs in, waits for the others, then: next pair, vote, next pair, vote... while tickets last."""

    def __init__(self, url: str, name: str, tickets: Tickets, ready: threading.Barrier):
        super().__init__(daemon=True)  # a stuck client must not keep the script (and so the server) alive
        self.url, self.name, self.tickets, self.ready = url, name, tickets, ready
        self.next_ms: list[float] = []
        self.vote_ms: list[float] = []
        self.stored = self.refused = 0
        self.error: BaseException | None = None

    def run(self):
        try:
            # A long timeout: 64 sign-ins at once (scrypt each) can take a while on two cores.
            client = Client(self.url, auth=(self.name, PASSWORD), verbose=False, httpx_kwargs={"timeout": 60})
        except BaseException as e:
            self.error = e
            self.ready.abort()
            return
        try:
            self.ready.wait()
            while self.tickets.take():
                start = time.perf_counter()
                token = client.predict(api_name="/next_pair")[0]
                self.next_ms.append((time.perf_counter() - start) * 1000)
                if not token:
                    raise RuntimeError(f"{self.name} was served no pair; make more")
                start = time.perf_counter()
                view = client.predict(token, None, "", api_name=f"/vote_{random.choice(CHOICES)}")
                self.vote_ms.append((time.perf_counter() - start) * 1000)
                if view[5] == "":  # the message line is empty when the vote was stored
                    self.stored += 1
                else:
                    self.refused += 1
        except BaseException as e:
            self.error = e
        finally:
            client.close()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_errors(annotators: list[Annotator], what: str) -> None:
    errors = [f"{a.name}: {a.error!r}" for a in annotators if a.error or a.is_alive()]
    if errors:
        raise RuntimeError(f"{what} ({len(errors)} of {len(annotators)} clients):\n" + "\n".join(errors[:5]))


def run_clients(server: Server, clients: int, votes: int) -> tuple[float, float, float, list[Annotator]]:
    """Wall time, client CPU and server CPU of the voting phase (sign-in excluded), and the annotators."""
    tickets = Tickets(votes)
    ready = threading.Barrier(clients + 1)
    annotators = [Annotator(server.url, f"annotator{i:02d}", tickets, ready) for i in range(clients)]
    for a in annotators:
        a.start()
    try:
        ready.wait(timeout=300)  # everyone signed in
    except threading.BrokenBarrierError:
        ready.abort()
        for a in annotators:
            a.join(timeout=30)
        raise_errors(annotators, "sign-in failed")
    start, client_cpu, server_cpu = time.perf_counter(), time.process_time(), cpu_seconds(server.process.pid)
    for a in annotators:
        a.join(timeout=600)
    seconds = time.perf_counter() - start
    client_cpu, server_cpu = time.process_time() - client_cpu, cpu_seconds(server.process.pid) - server_cpu
    raise_errors(annotators, "clients failed")
    return seconds, client_cpu, server_cpu, annotators


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


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,16,64", help="comma-separated client counts, one fresh project and server each")
    parser.add_argument("--votes", type=int, default=400, help="votes cast in all per client count, whatever the count")
    parser.add_argument("--insert-rows", type=int, default=2000, help="rows for the raw DuckDB insert ceiling")
    args = parser.parse_args()
    counts = [int(n) for n in args.clients.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so `finally` blocks stop the server on kill too
    # Started as `cmd &`, this process ignores SIGINT and so would the server; a handler is not inherited.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    results = []
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        ceiling = insert_ceiling(Path(tmp) / "ceiling.duckdb", args.insert_rows)
        print(f"raw DuckDB: {args.insert_rows} single-row INSERT transactions: {ceiling:,.0f} rows/s")
        for n in counts:
            root = Path(tmp) / f"clients-{n}"
            make_project(root, pairs=args.votes + n, annotators=n)  # each client keeps one pair leased at the end
            with Server(root, free_port()) as server:
                seconds, client_cpu, server_cpu, annotators = run_clients(server, n, args.votes)
            stored = sum(a.stored for a in annotators)
            refused = sum(a.refused for a in annotators)
            next_ms = [ms for a in annotators for ms in a.next_ms]
            vote_ms = [ms for a in annotators for ms in a.vote_ms]
            results.append((n, stored, seconds, client_cpu, server_cpu, next_ms, vote_ms))
            print(f"N={n}: {stored} votes stored ({refused} refused) in {seconds:.1f} s")

    print(f"\n{'clients':>7} {'votes/s':>8} {'of ceiling':>10} {'next p50':>9} {'next p99':>9} {'vote p50':>9} {'vote p99':>9}"
          f" {'CPU/vote: client':>16} {'server':>7}  (all ms)")
    for n, stored, seconds, client_cpu, server_cpu, next_ms, vote_ms in results:
        rate = stored / seconds
        print(
            f"{n:>7} {rate:>8.1f} {rate / ceiling:>10.4f} {percentile(next_ms, 50):>9.0f} {percentile(next_ms, 99):>9.0f} "
            f"{percentile(vote_ms, 50):>9.0f} {percentile(vote_ms, 99):>9.0f} "
            f"{client_cpu / stored * 1000:>16.0f} {server_cpu / stored * 1000:>7.0f}"
        )
    print(f"ceiling: {ceiling:,.0f} rows/s (raw single-row INSERT transactions); {args.votes} votes per client count; "
          f"{os.cpu_count()} CPUs shared by clients and server")


if __name__ == "__main__":
    main()
