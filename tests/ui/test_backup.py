"""`tether backup` while annotators vote, through the running server, and `tether restore` elsewhere."""

import contextlib
import hashlib
import json
import os
import random
import shutil
import threading
import time
from contextlib import closing
from pathlib import Path

import duckdb
import pytest

from annotate.pairs import add_completions_with_pairs
from annotate.queue import QueueConfig
from store import open_database
from store.completions import NewCompletion
from store.jobs import add_job
from store.prompt_files import NewPrompt
from store.prompts import add_prompts
from tests.conftest import RunningServer, add_pairs, add_users, app_client, run_tether, set_settings, tmpfs, toy_preferences, vote_every_pair
from train.common.files import partial_writes

PASSWORD = "password-123"


class Voter(threading.Thread):
    """Votes as fast as the server answers until told to stop; keeps each acknowledged token with its time."""

    def __init__(self, url: str, name: str):
        super().__init__(daemon=True)
        self.client = app_client(url, name, PASSWORD, httpx_kwargs={"timeout": 60})
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


@pytest.mark.deep
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
    # The next reward model reads which votes v1 trained on, from the snapshot the backup carried.
    run_tether("rm", "train", "--project", str(restored), check=True)


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
    assert not (tmp_path / "new").exists() and not partial_writes(tmp_path)


def test_restore_refuses_a_manifest_naming_paths_outside_the_backup(tiny_project, tmp_path):
    dest = tmp_path / "backup"
    run_tether("backup", str(dest), "--project", str(tiny_project), check=True)
    manifest = json.loads((dest / "backup.json").read_text())
    (tmp_path / "secret").mkdir()
    (dest / "backup.json").write_text(json.dumps(manifest | {"adapters": ["../secret"]}))
    refused = run_tether("restore", str(dest), "--project", str(tmp_path / "new" / "project"))
    assert refused.returncode == 1 and "field 'adapters': '../secret' is not a version directory" in refused.stderr
    (dest / "backup.json").write_text(json.dumps(manifest | {"inputs": ["jobs/1/inputs/../../../secret/x.parquet"]}))
    refused = run_tether("restore", str(dest), "--project", str(tmp_path / "new" / "project"))
    assert refused.returncode == 1 and "field 'inputs': 'jobs/1/inputs/../../../secret/x.parquet' is not a job's input" in refused.stderr
    assert not (tmp_path / "new" / "project").exists() and not (tmp_path / "new" / "secret").exists()


@pytest.fixture
def few_inodes(tmp_path):
    """A tmpfs with room for 64 files and directories, mounted for the test (which needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")
    with tmpfs(tmp_path / "disk", "size=64m,nr_inodes=64") as mount_point:
        yield mount_point


def test_a_backup_that_fails_while_copying_leaves_the_server_able_to_take_the_next(tiny_project, few_inodes):
    add_pairs(tiny_project, prompts=5)
    vote_every_pair(tiny_project)
    filler = few_inodes / "filler"
    filler.mkdir()
    made = 0
    with contextlib.suppress(OSError):  # until the filesystem has no file left to give
        while True:
            (filler / str(made)).touch()
            made += 1
    for n in range(made - 3, made):  # room for the backup's directories and its database, not for the database's log
        (filler / str(n)).unlink()
    server = RunningServer(tiny_project)
    try:
        failed = run_tether("backup", str(few_inodes / "monday"), "--project", str(tiny_project))
        assert failed.returncode == 1
        assert sorted(p.name for p in few_inodes.iterdir()) == ["filler"]  # nothing left half made
        shutil.rmtree(filler)
        taken = run_tether("backup", str(few_inodes / "tuesday"), "--project", str(tiny_project))
        assert taken.returncode == 0, taken.stderr
        assert "backed up 5 votes" in taken.stdout
    finally:
        server.stop()
    assert "cannot copy the database to" in failed.stderr and "No space left on device" in failed.stderr, failed.stderr
    restored = run_tether("restore", str(few_inodes / "tuesday"), "--project", str(few_inodes / "restored"))
    assert restored.returncode == 0, restored.stderr


@pytest.mark.parametrize("linked", ["tether.duckdb", "reward_models/v1/adapter_model.safetensors"])
def test_restore_refuses_a_backup_holding_a_symbolic_link(tiny_project, tmp_path, linked):
    dest = tmp_path / "backup"
    run_tether("backup", str(dest), "--project", str(tiny_project), check=True)
    secret = tmp_path / "secret"
    secret.write_text("not for the project")
    if linked == "tether.duckdb":  # a link to a real database: followed, it would be restored
        (dest / linked).rename(secret)
    else:  # an adapter whose weights are a link to a file elsewhere
        manifest = json.loads((dest / "backup.json").read_text())
        (dest / "backup.json").write_text(json.dumps(manifest | {"adapters": ["reward_models/v1"]}))
        (dest / "reward_models" / "v1").mkdir(parents=True)
        (dest / "reward_models" / "v1" / "adapter_config.json").write_text("{}")
    (dest / linked).symlink_to(secret)
    refused = run_tether("restore", str(dest), "--project", str(tmp_path / "restored"))
    assert refused.returncode == 1, refused.stdout
    assert f"{dest} holds a symbolic link, {linked}: a backup holds only files and directories" in refused.stderr
    assert not (tmp_path / "restored").exists()


def test_restore_reads_only_the_tables_of_a_backups_database_and_refuses_one_with_a_view_in_their_place(tiny_project, tmp_path):
    add_pairs(tiny_project, prompts=3)
    vote_every_pair(tiny_project)
    dest = tmp_path / "backup"
    run_tether("backup", str(dest), "--project", str(tiny_project), check=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the project")
    with closing(duckdb.connect(str(dest / "tether.duckdb"))) as con:  # what a tampered backup may hold
        con.execute(f"CREATE VIEW leak AS SELECT content FROM read_text('{secret}')")
    restored = run_tether("restore", str(dest), "--project", str(tmp_path / "restored"))
    assert restored.returncode == 0 and "restored 3 votes" in restored.stdout, restored.stderr
    with closing(open_database(tmp_path / "restored" / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone()[0] == 0

    with closing(duckdb.connect(str(dest / "tether.duckdb"))) as con:
        con.execute(f"DROP TABLE comparisons; CREATE VIEW comparisons AS SELECT content FROM read_text('{secret}')")
    refused = run_tether("restore", str(dest), "--project", str(tmp_path / "again"))
    assert refused.returncode == 1 and "table comparisons is not as schema version" in refused.stderr, refused.stderr
    assert not (tmp_path / "again").exists()


def test_after_a_restore_new_votes_prompts_and_jobs_get_fresh_ids(tiny_project, tmp_path):
    add_pairs(tiny_project, prompts=6)
    vote_every_pair(tiny_project)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        for _ in range(3):
            add_job(con, "generate", {})
    tables = ("prompts", "completions", "pairs", "assignments", "comparisons", "jobs")

    def highest_ids(project: Path) -> dict[str, int]:
        with closing(open_database(project / "tether.duckdb")) as con:
            return {table: con.execute(f"SELECT max(id) FROM {table}").fetchone()[0] for table in tables}

    before = highest_ids(tiny_project)
    run_tether("backup", str(tmp_path / "backup"), "--project", str(tiny_project), check=True)
    restored = tmp_path / "restored"
    run_tether("restore", str(tmp_path / "backup"), "--project", str(restored), check=True)
    assert highest_ids(restored) == before
    with closing(open_database(restored / "tether.duckdb")) as con:  # a new prompt, its pair and a job, as the app adds them
        add_prompts(con, [NewPrompt([{"role": "user", "content": "a question after the restore"}], "test")])
        prompt = con.execute("SELECT id FROM prompts WHERE source = 'test' ORDER BY created_at DESC, id DESC LIMIT 1").fetchone()[0]
        add_completions_with_pairs(con, [NewCompletion(prompt, 0, f"answer {k}", 5, True, {}) for k in range(2)], QueueConfig())
        add_job(con, "generate", {})
    assert vote_every_pair(restored, "someone-new") == 1
    with closing(open_database(restored / "tether.duckdb")) as con:
        fresh = {table: con.execute(f"SELECT min(id) FROM {table} WHERE id > ?", [before[table]]).fetchone()[0] for table in tables}
        counts = [con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in ("prompts", "comparisons", "jobs")]
    assert fresh == {table: before[table] + 1 for table in tables} and counts == [7, 7, 4]
