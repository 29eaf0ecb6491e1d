"""Rolling back: a new policy version that copies an earlier one, so that the next round starts from it."""

import os
import shutil
from pathlib import Path

from store import Connection, StoreError
from store.policies import Policy, add_rollback, plan_rollback
from train.common.files import built_beside, failure_reason, file_digests
from ui.owner.jobs import Run
from ui.owner.project import Project


def roll_back(project: Project, run: Run, version: int) -> Policy:
    """Register a new policy version that copies `version`, so the next round starts from it.

    Nothing is deleted: the versions given up keep their adapters, votes and ratings, and the
    new version records which one was newest when it was made.
    """
    plan = run(plan_rollback, version)
    if plan.to.adapter_path is None:  # the starting model: nothing to copy
        return run(add_rollback, plan, None)
    target = project.root / "policies" / f"v{plan.version}"
    copy = _copy_atomically(project.root / plan.to.adapter_path, target)
    try:
        return run(add_rollback, plan, str(target.relative_to(project.root)), file_digests(target))
    except BaseException:
        run(_remove_copy, target, copy)
        raise


def _copy_atomically(source: Path, target: Path) -> os.stat_result:
    """Copy a directory to `target`, built beside it and renamed into place: `target` is whole or absent. Returns the
    copy's identity, which stays with it wherever it is moved."""
    if target.exists():
        raise StoreError(f"{target} exists already: move it away, then roll back again")
    try:
        with built_beside(target) as built:
            shutil.copytree(source, built)
        return target.stat()
    except OSError as e:
        raise StoreError(f"cannot copy the adapter {source} to {target}: {failure_reason(e)}; nothing was copied") from None


def _remove_copy(con: Connection, target: Path, copy: os.stat_result) -> None:
    """Remove a rollback's copy that was not registered, if it is still at `target`.

    A job's ingest that registered the same version meanwhile has set the copy aside and put its
    own adapter there, which must stay. Run as the writer, so no ingest moves either meanwhile.
    """
    try:
        if os.path.samestat(target.stat(), copy):
            shutil.rmtree(target)
    except FileNotFoundError:
        pass
