"""scripts/fuzz.py, briefly: every endpoint the app serves called with values Hypothesis draws, beside honest annotators;
60 calls in the quick tier, 240 in the deep."""

import re
import subprocess
import sys
from typing import Callable

import pytest

from tests.conftest import REPO, add_users, app_client, free_port
from ui.owner.project import load_project
from ui.owner.server import Server
from ui.web.app import launch

PASSWORD = "password-123"


@pytest.mark.parametrize("drawn", [pytest.param(60, id="quick"), pytest.param(240, id="long", marks=pytest.mark.deep)])
def test_no_call_fails_the_server_or_writes_when_refused_and_no_honest_vote_is_lost(tmp_path, drawn):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "fuzz.py"), "--calls", str(drawn), "--annotators", "2",
                           "--pairs", "150", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    figures = dict(re.findall(r"^([a-z ]+): (\d+(?:\.\d+)?)$", done.stdout, re.M))
    assert int(figures["gradio functions"]) >= 40 and int(figures["endpoints"]) >= 50  # found from the app, not listed
    assert figures["tracebacks"] == figures["server errors"] == figures["writes by refused calls"] == "0" and int(figures["refusal lines"]) > 0
    assert int(figures["calls with one input of another type"]) > 0  # null, a list, an object... where the page sends text or a number
    assert int(figures["honest votes acknowledged"]) > 0 and figures["honest votes lost"] == figures["honest votes refused"] == "0"
    calls, failures = map(int, re.search(r"^calls: (\d+); failures \(must be 0\): (\d+)$", done.stdout, re.M).groups())
    assert failures == 0 and calls == drawn + int(figures["replays"])
    if drawn == 240:  # one call in ten replays an accepted one: none in 60 has a chance of 1 in 500
        assert int(figures["replays"]) > 0
    # A vote on a pair never served, or served to another, is refused in the annotate view's message line, and the
    # fuzzer checks that such a refusal wrote nothing but the lease of the pair shown instead.
    assert int(figures["annotate view refusals in words"]) > 0


def test_an_input_of_another_type_is_refused_in_one_line_before_its_handler_runs_and_nothing_is_written(tiny_project, capfd):
    """Found by the fuzzer's other-typed draws: a null password reached hash_new_password, and a null account name
    str.strip (a TypeError, then an error id and a traceback in the log); a list where text was due became its text.
    Each input is checked against the type its handler takes, before the handler runs."""
    sys.path.insert(0, str(REPO / "scripts"))
    from fuzz import fingerprint

    add_users(tiny_project, {"olga": "operator"}, PASSWORD)
    server = Server(load_project(tiny_project))
    port = free_port()
    app = launch(server, "127.0.0.1", port, prevent_thread_lock=True)
    refused = [(("mallory", "annotator", None), "/add_account", "password must be text, not null"),
               ((None, "a-long-password"), "/set_account_password", "name must be text, not null"),
               ((["mallory"], "annotator", "a-long-password"), "/add_account", "name must be text, not a list"),
               (({"limit": 5}, 2), "/generate", "limit must be a number or null, not an object"),
               (("jsonl", "yes", 0), "/export", "include_ties must be true or false, not text")]
    try:
        operator = app_client(f"http://127.0.0.1:{port}/", "olga", PASSWORD)
        before = fingerprint(server)
        for args, api_name, reason in refused:
            with pytest.raises(Exception, match=re.escape(f"Refused: this call's input is not what it takes ({reason})")):
                operator.predict(*args, api_name=api_name)
        after = fingerprint(server)
    finally:
        app.close()
        server.close()
    assert after == before
    log = capfd.readouterr().err
    assert "Traceback" not in log and not re.search(r"^error [0-9a-f]{8} in", log, re.M), log
    assert [line for line in log.splitlines() if line.startswith("refused ")] == [
        f"refused {name}: its input is not what it takes: {reason}"
        for name, (_, _, reason) in zip(["add_account", "set_account_password", "add_account", "generate_pairs", "export_data"], refused)]


def test_drawing_a_pair_token_does_not_depend_on_how_many_pairs_were_served():
    """The tokens grow between calls, and Hypothesis takes a draw whose bounds change on a path it has taken before for
    a strategy that depends on outside state: a 1,200-call run stopped after 600 calls with "Inconsistent data
    generation". A token is drawn by an index of fixed bounds: the same seed makes the same draws, and picks the token at
    the same index (modulo their number), whether one more token was offered at each call or always the same 64."""
    from hypothesis import HealthCheck, given, seed, settings, strategies as st

    sys.path.insert(0, str(REPO / "scripts"))
    from fuzz import TOKEN_CHOICES, value_for

    def draws(offered: Callable[[int], list[str]]) -> list[tuple[object, list[str]]]:
        """What 300 calls' textboxes were sent, and the tokens offered to each: offered(i) to the i-th."""
        sent = []

        @seed(0)
        @settings(max_examples=300, database=None, deadline=None, phases=["generate"], suppress_health_check=list(HealthCheck))
        @given(st.data())
        def draw(data):
            tokens = offered(len(sent))
            sent.append((data.draw(value_for({"type": "textbox", "props": {}}, tokens)), tokens))

        draw()
        return sent

    growing = draws(lambda i: [f"pair-token-{k}" for k in range(i + 1)])  # one more served before each call
    fixed = draws(lambda i: [f"pair-token-{k}" for k in range(TOKEN_CHOICES)])
    assert len(growing) == len(fixed) == 300  # Hypothesis stopped neither run
    picked = 0
    for (value, tokens), (other, _) in zip(growing, fixed):
        if isinstance(other, str) and re.fullmatch(r"pair-token-\d+", other):
            picked += 1
            assert value == tokens[int(other.removeprefix("pair-token-")) % len(tokens)]
        else:  # text, or JSON of another type: the same value
            assert repr(value) == repr(other)
    assert picked > 20
