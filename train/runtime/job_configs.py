"""What each kind of job is given: one frozen dataclass per kind, with one name for each thing.

The owner builds one (ui.owner.round_jobs, ui.owner.jobs), checks it by reading it back as the worker will
(`parse_job_config`) before the job is queued, and writes it into the job directory as JSON (train.runtime.jobdir);
the worker reads it with the same function and refuses one that does not parse, naming the field. A misspelt or
missing field is caught where the config is built, by the dataclass itself, or where it is read, by the parser:
never deep in a worker, on a GPU, an hour later.
"""

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from train.common.config import DPOConfig, GenerationConfig, GRPOConfig, JudgeConfig, ModelConfig, PPOConfig, RewardModelConfig


class JobConfigError(ValueError):
    """A job config that does not parse: the message names the field."""


@dataclass(frozen=True)
class PreviousRewardModel:
    """A reward-model version a new one builds on: a head measured on the votes it never saw, or a LoRA model continued
    on them."""

    version: int
    adapter_path: str
    new_pair_ids: list[int]  # the pairs of the new snapshot this version did not train on
    new_ranking_ids: list[int]


@dataclass(frozen=True)
class FlipRateUsed:
    rate: float  # the one the labels' confidence is taken at
    measured: dict[str, Any]  # annotate.agreement.FlipRate, as measured from the votes
    setting: float | str  # [reward_model] flip_rate: a rate, or "auto"


@dataclass(frozen=True)
class RewardModelJob:
    kind: ClassVar[str] = "reward_model"
    model: ModelConfig
    reward_model: RewardModelConfig
    flip_rate: FlipRateUsed
    warm_start: PreviousRewardModel | None  # the LoRA model continued, or None to train from scratch
    previous: PreviousRewardModel | None  # the newest head, measured on the votes it never saw
    features_cache: str | None  # the project's features/ folder, for a head


@dataclass(frozen=True)
class GenerateJob:
    kind: ClassVar[str] = "generate"
    model: ModelConfig
    generation: GenerationConfig
    policy_version: int
    policy_adapter_path: str | None  # None: v0, the base model
    against: int | None  # pair each completion with one of this version's, not within its prompt
    reward_model: RewardModelConfig
    reward_adapter_path: str | None  # scores the completions, for the 'active' queue
    pairs_per_prompt: int | None  # chosen from the scored completions (annotate.pairs.most_disputed)
    unpaired_prompts: list[int]  # held-back prompts: their completions are paired only against another version's


@dataclass(frozen=True)
class ScoreJob:
    kind: ClassVar[str] = "score"
    model: ModelConfig
    reward_model: RewardModelConfig
    reward_version: int
    reward_adapter_path: str


@dataclass(frozen=True)
class PPOJob:
    kind: ClassVar[str] = "ppo"
    model: ModelConfig
    ppo: PPOConfig
    policy_version: int
    policy_adapter_path: str | None
    reward_version: int
    reward_adapter_path: str
    candidate: int | None  # a round's candidate, numbered from 0: kept in its job until the predictor chooses


@dataclass(frozen=True)
class GRPOJob:
    kind: ClassVar[str] = "grpo"
    model: ModelConfig
    grpo: GRPOConfig
    policy_version: int
    policy_adapter_path: str | None
    reward_version: int
    reward_adapter_path: str
    candidate: int | None


@dataclass(frozen=True)
class DPOJob:
    kind: ClassVar[str] = "dpo"
    model: ModelConfig
    dpo: DPOConfig
    policy_version: int
    policy_adapter_path: str | None
    candidate: int | None
    # Given a reward model, DPO also trains on the pairs it ranks among the policy's answers to the frozen prompts.
    generation: GenerationConfig | None = None
    reward_model: RewardModelConfig | None = None
    reward_version: int | None = None
    reward_adapter_path: str | None = None


@dataclass(frozen=True)
class CandidateAdapter:
    job: int
    adapter_path: str


@dataclass(frozen=True)
class PredictJob:
    kind: ClassVar[str] = "predict"
    model: ModelConfig
    generation: GenerationConfig
    reward_model: RewardModelConfig
    reward_version: int
    reward_adapter_path: str
    start_version: int
    start_adapter_path: str | None
    candidates: list[CandidateAdapter]
    average: bool  # rate only the candidates' average, the one the round registers
    kl_budget: float  # 0: none
    confidence: float
    draws: int  # bootstrap draws of each win rate
    seed: int


@dataclass(frozen=True)
class JudgeJob:
    kind: ClassVar[str] = "judge"
    model: ModelConfig
    judge: JudgeConfig
    annotator: str


JobConfig = RewardModelJob | GenerateJob | ScoreJob | PPOJob | GRPOJob | DPOJob | PredictJob | JudgeJob
JOB_CONFIGS: dict[str, type] = {cls.kind: cls for cls in typing.get_args(JobConfig)}
POLICY_JOBS = (PPOJob, DPOJob, GRPOJob)


def parse_job_config(kind: str, data: Any) -> JobConfig:
    """The config of a job of `kind` from its JSON form; a JobConfigError naming the field where a field is missing,
    unknown or of the wrong type."""
    if kind not in JOB_CONFIGS:
        raise JobConfigError(f"no job kind {kind!r}: one of {', '.join(JOB_CONFIGS)}")
    return _parse(JOB_CONFIGS[kind], data, f"the {kind} job's config")


def checked(config: JobConfig) -> JobConfig:
    """`config` once it has been read back as the worker will read it: a wrong type (a value built from a setting that
    was never checked) is refused here, before the job is queued."""
    return parse_job_config(config.kind, job_config_json(config))


def job_config_json(config: JobConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def _parse(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise JobConfigError(f"{where}: expected an object, got {_shown(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if unknown := sorted(set(data) - set(fields)):
        raise JobConfigError(f"{where}: unknown field {unknown[0]!r} (its fields: {', '.join(fields)})")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        if name in data:
            values[name] = _value(hints[name], data[name], f"{where}, field {name!r}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise JobConfigError(f"{where}: missing field {name!r}")
    return cls(**values)


def _value(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _parse(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _value(option, value, where)
            except JobConfigError:
                continue
        raise JobConfigError(f"{where}: expected {_type_name(hint)}, got {_shown(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise JobConfigError(f"{where}: expected a list, got {_shown(value)}")
        return [_value(typing.get_args(hint)[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if hint is Any or (origin is dict and isinstance(value, dict)):
        return value
    if _is(hint, value):
        return value
    raise JobConfigError(f"{where}: expected {_type_name(hint)}, got {_shown(value)}")


def _is(hint: Any, value: Any) -> bool:
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return hint in (str, bool) and isinstance(value, hint)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(option) for option in typing.get_args(hint))
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
