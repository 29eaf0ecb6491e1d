"""The policy adapter of a TRL-trained round (DPO, GRPO): made or continued, then saved as plain PEFT."""

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from train.common.files import built_beside
from train.common.models import trainable_in_float32
from train.policy.ppo import StepFn, load_adapter_weights
from train.runtime.hardware import uses_bf16


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


def trainer_settings(scratch: str, seed: int, data_seed: int, precision: str, on_cpu: bool) -> dict[str, Any]:
    """The TRL config fields every round's trainer shares: a scratch output_dir, nothing saved or reported,
    no progress bar (StepLog reports each step), and bf16 autocast where precision asks for it. TRL initialises
    a new adapter under `seed`; `data_seed` orders the batches."""
    return {"output_dir": scratch, "seed": seed, "data_seed": data_seed, "save_strategy": "no", "report_to": "none",
            "disable_tqdm": True,
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


def average_adapters(folders: list[Path], out_dir: Path) -> None:
    """The average of LoRA adapters trained from one start, as one adapter of the same rank in out_dir.

    Each module's update is the mean of the adapters' B·A, cut to the adapters' rank r by its r
    largest singular values (exact where the updates share their directions). Candidates that
    learnt the same votes from the same start and initialisation (one seed, each its own data_seed)
    lie in one basin, where the average of their weights
    keeps what they share and cancels what each seed's minibatch order added (model soups, WARP):
    one draw of a round's training is a lottery, the mean of several far less.
    """
    weights = [load_file(str(folder / "adapter_model.safetensors")) for folder in folders]
    averaged = {}
    for key, first in weights[0].items():
        if "lora_A" not in key:
            if "lora_B" not in key:
                averaged[key] = sum(w[key] for w in weights) / len(weights)
            continue
        b_key = key.replace("lora_A", "lora_B")
        down = torch.cat([w[key] for w in weights])  # (K·r, in)
        up = torch.cat([w[b_key] for w in weights], dim=1) / len(weights)  # (out, K·r): up @ down is the mean update
        # The SVD of the (out, in) update, from QR of each factor and the SVD of the small (K·r, K·r) core.
        q_up, r_up = torch.linalg.qr(up)
        q_down, r_down = torch.linalg.qr(down.T)
        u, s, vh = torch.linalg.svd(r_up @ r_down.T)
        rank, root = first.shape[0], s[:first.shape[0]].sqrt()
        averaged[b_key] = ((q_up @ u[:, :rank]) * root).contiguous()
        averaged[key] = ((root[:, None] * vh[:rank]) @ q_down.T).contiguous()
    with built_beside(out_dir) as built:
        built.mkdir()
        shutil.copy(folders[0] / "adapter_config.json", built / "adapter_config.json")
        save_file(averaged, str(built / "adapter_model.safetensors"))


def scale_adapter(folder: Path, out_dir: Path, scale: float) -> None:
    """The adapter in `folder` with its update from the base scaled by `scale` (each lora_B, so B·A scales), in out_dir:
    the policy `scale` of the way from v0 to it along a straight line in weight space."""
    weights = {k: v * scale if "lora_B" in k else v for k, v in load_file(str(folder / "adapter_model.safetensors")).items()}
    with built_beside(out_dir) as built:
        built.mkdir()
        shutil.copy(folder / "adapter_config.json", built / "adapter_config.json")
        save_file(weights, str(built / "adapter_model.safetensors"))
