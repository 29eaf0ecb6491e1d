import asyncio
import hashlib
import json
import time
from contextlib import closing

import httpx
import pytest

from store import open_database
from store.db import utcnow
from store.users import account_events, add_user, get_user
from tests.conftest import RunningServer, app_client, run_tether, set_settings
from ui.owner.auth import SignInGuard, SignInLimits, hash_password, is_outdated, verify_password


def test_users_add_reads_the_password_from_stdin_or_a_file_and_stores_a_salted_hash(tiny_project, tmp_path):
    added = run_tether("users", "add", "alice", "--role", "annotator", "--project", str(tiny_project), input="correct horse\n")
    assert added.returncode == 0, added.stderr
    (tmp_path / "pw").write_text("battery staple\n")
    run_tether("users", "add", "olga", "--role", "operator", "--password-file", str(tmp_path / "pw"), "--project", str(tiny_project), check=True)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        alice, olga = get_user(con, "alice"), get_user(con, "olga")
    assert (alice.role, olga.role) == ("annotator", "operator")
    assert alice.password_hash.startswith("scrypt$") and "correct horse" not in alice.password_hash
    assert verify_password("correct horse", alice.password_hash) and not verify_password("correct horsE", alice.password_hash)
    assert verify_password("battery staple", olga.password_hash)
    assert hash_password("same") != hash_password("same")  # salted


@pytest.mark.parametrize("args, password, message", [
    (["bad name!", "--role", "annotator"], "long enough", "use 1 to 64 letters"),
    (["bob", "--role", "admin"], "long enough", "'admin' is not one of"),
    (["bob", "--role", "annotator"], "short", "at least 8 characters"),
    (["alice", "--role", "operator"], "long enough", "a user named 'alice' exists already"),
])
def test_users_add_refuses_bad_input(tiny_project, args, password, message):
    run_tether("users", "add", "alice", "--role", "annotator", "--project", str(tiny_project), input="long enough\n", check=True)
    result = run_tether("users", "add", *args, "--project", str(tiny_project), input=password + "\n")
    assert result.returncode != 0 and message in result.stderr


def sign_in(url: str, name: str, password: str) -> int:
    return httpx.post(url + "login", data={"username": name, "password": password}).status_code


@pytest.mark.deep
def test_200_parallel_guesses_cost_at_most_the_limits_hashes_and_the_right_password_works_after_the_lockout(tiny_project):
    set_settings(tiny_project, "server", sign_in_attempts=5, lockout_seconds=4, max_lockout_seconds=4)
    run_tether("users", "add", "alice", "--role", "annotator", "--project", str(tiny_project), input="right password\n", check=True)
    server = RunningServer(tiny_project)
    try:
        async def guess(client: httpx.AsyncClient, i: int) -> int:
            response = await client.post(server.url + "login", data={"username": "alice", "password": f"guess {i}"})
            return response.status_code

        async def attack() -> list[int]:
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=50), timeout=60) as client:
                return await asyncio.gather(*(guess(client, i) for i in range(200)))

        started = time.monotonic()
        statuses = asyncio.run(attack())
        attack_seconds = time.monotonic() - started
        locked_out = sign_in(server.url, "alice", "right password")
        time.sleep(4.5)
        after_lockout = sign_in(server.url, "alice", "right password")
    finally:
        server.stop()
    log = server.log.read_text()
    checked = log.count("sign-in failed for 'alice' from 127.0.0.1 (password checked)")
    refused = log.count("sign-in refused for 'alice' from 127.0.0.1: locked out")
    print(f"200 guesses from 50 connections in {attack_seconds:.1f} s: {checked} passwords hashed, {refused} refused unhashed")
    assert statuses == [400] * 200
    assert checked == 5  # the limit, however many arrive at once
    assert refused == 200 - checked + 1  # the rest, and the right password during the lockout, never reached scrypt
    assert (locked_out, after_lockout) == (400, 200)


def test_an_old_hash_is_replaced_by_one_at_the_current_parameters_at_the_next_good_sign_in(tiny_project):
    salt = bytes(16)
    old = f"scrypt${2**14}$8$1${salt.hex()}${hashlib.scrypt(b'right password', salt=salt, n=2**14, r=8, p=1).hex()}"
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        add_user(con, "bob", "annotator", old, "test", utcnow())
    assert is_outdated(old) and verify_password("right password", old)
    server = RunningServer(tiny_project)
    try:
        assert sign_in(server.url, "bob", "right password") == 200
    finally:
        server.stop()
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        upgraded = get_user(con, "bob").password_hash
    assert upgraded.startswith(f"scrypt${2**17}$8$1$") and not is_outdated(upgraded)
    assert verify_password("right password", upgraded)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert [(e.account, e.action, e.actor) for e in account_events(con)][0] == ("bob", "password hash upgraded at sign-in", "bob")


def test_the_tables_of_failures_stay_bounded_and_forget_the_least_recent_first():
    guard = SignInGuard(lambda name: None, lambda name, stored: None, SignInLimits(tracked=3))
    for i in range(10):
        guard.addresses.begin(f"10.0.0.{i}")
        guard.addresses.end(f"10.0.0.{i}", failed=True)
    assert list(guard.addresses.records) == ["10.0.0.7", "10.0.0.8", "10.0.0.9"]


def test_users_commands_go_through_a_running_server_and_every_change_is_logged(tiny_project):
    run_tether("users", "add", "olga", "--role", "operator", "--project", str(tiny_project), input="password-123\n", check=True)
    server = RunningServer(tiny_project)
    try:
        server_file = tiny_project / "tether.server.json"
        assert server_file.stat().st_mode & 0o777 == 0o600  # its token lets a command act as the server
        tether = lambda *args, password=None: run_tether(*args, "--project", str(tiny_project), input=password)  # noqa: E731
        assert tether("users", "add", "carol", "--role", "annotator", password="first password\n").returncode == 0
        open_session = signed_in(server.url, "carol", "first password")
        assert next_pair_status(open_session, server.url) == 200
        assert tether("users", "passwd", "carol", password="second password\n").returncode == 0
        assert next_pair_status(open_session, server.url) == 401  # a new password ends the sessions open
        assert (sign_in(server.url, "carol", "first password"), sign_in(server.url, "carol", "second password")) == (400, 200)
        open_session = signed_in(server.url, "carol", "second password")
        assert tether("users", "disable", "carol").returncode == 0
        assert next_pair_status(open_session, server.url) == 401  # a disable ends them too
        assert sign_in(server.url, "carol", "second password") == 400
        refused = tether("users", "disable", "carol")
        assert refused.returncode == 1 and "carol is disabled already" in refused.stderr
        assert tether("users", "enable", "carol").returncode == 0
        assert next_pair_status(open_session, server.url) == 401  # enabled again, it signs in afresh
        assert sign_in(server.url, "carol", "second password") == 200
        listed = tether("users", "list").stdout.split("\n")
        assert [line.split() for line in listed if line] == [["carol", "annotator", "active"], ["olga", "operator", "active"]]
        log = tether("users", "log").stdout.strip().split("\n")
    finally:
        server.stop()
    assert not server_file.exists()
    actions = [line.split("  ", 1)[1].split() for line in log]
    assert [a[:3] for a in actions] == [
        ["carol", "enabled", "by"], ["carol", "disabled", "by"], ["carol", "password", "set"],
        ["carol", "added", "as"], ["olga", "added", "as"],
    ]
    assert all(line.endswith("(command line)") for line in log)
    # With the server stopped the same commands open the database themselves.
    assert run_tether("users", "disable", "carol", "--project", str(tiny_project)).returncode == 0
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert get_user(con, "carol").disabled


def signed_in(url: str, name: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=url)
    assert client.post("login", data={"username": name, "password": password}).status_code == 200
    return client


def next_pair_status(session: httpx.Client, url: str) -> int:
    return session.post("gradio_api/call/next_pair", json={"data": []}).status_code


def test_the_control_route_wants_the_servers_token(tiny_project):
    server = RunningServer(tiny_project)
    try:
        url = server.url + "tether/control/users"
        assert httpx.post(url, json=[]).status_code == 403
        assert httpx.post(url, json=[], headers={"Authorization": "Bearer guessed"}).status_code == 403
        token = json.loads((tiny_project / "tether.server.json").read_text())["token"]
        assert httpx.post(url, json=[], headers={"Authorization": f"Bearer {token}"}).json() == []
        signed = {"Authorization": f"Bearer {token}"}
        for body in (b"not json", b'{"name": "x"}', b"[1, 2, 3]"):  # malformed, not a list, too many arguments
            refused = httpx.post(url, content=body, headers=signed)
            assert refused.status_code == 400 and "the body must be a JSON list of users's arguments" in refused.json()["error"]
        refused = httpx.post(server.url + "tether/control/set_disabled", json=["ann"], headers=signed)  # too few
        assert refused.status_code == 400
        # Found by scripts/fuzz.py: arguments of the wrong type, and a backup folder named with a NUL, were a 500.
        for action, args, message in [("account_log", [{}], "limit must be int, not dict"),
                                      ("account_log", [-1], "account changes to show must be 0 or more, got -1"),
                                      ("set_disabled", ["ann", 1, "me"], "disabled must be bool, not int"),
                                      ("backup", [None], "dest must be str, not NoneType"),
                                      ("backup", ["b\x00"], "cannot be a directory's name: it holds a NUL character")]:
            refused = httpx.post(server.url + f"tether/control/{action}", json=args, headers=signed)
            assert refused.status_code == 400 and message in refused.json()["error"], (action, refused.text)
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


def test_an_operator_manages_accounts_in_the_app_and_cannot_disable_themself(tiny_project):
    run_tether("users", "add", "olga", "--role", "operator", "--project", str(tiny_project), input="password-123\n", check=True)
    server = RunningServer(tiny_project)
    try:
        operator = app_client(server.url, "olga", "password-123")
        message, password_box, users, log = operator.predict("dave", "annotator", "dave's password", api_name="/add_account")
        assert message == "Added annotator dave." and password_box == ""
        assert users["data"] == [["dave", "annotator", "active"], ["olga", "operator", "active"]]
        with pytest.raises(Exception, match="at least 8 characters"):
            operator.predict("erin", "annotator", "short", api_name="/add_account")
        with pytest.raises(Exception, match="cannot disable your own account"):
            operator.predict("olga", api_name="/disable_account")
        operator.predict("dave", api_name="/disable_account")
        users, log = operator.predict(api_name="/accounts")
        assert ["dave", "annotator", "disabled"] in users["data"]
        assert [row[1:] for row in log["data"][:2]] == [["dave", "disabled", "olga"], ["dave", "added as annotator", "olga"]]
    finally:
        server.stop()
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert get_user(con, "dave").disabled and get_user(con, "erin") is None
