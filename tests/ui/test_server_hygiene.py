"""The app's limits and housekeeping: upload size, export files, and errors shown by id, on an app served in this process."""

import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.conftest import add_pairs, add_users, app_client, free_port, set_settings
from ui.owner.project import load_project
from ui.web.app import Server, launch

PASSWORD = "password-123"


@pytest.fixture
def project(tiny_project):
    add_pairs(tiny_project, prompts=4)
    add_users(tiny_project, {"ann": "annotator", "olga": "operator"}, PASSWORD)
    return tiny_project


@contextmanager
def serving(project: Path) -> Iterator[tuple[Server, str]]:
    """The real app, on a free port, served from this process so a test can reach its Server."""
    server = Server(load_project(project))
    port = free_port()
    app = launch(server, "127.0.0.1", port, prevent_thread_lock=True)
    try:
        yield server, f"http://127.0.0.1:{port}/"
    finally:
        app.close()
        server.close()


def test_an_upload_over_the_configured_size_is_refused(project, tmp_path):
    set_settings(project, "server", max_upload_mb=0.5)
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    small.write_text('{"prompt": "hello"}\n')
    large.write_text('{"prompt": "' + "x" * 700_000 + '"}\n')
    with serving(project) as (_, url), httpx.Client(base_url=url) as client:
        assert client.post("login", data={"username": "olga", "password": PASSWORD}).status_code == 200
        sizes = {}
        for path in (small, large):
            with path.open("rb") as f:
                sizes[path.name] = client.post("gradio_api/upload", files={"files": f}).status_code
    assert sizes == {"small.jsonl": 200, "large.jsonl": 413}


def test_export_files_are_removed_after_the_configured_time_and_when_the_server_stops(project):
    set_settings(project, "server", export_seconds=1)
    with serving(project) as (server, url):
        operator = app_client(url, "olga", PASSWORD)
        first = Path(operator.predict("jsonl", False, 0, api_name="/export"))
        assert first.read_text().count("\n") == 0  # no votes yet: an empty, but real, file downloaded
        folders = list(server.exports.iterdir())
        assert len(folders) == 1
        old = time.time() - 5
        os.utime(folders[0], (old, old))  # as if the first export were made 5 s ago
        operator.predict("jsonl", False, 0, api_name="/export")
        assert folders[0] not in list(server.exports.iterdir()) and len(list(server.exports.iterdir())) == 1
        exports = server.exports
    assert not exports.exists()


def test_an_unexpected_error_shows_an_id_and_the_log_has_its_details(project, capfd):
    with serving(project) as (server, url):
        annotator = app_client(url, "ann", PASSWORD)
        with server.lock:
            server.con.close()  # from now on every database call fails inside DuckDB
        message = annotator.predict(api_name="/next_pair")[5]  # the annotate tab's refusals are in its message line
    error_id = re.search(r"Something went wrong on the server \(error ([0-9a-f]{8})\)", message).group(1)
    assert "duckdb" not in message.lower() and "connection" not in message.lower()
    log = capfd.readouterr().err
    assert f"error {error_id} in next_pair:" in log and "duckdb" in log.lower()


def test_a_call_refused_by_gradios_own_input_checks_is_one_line_in_the_log_not_a_traceback(project, capfd):
    with serving(project) as (server, url):
        operator = app_client(url, "olga", PASSWORD)
        with pytest.raises(Exception, match="Refused: this call's input is not what it takes"):
            operator.predict("xml\nrefused forged: a line of the attacker's", False, 0, api_name="/export")  # not a format
        with pytest.raises(Exception, match="Refused"):
            operator.predict([1, 2], api_name="/set_schedule")  # a list where a number is due
        annotator = app_client(url, "ann", PASSWORD)
        annotator.predict("not a token of ann's", None, "", api_name="/vote_left")  # refused by the queue
    log = capfd.readouterr().err
    assert "Traceback" not in log, log
    refusals = [line for line in log.splitlines() if line.startswith("refused ")]
    assert len(refusals) == 3, log
    assert refusals[0].startswith("refused export_data: its input is not what it takes: ")
    assert refusals[1].startswith("refused set_schedule: its input is not what it takes: ")
    assert refusals[2].startswith("refused vote by ann: ")
    assert not any(line.startswith("refused forged") for line in log.splitlines())


def test_a_body_with_nan_and_an_upload_part_with_no_file_name_are_refused_not_a_traceback(project, capfd):
    """Found by scripts/fuzz.py: Gradio answered both with a 500 and a traceback in the log."""
    with serving(project) as (_, url), httpx.Client(base_url=url) as client:
        assert client.post("login", data={"username": "olga", "password": PASSWORD}).status_code == 200
        nan = client.post("gradio_api/queue/join", content=b'{"data": NaN, "fn_index": 0, "session_hash": "x"}',
                          headers={"Content-Type": "application/json"})
        assert nan.status_code == 400 and nan.text.startswith("The request's body is not JSON: NaN is no JSON number"), nan.text
        unnamed = client.post("gradio_api/upload", files={"files": ("", b"{}")})
        assert unnamed.status_code == 400 and unnamed.text == "The upload is not a file: each part needs a file name."
        named = client.post("gradio_api/upload", files={"files": ("p.jsonl", b"{}")})
        assert named.status_code == 200
    assert "Traceback" not in capfd.readouterr().err


def test_a_number_field_that_sent_no_whole_number_is_refused_in_words_not_an_error_id(project, capfd):
    """Found by scripts/fuzz.py: a list or None where a version or a job's number was due failed in Tether's own code."""
    with serving(project) as (_, url):
        operator = app_client(url, "olga", PASSWORD)
        for args, api_name, message in [(([1], "dpo"), "/start_round", "this call's input is not what it takes (reward_version must be a number or null, not a list)"),
                                        ((None,), "/job_log", "Give a job's number from the table."),
                                        ((None,), "/cancel_job", "Give a job's number from the table."),
                                        ((None, 2), "/generate", "Give the prompts and the completions per prompt as whole numbers.")]:
            with pytest.raises(Exception, match=re.escape(message)):
                operator.predict(*args, api_name=api_name)
    log = capfd.readouterr().err
    assert "Traceback" not in log and not re.search(r"^error [0-9a-f]{8} in", log, re.M), log
