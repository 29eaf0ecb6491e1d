"""`tether backup` while annotators vote, through the running server, and `tether restore` elsewhere."""

import hashlib
import json
import random
import threading
import time
from contextlib import closing
from pathlib import Path

from gradio_client import Client

from store import open_database
from tests.conftest import RunningServer, add_pairs, add_users, run_tether, set_settings, toy_preferences

PASSWORD = "password-123"


class Voter(threading.Thread):
    """Votes as fast as the server answers until told to stop; keeps each acknowledged token with its time."""

    def __init__(self, url: str, name: str):
        super().__init__(daemon=True)
        self.client = Client(url, auth=(name, PASSWORD), verbose=False, httpx_kwargs={"timeout": 60})
        self.acknowledged: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.error: Exception | None = None

    def run(self):
        try:
            token = self.client.predict(api_name="/next_pair")[0]
            while token and not self.stop.is_set():
                view = self.client.predict(token, None, "", api_name=f"/vote_{random.choice(['left', 'right', 'tie'])}")
                if view[5] == "":  # the message line is empty when the vote was stored
                    self.acknowledged.append((time.monotonic(), token))
                token = view[0]
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_backup_taken_while_annotators_vote_holds_every_vote_acknowledged_before_it_began(tiny_project, tmp_path):
    set_settings(tiny_project, "reward_model", epochs=1, warm_start=False, include_imported=True)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(tiny_project), check=True)
    run_tether("rm", "train", "--project", str(tiny_project), check=True)  # a registered adapter to back up
    add_pairs(tiny_project, prompts=600)
    add_users(tiny_project, {f"ann{i}": "annotator" for i in range(3)}, PASSWORD)
    dest = tmp_path / "backups" / "monday"
    dest.parent.mkdir()

    server = RunningServer(tiny_project)
    try:
        voters = [Voter(server.url, f"ann{i}") for i in range(3)]
        for voter in voters:
            voter.start()
        while sum(len(v.acknowledged) for v in voters) < 20:
            time.sleep(0.05)
        began = time.monotonic()
        taken = run_tether("backup", str(dest), "--project", str(tiny_project))
        ended = time.monotonic()
        time.sleep(1)  # voting goes on after the backup too
        for voter in voters:
            voter.stop.set()
            voter.join(timeout=60)
    finally:
        server.stop()
    assert taken.returncode == 0, taken.stderr
    assert all(v.error is None for v in voters), [v.error for v in voters]
    acknowledged = [ack for v in voters for ack in v.acknowledged]
    before = {token for at, token in acknowledged if at < began}
    during = [token for at, token in acknowledged if began <= at <= ended]
    after = [token for at, token in acknowledged if at > ended]
    assert before and during and after, (len(before), len(during), len(after))  # votes never paused

    restored = tmp_path / "restored"
    result = run_tether("restore", str(dest), "--project", str(restored))
    assert result.returncode == 0, result.stderr
    with closing(open_database(restored / "tether.duckdb")) as con:
        stored = {token for (token,) in con.execute("SELECT client_token FROM comparisons WHERE source = 'app'").fetchall()}
        adapters = [path for (path,) in con.execute("SELECT adapter_path FROM reward_models").fetchall()]
    assert before <= stored  # every vote acknowledged before the backup began
    assert stored <= {token for _, token in acknowledged}  # and nothing an annotator was not told was stored
    assert f"backed up {taken.stdout.split()[2]} votes" in taken.stdout
    assert adapters == ["reward_models/v1"]
    assert tree_digest(restored / "reward_models/v1") == tree_digest(tiny_project / "reward_models/v1")
    assert (restored / "tether.toml").read_text() == (tiny_project / "tether.toml").read_text()
    status = run_tether("status", "--project", str(restored))
    assert status.returncode == 0 and "reward models v1" in " ".join(status.stdout.split())


def test_restore_never_overwrites_a_project_and_backup_never_overwrites_a_directory(tiny_project, tmp_path):
    dest = tmp_path / "backup"
    run_tether("backup", str(dest), "--project", str(tiny_project), check=True)  # no server: straight from the file
    again = run_tether("backup", str(dest), "--project", str(tiny_project))
    assert again.returncode == 1 and "exists already" in again.stderr
    before = tree_digest(tiny_project)
    refused = run_tether("restore", str(dest), "--project", str(tiny_project))
    assert refused.returncode == 1 and "holds a project already" in refused.stderr
    assert tree_digest(tiny_project) == before
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    refused = run_tether("restore", str(dest), "--project", str(tmp_path / "busy"))
    assert refused.returncode == 1 and "not empty" in refused.stderr
    not_a_backup = run_tether("restore", str(tmp_path / "busy"), "--project", str(tmp_path / "new"))
    assert not_a_backup.returncode == 1 and "is not a Tether backup" in not_a_backup.stderr
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".new.*"))


def test_restore_refuses_a_manifest_naming_paths_outside_the_backup(tiny_project, tmp_path):
    dest = tmp_path / "backup"
    run_tether("backup", str(dest), "--project", str(tiny_project), check=True)
    manifest = json.loads((dest / "backup.json").read_text())
    (tmp_path / "secret").mkdir()
    (dest / "backup.json").write_text(json.dumps(manifest | {"adapters": ["../secret"]}))
    refused = run_tether("restore", str(dest), "--project", str(tmp_path / "new" / "project"))
    assert refused.returncode == 1 and "field 'adapters': '../secret' is not a version directory" in refused.stderr
    assert not (tmp_path / "new" / "project").exists() and not (tmp_path / "new" / "secret").exists()
