"""Jobs run in a worker process: progress, cancel, a kill -9, and the app serving throughout."""

import json
import os
import signal
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pytest
from gradio_client import Client

from store import open_database
from tests.conftest import DEMO_PROMPTS, RunningServer, add_pairs, add_users, app_client, run_tether, set_settings, wait_for, worker_pids
from train.common.config import JudgeConfig, ModelConfig
from train.runtime.job_configs import JudgeJob
from train.runtime.jobdir import OWNER_PID_ENV, RESULT_FILE, JobDirError, read_events, read_job, write_job
from train.worker import NICENESS
from ui.owner.jobs import WORKER_ENV, run_job
from ui.owner.project import job_dir, load_project
from ui.owner.round_jobs import submit_generation

pytestmark = pytest.mark.worker_process  # about the worker process itself: its jobs start real workers

PASSWORD = "password-123"


@pytest.fixture
def slow_project(tiny_project):
    """A project whose generation job runs long enough to be watched, cancelled and killed."""
    set_settings(tiny_project, "generation", max_new_tokens=400, batch_size=1)
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    add_pairs(tiny_project, prompts=20)
    add_users(tiny_project, {"ann": "annotator", "olga": "operator"}, PASSWORD)
    return tiny_project


def job_row(operator: Client, job_id: int) -> list:
    return next(row for row in operator.predict(api_name="/jobs")["data"] if row[0] == job_id)


def completions(project) -> int:
    with closing(open_database(project / "tether.duckdb")) as con:
        return con.execute("SELECT count(*) FROM completions").fetchone()[0]


def percent(progress_cell: str) -> int:
    """The percentage at the end of a progress cell such as "████░░░░ 20%"."""
    return int(progress_cell.split()[-1].rstrip("%"))


def test_killing_the_worker_fails_the_job_with_its_log_while_annotators_carry_on(slow_project):
    before = completions(slow_project)
    server = RunningServer(slow_project)
    try:
        operator = app_client(server.url, "olga", PASSWORD)
        annotator = app_client(server.url, "ann", PASSWORD)
        assert operator.predict(28, 4, api_name="/generate").startswith("Queued job 1")
        # Progress moves while the worker runs, and the annotator keeps voting meanwhile.
        first = wait_for(lambda: (row := job_row(operator, 1))[2] == "running" and percent(row[3]) > 0 and row[3])
        token = annotator.predict(api_name="/next_pair")[0]
        view = annotator.predict(token, None, "", api_name="/vote_left")
        assert view[5] == "" and view[0] != token
        later = wait_for(lambda: (p := job_row(operator, 1)[3]) != first and p)
        assert percent(later) > percent(first)

        [pid] = worker_pids(slow_project, 1)
        # The worker gives way to the server for the CPU: annotators come first.
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, server.process.pid) + NICENESS)
        os.kill(pid, signal.SIGKILL)
        failed = wait_for(lambda: (row := job_row(operator, 1))[2] == "failed" and row)
        assert "the worker exited with code -9" in failed[7]
        assert annotator.predict(view[0], None, "", api_name="/vote_right")[5] == ""  # still serving
    finally:
        server.stop()
    assert completions(slow_project) == before  # a half-finished job stores nothing
    with closing(open_database(slow_project / "tether.duckdb")) as con:
        assert con.execute("SELECT status FROM jobs WHERE id = 1").fetchone() == ("failed",)
        assert con.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 2


def test_an_operator_cancels_a_running_job_and_its_worker_stops(slow_project):
    before = completions(slow_project)
    server = RunningServer(slow_project)
    try:
        operator = app_client(server.url, "olga", PASSWORD)
        operator.predict(28, 4, api_name="/generate")
        operator.predict(28, 4, api_name="/generate")  # queued behind the first: one job at a time
        wait_for(lambda: job_row(operator, 1)[2] == "running")
        assert job_row(operator, 2)[2] == "queued"
        operator.predict(2, api_name="/cancel_job")
        assert job_row(operator, 2)[2] == "cancelled"
        operator.predict(1, api_name="/cancel_job")
        wait_for(lambda: job_row(operator, 1)[2] == "cancelled")
        wait_for(lambda: not worker_pids(slow_project, 1), seconds=10)
    finally:
        server.stop()
    assert completions(slow_project) == before


@pytest.mark.deep  # the quick soak (tests/ui/test_soak.py) counts workers outliving a killed server
def test_a_worker_runs_in_its_own_session_and_dies_with_a_server_killed_by_kill_9(slow_project):
    server = RunningServer(slow_project)
    try:
        operator = app_client(server.url, "olga", PASSWORD)
        operator.predict(28, 4, api_name="/generate")
        wait_for(lambda: percent(job_row(operator, 1)[3]) > 0)  # the worker is at work
        [pid] = worker_pids(slow_project, 1)
        assert os.getsid(pid) == pid  # its own session: a cancel kills it and all it started
    finally:
        server.crash()
    wait_for(lambda: not worker_pids(slow_project, 1), seconds=10)


def queue_generation(project_dir: Path) -> Path:
    """A slow generation job queued and not run: its directory."""
    project = load_project(project_dir)
    return job_dir(project, submit_generation(project, project.run, per_prompt=4).id)


# The app's part of running a job, in a process of its own, so that the test can kill it: run_job
# starts the worker under `accelerate launch`, as it does for [worker] gpus over 1, with one process.
OWNER = """
import sys
from pathlib import Path
from store.jobs import get_job
from ui.owner.jobs import run_job
from ui.owner.project import load_project
project = load_project(Path(sys.argv[1]))
launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "train.worker", sys.argv[2]]
run_job(project, project.run, project.run(get_job, 1), command=launch)
"""


@pytest.mark.deep
def test_a_worker_under_a_launcher_dies_with_the_process_that_started_the_job(slow_project):
    directory = queue_generation(slow_project)
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(slow_project), str(directory)])
    try:
        wait_for(lambda: any("progress" in e for e in read_events(directory, 0)[0]))  # the worker is at work
        assert len(worker_pids(slow_project, 1)) == 2  # the launcher, and the worker it started
    finally:
        owner.kill()
        owner.wait()
    wait_for(lambda: not worker_pids(slow_project, 1), seconds=10)
    assert "the process that started this job" in (directory / "worker.log").read_text()


def test_a_worker_whose_owner_is_gone_before_it_starts_stops_at_once(slow_project):
    directory = queue_generation(slow_project)
    gone = subprocess.Popen(["true"])
    gone.wait()
    worker = subprocess.run([sys.executable, "-m", "train.worker", str(directory)], capture_output=True, text=True,
                            env=os.environ | {OWNER_PID_ENV: str(gone.pid)}, timeout=60)
    assert worker.returncode == 1 and f"the process that started this job ({gone.pid}) is gone" in worker.stderr
    assert not (directory / RESULT_FILE).exists()


@pytest.mark.parametrize("worker", ["process", "here"])
def test_a_failing_worker_is_reported_by_the_cli_with_its_log(tiny_project, tmp_path, monkeypatch, worker):
    monkeypatch.setenv(WORKER_ENV, worker)
    config = tiny_project / "tether.toml"
    config.write_text(config.read_text().replace('name_or_path = "', f'name_or_path = "{tmp_path}/gone'))
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    result = run_tether("generate", "--project", str(tiny_project))
    assert result.returncode == 1
    assert "job 1 failed: the worker exited with code 1" in result.stderr
    assert "error: cannot load model" in result.stderr and "Traceback" not in result.stderr
    assert completions(tiny_project) == 0


def test_a_job_run_here_that_raises_fails_with_its_traceback_and_the_next_runs(tiny_project):
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    project = load_project(tiny_project)
    broken = submit_generation(project, project.run, limit=1, per_prompt=1)
    (job_dir(project, broken.id) / "inputs" / "prompts.parquet").write_bytes(b"changed")
    failed = run_job(project, project.run, broken, here=True)
    assert failed.status == "failed" and failed.error.startswith("the worker exited with code 1:")
    assert "Traceback" in failed.error and "changed after the job was written" in failed.error
    assert run_job(project, project.run, submit_generation(project, project.run, limit=1, per_prompt=1), here=True).status == "done"
    assert completions(tiny_project) == 1


def test_job_inputs_are_frozen_by_their_hashes(tmp_path):
    config = JudgeJob(model=ModelConfig(), judge=JudgeConfig(), annotator="ai:judge")
    job = write_job(tmp_path / "job", config, {"prompts": pa.table({"prompt_id": [1, 2]})})
    assert read_job(tmp_path / "job") == job == json.loads((tmp_path / "job" / "job.json").read_text())
    (tmp_path / "job" / "inputs" / "prompts.parquet").write_bytes(b"changed")
    with pytest.raises(JobDirError, match="changed after the job was written"):
        read_job(tmp_path / "job")


@pytest.mark.deep
def test_a_module_named_like_the_standard_librarys_where_tether_runs_does_not_reach_the_worker(tiny_project, tmp_path):
    here = tmp_path / "elsewhere"
    here.mkdir()
    (here / "signal.py").write_text("raise SystemExit('the standard library was shadowed')\n")
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    result = run_tether("generate", "--limit", "1", "--project", str(tiny_project), cwd=here)
    assert result.returncode == 0, result.stderr
    assert "stored 2 completions" in result.stdout


# A stand-in worker that only says which allocator setting it was started with, then fails, so its log is kept.
SAY_ALLOCATOR = "import os, sys; print('threshold', os.environ.get('MALLOC_MMAP_THRESHOLD_')); sys.exit(3)"


@pytest.mark.parametrize("release", [True, False])
def test_workers_start_with_glibc_returning_freed_memory_unless_the_setting_is_off(slow_project, release):
    set_settings(slow_project, "worker", release_memory=release)
    project = load_project(slow_project)
    job = submit_generation(project, project.run, per_prompt=4)
    failed = run_job(project, project.run, job, command=[sys.executable, "-c", SAY_ALLOCATOR])
    assert failed.status == "failed"
    assert ("threshold 131072" if release else "threshold None") in failed.error
