"""A job's config is one frozen dataclass per kind: a misspelt, missing or mistyped field is refused where the job is
submitted, or where the worker reads it, with the field named; never deep in the work."""

import dataclasses
import json
from contextlib import closing

import pytest

from store import open_database
from tests.conftest import DEMO_PROMPTS, run_tether, vote_every_pair
from train import worker
from train.runtime.job_configs import JOB_CONFIGS, JobConfigError, PPOJob, job_config_json, parse_job_config
from train.runtime.jobdir import JOB_FILE
from ui.owner.jobs import JobError
from ui.owner.project import job_dir, load_project
from ui.owner.round_jobs import submit_generation, submit_reward_training


def test_every_kind_has_its_config():
    assert set(JOB_CONFIGS) == {"reward_model", "generate", "score", "ppo", "dpo", "grpo", "predict", "judge"}


@pytest.fixture
def generation_queued(tiny_project):
    """A project with a generation job queued: (the project, the job)."""
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    project = load_project(tiny_project)
    return project, submit_generation(project, project.run, limit=2, per_prompt=2)


def test_a_written_config_reads_back_as_it_was_built(generation_queued):
    project, job = generation_queued
    written = json.loads((job_dir(project, job.id) / JOB_FILE).read_text())
    config = parse_job_config("generate", written["config"])
    assert job_config_json(config) == written["config"] == job.config
    assert config.policy_version == 0 and config.policy_adapter_path is None and config.generation.per_prompt == 2


@pytest.mark.parametrize("change, named", [
    (lambda c: c | {"polcy_version": c.pop("policy_version")}, "unknown field 'polcy_version'"),
    (lambda c: {k: v for k, v in c.items() if k != "against"}, "missing field 'against'"),
    (lambda c: c | {"policy_version": "0"}, "field 'policy_version': expected int, got str '0'"),
    (lambda c: c | {"generation": c["generation"] | {"max_new_tokens": None}}, "field 'generation', field 'max_new_tokens': expected int"),
    (lambda c: c | {"unpaired_prompts": [1, "2"]}, "field 'unpaired_prompts'[1]: expected int"),
    (lambda c: c | {"generation": [1]}, "field 'generation': expected an object, got list"),
])
def test_the_worker_refuses_a_config_that_does_not_parse_naming_the_field(generation_queued, capsys, change, named):
    project, job = generation_queued
    path = job_dir(project, job.id) / JOB_FILE
    written = json.loads(path.read_text())
    path.write_text(json.dumps(written | {"config": change(dict(written["config"]))}))
    assert worker.run(path.parent) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: {path}: the generate job's config") and named in error.replace('"', "'"), error
    assert not (path.parent / "completions.parquet").exists()


def test_a_mistyped_config_is_refused_at_submission_with_nothing_queued(tiny_project):
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    run_tether("generate", "--project", str(tiny_project), check=True)
    vote_every_pair(tiny_project)
    project = load_project(tiny_project)
    # A setting no reader checked, as a hand-edited dataclass would carry it to the job.
    project.config.reward_model.epochs = "2"
    with pytest.raises(JobError, match="the reward_model job's config, field 'reward_model', field 'epochs': expected int, got str '2'"):
        submit_reward_training(project, project.run)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM jobs WHERE kind = 'reward_model'").fetchone() == (0,)


def test_a_misspelt_or_missing_field_cannot_be_built():
    fields = {f.name: None for f in dataclasses.fields(PPOJob)}
    with pytest.raises(TypeError, match="unexpected keyword argument 'polcy_version'"):
        PPOJob(**fields | {"polcy_version": 0})
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'candidate'|missing 1 required positional argument: 'candidate'"):
        PPOJob(**{k: v for k, v in fields.items() if k != "candidate"})


def test_an_unknown_kind_is_refused():
    with pytest.raises(JobConfigError, match="no job kind 'train'"):
        parse_job_config("train", {})
