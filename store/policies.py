"""Policy versions (0 is the starting model) and reward-model versions."""

from dataclasses import dataclass

from store.db import Connection, StoreError, transaction
from store.jobs import record_files
from store.rounds import running_round

POLICY_JOBS = ("ppo", "dpo", "grpo")  # the job kinds whose result registers the next policy version


@dataclass(frozen=True)
class Policy:
    version: int
    adapter_path: str | None  # None: the base model itself


def add_policy(con: Connection, version: int, adapter_path: str | None, parent: int | None = None, round: int | None = None,
               job: int | None = None) -> Policy:
    """Register a policy version; `job` is the job that trained its adapter."""
    con.execute(
        "INSERT INTO policies (version, parent, adapter_path, round, job) VALUES (?, ?, ?, ?, ?)",
        [version, parent, adapter_path, round, job],
    )
    return Policy(version, adapter_path)


def get_policy(con: Connection, version: int | None = None) -> Policy:
    """The given policy version, or the newest one when version is None."""
    if version is None:
        row = con.execute("SELECT version, adapter_path FROM policies ORDER BY version DESC LIMIT 1").fetchone()
    else:
        row = con.execute("SELECT version, adapter_path FROM policies WHERE version = ?", [version]).fetchone()
    if row is None:
        known = ", ".join(str(v) for v in policy_versions(con)) or "none"
        raise StoreError(f"no policy version {version} (the project has: {known})")
    return Policy(*row)


@dataclass(frozen=True)
class Rollback:
    version: int  # the version the rollback will be registered as
    to: Policy  # the version it copies
    replaces: int  # the newest version before it


def plan_rollback(con: Connection, version: int) -> Rollback:
    """What rolling back to `version` would register; refused while a round or a policy job could add a version of its own.

    A cancelled job stays running here until its runner has stopped its worker, so a job that
    finished as it was cancelled cannot register its version in the middle of a rollback.
    """
    if (round_ := running_round(con)) is not None:
        raise StoreError(f"round {round_.id} is running: wait for it or cancel it before rolling back")
    job = con.execute(
        "SELECT id, kind FROM jobs WHERE list_contains(?, kind) AND status IN ('queued', 'running') ORDER BY id LIMIT 1",
        [list(POLICY_JOBS)],
    ).fetchone()
    if job is not None:
        raise StoreError(f"{job[1].upper()} job {job[0]} has not ended: wait for it, or cancel it and wait until it "
                         "shows cancelled, before rolling back")
    to, newest = get_policy(con, version), get_policy(con, None)
    if to.version == newest.version:
        raise StoreError(f"v{version} is already the newest policy: rounds start from it")
    return Rollback(newest.version + 1, to, newest.version)


def add_rollback(con: Connection, plan: Rollback, adapter_path: str | None, digests: dict[str, str] | None = None) -> Policy:
    """Register a planned rollback with its copy of the adapter and its files' digests, unless the policies changed
    since it was planned."""
    with transaction(con):
        if plan_rollback(con, plan.to.version) != plan:
            raise StoreError("the policies changed while the adapter was copied: roll back again")
        con.execute(
            "INSERT INTO policies (version, parent, adapter_path, rollback_from) VALUES (?, ?, ?, ?)",
            [plan.version, plan.to.version, adapter_path, plan.replaces],
        )
        if digests:
            record_files(con, adapter_path, digests)
    return Policy(plan.version, adapter_path)


def copied_version(con: Connection, version: int) -> int | None:
    """The version a rollback's copy copies (its adapter is that version's, byte for byte); None for any other version."""
    row = con.execute("SELECT parent FROM policies WHERE version = ? AND rollback_from IS NOT NULL", [version]).fetchone()
    return row[0] if row else None


def policy_versions(con: Connection) -> list[int]:
    return [row[0] for row in con.execute("SELECT version FROM policies ORDER BY version").fetchall()]


def reward_model_versions(con: Connection) -> list[int]:
    return [row[0] for row in con.execute("SELECT version FROM reward_models ORDER BY version").fetchall()]


def dpo_jobs_behind(con: Connection, version: int) -> list[int]:
    """The DPO jobs whose pairs are in a policy version's adapter: those that trained it or a version it descends from
    (a rollback's copy descends from the version it copies). A version registered before policies named their job
    counts its round's DPO jobs."""
    return [job for (job,) in con.execute(
        """
        WITH RECURSIVE lineage(version, parent, round, job) AS (
            SELECT version, parent, round, job FROM policies WHERE version = ?
            UNION ALL
            SELECT p.version, p.parent, p.round, p.job FROM policies p JOIN lineage l ON p.version = l.parent
        )
        SELECT j.id FROM lineage l JOIN jobs j ON (j.id = l.job OR l.job IS NULL AND j.round = l.round)
                                                AND j.kind = 'dpo' AND j.status = 'done'
        ORDER BY j.id
        """,
        [version],
    ).fetchall()]
