import asyncio
import hashlib
import time
from contextlib import closing

import httpx
import pytest

from store import open_database
from store.users import add_user, get_user
from tests.conftest import RunningServer, run_tether, set_settings
from ui.auth import SignInGuard, SignInLimits, hash_password, is_outdated, verify_password


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
        add_user(con, "bob", "annotator", old)
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


def test_the_tables_of_failures_stay_bounded_and_forget_the_least_recent_first():
    guard = SignInGuard(lambda name: None, lambda name, stored: None, SignInLimits(tracked=3))
    for i in range(10):
        guard.addresses.begin(f"10.0.0.{i}")
        guard.addresses.end(f"10.0.0.{i}", failed=True)
    assert list(guard.addresses.records) == ["10.0.0.7", "10.0.0.8", "10.0.0.9"]
