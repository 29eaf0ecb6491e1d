"""Hostile input through a real `tether serve`: malformed votes from one annotator, and a decompression bomb."""

import gzip
import json
import re
import threading
import time
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from gradio_client import handle_file

from annotate.queue import Action
from store import open_database
from tests.conftest import RunningServer, add_pairs, add_users, app_client, wait_for
from ui.owner.project import load_project
from ui.owner.server import Server

PASSWORD = "password-123"
MESSAGE = 5  # the annotate view's message line, in its outputs

# Votes whose fields are not what the page sends: numbers, lists, objects, a token far too long.
MALFORMED = [
    ("token", None, 5), ("token", None, ["a comment"]), ("token", None, {"text": "a comment"}),
    (5, None, ""), (["token"], None, ""), ({"token": 1}, None, ""), ("x" * 10_000, None, ""),
    ("token", 5, ""), ("token", ["much better"], ""), ("token", {"much": "better"}, ""),
]


def signed_in(url: str, name: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=60)
    assert client.post("login", data={"username": name, "password": PASSWORD}).status_code == 200
    return client


def call(client: httpx.Client, api_name: str, *data) -> httpx.Response:
    """One unqueued event, as the page's button sends it: one POST, answered with the outputs."""
    return client.post(f"gradio_api/run/{api_name}", json={"data": list(data)})


def test_malformed_votes_from_one_annotator_fail_none_of_anothers_and_are_refused_clearly(tiny_project):
    add_pairs(tiny_project, prompts=40)
    add_users(tiny_project, {"mallory": "annotator", "bob": "annotator"}, PASSWORD)
    server = RunningServer(tiny_project)
    stop, refusals, attackers = threading.Event(), [], []

    def attack(client: httpx.Client, lease: str) -> None:
        try:
            while not stop.is_set():
                for token, strength, comment in MALFORMED:
                    reply = call(client, "vote_left", lease if token == "token" else token, strength, comment)
                    refusals.append((token, strength, comment, reply.status_code, reply.text))
        except httpx.HTTPError as e:  # the server failed to answer: reported below
            refusals.append((None, None, None, None, repr(e)))

    try:
        mallory, bob = signed_in(server.url, "mallory"), signed_in(server.url, "bob")
        lease = call(mallory, "next_pair").json()["data"][0]  # a real pair of hers, so only the malformed field is wrong
        attackers += [threading.Thread(target=attack, args=(mallory, lease)) for _ in range(3)]
        for thread in attackers:
            thread.start()
        view, answered = call(bob, "next_pair").json()["data"], []
        for i in range(30):
            reply = call(bob, f"vote_{'left' if i % 2 else 'right'}", view[0], "much better" if i % 3 else None, f"reason {i}")
            assert reply.status_code == 200, reply.text
            answered.append(view[0])
            view = reply.json()["data"]
            assert view[MESSAGE] == "", f"bob's vote {i} was refused: {view[MESSAGE]}"
        stop.set()
        for thread in attackers:
            thread.join()
        huge = call(mallory, "vote_left", lease, None, "x" * 2**20)
        assert huge.status_code == 413 and "max_request_kb" in huge.text
        body = json.dumps({"data": [lease, None, "x" * 2**20]}).encode()
        chunked = mallory.post("gradio_api/run/vote_left", headers={"Content-Type": "application/json"},
                               content=(body[i:i + 2**16] for i in range(0, len(body), 2**16)))  # no Content-Length
        assert chunked.status_code == 413
    finally:
        stop.set()
        for thread in attackers:
            thread.join()
        server.stop()

    assert len(refusals) >= len(MALFORMED)
    for token, strength, comment, status, body in refusals:
        assert status == 200, (token, strength, comment, body)
        message = json.loads(body)["data"][MESSAGE]
        assert "must be" in message and "went wrong" not in message, (token, strength, comment, message)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        stored = dict(con.execute("SELECT annotator, count(*) FROM comparisons GROUP BY annotator").fetchall())
        tokens = {row[0] for row in con.execute("SELECT client_token FROM comparisons WHERE annotator = 'bob'").fetchall()}
    assert stored == {"bob": 30} and tokens == set(answered)


def test_an_action_that_fails_inside_a_batch_fails_alone(tiny_project):
    """The group commit's second line of defence: one action that fails in the batch's transaction
    (one past Action's checks, as a future bug might let through) fails alone; the others are stored."""
    add_pairs(tiny_project, prompts=10)
    server = Server(load_project(tiny_project))
    try:
        names = ["ann", "bob", "cat", "dan"]
        tokens = {name: server.annotate(Action("serve", name))[0].assignment.token for name in names}
        actions = {name: Action("vote", name, tokens[name], "left") for name in names}
        object.__setattr__(actions["cat"], "token", ["not", "text"])  # fails in the transaction: unhashable
        results: dict[str, object] = {}

        def vote(name: str) -> None:
            try:
                results[name] = server.annotate(actions[name])[0]
            except Exception as e:
                results[name] = e

        threads = [threading.Thread(target=vote, args=(name,)) for name in names]
        with server.lock:  # all four arrive while the writer is busy, so they are done as one batch
            for thread in threads:
                thread.start()
            wait_for(lambda: len(server.arrivals) == len(names), seconds=30)
        for thread in threads:
            thread.join()
        stored = {row[0] for row in server.db(lambda con: con.execute("SELECT annotator FROM comparisons").fetchall())}
    finally:
        server.close()
    assert isinstance(results.pop("cat"), TypeError)
    assert all(outcome.vote is not None and not outcome.refused for outcome in results.values()), results
    assert stored == {"ann", "bob", "dan"}


def decompression_bomb(path: Path, gib: int) -> Path:
    """A .gz of about 1 MiB that holds `gib` GiB of zeros: one small gzip member, repeated, which
    gzip readers decompress one after another."""
    path.write_bytes(gzip.compress(bytes(2**20)) * (1024 * gib))
    return path


def peak_memory(pid: int) -> int:
    """The process's peak resident memory so far, in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) * 1024


@pytest.mark.deep
def test_a_decompression_bomb_is_refused_in_bounded_memory_while_votes_go_on(tiny_project, tmp_path):
    add_pairs(tiny_project, prompts=400)
    add_users(tiny_project, {"olga": "operator", "bob": "annotator"}, PASSWORD)
    bomb = decompression_bomb(tmp_path / "prompts.jsonl.gz", gib=1)
    server = RunningServer(tiny_project)
    importing, stop, votes = threading.Event(), threading.Event(), []

    def keep_voting(bob: httpx.Client) -> None:
        view = call(bob, "next_pair").json()["data"]
        while not stop.is_set():
            sent_during = importing.is_set()
            view = call(bob, "vote_left", view[0], None, "").json()["data"]
            votes.append((sent_during and importing.is_set(), view[MESSAGE]))  # sent and answered during the import
            time.sleep(0.05)

    voter = threading.Thread(target=keep_voting, args=(signed_in(server.url, "bob"),))
    try:
        operator = app_client(server.url, "olga", PASSWORD)
        voter.start()
        wait_for(lambda: len(votes) >= 3, seconds=30)
        before = peak_memory(server.process.pid)
        importing.set()
        with pytest.raises(Exception) as refused:
            operator.predict(handle_file(str(bomb)), api_name="/import_prompts")
        importing.clear()
        wait_for(lambda: votes and not votes[-1][0], seconds=30)  # a vote after the import, too
        peak = peak_memory(server.process.pid)
    finally:
        stop.set()
        if voter.is_alive():
            voter.join()
        server.stop()
    assert "prompts.jsonl.gz: file: is larger than 256 MiB when decompressed, the limit set by [server] max_import_mb" in str(refused.value)
    assert peak - before < 300 * 2**20, f"the server's peak memory grew by {(peak - before) / 2**20:.0f} MiB"
    assert [message for _, message in votes] == [""] * len(votes)
    assert any(during for during, _ in votes)


def test_malformed_rankings_through_the_api_are_refused_clearly_and_nothing_is_written(tiny_project):
    add_pairs(tiny_project, prompts=2, answers_per_task=4)
    add_users(tiny_project, {"mallory": "annotator"}, PASSWORD)
    server = RunningServer(tiny_project)
    try:
        mallory = signed_in(server.url, "mallory")
        lease = call(mallory, "next_pair").json()["data"][0]
        not_text = "the ranking must be text such as &#x27;C &gt; A = D &gt; B&#x27;, of at most 200 characters"
        refused = [
            ("A > B > C", "the ranking leaves out answer D: rank all 4 answers"),
            ("A > B = C > D > B", "the ranking names answer B 2 times; name each answer once"),
            ("A > B > C > E", ("the ranking names &#x27;E&#x27;, which is not one of the answers A, B, C, D, "
                               "as in &#x27;A &gt; B &gt; C &gt; D&#x27;")),
            ("", "the ranking is empty: rank all 4 answers"),
            (5, not_text), (["A", "B"], not_text), ({"A": 1}, not_text), ("A > " * 5_000, not_text),
        ]
        for ranking, message in refused:
            reply = call(mallory, "rank", lease, ranking)
            assert reply.status_code == 200, reply.text
            view = reply.json()["data"]
            assert view[MESSAGE] == message, ranking
            assert view[0] == lease  # the same task stays, to rank again
        assert call(mallory, "vote_left", lease, None, "").json()["data"][MESSAGE] == "this task wants a ranking of its answers, not a vote"
        # Signed out, nothing is answered at all; signed in, a whole ranking is stored.
        assert httpx.post(f"{server.url}gradio_api/run/rank", json={"data": [lease, "A > B > C > D"]}).status_code == 401
        view = call(mallory, "rank", lease, "A > B = C > D").json()["data"]
        assert view[MESSAGE] == "" and view[0] != lease
    finally:
        server.stop()
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT ranks FROM rankings").fetchall() == [([1, 2, 2, 3],)]
        assert con.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 6
