"""DPO on the policy's LoRA adapter with TRL's DPOTrainer: a round of iterative DPO.

The policy is a fresh adapter on v0 (its LoRA B is zero, so it starts equal to the base), trained on
every vote so far ([dpo] refit), or continues from the adapter of the version the round starts
from on the votes it has not learnt. The reference is the base
with every adapter off: no second copy of the model is loaded, and every round is tethered to
the starting model, as PPO's KL penalty is.

The pairs are people's votes, pairs the reward model ranked (`ranked_pairs`: the best and the
worst of several fresh answers of the policy to a prompt, where the reward model is confident),
or both.
"""

import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from train.common.config import DPOConfig, data_seed
from train.common.errors import ModelError
from train.common.models import prepare_for_training
from train.common.snapshot import Messages, PreferenceRow
from train.policy.adapters import StepFn, StepLog, policy_lora, save_adapter, train_from, trainer_settings
from train.runtime import distributed

# What DPOTrainer logs at each step, under the names Tether stores: the loss, the implicit rewards
# beta * log(pi / pi_ref) of the chosen and rejected responses, their margin, and the share of
# pairs whose chosen response has the larger one.
METRICS = {
    "loss": "loss",
    "rewards/chosen": "chosen_reward",
    "rewards/rejected": "rejected_reward",
    "rewards/margins": "margin",
    "rewards/accuracies": "accuracy",
}


def ranked_pairs(
    prompts: list[Messages], answers: list[list[tuple[str, bool]]], heads: list[list[list[float]]], rewards: list[list[float]],
    confidence: float,
) -> list[PreferenceRow]:
    """Per prompt, its answers' (text, finished) ranked by reward: the best against the worst, kept where the
    heads' mean Bradley-Terry probability that the best wins, mean_k sigmoid(best_k - worst_k) on each head's raw
    scores (heads), is at least `confidence`."""
    rows = []
    for prompt, texts, raw, reward in zip(prompts, answers, heads, rewards):
        best = max(range(len(texts)), key=reward.__getitem__)
        worst = min(range(len(texts)), key=reward.__getitem__)
        if texts[best][0] == texts[worst][0]:
            continue
        margins = torch.tensor(raw[best], dtype=torch.float64) - torch.tensor(raw[worst], dtype=torch.float64)
        probability = torch.sigmoid(margins).mean().item()
        if probability >= confidence:
            rows.append(PreferenceRow(prompt, texts[best][0], texts[worst][0], texts[best][1], texts[worst][1], confidence=probability))
    return rows


# Robust DPO divides each pair's loss by 1 - 2e: this keeps a round's gradients within 5 times plain DPO's, where
# the flip rate's own cap (annotate.agreement.MAX_FLIP_RATE) would allow 10.
MAX_LABEL_SMOOTHING = 0.4


def label_smoothing(rows: list[PreferenceRow], setting: float | str) -> float:
    """[dpo] label_smoothing for these rows: the number set, or with 'auto' the expected share of wrong labels among
    them, each row wrong with 1 less the probability its votes (or the reward model's heads) give its label."""
    if setting != "auto":
        return setting
    return min(sum(1 - r.confidence for r in rows) / len(rows), MAX_LABEL_SMOOTHING) if rows else 0.0


def encode_pair(tokenizer: PreTrainedTokenizerBase, row: PreferenceRow) -> dict[str, list[int]]:
    """The pair's tokens as the policy sampled them: the prompt as the chat template renders it for
    generation, then each completion closed by EOS only where it ended (`chosen_finished`,
    `rejected_finished`).

    The chat template would close every completion, and for one cut at max_new_tokens DPO would
    then raise the probability of ending exactly there, in the chosen and the rejected alike.
    """
    prompt = tokenizer.apply_chat_template(row.prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]

    def completion(text: str, finished: bool) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] * finished

    return {"prompt_ids": prompt, "chosen_ids": completion(row.chosen, row.chosen_finished),
            "rejected_ids": completion(row.rejected, row.rejected_finished)}


def train_dpo(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[PreferenceRow],
    config: DPOConfig,
    out_dir: Path,
    policy_dir: Path | None = None,
    on_step: StepFn | None = None,
    on_cpu: bool = False,
) -> dict[str, Any]:
    """Fit the policy adapter to preference rows; save it to out_dir as a plain PEFT adapter.
    Returns each step's metrics and the pairs used and left out.

    model is the base causal LM, without adapters (train.common.models.load_model gives it).
    """
    from datasets import Dataset
    from trl import DPOConfig as TRLDPOConfig
    from trl import DPOTrainer

    class _PairsAsSampled(DPOTrainer):
        def _prepare_dataset(self, dataset, *args, **kwargs):  # tokenized already, by encode_pair
            return dataset

    processes = distributed.world_size()
    if config.batch_size % processes:
        raise ModelError(f"[dpo] batch_size = {config.batch_size} does not split evenly across {processes} processes: "
                         f"make it a multiple of {processes}")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"{out_dir} already exists and is not empty")
    encoded = [encode_pair(tokenizer, r) for r in rows]
    fits = [len(e["prompt_ids"]) + max(len(e["chosen_ids"]), len(e["rejected_ids"])) <= config.max_length for e in encoded]
    kept = [e for e, fit in zip(encoded, fits) if fit]
    if not kept:
        raise ModelError(f"none of the {len(rows)} preference pairs fits in [dpo] max_length = {config.max_length} tokens")
    smoothing = label_smoothing([row for row, fit in zip(rows, fits) if fit], config.label_smoothing)
    model = prepare_for_training(model)  # a quantised base as PPO and the reward model have it (PEFT's k-bit recipe)
    lora = policy_lora(policy_dir, config.lora_r, config.lora_alpha)
    dataset = Dataset.from_list(kept)
    log = StepLog(on_step, METRICS)
    with tempfile.TemporaryDirectory(prefix="tether-dpo-") as scratch:  # the Trainer wants an output_dir; nothing is kept
        args = TRLDPOConfig(
            **trainer_settings(scratch, config.seed, data_seed(config), config.precision, on_cpu),
            beta=config.beta,
            # Robust DPO (rDPO) where labels may be flipped: unbiased for the loss on the true labels. Plain DPO at 0.
            loss_type=["robust" if smoothing else "sigmoid"] + ["sft"] * (config.sft_weight > 0),
            loss_weights=[1.0] + [config.sft_weight] * (config.sft_weight > 0),
            label_smoothing=smoothing,
            num_train_epochs=config.epochs,
            per_device_train_batch_size=config.batch_size // processes,
            learning_rate=config.learning_rate,
            lr_scheduler_type="linear",
            max_length=None,  # the pairs that do not fit were left out above: TRL would cut their responses' ends
            logging_steps=1,
        )
        # With a peft_config and no ref_model, the trainer puts a new adapter on the base and takes the
        # base with adapters off as the reference.
        trainer = _PairsAsSampled(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=lora,
                              callbacks=[log])
        train_from(trainer, policy_dir)
    distributed.report_share(len(kept), "preference pairs")
    if distributed.is_main():
        save_adapter(trainer, out_dir, "dpo_config.json", asdict(config))
    return {"steps": log.steps, "pairs": len(kept), "pairs_too_long": len(rows) - len(kept), "label_smoothing": smoothing}
