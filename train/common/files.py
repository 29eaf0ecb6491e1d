"""Putting a file or a directory in place whole: built beside its place, synced to disk, then renamed in.

A rename within one directory is atomic, so a reader, or a process that starts after a crash,
finds the old target or the new one, never a half-written one. The fsyncs before the rename make
the content reach the disk before the name does, so that a power cut cannot leave a whole-looking
but empty file either; the one after it makes the new name itself survive one.

Standard library only: the worker, the owner and the export all use it, and the export must not
wait for torch to import.
"""

import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# The start of the name built_beside builds under, followed by the builder's process id: one whose process is gone is
# what a write that was killed left behind, which nothing names.
PARTIAL = ".partial-"


@contextmanager
def built_beside(target: Path) -> Iterator[Path]:
    """The path to build `target` at, a file or a directory that the block makes, inside a hidden directory beside it.

    When the block ends, everything built is synced to disk and renamed to `target`, which may be
    absent, a file (replaced) or an empty directory (replaced). Whether the block succeeds or
    fails, the hidden directory is removed, so a failure leaves `target` as it was and nothing beside it.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{PARTIAL}{os.getpid()}-{target.name}.", dir=target.parent))
    try:
        built = staging / target.name
        yield built
        sync_tree(built)
        os.rename(built, target)
        sync(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def failure_reason(e: OSError) -> str:
    """Why a file operation failed, in a few words. shutil.copytree gathers one error per file, each as text naming
    both paths; the first one's reason stands for them (on a full disk, they all say so)."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) and e.args[0]:
        return re.sub(r"^\[Errno \d+\] ", "", str(e.args[0][0][2]).split(": '")[0])
    return e.strerror or str(e)


def write_durably(path: Path, text: str, mode: int = 0o666) -> None:
    """Replace the file at `path` with `text`, whole and synced; `mode` before the umask (0o600: its owner's alone)."""
    with built_beside(path) as built:
        built.touch(mode=mode)
        built.write_text(text, encoding="utf-8")


def partial_writes(folder: Path) -> list[Path]:
    """What built_beside left in `folder` when the process building it was killed; not what a live process is building."""
    left = []
    for path in sorted(folder.glob(f"{PARTIAL}*")):
        pid = path.name.removeprefix(PARTIAL).split("-", 1)[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            left.append(path)
        except (ValueError, PermissionError):  # not built_beside's, or a live process of another user's: left alone
            pass
    return left


def file_digests(directory: Path) -> dict[str, str]:
    """The sha256 of every file under `directory`, by its path relative to it."""
    digests = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        with path.open("rb") as f:
            digests[str(path.relative_to(directory))] = hashlib.file_digest(f, "sha256").hexdigest()
    return digests


def sync(path: Path) -> None:
    """fsync a file, or a directory's entries (a file made or renamed in it), so that it survives a power cut."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_tree(path: Path) -> None:
    """fsync a file, or a directory with every file and directory under it, each directory after its contents."""
    for each in _tree(path):
        sync(each)


def _tree(path: Path) -> Iterator[Path]:
    """`path` and, when it is a directory, every file and directory under it, each directory after its contents."""
    if path.is_dir():
        for parent, _, files in os.walk(path, topdown=False):
            yield from (Path(parent) / name for name in files)
            yield Path(parent)
    else:
        yield path
