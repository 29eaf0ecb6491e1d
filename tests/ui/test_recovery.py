"""Faults in jobs and crashes during registration: the runner goes on, and disk and database agree after a restart.

The kill tests run the real `tether rm train` / `tether ppo` with TETHER_TEST_KILL_AT naming an
ingest step, where the process kills itself as kill -9 would; the next command is the restart.
"""

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import pytest

from store import open_database
from store.jobs import add_job, get_job
from tests.conftest import DEMO_PROMPTS, run_tether, set_settings, toy_preferences
from ui.owner import recovery
from ui.owner.jobs import run_job
from ui.owner.project import init_project, job_dir, load_project
from ui.owner.recovery import INTENT_FILE, KILL_AT_ENV, record_worker
from ui.owner.round_jobs import submit_reward_training
from ui.web.app import Server

# Every kill point in the deep tier; the quick one kills where the adapter is in place and the row not yet written.
INGEST_STEPS = [pytest.param(step, marks=pytest.mark.deep) if step != "after_rename" else step
                for step in ("after_intent", "after_rename", "before_commit", "after_commit")]


@pytest.fixture
def project(tiny_project, tmp_path) -> Path:
    """The tiny project with 40 imported comparisons, a reward model that trains in seconds, from scratch each time."""
    set_settings(tiny_project, "reward_model", epochs=1, warm_start=False, include_imported=True)
    set_settings(tiny_project, "ppo", steps=1, batch_size=4, minibatch_size=2, epochs=1)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(tiny_project), check=True)
    return tiny_project


def rows(project: Path, sql: str) -> list[tuple]:
    with closing(open_database(project / "tether.duckdb")) as con:
        return con.execute(sql).fetchall()


def holds_a_model(path: Path) -> bool:
    """A version's directory is whole: a policy's adapter, or a reward model's head (the default kind)."""
    return (path / "adapter_config.json").exists() or (path / "head.safetensors").exists()


def assert_consistent(project: Path) -> None:
    """Every registered adapter is on disk, every version directory is registered, and no registration is half done."""
    registered = {path for (path,) in rows(project, "SELECT adapter_path FROM reward_models UNION "
                                                    "SELECT adapter_path FROM policies WHERE adapter_path IS NOT NULL")}
    on_disk = {str(p.relative_to(project)) for kind in ("reward_models", "policies") for p in (project / kind).glob("v*/")}
    assert registered == on_disk
    assert all(holds_a_model(project / path) for path in registered)
    assert not list(project.glob(f"jobs/*/{INTENT_FILE}"))
    assert rows(project, "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')") == [(0,)]
    check = run_tether("check", "--project", str(project))
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("step", INGEST_STEPS)
def test_killed_at_each_step_of_registering_a_reward_model_the_restart_leaves_one_consistent_state(project, step):
    killed = run_tether("rm", "train", "--project", str(project), env={KILL_AT_ENV: step})
    assert killed.returncode == -9, killed.stderr

    restarted = run_tether("rm", "train", "--project", str(project))
    assert restarted.returncode == 0, restarted.stderr
    assert_consistent(project)
    jobs = rows(project, "SELECT id, status FROM jobs ORDER BY id")
    versions = rows(project, "SELECT version, metrics->>'job' FROM reward_models ORDER BY version")
    if step == "after_commit":  # the row was the commit point: the first job's version stands
        assert jobs == [(1, "done"), (2, "done")] and versions == [(1, "1"), (2, "2")]
    else:  # nothing was registered; the next job takes the next free number
        assert jobs == [(1, "failed"), (2, "done")] and versions == [(1, "2")]
    set_aside = project / "jobs" / "1" / "orphaned" / "reward_models-v1"
    if step in ("after_rename", "before_commit"):  # the adapter had moved: it is set aside, not deleted
        assert holds_a_model(set_aside)
        assert "reward_models/v1 was moved to jobs/1/orphaned/reward_models-v1" in restarted.stderr
    else:
        assert not set_aside.exists()


def test_killed_while_registering_a_policy_the_restart_sets_it_aside_and_the_next_ppo_registers_v1(project):
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(project), check=True)
    assert run_tether("rm", "train", "--project", str(project)).returncode == 0
    killed = run_tether("ppo", "--project", str(project), env={KILL_AT_ENV: "after_rename"})
    assert killed.returncode == -9, killed.stderr

    restarted = run_tether("ppo", "--project", str(project))
    assert restarted.returncode == 0, restarted.stderr
    assert_consistent(project)
    assert rows(project, "SELECT version, adapter_path FROM policies ORDER BY version") == [(0, None), (1, "policies/v1")]
    assert (project / "jobs" / "2" / "orphaned" / "policies-v1" / "adapter_config.json").exists()


def test_a_version_directory_nobody_registered_is_set_aside_not_overwritten(project):
    stray = project / "reward_models" / "v1"
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("left by hand")
    trained = run_tether("rm", "train", "--project", str(project))
    assert trained.returncode == 0, trained.stderr
    assert "reward_models/v1 is not a registered version: moved to jobs/orphaned/reward_models-v1" in trained.stderr
    assert (project / "jobs" / "orphaned" / "reward_models-v1" / "notes.txt").read_text() == "left by hand"
    assert holds_a_model(project / "reward_models" / "v1")
    assert_consistent(project)


def test_the_process_that_registers_an_adapter_syncs_each_of_its_files_then_its_directories_before_the_row_commits(
    project, monkeypatch
):
    """The worker syncs what it builds, but in its own process; the row is this process's word that the files are whole.

    os.fsync is watched in this process only (the worker is a child process), recording what each
    call synced by inode, which a rename keeps; the ingest's fault points mark where the row commits.
    """
    synced: list[int | str] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda descriptor: (synced.append(os.fstat(descriptor).st_ino), fsync(descriptor))[1])
    monkeypatch.setattr(recovery, "fault_point", synced.append)
    loaded = load_project(project)
    assert run_job(loaded, loaded.run, submit_reward_training(loaded, loaded.run)).status == "done"

    before_commit = synced[: synced.index("before_commit")]
    adapter = loaded.root / "reward_models" / "v1"
    files = [path.stat().st_ino for path in adapter.rglob("*") if path.is_file()]
    directories = [path.stat().st_ino for path in (adapter, adapter.parent, loaded.root)]
    assert len(files) >= 3 and set(files + directories) <= set(before_commit)
    last_file = max(before_commit.index(inode) for inode in files)
    assert all(len(before_commit) - 1 - before_commit[::-1].index(inode) > last_file for inode in directories)


# The app's job runner: a fault in one job fails that job, with its error, and the runner goes on.


def wait_for_job(server: Server, job_id: int, timeout: float = 300) -> tuple[str, str | None]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = server.db(get_job, job_id)
        if job.status in ("done", "failed", "cancelled"):
            return job.status, job.error
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


def queue_reward_training(project_dir: Path) -> tuple[int, Path]:
    project = load_project(project_dir)
    job = submit_reward_training(project, project.run)
    return job.id, job_dir(project, job.id)


def break_events(directory: Path) -> None:
    (directory / "events.jsonl").write_text('{"event": "progress", "progress": 0.\n')


def remove_directory(directory: Path) -> None:
    shutil.rmtree(directory)


def block_reward_models(directory: Path) -> None:
    (directory.parent.parent / "reward_models").write_text("a file where the versions' directory must go")


@pytest.mark.parametrize("fault, error", [
    (break_events, "JSONDecodeError"),
    pytest.param(remove_directory, "FileNotFoundError", marks=pytest.mark.deep),  # a result lost, as break_events
    pytest.param(block_reward_models, "FileExistsError", marks=pytest.mark.deep),  # raised by the ingest, after the worker succeeded
])
def test_a_fault_in_a_job_fails_that_job_and_the_runner_registers_the_next(project, fault, error, capsys):
    broken, directory = queue_reward_training(project)
    fault(directory)
    server = Server(load_project(project))
    try:
        status, message = wait_for_job(server, broken)
        assert status == "failed" and message.startswith(error), message
        assert server.jobs.thread.is_alive()
        if fault is block_reward_models:
            (project / "reward_models").unlink()
        following = submit_reward_training(server.project, server.db).id
        assert wait_for_job(server, following) == ("done", None)
    finally:
        server.close()
    assert rows(project, "SELECT version, metrics->>'job' FROM reward_models") == [(1, str(following))]
    assert f"job {broken} failed:" in capsys.readouterr().err
    assert_consistent(project)


def test_at_start_a_job_whose_worker_is_gone_is_failed_and_processes_it_left_are_killed(project, capsys):
    job_id, directory = queue_reward_training(project)
    with closing(open_database(project / "tether.duckdb")) as con:
        con.execute("UPDATE jobs SET status = 'running' WHERE id = ?", [job_id])
    # What a multi-GPU launcher's rank process looks like once the launcher is gone: it names the job directory.
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(directory)])
    try:
        server = Server(load_project(project))
        server.close()
        assert stray.wait(timeout=10) == -signal.SIGKILL
    finally:
        stray.kill()
    printed = capsys.readouterr().out
    assert f"killed process {stray.pid}, left over from job {job_id}" in printed
    assert "marked 1 job failed: the process running it stopped" in printed
    assert rows(project, f"SELECT status, error FROM jobs WHERE id = {job_id}") == [("failed", "the process running it stopped")]


# Starts the server as another user: imports as root (the interpreter lies under root's home), then gives up root.
START_AS = """
import os, sys
from pathlib import Path
from ui.owner.project import load_project
from ui.owner.server import Server
project = load_project(Path(sys.argv[1]))
os.setgroups([])
os.setgid(int(sys.argv[3]))
os.setuid(int(sys.argv[2]))
Server(project).close()
"""


@pytest.mark.deep
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run processes as two users")
def test_processes_of_another_user_never_stop_the_server_starting_and_are_left_alone():
    """The server runs as nobody; its job's recorded worker pid now belongs to root's init, and a process of root's
    names the job's directory: neither is taken for the worker, the job is failed, and nothing is killed."""
    nobody = pwd.getpwnam("nobody")
    home = Path(tempfile.mkdtemp(prefix="tether-other-user-"))  # outside pytest's directories, which only root may enter
    try:
        project = init_project(home / "project", "a-model-nobody-loads")
        job = project.run(add_job, "generate", {}, None)
        project.run(lambda con: con.execute("UPDATE jobs SET status = 'running' WHERE id = ?", [job.id]))
        directory = job_dir(project, job.id)
        directory.mkdir(parents=True)
        record_worker(directory, 1)  # the pid its worker had, now init's
        for path in [home, *home.rglob("*")]:
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        someone_elses = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(directory)])
        try:
            started = subprocess.run([sys.executable, "-c", START_AS, str(project.root), str(nobody.pw_uid), str(nobody.pw_gid)],
                                     capture_output=True, text=True, timeout=120)
            assert started.returncode == 0, started.stderr
            assert someone_elses.poll() is None  # left alone
        finally:
            someone_elses.kill()
        assert "marked 1 job failed: the process running it stopped" in started.stdout
        assert "killed process" not in started.stdout
        assert project.run(get_job, job.id).status == "failed"
    finally:
        shutil.rmtree(home)
