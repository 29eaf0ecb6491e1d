"""Rollback beside jobs that register a policy: a DPO job cancelled or finishing while a rollback runs
never costs a registered adapter, and a cancelled job's result is never registered."""

import threading
from contextlib import closing
from pathlib import Path

import pytest

from store import StoreError, open_database
from store.policies import add_policy, add_rollback
from tests.conftest import add_pairs, run_tether, set_settings, vote_every_pair, wait_for, worker_pids
from train.runtime.jobdir import RESULT_FILE
from ui.owner.jobs import run_job
from ui.owner.project import job_dir, load_project
from ui.owner.rollback import roll_back
from ui.owner.round_jobs import submit_dpo


@pytest.fixture
def project(tiny_project) -> Path:
    """Voted pairs for DPO on the votes alone, v1 with an adapter, and v2 newest without one (DPO starts from the base)."""
    set_settings(tiny_project, "dpo", pairs="human", votes="all", epochs=1, batch_size=4)
    add_pairs(tiny_project, prompts=16)
    vote_every_pair(tiny_project)
    adapter = tiny_project / "policies" / "v1"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights of v1")
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        add_policy(con, 1, "policies/v1", parent=0)
        add_policy(con, 2, None, parent=0)
    return tiny_project


def policies(project: Path) -> list[tuple]:
    with closing(open_database(project / "tether.duckdb")) as con:
        return con.execute("SELECT version, parent, adapter_path, rollback_from FROM policies ORDER BY version").fetchall()


def job_status(project: Path, job_id: int) -> str:
    with closing(open_database(project / "tether.duckdb")) as con:
        return con.execute("SELECT status FROM jobs WHERE id = ?", [job_id]).fetchone()[0]


def assert_registered_adapters_on_disk(project: Path) -> None:
    for _, _, adapter_path, _ in policies(project):
        if adapter_path is not None:
            assert (project / adapter_path / "adapter_config.json").exists(), adapter_path


def test_a_rollback_while_a_cancelled_dpo_job_is_still_stopping_is_refused_then_keeps_every_adapter(project):
    """The runner stops a cancelled job's worker when it next looks; until then the job is running, and a rollback
    waits. The runner's look is held here, so the window is certain rather than a race against its poll."""
    set_settings(project, "dpo", epochs=100)  # long enough to be running when it is cancelled
    tether = load_project(project)
    runner_looks = threading.Event()
    ended = []
    job = submit_dpo(tether, tether.run)
    runner = threading.Thread(target=lambda: ended.append(
        run_job(tether, tether.run, job, cancelled=lambda: "cancelled by an operator" if runner_looks.is_set() else None)
    ))
    runner.start()
    try:
        wait_for(lambda: worker_pids(project, job.id), seconds=60)
        with pytest.raises(StoreError, match="DPO job 1 has not ended: wait for it, or cancel it and wait until it shows cancelled"):
            roll_back(tether, tether.run, 1)
    finally:
        runner_looks.set()
        runner.join(timeout=60)
    assert [j.status for j in ended] == ["cancelled"]
    assert worker_pids(project, job.id) == []
    assert roll_back(tether, tether.run, 1).version == 3
    assert job_status(project, 1) == "cancelled"
    assert policies(project) == [(0, None, None, None), (1, 0, "policies/v1", None), (2, 0, None, None), (3, 1, "policies/v3", 2)]
    assert (project / "policies" / "v3" / "adapter_model.safetensors").read_bytes() == b"weights of v1"
    assert_registered_adapters_on_disk(project)
    # The copy's files were registered with their digests: `tether check` finds one changed since.
    (project / "policies" / "v3" / "adapter_model.safetensors").write_bytes(b"changed")
    check = run_tether("check", "--project", str(project))
    assert check.returncode == 1 and "policy v3: policies/v3/adapter_model.safetensors is changed since it was registered" in check.stderr


def test_a_dpo_job_that_registers_the_version_a_rollback_was_copying_keeps_its_adapter(project):
    tether = load_project(project)
    dpo_jobs = []

    def run(fn, *args):
        """The project's own run; once the rollback's copy is made, a DPO job runs to its end and registers v3 first."""
        if fn is add_rollback:
            dpo_jobs.append(run_job(tether, tether.run, submit_dpo(tether, tether.run)))
        return tether.run(fn, *args)

    with pytest.raises(StoreError, match="the policies changed while the adapter was copied"):
        roll_back(tether, run, 1)
    [dpo] = dpo_jobs
    assert dpo.status == "done", dpo.error
    assert policies(project)[3] == (3, 2, "policies/v3", None)  # DPO's, from v2
    assert_registered_adapters_on_disk(project)
    set_aside = job_dir(tether, dpo.id) / "orphaned" / "policies-v3"  # the rollback's copy, moved by the ingest
    assert (set_aside / "adapter_model.safetensors").read_bytes() == b"weights of v1"
    assert (project / "policies" / "v3" / "adapter_model.safetensors").read_bytes() != b"weights of v1"


def test_a_dpo_job_cancelled_as_its_worker_finishes_registers_nothing(project):
    tether = load_project(project)
    job = submit_dpo(tether, tether.run)
    directory = job_dir(tether, job.id)
    asked = []

    def cancelled() -> str | None:
        """An operator's cancel that arrives right after the runner looked, once the worker had written its result and exited."""
        if asked:
            return "cancelled by an operator"
        if (directory / RESULT_FILE).exists():
            wait_for(lambda: not worker_pids(project, job.id), seconds=30)
            asked.append(True)
        return None

    finished = run_job(tether, tether.run, job, cancelled=cancelled)
    assert asked and (directory / RESULT_FILE).exists()  # the worker did finish
    assert (finished.status, finished.error) == ("cancelled", "cancelled by an operator")
    assert policies(project) == [(0, None, None, None), (1, 0, "policies/v1", None), (2, 0, None, None)]
    assert not (project / "policies" / "v3").exists()
    assert_registered_adapters_on_disk(project)
