"""A job directory: the contract between the database's owner and the worker process.

    job.json        kind, config and the inputs' content hashes (the owner writes it)
    inputs/*.parquet  frozen inputs, checked against their hashes before the work starts
    events.jsonl    progress and metrics, one JSON object a line (the worker appends)
    worker.log      the worker's stdout and stderr
    result.json     written last and atomically: it exists only once the work is complete
"""

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from train.common.files import write_durably
from train.runtime.job_configs import JobConfig, job_config_json

JOB_FILE = "job.json"
EVENTS_FILE = "events.jsonl"
LOG_FILE = "worker.log"
RESULT_FILE = "result.json"
# The environment variable that names the process that started the worker: the worker exits when that process is gone.
OWNER_PID_ENV = "TETHER_OWNER_PID"
# glibc raises its threshold for returning a freed block to the system as a process frees large blocks, up to
# 32 MB, and then keeps a training step's freed temporaries in its heap: a reward-model step's peak resident
# memory was 1.45 to 1.75 times what train.runtime.memory counts as alive (scripts/bench_memory.py). Holding the threshold at
# its starting value returns each block of 128 KiB or more as soon as it is freed ([worker] release_memory).
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


class JobDirError(Exception):
    """A job directory that is incomplete or was changed after it was written."""


def write_job(job_dir: Path, config: JobConfig, inputs: dict[str, pa.Table]) -> dict[str, Any]:
    """Freeze the inputs as Parquet and describe the job; returns what job.json holds (its config parsed by
    train.runtime.job_configs.parse_job_config)."""
    (job_dir / "inputs").mkdir(parents=True)
    hashes = {}
    for name, table in inputs.items():
        path = job_dir / "inputs" / f"{name}.parquet"
        pq.write_table(table, path)
        hashes[name] = _sha256(path)
    job = {"kind": config.kind, "config": job_config_json(config), "inputs": hashes}
    write_durably(job_dir / JOB_FILE, json.dumps(job, indent=1))
    return job


def read_job(job_dir: Path) -> dict[str, Any]:
    job = json.loads((job_dir / JOB_FILE).read_text())
    for name, expected in job["inputs"].items():
        if _sha256(input_path(job_dir, name)) != expected:
            raise JobDirError(f"{input_path(job_dir, name)} changed after the job was written")
    return job


def input_path(job_dir: Path, name: str) -> Path:
    return job_dir / "inputs" / f"{name}.parquet"


class Events:
    """The worker's side of events.jsonl: one flushed line per event, so the owner can tail it."""

    def __init__(self, job_dir: Path, enabled: bool = True):
        self.path = job_dir / EVENTS_FILE
        self.enabled = enabled  # off in every process of a job but the first, which speaks for them all

    def emit(self, kind: str, **fields: Any) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"time": time.time(), "event": kind, **fields}) + "\n")


def read_events(job_dir: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole events written since `offset` (a byte position), and the new offset."""
    path = job_dir / EVENTS_FILE
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next read
    return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)


def write_result(job_dir: Path, result: dict[str, Any]) -> None:
    write_durably(job_dir / RESULT_FILE, json.dumps(result, indent=1))


def read_result(job_dir: Path) -> dict[str, Any] | None:
    path = job_dir / RESULT_FILE
    return json.loads(path.read_text()) if path.exists() else None


def log_tail(job_dir: Path, lines: int = 20) -> str:
    path = job_dir / LOG_FILE
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
