"""`tether check`: whether a project is whole, and what is not, in words an operator can act on.

Postgres has amcheck and SQLite `PRAGMA integrity_check`; this is Tether's, for after a crash,
a full disk or a restore. It reads, and changes nothing:
- the database: every table read back, every reference between tables (store.integrity);
- the settings file, as the server would read it;
- each registered version's directory, file by file against the digests taken as it was registered;
- the votes each reward model and DPO job learnt, which later training reads, and the features cache;
- what nothing names in the folders Tether owns (policies/, reward_models/, jobs/, features/), and
  what a write that was killed left behind. Files of the user's own beside tether.toml are theirs.
"""

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from store.db import Connection
from store.integrity import NamedFiles, broken_references, named_files, unreadable_tables
from train.common.files import PARTIAL, file_digests, partial_writes
from train.runtime.jobdir import input_path
from ui.owner.config import ConfigError, read_config
from ui.owner.project import CONFIG_FILE, Project
from ui.owner.recovery import FEATURES_DIR, ORPHANED_DIR, VERSION_DIRS, written_folders

RESTORE = "restore the project from a backup (`tether restore`)"


def dpo_preferences(job: int) -> str:
    """Where a DPO job froze the votes it trained on, relative to the project."""
    return str(input_path(Path("jobs") / str(job), "preferences"))


@dataclass(frozen=True)
class Check:
    problems: list[str]  # one line each; none when the project is whole
    checked: list[str]  # what was checked, for the report of a whole project


def check_project(con: Connection, project: Project) -> Check:
    unreadable, settings = unreadable_tables(con), _settings_problems(project.root / CONFIG_FILE)
    if unreadable:  # the files are checked against what the database names, once it reads
        return Check(unreadable + settings, [])
    problems = broken_references(con) + settings
    named = named_files(con)
    problems += _version_problems(project.root, named)
    problems += _input_problems(project.root, named)
    problems += _cache_problems(project.root / FEATURES_DIR)
    problems += _unnamed(project.root, named)
    files = sum(len(digests) for digests in named.versions.values())
    checked = ["the database: every table read back, and the references between tables",
               f"the settings: {CONFIG_FILE} reads",
               f"registered versions: {len(named.versions)}, with {files} files as they were registered",
               f"votes frozen for later training: {len(named.snapshots) + len(named.dpo_jobs)} files; the features cache",
               "the folders Tether owns: nothing that nothing names, nothing a killed write left"]
    return Check(problems, checked)


def _settings_problems(path: Path) -> list[str]:
    try:
        read_config(path)
    except ConfigError as e:
        return [str(e)]
    return []


def _kind(adapter_path: str) -> str:
    kind, version = Path(adapter_path).parts
    return f"{'policy' if kind == 'policies' else 'reward model'} {version}"


def _version_problems(root: Path, named: NamedFiles) -> list[str]:
    problems = []
    for adapter_path, recorded in sorted(named.versions.items()):
        directory = root / adapter_path
        if not directory.is_dir():
            problems.append(f"{_kind(adapter_path)} is registered but its directory {adapter_path} is missing: {RESTORE}")
            continue
        if not recorded:  # registered before Tether kept digests: that it is there is all that can be said
            continue
        found = file_digests(directory)
        missing = sorted(set(recorded) - set(found))
        changed = sorted(f for f in set(recorded) & set(found) if recorded[f] != found[f])
        added = sorted(set(found) - set(recorded))
        for files, what in ((missing, "missing"), (changed, "changed since it was registered"),
                            (added, "not among the files it was registered with")):
            if files:
                problems.append(f"{_kind(adapter_path)}: {', '.join(f'{adapter_path}/{f}' for f in files)} "
                                f"{'is' if len(files) == 1 else 'are'} {what}: {RESTORE}")
    return problems


def _input_problems(root: Path, named: NamedFiles) -> list[str]:
    """The votes that reward models and DPO jobs learnt, which the next ones read to train on the new votes."""
    problems = []
    frozen = {**named.snapshots, **{dpo_preferences(job): None for job in named.dpo_jobs}}
    for path, rows in sorted(frozen.items()):
        try:
            found = pq.read_metadata(root / path).num_rows
        except (OSError, pa.ArrowException) as e:
            problems.append(f"the votes frozen in {path} cannot be read ({e}): the next training cannot tell the new votes "
                            f"from those learnt; {RESTORE}")
            continue
        if rows is not None and found != rows:
            problems.append(f"the votes frozen in {path} are {found} rows where {rows} were recorded: {RESTORE}")
    return problems


def _cache_problems(cache: Path) -> list[str]:
    """Each reading's folder holds Parquet files of keys and features of one length; one that does not is dropped
    from the cache with no loss, as its features are read again from the model."""
    problems = []
    for path in sorted(cache.glob("*/*.parquet")):
        try:
            table = pq.read_table(path)
            lengths = set(pc.list_value_length(table["features"]).unique().to_pylist())
            if table.schema.names != ["key", "features"] or len(lengths) > 1:
                raise ValueError(f"columns {table.schema.names}, feature lengths {sorted(lengths)}")
        except (OSError, KeyError, ValueError, pa.ArrowException) as e:
            problems.append(f"the features cache's file {path.relative_to(cache.parent)} is not whole ({e}): delete it; "
                            "the features it held are read again from the model when next needed")
    return problems


def _unnamed(root: Path, named: NamedFiles) -> list[str]:
    """What nothing names in the folders Tether owns, and what a write that was killed left behind."""
    problems = []
    for kind in VERSION_DIRS:
        for path in sorted((root / kind).glob("*")):
            relative = str(path.relative_to(root))
            if relative in named.versions or path.name.startswith(PARTIAL):  # a partial write: below
                continue
            if path.is_dir() and path.name[:1] == "v" and path.name[1:].isdigit():
                problems.append(f"{relative} is not a registered version (its registration stopped part-way): the server "
                                "sets it aside under jobs/ when it next starts")
            else:
                problems.append(f"{relative} is no version Tether made: delete it once you know it holds nothing of yours")
    cache = root / FEATURES_DIR
    for path in sorted([*cache.glob("*"), *cache.glob("*/*")]):
        in_cache = path.parent == cache and path.is_dir() or path.parent.parent == cache and path.suffix == ".parquet"
        if not in_cache and not path.name.startswith(PARTIAL):
            problems.append(f"{path.relative_to(root)} is not part of the features cache: delete it once you know it holds "
                            "nothing of yours")
    for path in sorted((root / "jobs").glob("*")):
        if not (path.name.isdigit() and int(path.name) in named.jobs) and path.name != ORPHANED_DIR:
            problems.append(f"jobs/{path.name} belongs to no job: delete it once you know it holds nothing of yours")
    for folder in written_folders(root):
        for path in partial_writes(folder):
            problems.append(f"{path.relative_to(root)} is what a write that was killed left behind: the server removes it "
                            "when it next starts, or delete it")
    return problems
