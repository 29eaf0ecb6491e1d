"""Reward-model versions and the snapshots of comparisons they were trained on."""

import json
from dataclasses import dataclass
from typing import Any

from store.db import Connection, StoreError


@dataclass(frozen=True)
class RewardModel:
    version: int
    snapshot: str
    adapter_path: str  # relative to the project directory
    metrics: dict[str, Any]


def next_reward_model_version(con: Connection) -> int:
    return con.execute("SELECT coalesce(max(version), 0) + 1 FROM reward_models").fetchone()[0]


def add_snapshot(con: Connection, content_hash: str, rows: int, path: str) -> None:
    """Record the frozen comparisons a reward model is registered with; content met before now names this file, whose
    job registered a model and so keeps its directory."""
    con.execute("INSERT INTO snapshots (hash, rows, path) VALUES (?, ?, ?) ON CONFLICT (hash) DO UPDATE SET path = excluded.path",
                [content_hash, rows, path])


def add_reward_model(con: Connection, version: int, snapshot: str, adapter_path: str, metrics: dict[str, Any]) -> None:
    con.execute(
        "INSERT INTO reward_models (version, snapshot, adapter_path, metrics) VALUES (?, ?, ?, ?)",
        [version, snapshot, adapter_path, json.dumps(metrics)],
    )


def get_reward_model(con: Connection, version: int | None = None) -> RewardModel:
    """The given version, or the newest when version is None."""
    if version is None:
        row = con.execute("SELECT version, snapshot, adapter_path, metrics FROM reward_models ORDER BY version DESC LIMIT 1").fetchone()
    else:
        row = con.execute("SELECT version, snapshot, adapter_path, metrics FROM reward_models WHERE version = ?", [version]).fetchone()
    if row is None:
        raise StoreError("no reward model yet: train one with `tether rm train`" if version is None else f"no reward model version {version}")
    return RewardModel(row[0], row[1], row[2], json.loads(row[3]))


def snapshot_path(con: Connection, content_hash: str) -> str:
    """Where a recorded snapshot's Parquet file is, relative to the project directory."""
    row = con.execute("SELECT path FROM snapshots WHERE hash = ?", [content_hash]).fetchone()
    if row is None:
        raise StoreError(f"no snapshot {content_hash[:12]} is recorded")
    return row[0]


def list_reward_models(con: Connection) -> list[RewardModel]:
    rows = con.execute("SELECT version, snapshot, adapter_path, metrics FROM reward_models ORDER BY version DESC").fetchall()
    return [RewardModel(row[0], row[1], row[2], json.loads(row[3])) for row in rows]
