"""Operator endpoints refuse annotators, on the server, whatever client calls them."""

import json
import time
import urllib.error
import urllib.request
from contextlib import closing

import pytest
from gradio_client import handle_file

from store import open_database
from tests.conftest import DEMO_PROMPTS, RunningServer, add_pairs, add_users, app_client

PASSWORD = "password-123"
OPERATOR_CALLS = {
    "/operator_data": (),
    "/mark_agreed_gold": (),
    "/ask_the_judge": (),
    "/check_project": (),
    "/jobs": (),
    "/job_log": (1,),
    "/cancel_job": (1,),
    "/import_prompts": (handle_file(str(DEMO_PROMPTS)),),
    "/generate": (5, 2),
    "/export": ("jsonl", False, 0),
    "/train_reward_model": (True,),
    "/score_completions": (),
    "/reward_models": (None,),
    "/round_status": (),
    "/rounds": (None,),
    "/start_round": (None, "dpo"),
    "/cancel_round": (),
    "/set_schedule": (5,),
    "/rollback": (0,),
    "/accounts": (),
    "/add_account": ("mallory", "operator", "password-456"),
    "/disable_account": ("olga",),
    "/enable_account": ("ann",),
    "/set_account_password": ("olga", "password-456"),
}

UPLOAD_REFUSED = "403 Forbidden' for url '[^']*/gradio_api/upload'"


def database_contents(project) -> dict[str, list]:
    with closing(open_database(project / "tether.duckdb")) as con:
        tables = [row[0] for row in con.execute("SHOW TABLES").fetchall()]
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in tables}


@pytest.fixture
def project(tiny_project):
    add_pairs(tiny_project, prompts=6)
    add_users(tiny_project, {"ann": "annotator", "olga": "operator"}, PASSWORD)
    return tiny_project


def test_an_annotator_calling_operator_endpoints_is_refused_and_changes_nothing(project):
    before = database_contents(project)
    server = RunningServer(project)
    try:
        annotator = app_client(server.url, "ann", PASSWORD)
        for endpoint, args in OPERATOR_CALLS.items():
            # A file argument is uploaded first, and the upload is refused already (test_only_operators_may_upload).
            refusal = UPLOAD_REFUSED if endpoint == "/import_prompts" else "Only operators may do this"
            with pytest.raises(Exception, match=refusal):
                annotator.predict(*args, api_name=endpoint)
    finally:
        server.stop()
    assert database_contents(project) == before


def test_the_same_endpoints_work_for_an_operator(project):
    server = RunningServer(project)
    try:
        operator = app_client(server.url, "olga", PASSWORD)
        states, _, agreement, _, gold, judges = operator.predict(api_name="/operator_data")
        assert {row[0]: row[1] for row in states["data"]}["waiting"] == 6
        assert "0 pairs with two or more votes" in agreement and judges.startswith("No AI judge")
        assert gold == "0 gold pairs · flagged: no one"
        assert operator.predict(api_name="/check_project").startswith("Whole. Checked:\n- the database: every table read back")
        assert operator.predict(api_name="/mark_agreed_gold") == "Marked 0 pairs gold: those with 2 or more votes, all alike."
        assert "Imported 28 prompts" in operator.predict(*OPERATOR_CALLS["/import_prompts"], api_name="/import_prompts")
        assert operator.predict(*OPERATOR_CALLS["/generate"], api_name="/generate").startswith("Queued job 1")
        deadline = time.monotonic() + 120
        while (jobs := operator.predict(api_name="/jobs")["data"])[0][2] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert jobs[0][:3] == [1, "generate", "done"] and jobs[0][3] == "█" * 20 + " 100%"
        assert operator.predict(api_name="/ask_the_judge").startswith("Queued job 2: the AI judge votes")
        while (jobs := operator.predict(api_name="/jobs")["data"])[0][2] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert jobs[0][:3] == [2, "judge", "done"]
        states = operator.predict(api_name="/operator_data")[0]
        assert {row[0]: row[1] for row in states["data"]}["waiting"] > 6, "the judge's votes leave every pair to people"
        exported = operator.predict(*OPERATOR_CALLS["/export"], api_name="/export")
        assert exported.endswith("preferences.jsonl")
    finally:
        server.stop()


def test_without_signing_in_nothing_answers_and_wrong_passwords_fail(project):
    server = RunningServer(project)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(
                server.url + "gradio_api/call/operator_data", data=json.dumps({"data": []}).encode(),
                headers={"Content-Type": "application/json"},
            ))
        assert refused.value.code == 401
        with pytest.raises(Exception):
            app_client(server.url, "ann", "not-the-password")
        with pytest.raises(Exception):
            app_client(server.url, "nobody", PASSWORD)
    finally:
        server.stop()


def test_the_api_docs_list_no_endpoints(project):
    server = RunningServer(project)
    try:
        client = app_client(server.url, "ann", PASSWORD)
        assert client.view_api(print_info=False, return_format="dict")["named_endpoints"] == {}
    finally:
        server.stop()
