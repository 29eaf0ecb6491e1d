"""Files put in place whole (train.common.files), and the preference snapshot's one shape (train.common.snapshot)."""

import ast
import os
import signal
import subprocess
import sys
from dataclasses import fields

import pytest

from tests.conftest import REPO
from train.common.files import built_beside, partial_writes, write_durably
from train.common.snapshot import SCHEMA, PreferenceRow, conversational, preference_table, read_preferences

ROWS = [
    PreferenceRow([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit, 好?"}], "A fig.", "Fruit is",
                  chosen_finished=True, rejected_finished=False, pair_id=7, prompt_id=3, chosen_completion_id=11,
                  rejected_completion_id=12, chosen_policy=1, rejected_policy=0),
    PreferenceRow([{"role": "user", "content": "Hi"}], "Hello!", "Go away."),  # from a preference file: no ids
]


def test_a_directory_is_built_beside_its_place_and_renamed_in_whole(tmp_path):
    target = tmp_path / "v1"
    with built_beside(target) as built:
        assert built.parent.parent == tmp_path and built.parent.name.startswith(f".partial-{os.getpid()}-v1.") and not built.exists()
        (built / "inner").mkdir(parents=True)
        (built / "inner" / "weights").write_bytes(b"\0" * 1000)
        assert not target.exists()  # nothing shows until the block ends
    assert (target / "inner" / "weights").read_bytes() == b"\0" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]  # the staging directory is gone


def test_what_a_killed_builder_left_is_found_and_what_a_live_one_builds_is_not(tmp_path):
    builder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from train.common.files import built_beside\n"
        "with built_beside(Path(sys.argv[1]) / 'v1') as built:\n"
        "    built.mkdir(); print('building', flush=True); time.sleep(60)"), str(tmp_path)], stdout=subprocess.PIPE, cwd=REPO, text=True)
    try:
        assert builder.stdout.readline() == "building\n"
        with built_beside(tmp_path / "v2") as built:
            built.mkdir()
            assert partial_writes(tmp_path) == []  # both builders live
    finally:
        builder.send_signal(signal.SIGKILL)
        builder.wait()
    (left,) = partial_writes(tmp_path)
    assert left.name.startswith(f".partial-{builder.pid}-v1.") and not (tmp_path / "v1").exists()


def test_a_failure_in_the_block_leaves_neither_target_nor_staging(tmp_path):
    with pytest.raises(OSError, match="disk full"):
        with built_beside(tmp_path / "v1") as built:
            built.mkdir()
            (built / "half").write_text("half")
            raise OSError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_directory_or_a_file_is_replaced_and_a_full_directory_refused(tmp_path):
    (tmp_path / "made-for-it").mkdir()
    with built_beside(tmp_path / "made-for-it") as built:
        built.mkdir()
        (built / "a").write_text("a")
    assert [p.name for p in (tmp_path / "made-for-it").iterdir()] == ["a"]

    write_durably(tmp_path / "job.json", "old")
    write_durably(tmp_path / "job.json", "new")
    assert (tmp_path / "job.json").read_text() == "new"

    with pytest.raises(OSError):
        with built_beside(tmp_path / "made-for-it") as built:
            built.mkdir()
    assert [p.name for p in (tmp_path / "made-for-it").iterdir()] == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json", "made-for-it"]


def test_a_durable_file_can_be_its_owners_alone(tmp_path):
    write_durably(tmp_path / "secret.json", '{"token": "x"}', mode=0o600)
    assert (tmp_path / "secret.json").stat().st_mode & 0o777 == 0o600


def test_a_snapshot_round_trips_through_parquet(tmp_path):
    import pyarrow.parquet as pq

    assert SCHEMA.names == [f.name for f in fields(PreferenceRow)]
    pq.write_table(preference_table(ROWS), tmp_path / "preferences.parquet")  # as write_job freezes it
    assert read_preferences(tmp_path / "preferences.parquet") == ROWS
    assert conversational(ROWS[0]) == {"prompt": ROWS[0].prompt, "chosen": [{"role": "assistant", "content": "A fig."}],
                                       "rejected": [{"role": "assistant", "content": "Fruit is"}]}


def test_the_train_modules_annotate_imports_do_not_import_torch():
    """tests/test_layout.py lets annotate import train for modules like these alone: the export must not wait for torch."""
    repo = REPO
    used = sorted({node.module for path in (repo / "annotate").rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "train"})
    assert used
    code = f"import sys, {', '.join(used)}; print(sorted(m for m in ('torch', 'transformers', 'duckdb') if m in sys.modules))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    assert imported.stdout.strip() == "[]", used


def test_the_app_and_the_command_line_start_without_importing_torch():
    """`tether serve` and every command import torch only in the functions that need it (a job's worker, `tether init`'s
    hardware check): it takes 3 s of the server's 6 s start, paid at each start and by each test that starts one."""
    code = "import sys, ui.cli, ui.web.app; print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert imported.stdout.strip() == "[]"
