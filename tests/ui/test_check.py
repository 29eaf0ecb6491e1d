"""`tether check` says a whole project is whole, and names each kind of damage in words, with exit status 1."""

import shutil
from contextlib import closing
from pathlib import Path

import pytest

from store import open_database
from tests.conftest import RunningServer, run_tether, set_settings, toy_preferences


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir) -> Path:
    """A project with imported votes and reward model v1 registered (its head, features cache and snapshot)."""
    from ui.owner.project import init_project

    root = tmp_path_factory.mktemp("trained") / "project"
    init_project(root, str(tiny_model_dir))
    set_settings(root, "reward_model", epochs=1, include_imported=True)
    run_tether("import-prefs", str(toy_preferences(root.parent / "prefs.jsonl")), "--project", str(root), check=True)
    run_tether("rm", "train", "--project", str(root), check=True)
    return root


@pytest.fixture
def project(trained, tmp_path) -> Path:
    copy = tmp_path / "project"
    shutil.copytree(trained, copy)
    return copy


def check(project: Path) -> tuple[int, str]:
    done = run_tether("check", "--project", str(project))
    return done.returncode, done.stdout + done.stderr


def execute(project: Path, sql: str) -> None:
    with closing(open_database(project / "tether.duckdb")) as con:
        con.execute(sql)


def test_a_whole_project_is_whole(project):
    status, report = check(project)
    assert status == 0, report
    assert "is whole" in report and "registered versions: 1, with 3 files as they were registered" in report


def remove_version(project):
    shutil.rmtree(project / "reward_models" / "v1")
    return "reward model v1 is registered but its directory reward_models/v1 is missing: restore the project from a backup"


def change_a_file(project):
    with (project / "reward_models" / "v1" / "head.safetensors").open("r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    return "reward model v1: reward_models/v1/head.safetensors is changed since it was registered"


def add_a_file(project):
    (project / "reward_models" / "v1" / "notes.txt").write_text("mine")
    return "reward_models/v1/notes.txt is not among the files it was registered with"


def lose_a_pair(project):
    execute(project, "DELETE FROM pairs WHERE id = (SELECT min(pair_id) FROM comparisons)")
    return "votes name 1 pairs row that the database does not hold (comparisons.pair_id: "


def lose_the_snapshot(project):
    (snapshot,) = project.glob("jobs/*/inputs/*.parquet")
    snapshot.write_bytes(b"not parquet")
    return f"the votes frozen in {snapshot.relative_to(project)} cannot be read"


def break_the_cache(project):
    (cached,) = project.glob("features/*/*.parquet")
    cached.write_bytes(cached.read_bytes()[:100])
    return f"the features cache's file {cached.relative_to(project)} is not whole"


def leave_an_unregistered_version(project):
    shutil.copytree(project / "reward_models" / "v1", project / "reward_models" / "v2")
    return "reward_models/v2 is not a registered version"


def leave_a_stray_job_folder(project):
    (project / "jobs" / "77").mkdir()
    return "jobs/77 belongs to no job"


def leave_a_stray_file_among_the_versions(project):
    (project / "reward_models" / "notes.txt").write_text("mine")
    return "reward_models/notes.txt is no version Tether made"


def leave_a_stray_file_in_the_features_cache(project):
    (reading,) = project.glob("features/*/")
    (reading / "notes.txt").write_text("mine")
    return f"{(reading / 'notes.txt').relative_to(project)} is not part of the features cache"


def leave_a_partial_write(project):
    (project / "policies").mkdir()
    (project / "policies" / ".partial-2147483646-v2.abc").mkdir()
    return "policies/.partial-2147483646-v2.abc is what a write that was killed left behind"


def break_the_settings(project):
    (project / "tether.toml").write_text("[round\n")
    return "tether.toml: cannot read it"


DAMAGE = [remove_version, change_a_file, add_a_file, lose_a_pair, lose_the_snapshot, break_the_cache,
          leave_an_unregistered_version, leave_a_stray_file_among_the_versions, leave_a_stray_file_in_the_features_cache,
          leave_a_stray_job_folder, leave_a_partial_write, break_the_settings]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda d: d.__name__)
def test_each_kind_of_damage_is_named_and_the_status_is_1(project, damage):
    expected = damage(project)
    status, report = check(project)
    assert status == 1 and expected in report, report
    assert "is not whole: 1 problem\n" in report, report


def test_a_broken_reference_does_not_hide_the_damage_to_the_files(project):
    expected = [lose_a_pair(project), remove_version(project), leave_a_stray_job_folder(project)]
    status, report = check(project)
    assert status == 1 and all(line in report for line in expected), report
    assert "is not whole: 3 problems\n" in report, report


def test_a_damaged_database_file_is_reported_not_read_as_whole(project):
    path = project / "tether.duckdb"
    data = bytearray(path.read_bytes())
    for offset in range(3 * 2**18, len(data), 2**12):  # past the header, through the data blocks
        data[offset:offset + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))
    status, report = check(project)
    assert status == 1 and "restore" in report, report


def test_through_the_running_server_and_after_its_restart_partial_writes_are_gone(project):
    leave_a_partial_write(project)
    server = RunningServer(project)
    try:
        status, report = check(project)  # the server removed it as it started, and answers for the database
    finally:
        server.stop()
    assert status == 0, report
    assert "removed policies/.partial-2147483646-v2.abc, left by a write that was killed" in server.log.read_text()
