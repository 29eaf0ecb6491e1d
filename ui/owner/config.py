"""`tether.toml`: one typed, documented section per configured part of Tether."""

import dataclasses
import json
import re
import textwrap
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from annotate.queue import QueueConfig
from store.input_files import ImportLimits
from train.common.config import DPOConfig, GenerationConfig, GRPOConfig, Hardware, JudgeConfig, ModelConfig, PPOConfig, RewardModelConfig
from train.common.files import write_durably
from ui.owner.auth import SignInLimits

DEFAULT_GUIDELINES = """Read the prompt, then both responses in full.
Choose the response that is more helpful, honest and harmless.
- **Tie**: both are about equally good.
- **Both are bad**: neither is acceptable (wrong, harmful or off-topic).
- **Skip**: you cannot judge this pair.
Add a strength when the difference is large, and a comment when something stands out."""


ORIGIN = re.compile(r"https?://[^/\s]+")  # what a browser sends as Origin: no path, no trailing slash


class ConfigError(Exception):
    """A tether.toml that cannot be used, told in one line naming the file and key."""


@dataclass
class ServerConfig:
    guidelines: str = field(default=DEFAULT_GUIDELINES, metadata={"help": "Annotation guidelines shown to annotators (Markdown)."})
    # The defaults are SignInLimits', so that they are stated once.
    sign_in_attempts: int = field(
        default=SignInLimits.per_account,
        metadata={"help": "Failed sign-ins on one account before it is locked out. Attempts are counted before the password "
                          "is checked, so guesses sent in parallel meet the same limit."},
    )
    sign_in_attempts_per_address: int = field(
        default=SignInLimits.per_address, metadata={"help": "Failed sign-ins from one client address, on any accounts, before the address is locked out. "
                          "A reverse proxy on the same machine is trusted to name the client (X-Forwarded-For); for one "
                          "on another machine set the FORWARDED_ALLOW_IPS environment variable to its address, or every "
                          "client counts as the proxy."},
    )
    lockout_seconds: float = field(
        default=SignInLimits.lockout_seconds,
        metadata={"help": "How long the first lockout lasts; each next one of the same account or address doubles, up to "
                          "max_lockout_seconds. A locked-out attempt is refused at once, without checking the password."},
    )
    max_lockout_seconds: float = field(
        default=SignInLimits.max_lockout_seconds,
        metadata={"help": "The longest lockout. With the defaults an attacker gets at most 35 guesses at one account in "
                          "the first hour and 20 an hour after that, from any number of addresses; the price is that an "
                          "attacker can keep an account locked out, its owner waiting up to this long."},
    )
    max_upload_mb: float = field(default=100.0, metadata={"help": "The largest file the app accepts (prompt uploads), in MiB."})
    # The defaults are ImportLimits', so that they are stated once.
    max_import_mb: int = field(
        default=ImportLimits.max_mb,
        metadata={"help": "The largest prompt or preference file an import reads, in MiB once decompressed: a larger one "
                          "is refused before it is read into memory. A .gz is measured as it is decompressed."},
    )
    max_import_rows: int = field(
        default=ImportLimits.max_rows, metadata={"help": "The most rows a prompt or preference file may hold; one with more is refused."},
    )
    max_request_kb: int = field(
        default=64, metadata={"help": "The largest request the app accepts other than a file upload, in KiB: a vote with the "
                          "longest comment allowed is under 10 KiB. Larger ones are refused (413) before they are read."},
    )
    export_seconds: int = field(
        default=600, metadata={"help": "How long an export's file is kept for download before the server removes it; all of them go "
                          "when the server stops."},
    )
    session_hours: float = field(
        default=12.0, metadata={"help": "How long a sign-in lasts: after this many hours the browser's session ends and its "
                          "account signs in again. Disabling an account or setting its password ends its sessions at once."},
    )
    trusted_origins: list[str] = field(
        default_factory=list,
        metadata={"help": "Other sites whose pages may send changes to the app, such as \"https://tether.example.org\" (scheme "
                          "and host, and the port unless the default). The app refuses a change (a vote, an upload, any "
                          "operator action) sent by a page on another site than the one it is served at, which it reads "
                          "from the request's Host header; behind a reverse proxy that rewrites Host, list the public "
                          "address here, or have the proxy pass Host on."},
    )

    def __post_init__(self):
        for name in ("sign_in_attempts", "sign_in_attempts_per_address"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be 1 or more, got {getattr(self, name)}")
        if self.max_upload_mb <= 0:
            raise ValueError(f"max_upload_mb must be over 0, got {self.max_upload_mb}")
        for name in ("max_import_mb", "max_import_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be 1 or more, got {getattr(self, name)}")
        if self.max_request_kb < 1:
            raise ValueError(f"max_request_kb must be 1 or more, got {self.max_request_kb}")
        if self.export_seconds < 1:
            raise ValueError(f"export_seconds must be 1 or more, got {self.export_seconds}")
        if self.session_hours <= 0:
            raise ValueError(f"session_hours must be over 0, got {self.session_hours}")
        for origin in self.trusted_origins:
            if not ORIGIN.fullmatch(origin):
                raise ValueError(f"trusted_origins must hold origins such as \"https://tether.example.org\": a scheme and a "
                                 f"host, with a port if need be, and no path; got {origin!r}")
        if not 0 < self.lockout_seconds <= self.max_lockout_seconds:
            raise ValueError(f"lockout_seconds must be over 0 and at most max_lockout_seconds, got {self.lockout_seconds}")

    def import_limits(self) -> ImportLimits:
        return ImportLimits(max_mb=self.max_import_mb, max_rows=self.max_import_rows)

    def sign_in_limits(self) -> SignInLimits:
        return SignInLimits(per_account=self.sign_in_attempts, per_address=self.sign_in_attempts_per_address,
                            lockout_seconds=self.lockout_seconds, max_lockout_seconds=self.max_lockout_seconds)


OPTIMIZERS = ("auto", "ppo", "dpo", "grpo")
START_FROM = ("best", "newest")
REGISTER = ("average", "confident", "best")
TRUSTED_OPTIMIZERS = ("dpo", "ppo", "grpo")


@dataclass
class RoundConfig:
    optimizer: str = field(
        default="auto",
        metadata={"help": "How a round turns votes into the next policy. 'auto': a reward model is trained on the votes "
                          "first, then DPO on the votes, or with trusted_optimizer 'ppo' or 'grpo' that against it once it steers "
                          "([reward_model] trust: it has predicted votes it never saw better than chance); the round says "
                          "which and why. 'ppo' (PPO against a reward model trained on the votes, with a KL penalty to the starting "
                          "model), 'dpo' (DPO with the starting model as its reference, on the votes and on the policy's "
                          "fresh answers ranked by a reward model trained on them first, as [dpo] pairs says) or 'grpo' (a "
                          "reward model, then GRPO: groups of responses per prompt, each group's mean reward the baseline, no "
                          "value model) run whatever the reward model has shown: PPO against a reward model no better "
                          "than chance teaches the policy that model's biases (scripts/BENCHMARKS.md)."},
    )
    trusted_optimizer: str = field(
        default="dpo",
        metadata={"help": "With optimizer 'auto': what runs once the reward model steers. 'dpo': DPO on the votes still, as "
                          "before; 'ppo' or 'grpo' optimise the reward model's reward, the heads' mean (less "
                          "uncertainty_penalty times their spread where it is set, [ppo], [grpo]). 'dpo' because at 96 votes a round PPO "
                          "against a steering reward model gained less over v0 a round than DPO on the votes did (+2.7 "
                          "points against +7.4, over 5 and 9 rounds) at three times the time (scripts/BENCHMARKS.md)."},
    )
    min_pairs: int = field(
        default=30,
        metadata={"help": "Fewest pairs a round's DPO on the votes alone trains on. With fewer, the round trains nothing, "
                          "says so, and its votes carry over to the next. Over 37 DPO rounds at 70% agreement, those on 15 to 27 "
                          "pairs (a few optimiser steps) gained 1.4 points over their start on average, one losing 9; those "
                          "on 34 or more gained 7 (scripts/BENCHMARKS.md). 1 trains on any."},
    )
    held_back_share: float = field(
        default=0.25,
        metadata={"help": "Share of the active prompts no optimiser trains on. A round pairs the new policy against the old on "
                          "them, so the votes measure it on prompts it was not optimised for; annotators see no other pairs "
                          "there. A prompt's side is fixed by its content, the same round after round."},
    )
    per_prompt: int = field(default=2, metadata={"help": "Completions of each policy per held-back prompt in a round, paired new against old."})
    every_comparisons: int = field(
        default=0,
        metadata={"help": "The app starts a round by itself once this many comparisons have come in since the last round "
                          "started; 0 turns the scheduler off. The Loop view sets it too."},
    )
    kl_budget: float = field(
        default=20.0,
        metadata={"help": "The most KL to the starting model (nats per response) you accept, over all rounds together: "
                          "KL adds up round after round, as each round moves on from where the last one ended. No round "
                          "registers a candidate further than this on its answers to the predictor's prompts, whatever "
                          "its optimiser: the one measure of it, taken on prompts no candidate trained on. A candidate past "
                          "it is pulled back along its step from v0 (its LoRA update scaled down, as if its KL grew with "
                          "the square of the share kept) to 0.9 of it, measured again, and registered if inside: the judge "
                          "had rated such candidates 67% to 81% over their start when they were thrown away "
                          "(scripts/BENCHMARKS.md). 0: no budget."},
    )
    kl_per_vote: float = field(
        default=0.0,
        metadata={"help": "The most KL to v0 (nats) a round may register for each vote the project holds (people's, "
                          "imported and the AI judge's), within [round] kl_budget: a round on a few noisy votes moves the policy a little, so that a draw that "
                          "pulls the wrong way costs little, and a later round on more votes may go further. A candidate "
                          "past it is pulled back as past kl_budget. 0: every round may use the whole kl_budget."},
    )
    candidates: int = field(
        default=2,
        metadata={"help": "Policies a round trains from its start, from one initialisation, each with its own seed (its batches "
                          "and samples). With [round] register = "
                          "'average' each by the optimiser the round runs, and the round registers their average; "
                          "otherwise the first by it and the others by DPO, the cheapest, and the predictor rates "
                          "each and picks one. 2: each costs a round its optimiser's time again: on a 2-core CPU, three rounds of 96 "
                          "votes with their evaluations took 63 minutes, DPO's two candidates 7 to 8 minutes of each round's 20 to 22 "
                          "(scripts/BENCHMARKS.md)."},
    )
    predictor_prompts: int = field(
        default=32,
        metadata={"help": "Held-back prompts the predictor compares candidates with the start on: the first this many by "
                          "content, the same every round. No policy of the round trained on them."},
    )
    predictor_answers: int = field(
        default=4,
        metadata={"help": "Answers of the start and of each candidate to each of the predictor's prompts. The predicted win "
                          "rate is the share of pairs of answers to the same prompt where the reward model scores the "
                          "candidate's higher. 4, not 8: with register = 'average' the prediction decides nothing but the "
                          "KL budget, and 8 (then for each candidate too) made the predictor a third of a round on a CPU "
                          "(scripts/BENCHMARKS.md)."},
    )
    predictor_confidence: float = field(
        default=0.8,
        metadata={"help": "Level of the predicted win rate's interval (a bootstrap over the prompts, their answers and the "
                          "reward model's heads). A candidate is registered only if its whole interval lies above 50%: at "
                          "0.8, its win rate is above 50% with 90% confidence."},
    )
    register: str = field(
        default="average",
        metadata={"help": "What a round registers. 'average': the average of its candidates' weights, which keeps what "
                          "they learnt alike and drops what each seed's draw added (one candidate alone gained anywhere "
                          "from -8 to +14 points over its start by a judge; the average of two or three, the candidates' "
                          "mean or better at half their KL: scripts/BENCHMARKS.md). 'confident': the candidate the "
                          "predictor rates best among those predicted better than the start with [round] "
                          "predictor_confidence, or none (its votes then carry over). 'best': the one it rates best, "
                          "whatever it predicts. Any way, none over [round] kl_budget."},
    )
    start_from: str = field(
        default="best",
        metadata={"help": "Which version a round starts from. 'best': the version people's votes on the held-back pairs "
                          "rate best (Bradley-Terry), once they rate it above the newest with 90% confidence; the round "
                          "first registers a copy of it as the newest, as a rollback does, and says so. 'newest': the "
                          "newest, always."},
    )

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.trusted_optimizer not in TRUSTED_OPTIMIZERS:
            raise ValueError(f"trusted_optimizer must be one of {', '.join(TRUSTED_OPTIMIZERS)}, got {self.trusted_optimizer!r}")
        if not 0 < self.held_back_share < 1:
            raise ValueError(f"held_back_share must be between 0 and 1, got {self.held_back_share}")
        if self.per_prompt < 1 or self.every_comparisons < 0:
            raise ValueError("per_prompt must be at least 1 and every_comparisons at least 0")
        if self.kl_budget < 0 or self.kl_per_vote < 0:
            raise ValueError(f"kl_budget and kl_per_vote must be 0 or more, got {self.kl_budget} and {self.kl_per_vote}")
        if self.min_pairs < 1:
            raise ValueError(f"min_pairs must be at least 1, got {self.min_pairs}")
        if self.candidates < 1 or self.predictor_prompts < 1 or self.predictor_answers < 1:
            raise ValueError("candidates, predictor_prompts and predictor_answers must be at least 1")
        if not 0 < self.predictor_confidence < 1:
            raise ValueError(f"predictor_confidence must be between 0 and 1, got {self.predictor_confidence}")
        if self.register not in REGISTER:
            raise ValueError(f"register must be one of {', '.join(REGISTER)}, got {self.register!r}")
        if self.start_from not in START_FROM:
            raise ValueError(f"start_from must be one of {', '.join(START_FROM)}, got {self.start_from!r}")


    def kl_allowance(self, votes: int) -> float:
        """The most KL to v0 a round begun after `votes` votes may register; 0: no limit."""
        if not self.kl_per_vote:
            return self.kl_budget
        by_votes = self.kl_per_vote * votes
        return min(self.kl_budget, by_votes) if self.kl_budget else by_votes


@dataclass
class WorkerConfig:
    gpus: int | str = field(
        default=1,
        metadata={"help": 'GPUs each model job uses: a number, or "all". Over 1, the worker runs under accelerate launch, '
                          "one process per GPU (DDP): reward-model training and PPO split each batch and average the "
                          "gradients, generation and scoring split the prompts. Batch sizes stay global, so [reward_model] "
                          "batch_size and [ppo] batch_size and minibatch_size must be multiples of it. A job asking for more "
                          "GPUs than the machine has is refused before it is queued."},
    )
    release_memory: bool = field(
        default=False,
        metadata={"help": "Workers hand the memory they free back to the system at once (glibc's mmap threshold held at "
                          "128 KiB) rather than keep it for reuse. On the CPU a reward-model step of 8 pairs of 256 tokens "
                          "on the default model then peaked at 9.5 GB rather than 13.0 and took 1.5 times as long "
                          "(scripts/bench_memory.py). Turn it on where a CPU machine is short of memory. On a GPU the "
                          "activations are in GPU memory, which it leaves alone."},
    )

    def __post_init__(self):
        if not (self.gpus == "all" or isinstance(self.gpus, int) and self.gpus >= 1):
            raise ValueError(f'gpus must be a whole number of at least 1, or "all", got {self.gpus!r}')

    def processes(self) -> int:
        """How many worker processes a job runs as: one per GPU asked for; "all" on a machine without CUDA is one."""
        if self.gpus != "all":
            return self.gpus
        import torch

        return max(1, torch.cuda.device_count())


@dataclass
class TetherConfig:
    """tether.toml: one section per field, each a dataclass whose fields carry their help."""

    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "The base model every job loads, and how."})
    generation: GenerationConfig = field(
        default_factory=GenerationConfig, metadata={"help": "Sampling the completions annotators compare, and evaluation answers."},
    )
    queue: QueueConfig = field(default_factory=QueueConfig, metadata={"help": "Which pair each annotator is served next."})
    server: ServerConfig = field(
        default_factory=ServerConfig,
        metadata={"help": "The annotation app: guidelines, sign-in limits and sessions, uploads and exports, trusted sites."},
    )
    reward_model: RewardModelConfig = field(
        default_factory=RewardModelConfig,
        metadata={"help": "The Bradley-Terry reward model fitted to the votes: a head on the base's features, or a LoRA model."},
    )
    ppo: PPOConfig = field(default_factory=PPOConfig, metadata={"help": "PPO rounds: the policy against the reward model, held near the version it starts from, within [round] kl_budget of v0."})
    dpo: DPOConfig = field(default_factory=DPOConfig, metadata={"help": "DPO rounds: the policy trained on the votes directly."})
    grpo: GRPOConfig = field(default_factory=GRPOConfig, metadata={"help": "GRPO rounds: groups of answers per prompt scored by the reward model."})
    round: RoundConfig = field(default_factory=RoundConfig, metadata={"help": "Rounds: the optimiser, held-back prompts, the scheduler, the KL budget."})
    judge: JudgeConfig = field(
        default_factory=JudgeConfig,
        metadata={"help": "The AI judge (`tether judge`): a language model voting on pairs, its votes kept apart from people's."},
    )
    worker: WorkerConfig = field(default_factory=WorkerConfig, metadata={"help": "The worker process that runs model jobs."})

    def __post_init__(self):
        if self.ppo.max_new_tokens is not None and self.ppo.max_new_tokens > self.generation.max_new_tokens:
            raise ValueError(
                f"[ppo] max_new_tokens ({self.ppo.max_new_tokens}) is longer than [generation] max_new_tokens "
                f"({self.generation.max_new_tokens}): PPO would optimise text annotators never see"
            )
        if self.grpo.max_new_tokens is not None and self.grpo.max_new_tokens > self.generation.max_new_tokens:
            raise ValueError(
                f"[grpo] max_new_tokens ({self.grpo.max_new_tokens}) is longer than [generation] max_new_tokens "
                f"({self.generation.max_new_tokens}): GRPO would optimise text annotators never see"
            )

    def judge_model(self) -> ModelConfig:
        """The AI judge's model: [judge] model, or the base of [model] when unset, loaded as [model] says."""
        return dataclasses.replace(self.model, name_or_path=self.judge.model or self.model.name_or_path)

    def ppo_response_tokens(self) -> int:
        """PPO's length budget: the pairs' unless the operator set a shorter one."""
        return self.ppo.max_new_tokens or self.generation.max_new_tokens

    def length_warning(self) -> str | None:
        """Why PPO's responses are shorter than the pairs annotators compare, when they are."""
        if self.ppo_response_tokens() >= self.generation.max_new_tokens:
            return None
        return (f"PPO samples at most {self.ppo_response_tokens()} tokens ([ppo] max_new_tokens) while annotators compare "
                f"completions of up to {self.generation.max_new_tokens} ([generation] max_new_tokens): PPO optimises "
                f"text people never see, and the reward model scores prefixes unlike what it was trained on")


def settings_for(hardware: Hardware, model: ModelConfig) -> tuple[TetherConfig, str]:
    """The settings `tether init` writes for this hardware, and which profile they are.

    The defaults are the CPU profile: the loop in scripts/BENCHMARKS.md is measured with them,
    unedited, on a 2-core CPU and the default model. A GPU gets the answers a chat model needs and batches that
    fill it; those were chosen for a 0.5B to 8B model and not measured here.
    """
    config = TetherConfig(model=model)
    if hardware.device != "cuda":
        return config, f"CPU profile for {hardware}: short answers and small batches, so a round takes minutes"
    roomy = hardware.memory_gb >= 40
    config.generation = dataclasses.replace(config.generation, max_new_tokens=256, batch_size=64)
    config.reward_model = dataclasses.replace(config.reward_model, batch_size=16, max_length=1024, gradient_checkpointing="auto" if roomy else True)
    config.ppo = dataclasses.replace(config.ppo, steps=40, batch_size=32 if roomy else 16, minibatch_size=8)
    config.grpo = dataclasses.replace(config.grpo, steps=40, prompts_per_step=8 if roomy else 4, minibatches=4 if roomy else 2)
    return config, f"GPU profile for {hardware}: answers of up to 256 tokens and {'larger' if roomy else 'moderate'} batches"


def load_config(path: Path) -> TetherConfig:
    return read_config(path)[0]


def read_config(path: Path) -> tuple[TetherConfig, str]:
    """The settings in a tether.toml, and the text they were read from: set_setting refuses to write over a
    file that no longer holds it. A file that does not parse, or is empty, stops here, never read as defaults."""
    try:
        text = path.read_bytes().decode("utf-8")  # its line endings as they are, so that set_setting keeps them
        document = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it: {e}") from None
    if not text.strip():  # what a write cut short leaves; `tether init` writes every setting
        raise ConfigError(f"{path}: the file is empty: put back the project's settings, from a backup or a new `tether init`")
    sections = {f.name: f.type for f in dataclasses.fields(TetherConfig)}
    for name in document:
        if name not in sections:
            raise ConfigError(f"{path}: unknown section [{name}] (known: {', '.join(sections)})")
    try:
        config = TetherConfig(**{name: _section(path, name, cls, document.get(name, {})) for name, cls in sections.items()})
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    return config, text


def _section(path: Path, name: str, cls: type, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"{path}: [{name}] has no setting {key!r} (known: {', '.join(hints)})")
        if not _has_type(value, hints[key]):
            raise ConfigError(f"{path}: [{name}] {key} must be {_type_label(hints[key])}, got {value!r}")
    try:
        return cls(**values)
    except ValueError as e:
        raise ConfigError(f"{path}: [{name}] {e}") from None


def _has_type(value: Any, hint: Any) -> bool:
    if isinstance(hint, types.UnionType):
        return any(_has_type(value, option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return isinstance(value, list) and all(_has_type(item, typing.get_args(hint)[0]) for item in value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_label(hint: Any) -> str:
    if typing.get_origin(hint) is list:
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    options = [o for o in typing.get_args(hint) if o is not type(None)] if isinstance(hint, types.UnionType) else [hint]
    return " or ".join({str: "text", int: "a whole number", float: "a number", bool: "true or false"}[o] for o in options)


def write_config(path: Path, config: TetherConfig) -> None:
    """Write every setting with its help as a comment, so the file documents itself."""
    lines = ["# Tether project settings. Each setting's comment says what it does.", ""]
    for section in dataclasses.fields(config):
        lines.append(f"[{section.name}]")
        values = getattr(config, section.name)
        for setting in dataclasses.fields(values):
            lines += textwrap.wrap(setting.metadata["help"], width=96, initial_indent="# ", subsequent_indent="# ")
            value = getattr(values, setting.name)
            lines.append(f"# {setting.name} = 0" if value is None else f"{setting.name} = {_toml_value(value)}")
        lines.append("")
    write_durably(path, "\n".join(lines))


def set_setting(path: Path, read: str, section: str, key: str, value: Any) -> str:
    """Change one setting in tether.toml, leaving every other line as it is, and return the file's new text.

    `read` is the text the running settings came from: a file changed since (by hand, or by another
    process) is refused, not overwritten with them. The file is replaced whole, never half written.
    """
    try:
        current = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it: {e}") from None
    if current != read:
        raise ConfigError(f"{path} changed since the settings in use were read from it, so it was left as it is: "
                          "restart the app to use the file's settings, then change this one again")
    lines = current.splitlines(keepends=True)
    header = next((i for i, text in enumerate(lines) if re.fullmatch(rf"\s*\[{section}\]\s*(#.*)?", text.rstrip("\r\n"))), len(lines))
    end = next((i for i in range(header + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    at = next((i for i in range(header + 1, end) if re.match(rf"\s*{key}\s*=", lines[i])), None)
    if at is None:
        raise ConfigError(f"{path}: [{section}] has no line '{key} = ...' to change: add it to the file by hand")
    lines[at] = f"{key} = {_toml_value(value)}" + lines[at][len(lines[at].rstrip("\r\n")):]  # its own line ending
    changed = "".join(lines)
    expected = tomllib.loads(current)
    expected.setdefault(section, {})[key] = value
    try:
        placed = tomllib.loads(changed) == expected
    except tomllib.TOMLDecodeError:
        placed = False
    if not placed:  # a line this simple reading misplaced, such as one inside a multi-line string
        raise ConfigError(f"{path}: cannot change [{section}] {key} without touching other settings: set it in the file by hand")
    try:
        write_durably(path, changed)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write it ({e.strerror or e}), so it was left as it is") from None
    return changed


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, list)):
        return json.dumps(value, ensure_ascii=False)  # a JSON string, or list of them, is valid TOML
    return repr(value)


SECTIONS = tuple(f.name for f in dataclasses.fields(TetherConfig))


@dataclass(frozen=True)
class Setting:
    """One setting of tether.toml as `tether settings` shows it, read off the config dataclasses."""

    section: str
    name: str
    type: str
    default: Any  # the dataclass default, which is the CPU profile's value
    gpu_default: str | None  # what `tether init` writes on a CUDA GPU, where it differs
    help: str


def all_settings(section: str | None = None) -> list[Setting]:
    """Every setting of tether.toml (or of one section), in file order, with its type, default and help."""
    if section is not None and section not in SECTIONS:
        raise ConfigError(f"no section [{section}] in tether.toml (known: {', '.join(SECTIONS)})")
    default = TetherConfig()
    roomy, small = (settings_for(Hardware("cuda", "a GPU", memory), ModelConfig())[0] for memory in (80.0, 24.0))
    settings = []
    for part in dataclasses.fields(TetherConfig):
        if section not in (None, part.name):
            continue
        hints = typing.get_type_hints(part.type)
        for setting in dataclasses.fields(part.type):
            value = getattr(getattr(default, part.name), setting.name)
            on_gpu = [getattr(getattr(c, part.name), setting.name) for c in (roomy, small)]
            settings.append(Setting(part.name, setting.name, _type_name(hints[setting.name]), value,
                                    _gpu_default(value, *on_gpu), setting.metadata.get("help", "")))
    return settings


def settings_reference(section: str | None = None, width: int = 96) -> str:
    """`tether settings`: each section's help, then each setting as `name = default`, its type and its help."""
    sections = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(TetherConfig)}
    lines: list[str | None] = [
        "# Each setting of tether.toml: name = default (type), then what it does. The defaults are the CPU profile;",
        "# on a CUDA GPU `tether init` writes the GPU profile's value where one is shown. A project's own values are",
        "# in its tether.toml.",
    ]
    current = None
    for setting in all_settings(section):
        if setting.section != current:
            current = setting.section
            lines += ["", f"[{current}]  {sections[current]}", ""]
        kind = setting.type + (f"; GPU profile: {setting.gpu_default}" if setting.gpu_default else "")
        lines.append(f"{setting.name} = {_shown(setting.default)}    ({kind})")
        lines += textwrap.wrap(setting.help, width=width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(line for line in lines if line is not None)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is list:
        return f"list of {_type_name(typing.get_args(hint)[0])}"
    names = {str: "text", int: "integer", float: "number", bool: "true or false"}
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    name = " or ".join(names[o] for o in options if o is not type(None))
    return name + ", may be unset" if type(None) in options else name


def _gpu_default(value: Any, roomy: Any, small: Any) -> str | None:
    if roomy == small == value:
        return None
    if roomy == small:
        return _shown(roomy)
    return f"{_shown(roomy)} from 40 GB of GPU memory, {_shown(small)} under"


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, str) and "\n" in value:
        return f"{_toml_value(value.splitlines()[0])[:-1]} ...\" ({len(value.splitlines())} lines)"
    return _toml_value(value)
