"""A server on a real network: requests sent by other sites, sessions that end, and what only its own machine may reach."""

import json
import re
import time
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from store import open_database
from tests.conftest import RunningServer, add_pairs, add_users, app_client, run_tether, set_settings
from ui.owner.config import ConfigError, ServerConfig, TetherConfig, load_config, write_config
from ui.owner.control import from_this_machine

PASSWORD = "password-123"
EVIL = "https://evil.example"
PROMPTS = ("prompts.jsonl", b'{"prompt": "Say hello."}\n')


@pytest.fixture
def project(tiny_project):
    add_pairs(tiny_project, prompts=4)
    add_users(tiny_project, {"ann": "annotator", "olga": "operator", "otto": "operator"}, PASSWORD)
    return tiny_project


def signed_in(url: str, name: str) -> httpx.Client:
    """A session as a browser gets it from the sign-in form: its cookie goes with every request."""
    client = httpx.Client(base_url=url)
    assert client.post("login", data={"username": name, "password": PASSWORD}).status_code == 200
    return client


def add_account(session: httpx.Client, name: str, headers: dict[str, str]) -> httpx.Response:
    """The operator endpoint that adds an account, as a page's script would call it; waits for it when it was accepted."""
    started = session.post("gradio_api/call/add_account", json={"data": [name, "operator", "password-456"]}, headers=headers)
    if started.status_code == 200:
        outcome = session.get(f"gradio_api/call/add_account/{started.json()['event_id']}").text
        assert f"Added operator {name}" in outcome, outcome
    return started


def account_names(project: Path) -> set[str]:
    with closing(open_database(project / "tether.duckdb")) as con:
        return {row[0] for row in con.execute("SELECT name FROM users").fetchall()}


def test_a_change_sent_by_another_site_with_an_operators_cookie_is_refused_and_no_other_site_may_read_replies(project):
    set_settings(project, "server", trusted_origins=["https://tether.example.org"])
    server = RunningServer(project, host="127.0.0.2")  # not localhost: Gradio's CORS layer then trusts every site
    own = server.url.rstrip("/")
    try:
        olga = signed_in(server.url, "olga")
        forged = add_account(olga, "mallory", {"Origin": EVIL})
        assert forged.status_code == 403 and "evil.example" in forged.text
        assert not {"access-control-allow-origin", "access-control-allow-credentials"} & set(forged.headers)
        # A browser that sends no Origin still names a cross-site request in Sec-Fetch-Site.
        assert add_account(olga, "sid", {"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert olga.post("gradio_api/upload", files={"files": PROMPTS}, headers={"Origin": EVIL}).status_code == 403
        # Reads stay open (a link from another site works) but another site's script may not see the reply...
        read = olga.get("config", headers={"Origin": EVIL})
        assert read.status_code == 200 and not any(h.startswith("access-control-") for h in read.headers)
        # ...nor be told by a preflight that it may send one.
        preflight = olga.options("gradio_api/call/add_account", headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"})
        assert not any(h.startswith("access-control-allow") for h in preflight.headers)
        # The app's own page, a trusted site and a program (no Origin) go on working.
        assert add_account(olga, "maria", {"Origin": own, "Sec-Fetch-Site": "same-origin"}).status_code == 200
        assert add_account(olga, "trudy", {"Origin": "https://tether.example.org"}).status_code == 200
        assert add_account(olga, "paul", {}).status_code == 200
    finally:
        server.stop()
    assert account_names(project) == {"ann", "olga", "otto", "maria", "trudy", "paul"}


def test_only_operators_may_upload(project):
    server = RunningServer(project)
    try:
        refused = signed_in(server.url, "ann").post("gradio_api/upload", files={"files": PROMPTS})
        assert refused.status_code == 403 and "Only operators may do this" in refused.text
        assert signed_in(server.url, "olga").post("gradio_api/upload", files={"files": PROMPTS}).status_code == 200
    finally:
        server.stop()


def test_disabling_an_account_ends_its_sessions_for_gradios_own_routes_too(project):
    server = RunningServer(project)
    try:
        otto = signed_in(server.url, "otto")
        uploaded = otto.post("gradio_api/upload", files={"files": PROMPTS})
        assert uploaded.status_code == 200
        download = f"gradio_api/file={uploaded.json()[0]}"
        assert otto.get(download).status_code == 200
        assert run_tether("users", "disable", "otto", "--project", str(project)).returncode == 0
        assert otto.get(download).status_code == 401
        refused = otto.post("gradio_api/upload", files={"files": PROMPTS})
        assert refused.status_code == 403 and "Sign in first" in refused.text
        assert otto.post("login", data={"username": "otto", "password": PASSWORD}).status_code == 400
    finally:
        server.stop()


def test_a_session_ends_session_hours_after_its_sign_in(project):
    set_settings(project, "server", session_hours=0.001)  # 3.6 s
    server = RunningServer(project)
    try:
        ann = signed_in(server.url, "ann")
        signed_in_by = time.monotonic()
        assert ann.post("gradio_api/call/next_pair", json={"data": []}).status_code == 200
        time.sleep(max(0.0, signed_in_by + 4.0 - time.monotonic()))
        assert ann.post("gradio_api/call/next_pair", json={"data": []}).status_code == 401
        assert ann.get("gradio_api/login_check").status_code == 401
        ann = signed_in(server.url, "ann")
        assert ann.post("gradio_api/call/next_pair", json={"data": []}).status_code == 200
    finally:
        server.stop()


def test_the_control_route_answers_this_machine_only(project):
    server = RunningServer(project)
    try:
        token = json.loads((project / "tether.server.json").read_text())["token"]
        url, authorised = server.url + "tether/control/users", {"Authorization": f"Bearer {token}"}
        assert httpx.post(url, json=[], headers=authorised).status_code == 200
        # A reverse proxy on this machine names the client it forwards, and the server takes its word
        # (uvicorn trusts 127.0.0.1 to): here a client on another machine, with the right token.
        forwarded = httpx.post(url, json=[], headers={**authorised, "X-Forwarded-For": "203.0.113.7"})
        assert forwarded.status_code == 403 and "this machine only" in forwarded.text
        assert run_tether("users", "list", "--project", str(project)).returncode == 0
    finally:
        server.stop()


@pytest.mark.parametrize("client, local, answered", [
    ("127.0.0.1", "127.0.0.1", True),
    ("127.0.0.2", "192.0.2.2", True),
    ("::1", "::1", True),
    ("::ffff:127.0.0.1", "::ffff:127.0.0.1", True),
    ("192.0.2.2", "192.0.2.2", True),  # a command on the machine of a server that listens on this address only
    ("192.0.2.7", "192.0.2.2", False),
    ("203.0.113.7", "127.0.0.1", False),
    (None, None, False),
    ("testclient", "testserver", False),
])
def test_which_client_addresses_are_this_machines(client, local, answered):
    assert from_this_machine(client, local) is answered


def test_the_server_writes_files_for_its_owner_alone_and_gradios_under_the_project(project, tmp_path):
    project.chmod(0o755)  # as a plain mkdir makes it: the database, with its password hashes, open to other users
    before = set(project.rglob("*"))
    server = RunningServer(project, log_dir=tmp_path)
    try:
        olga = signed_in(server.url, "olga")
        uploaded = olga.post("gradio_api/upload", files={"files": PROMPTS})
        assert Path(uploaded.json()[0]).is_relative_to(project / "gradio-files")
        operator = app_client(server.url, "olga", PASSWORD)
        operator.predict("jsonl", False, 0, api_name="/export")  # Gradio copies the file into its folder to serve it
        assert operator.predict(2, 2, api_name="/generate").startswith("Queued job 1")
        deadline = time.monotonic() + 120
        while operator.predict(api_name="/jobs")["data"][0][2] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.5)
        modes = {p.relative_to(project): p.stat().st_mode & 0o777 for p in set(project.rglob("*")) - before}
    finally:
        server.stop()
    assert {p.name for p in modes} >= {"gradio-files", "prompts.jsonl", "preferences.jsonl", "job.json", "completions.parquet"}
    assert {str(p): oct(mode) for p, mode in modes.items() if mode & 0o077} == {}
    assert project.stat().st_mode & 0o777 == 0o700  # what was there before, the database too, is closed to others


def test_the_new_server_settings_read_back_and_bad_values_are_named(tmp_path):
    path = tmp_path / "tether.toml"
    config = TetherConfig(server=ServerConfig(session_hours=0.5, trusted_origins=["https://tether.example.org", "http://10.0.0.5:8080"]))
    write_config(path, config)
    assert load_config(path) == config
    for text, message in [
        ("trusted_origins = 'https://a.example'", "[server] trusted_origins must be a list of text, got 'https://a.example'"),
        ("trusted_origins = ['https://a.example/']", "trusted_origins must hold origins such as"),
        ("trusted_origins = ['a.example']", "a scheme and a host"),
        ("session_hours = 0", "session_hours must be over 0"),
    ]:
        path.write_text(f"[server]\n{text}\n")
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(path)
