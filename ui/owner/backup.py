"""`tether backup` and `tether restore`: a project's database, settings, registered adapters and the votes each
reward model trained on (frozen in its job's directory: the next training reads which votes are new), copied consistently.

The database is copied from one transaction's snapshot (DuckDB's COPY FROM DATABASE), so a
backup taken while annotators vote holds every vote committed before it began and none half
written, and the writer is never paused. Registered adapter directories and frozen inputs never
change once their rows exist, so they are copied after the snapshot, outside it.

A backup is not trusted when it is restored: one holding a symbolic link is refused, and its
database file is read with no access to other files, its rows copied into a new database that
this Tether's migrations make (store.backups.restore_database).
"""

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from store.backups import copy_database, restore_database
from store.db import Connection, StoreError, open_database, utcnow
from store.integrity import named_files
from store.jobs import registered_adapter_paths
from store.reward_models import list_reward_models
from train.common.files import built_beside, failure_reason
from train.runtime.jobdir import input_path
from ui.owner.check import dpo_preferences
from ui.owner.project import CONFIG_FILE, DATABASE_FILE

MANIFEST = "backup.json"
ADAPTER_PATH = re.compile(r"(reward_models|policies)/v[0-9]+")
INPUT_PATH = re.compile(r"jobs/[0-9]+/inputs/[a-z_]+\.parquet")


@dataclass(frozen=True)
class Backup:
    votes: int
    adapters: list[str]
    inputs: list[str]  # the votes frozen for later training (_trained_on), relative to the project


def _trained_on(con: Connection) -> list[str]:
    """The votes frozen for later training: each reward model's snapshot, with the rankings beside it when it fitted
    some whole, and the votes of the DPO jobs behind each policy."""
    named = named_files(con)
    rankings = [str(input_path(Path("jobs") / str(rm.metrics["job"]), "rankings")) for rm in list_reward_models(con) if "job" in rm.metrics]
    return sorted({*named.snapshots, *rankings, *map(dpo_preferences, named.dpo_jobs)})


def backup(con: Connection, root: Path, dest: Path) -> Backup:
    """Copy the project at `root`, whose database `con` is open, into `dest`, which must not exist yet."""
    if "\x00" in str(dest):
        raise StoreError(f"{str(dest)!r} cannot be a directory's name: it holds a NUL character")
    dest = dest.resolve()
    if dest.exists():
        raise StoreError(f"{dest} exists already: a backup goes into a new directory")
    if not dest.parent.is_dir():
        raise StoreError(f"{dest.parent} is not a directory")
    try:
        return _copy_project(con, root, dest)
    except OSError as e:  # a full disk, a folder not ours: nothing is left behind (built_beside)
        raise StoreError(f"cannot write the backup into {dest}: {failure_reason(e)}") from None


def _copy_project(con: Connection, root: Path, dest: Path) -> Backup:
    with built_beside(dest) as partial:
        partial.mkdir(mode=0o700)  # the database holds password hashes: the backup is its owner's alone
        snapshot = con.cursor()  # its own connection: the snapshot is not blocked by, and does not block, votes
        try:
            adapters, inputs, votes = copy_database(snapshot, partial / DATABASE_FILE, lambda con: (
                sorted(registered_adapter_paths(con)), _trained_on(con), con.execute("SELECT count(*) FROM comparisons").fetchone()[0]))
        finally:
            snapshot.close()
        for adapter in adapters:
            shutil.copytree(root / adapter, partial / adapter)
        inputs = [name for name in inputs if (root / name).exists()]  # a version that fitted no rankings has none
        for name in inputs:
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, partial / name)
        shutil.copy2(root / CONFIG_FILE, partial / CONFIG_FILE)
        manifest = {"taken_at": utcnow().isoformat(), "from": str(root), "votes": votes, "adapters": adapters, "inputs": inputs}
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return Backup(votes, adapters, inputs)


def restore(src: Path, root: Path) -> Backup:
    """Make a project at `root` from the backup in `src`; `root` must not hold a project."""
    src, root = src.resolve(), root.resolve()
    for name in (CONFIG_FILE, DATABASE_FILE):
        if (root / name).exists():
            raise StoreError(f"{root} holds a project already ({name} exists): restore into a new directory, "
                             "or move that project away first")
    if root.exists() and any(root.iterdir()):
        raise StoreError(f"{root} is not empty: restore into a new or empty directory")
    _refuse_links(src, MANIFEST)
    try:
        manifest = json.loads((src / MANIFEST).read_text())
        if not isinstance(manifest, dict) or not isinstance(manifest.get("adapters"), list):
            raise ValueError("it names no adapters")
    except (OSError, ValueError) as e:
        raise StoreError(f"{src} is not a Tether backup ({MANIFEST}: {e})") from None
    inputs = manifest.get("inputs", [])  # backups before Tether kept them have none
    # Names from a file: nothing outside the backup is read, or outside root written.
    for field, pattern, example in (("adapters", ADAPTER_PATH, "a version directory such as reward_models/v1"),
                                    ("inputs", INPUT_PATH, "a job's input such as jobs/3/inputs/preferences.parquet")):
        for name in manifest.get(field, []):
            if not isinstance(name, str) or not pattern.fullmatch(name):
                raise StoreError(f"{src / MANIFEST}: field '{field}': {name!r} is not {example}")
    for name in (CONFIG_FILE, DATABASE_FILE, *manifest["adapters"], *inputs):
        _refuse_links(src, name)
        if not (src / name).exists():
            raise StoreError(f"{src} is incomplete: {name} is missing")
    try:
        return _restore_files(src, root, manifest, inputs)
    except OSError as e:  # a full disk: nothing is left behind (built_beside)
        raise StoreError(f"cannot restore into {root}: {failure_reason(e)}") from None


def _restore_files(src: Path, root: Path, manifest: dict, inputs: list[str]) -> Backup:
    with built_beside(root) as partial:
        partial.mkdir(mode=0o700)  # as the backup was made
        for name in (CONFIG_FILE, *manifest["adapters"], *inputs):  # a link that appeared since the check is copied, never followed
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            if (src / name).is_dir():
                shutil.copytree(src / name, partial / name, symlinks=True)
            else:
                shutil.copy2(src / name, partial / name, follow_symlinks=False)
        restore_database(src / DATABASE_FILE, partial / DATABASE_FILE)
        con = open_database(partial / DATABASE_FILE)
        try:
            votes = con.execute("SELECT count(*) FROM comparisons").fetchone()[0]
            missing = sorted(registered_adapter_paths(con) - set(manifest["adapters"]))
        finally:
            con.close()
        if missing:
            raise StoreError(f"{src} is incomplete: the database registers {', '.join(missing)}, which it does not hold")
    return Backup(votes, manifest["adapters"], inputs)


def _refuse_links(src: Path, name: str) -> None:
    """Refuse a symbolic link at, above (inside src) or under src/name: it could bring a file from elsewhere into the project."""
    for path in _links(src, name):
        raise StoreError(f"{src} holds a symbolic link, {path.relative_to(src)}: a backup holds only files and directories, "
                         "so it is not restored")


def _links(src: Path, name: str) -> Iterator[Path]:
    path = src
    for part in Path(name).parts:
        path = path / part
        if path.is_symlink():
            yield path
    for parent, directories, files in os.walk(src / name):  # os.walk lists a link to a directory without entering it
        yield from (Path(parent) / entry for entry in directories + files if (Path(parent) / entry).is_symlink())
