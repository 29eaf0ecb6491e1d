"""The policy adapter of a TRL-trained round (DPO, GRPO): made or continued, then saved as plain PEFT."""

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from train.files import built_beside
from train.hardware import uses_bf16
from train.models import trainable_in_float32
from train.ppo import StepFn, load_adapter_weights


class StepLog(TrainerCallback):
    """Each step's statistics from a TRL trainer's logs, under Tether's names ({theirs: ours}), kept
    and passed to on_step as they come. A step may span several optimiser updates (logging_steps)."""

    def __init__(self, on_step: StepFn | None, names: dict[str, str], updates_per_step: int = 1):
        self.on_step, self.names, self.updates_per_step, self.steps = on_step, names, updates_per_step, []

    def stats(self, logs: dict[str, float]) -> dict[str, float]:
        return {ours: float(logs[theirs]) for theirs, ours in self.names.items()}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and self.names.keys() <= logs.keys():  # a step's log, not the run's summary
            stats = {"step": state.global_step // self.updates_per_step, **self.stats(logs)}
            self.steps.append(stats)
            if self.on_step is not None:
                self.on_step({**stats, "total_steps": state.max_steps // self.updates_per_step})


def policy_lora(policy_dir: Path | None, lora_r: int, lora_alpha: int):
    """The LoraConfig of the policy a round starts from, or of a new adapter on v0 (its B is zero: it starts as the base)."""
    from peft import LoraConfig

    if policy_dir is None:
        return LoraConfig(task_type="CAUSAL_LM", r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules="all-linear")
    lora = LoraConfig.from_pretrained(str(policy_dir))
    lora.inference_mode = False
    return lora


def trainer_settings(scratch: str, seed: int, precision: str, on_cpu: bool) -> dict[str, Any]:
    """The TRL config fields every round's trainer shares: a scratch output_dir, nothing saved or reported,
    no progress bar (StepLog reports each step), and bf16 autocast where precision asks for it."""
    return {"output_dir": scratch, "seed": seed, "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
            "gradient_checkpointing": False, "bf16": uses_bf16(precision), "use_cpu": on_cpu}


def train_from(trainer, policy_dir: Path | None) -> None:
    """Train the trainer's new adapter, first loading the starting policy's LoRA weights into it when there is
    one (before train(), which makes the optimiser). TRL's printed logs are off: StepLog reports each step."""
    trainer.remove_callback(PrinterCallback)
    trainable_in_float32(trainer.model)
    if policy_dir is not None:
        weights = {k: v for k, v in load_file(str(policy_dir / "adapter_model.safetensors")).items() if "lora_" in k}
        load_adapter_weights(trainer.model, weights, "default", policy_dir)
    trainer.train()


def save_adapter(trainer, out_dir: Path, settings_file: str, settings: dict[str, Any]) -> None:
    """The trained adapter as a directory PeftModel.from_pretrained loads, with the settings it trained with,
    built beside out_dir and renamed into place."""
    # Mixed precision wraps forward in autocast; the saved adapter must be the plain float32 one.
    peft_model = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    with built_beside(out_dir) as built:
        peft_model.save_pretrained(built)  # the adapter named "default" lands in the folder itself
        (built / settings_file).write_text(json.dumps(settings, indent=2) + "\n")
