"""A project directory: `tether.toml` beside the database `tether.duckdb`."""

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from store import Connection, open_database
from store.integrity import holds_only_the_start
from store.policies import add_policy, policy_versions
from train.common.config import Hardware, ModelConfig
from ui.owner.config import TetherConfig, read_config, settings_for, write_config

CONFIG_FILE = "tether.toml"
DATABASE_FILE = "tether.duckdb"


class ProjectError(Exception):
    """No usable project where one was asked for."""


@dataclass
class Project:
    root: Path
    config: TetherConfig
    profile: str | None = None  # which settings init chose for the hardware; only on a project just created
    config_text: str | None = None  # tether.toml as `config` was read from it: a changed file is never overwritten

    @property
    def database_path(self) -> Path:
        return self.root / DATABASE_FILE

    def connect(self) -> Connection:
        return open_database(self.database_path)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a store function on the database, opened for just this call."""
        with closing(self.connect()) as con:
            return fn(con, *args)


def job_dir(project: Project, job_id: int) -> Path:
    """Where a job's frozen inputs, events, log and result are: the contract with its worker (train.runtime.jobdir)."""
    return project.root / "jobs" / str(job_id)


def init_project(root: Path, model: str | None = None, hardware: Hardware | None = None) -> Project:
    """Write tether.toml with settings for the hardware (found when not given) and create the database,
    with the starting model as policy version 0. The project's `profile` says which settings it chose."""
    if (root / CONFIG_FILE).exists():
        raise ProjectError(f"{root} already holds a Tether project ({CONFIG_FILE} exists)")
    if (root / DATABASE_FILE).exists() and not _as_init_left_it(root / DATABASE_FILE):
        raise ProjectError(f"{root} holds a Tether database ({DATABASE_FILE}) but no {CONFIG_FILE}: put back its settings "
                           "from a backup, or restore the backup")
    if model is not None and Path(model).exists():
        model = str(Path(model).resolve())  # so the project works from any directory
    if hardware is None:
        from train.runtime.hardware import detect_hardware  # torch takes seconds to import; only init needs it

        hardware = detect_hardware()
    config, profile = settings_for(hardware, ModelConfig(name_or_path=model) if model else ModelConfig())
    if lowered := _fit_to_memory(config, hardware):
        profile += f", lowered to fit a round in its {hardware.memory_gb:.0f} GB: {'; '.join(lowered)}"
    root.mkdir(parents=True, exist_ok=True)
    project = Project(root.resolve(), config)
    made = not project.database_path.exists()
    try:
        with closing(project.connect()) as con:
            if not policy_versions(con):  # an init killed before it wrote the settings made it already
                add_policy(con, version=0, adapter_path=None)
    except BaseException:
        if made:  # a full disk leaves a file DuckDB cannot open, which the next init would refuse
            for path in (project.database_path, project.database_path.with_name(DATABASE_FILE + ".wal")):
                path.unlink(missing_ok=True)
        raise
    write_config(root / CONFIG_FILE, config)  # last: a project exists only once its database does
    project.profile = profile
    return project


def _as_init_left_it(path: Path) -> bool:
    """Whether a database holds nothing but what `tether init` writes: the leftover of an init killed before its last step."""
    with closing(open_database(path)) as con:
        return holds_only_the_start(con)


def _fit_to_memory(config: TetherConfig, hardware: Hardware) -> list[str]:
    """train.runtime.memory.fit_to_memory for the hardware; nothing where the model's config cannot be read here (a hub id
    not yet downloaded), as `tether status` then says."""
    from train.common.errors import ModelError
    from train.runtime.memory import fit_to_memory

    try:
        return fit_to_memory(config, config.round.optimizer, hardware.device == "cuda", hardware.memory_gb)
    except (OSError, ValueError, ModelError):
        return []


def load_project(root: Path) -> Project:
    config_path = root / CONFIG_FILE
    if not config_path.exists():
        raise ProjectError(
            f"no Tether project in {root.resolve()} ({CONFIG_FILE} not found): "
            "create one with `tether init DIR`, or point --project / TETHER_PROJECT at one"
        )
    config, text = read_config(config_path)
    return Project(root.resolve(), config, config_text=text)
