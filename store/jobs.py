"""Jobs: heavy work (generation, training) that a worker process runs from a job directory.

The database holds each job's state; the directory holds its inputs, events and results.
"""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from store.db import Connection, StoreError, insert_rows, insert_values, transaction

FINISHED = ("done", "failed", "cancelled")


@dataclass(frozen=True)
class Job:
    id: int
    kind: str
    status: str
    config: dict[str, Any]
    progress: float
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    round: int | None = None  # the training round the job is a step of


_COLUMNS = "id, kind, status, config, progress, error, created_at, finished_at, round"


def _job(row: tuple) -> Job:
    return Job(row[0], row[1], row[2], json.loads(row[3]), *row[4:])


def add_job(con: Connection, kind: str, config: dict[str, Any], round_id: int | None = None) -> Job:
    with transaction(con):  # a commit that fails (a full disk) is NotSaved, in words
        row = con.execute(
            f"INSERT INTO jobs (kind, status, config, round) VALUES (?, 'queued', ?, ?) RETURNING {_COLUMNS}",
            [kind, json.dumps(config), round_id],
        ).fetchall()[0]
    return _job(row)


def get_job(con: Connection, job_id: int) -> Job:
    row = con.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", [job_id]).fetchone()
    if row is None:
        raise StoreError(f"no job {job_id}")
    return _job(row)


def list_jobs(con: Connection, limit: int = 20) -> list[Job]:
    return [_job(row) for row in con.execute(f"SELECT {_COLUMNS} FROM jobs ORDER BY id DESC LIMIT ?", [limit]).fetchall()]


def next_queued(con: Connection) -> Job | None:
    row = con.execute(f"SELECT {_COLUMNS} FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1").fetchone()
    return _job(row) if row else None


def start_job(con: Connection, job_id: int) -> bool:
    """Mark a queued job running; False when it is no longer queued (cancelled meanwhile)."""
    return con.execute("UPDATE jobs SET status = 'running' WHERE id = ? AND status = 'queued'", [job_id]).fetchone()[0] == 1


def set_progress(con: Connection, job_id: int, progress: float) -> None:
    con.execute("UPDATE jobs SET progress = ? WHERE id = ? AND status = 'running'", [progress, job_id])


def finish_job(con: Connection, job_id: int, status: str, now: datetime, error: str | None = None) -> None:
    """Mark a queued or running job done, failed or cancelled; a finished job stays as it is."""
    if status not in FINISHED:
        raise StoreError(f"a job finishes as one of {', '.join(FINISHED)}, not {status!r}")
    with transaction(con):
        con.execute(
            """
            UPDATE jobs SET status = ?, error = ?, finished_at = ?,
                            progress = CASE WHEN ? = 'done' THEN 1 ELSE progress END
            WHERE id = ? AND status IN ('queued', 'running')
            """,
            [status, error, now, status, job_id],
        )


def running_job_ids(con: Connection) -> list[int]:
    return [row[0] for row in con.execute("SELECT id FROM jobs WHERE status = 'running' ORDER BY id").fetchall()]


def fail_interrupted(con: Connection, now: datetime, keep: list[int] | tuple[int, ...] = ()) -> int:
    """Jobs left running by a process that is gone, all but those in `keep`: failed, since nobody watches their worker."""
    return con.execute(
        "UPDATE jobs SET status = 'failed', error = 'the process running it stopped', finished_at = ? "
        "WHERE status = 'running' AND NOT list_contains(?, id)",
        [now, list(keep)],
    ).fetchone()[0]


def registered_adapter_paths(con: Connection) -> set[str]:
    """Every adapter directory a reward-model or policy version names, relative to the project."""
    rows = con.execute(
        "SELECT adapter_path FROM reward_models UNION SELECT adapter_path FROM policies WHERE adapter_path IS NOT NULL"
    ).fetchall()
    return {row[0] for row in rows}


def record_files(con: Connection, adapter_path: str, digests: dict[str, str]) -> None:
    """Keep the digests of a version's files as it is registered, in the transaction that registers it."""
    insert_values(con, "version_files (adapter_path, file, sha256)", [(adapter_path, f, d) for f, d in digests.items()])


def cancel_if_queued(con: Connection, job_id: int, now: datetime) -> None:
    """Cancel a job that has not started; a running one is stopped by whoever runs it."""
    con.execute(
        "UPDATE jobs SET status = 'cancelled', error = 'cancelled by an operator', finished_at = ? WHERE id = ? AND status = 'queued'",
        [now, job_id],
    )


_METRIC_SCHEMA = pa.schema([("job_id", pa.int32()), ("step", pa.int32()), ("name", pa.string()), ("value", pa.float64())])


def add_metrics(con: Connection, job_id: int, steps: list[tuple[int, dict[str, float]]]) -> None:
    """Store a job's metrics, (step, {name: value}) each, in one statement: executemany is row by row and slow."""
    rows = [{"job_id": job_id, "step": step, "name": k, "value": float(v)} for step, values in steps for k, v in values.items()]
    insert_rows(con, "metrics", rows, _METRIC_SCHEMA)


def job_metrics(con: Connection, job_id: int) -> dict[str, float]:
    """The latest value of each metric the job recorded."""
    rows = con.execute(
        "SELECT name, arg_max(value, step) FROM metrics WHERE job_id = ? GROUP BY name", [job_id]
    ).fetchall()
    return dict(rows)


def metric_series(con: Connection, job_id: int, name: str) -> list[tuple[int, float]]:
    """(step, value) of one metric of a job, in step order."""
    return con.execute("SELECT step, value FROM metrics WHERE job_id = ? AND name = ? ORDER BY step", [job_id, name]).fetchall()


def round_jobs(con: Connection, round_id: int) -> list[Job]:
    return [_job(row) for row in con.execute(f"SELECT {_COLUMNS} FROM jobs WHERE round = ? ORDER BY id", [round_id]).fetchall()]
