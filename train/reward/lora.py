"""The LoRA reward model: a LoRA adapter and K scalar heads on the base model, fitted Bradley-Terry style, saved,
loaded and scored. Its directory is train.reward.layout's; its encoding train.reward.encoding's. The algorithm, in the order `train_reward_model` runs it:
1. split the preference rows by prompt, so no prompt is both trained on and held out; a prompt's
   side is fixed by its hash, so it is the same in every version;
2. encode each response with its prompt through the chat template, the response as the assistant
   turn closed by EOS; a sequence over max_length loses the start of its prompt, never a pair;
3. fit -log sigmoid(r_chosen - r_rejected) with TRL's RewardTrainer, the score being a head's
   output at the last non-pad token (the EOS that closes the response). A pair whose label is
   right only with probability c < 1 (its row's confidence) is fitted CrowdBT-style (Chen et al.
   2013): -log(c sigmoid(d) + (1 - c) sigmoid(-d)), so a vote at c = 0.5 teaches nothing and at
   c = 1 it is plain Bradley-Terry. A ranking of K answers ([reward_model] rankings =
   "plackett_luce") is one item, fitted by its Plackett-Luce likelihood, which is Bradley-Terry's
   at K = 2; its answers share a batch with the pairs'. Each head k weighs row i
   by its own bootstrap weight w_ik, 0 or 2 at random ("double or nothing", Owen & Eckles 2012),
   so the heads learn on different resamplings of the votes through one shared adapter: an
   ensemble whose spread is the reward's uncertainty, at the cost of one model. From scratch, a fresh
   adapter and head fit every training pair. Warm-started, the previous version's adapter and
   head first score the pairs it has not seen (its accuracy on the new votes), then fit those
   of them on the training side plus a random replay sample of the old training pairs;
4. normalise: each head's mean and std of the raw rewards on up to 64 of the pairs this run fitted (of all
   the training pairs from scratch; of the new and replayed ones warm-started), saved beside the
   adapter, so that (raw - mean) / std is comparable across reward-model versions;
5. evaluate pairwise accuracy and calibration on the held-out prompts (a ranking as its untied pairs);
6. save it as save_reward_model does: a plain PEFT adapter directory with the
   head, the tokenizer, the normalisation and the metrics.

TRL's RewardTrainer drops every pair longer than its max_length (its help says "filtered out").
So it gets pairs already tokenised and truncated here: it skips its own tokenisation, its length
filter then has nothing left to drop, and `_fit` checks that it dropped nothing.
"""

import hashlib
import json
import random
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

from train.common.config import ModelConfig, RewardModelConfig
from train.common.device import device
from train.common.errors import ModelError
from train.common.files import built_beside
from train.common.models import from_pretrained, load_tokenizer, prepare_for_training, set_pad_token, trainable_in_float32
from train.common.snapshot import Messages, PreferenceRow, RankingRow, ranked_answers
from train.reward.encoding import EncodedPairs, encode, encode_pairs, pad_right
from train.reward.layout import METRICS_FILE, NORMALIZATION_FILE, RewardAdapter, read_normalization, trained_config
from train.reward.scores import Normalization, PairwiseResult, RewardModel, normalization_of, pairwise_result
from train.reward.votes import Row, as_pairs, label_noise_loss
from train.runtime import distributed
from train.runtime.batching import in_batches
from train.runtime.hardware import uses_bf16

ProgressFn = Callable[[dict[str, Any]], None]

NORMALIZATION_PAIRS = 64


@dataclass(frozen=True)
class WarmStart:
    """A run that continues from a saved reward model: what is new to it, and what it trains on again."""

    adapter_dir: Path  # the previous version's saved reward model
    version: int
    new_train: list[Row]  # training-side rows it never saw
    new_eval: list[Row]  # held-out rows it never saw; with new_train, the new votes it is measured on
    replayed: list[Row]  # training rows it saw, fitted again so that it does not forget them


# 1. What a warm start fits


def plan_warm_start(
    adapter_dir: Path,
    version: int,
    train_rows: list[Row],
    eval_rows: list[Row],
    is_new: Callable[[Row], bool],
    replay: float,
    seed: int,
) -> WarmStart:
    """Continue from `version`'s reward model: the rows it never saw, and old training rows to replay.

    The replay sample is min(old, round(replay * new)) of the old training rows, drawn at random.
    Old rows on the held-out side are never trained on: the split holds for every version, so no
    earlier version trained on them either.
    """
    new_train = [row for row in train_rows if is_new(row)]
    old_train = [row for row in train_rows if not is_new(row)]
    replayed = random.Random(seed + version).sample(old_train, min(len(old_train), round(replay * len(new_train))))
    return WarmStart(Path(adapter_dir), version, new_train, [row for row in eval_rows if is_new(row)], replayed)


# 2. The model: a classifier with its adapter, scored, saved and loaded


def load_classifier(model_path: str, tokenizer: PreTrainedTokenizerBase, base: ModelConfig, heads: int) -> PreTrainedModel:
    """The base model, loaded as `base` says, as a sequence classifier with `heads` outputs and a float32 head."""
    # TRL's helper quietens the expected "score.weight newly initialised, lm_head.weight unused".
    from trl.trainer.reward_trainer import suppress_seqcls_warning

    try:
        with suppress_seqcls_warning():
            model = from_pretrained(AutoModelForSequenceClassification, model_path, base, num_labels=heads)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load model {model_path!r}: {' '.join(str(e).split())}") from None
    # The scalar head stays float32 on a bf16 or fp16 base, as PEFT keeps output layers for k-bit
    # training, so that its small updates are not rounded away; it reads a float32 copy of the states.
    model.score.float().register_forward_pre_hook(lambda head, args: (args[0].to(head.weight.dtype),))
    set_pad_token(model, tokenizer)  # the classifier reads its score at the last token that is not config.pad_token_id
    return model


@dataclass
class LoraRewardModel(RewardModel):
    """A LoRA reward model ready to score: `model` is the classifier with its adapter."""

    def raw_scores(self, prompts: list[Messages | str], responses: list[str], batch_size: int = 16) -> list[list[float]]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        if not prompts:
            return []
        sequences = [encode(self.tokenizer, p, r, self.max_length).input_ids for p, r in zip(prompts, responses)]
        return score_sequences(self.model, self.tokenizer.pad_token_id, sequences, batch_size)

    def pairwise_accuracy(
        self, rows: list[PreferenceRow], batch_size: int = 16, on_scored: Callable[[int], None] | None = None
    ) -> PairwiseResult:
        if not rows:
            return pairwise_result(torch.empty(0, 0), torch.empty(0, 0), self.normalization, 0)
        encoded = encode_pairs(self.tokenizer, rows, self.max_length)
        sequences = encoded.chosen_ids + encoded.rejected_ids
        raw = torch.tensor(score_sequences(self.model, self.tokenizer.pad_token_id, sequences, batch_size, on_scored), dtype=torch.float64)
        return pairwise_result(raw[: len(rows)], raw[len(rows) :], self.normalization, encoded.truncated)


@torch.inference_mode()
def score_sequences(
    model, pad_token_id: int, sequences: list[list[int]], batch_size: int, on_scored: Callable[[int], None] | None = None
) -> list[float]:
    """Each head's raw output at each sequence's last token, (N, K) in sequence order.

    Batches hold sequences of like length (longest first) to spend little on padding, and one
    that runs out of GPU memory is halved; they are right-padded, and the classifier reads the
    last token that is not the pad token.
    """
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))

    def score(batch: list[int]) -> list[list[float]]:
        input_ids, attention_mask = pad_right([sequences[i] for i in batch], pad_token_id)  # (B, T) each
        logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits  # (B, K)
        if on_scored is not None:
            on_scored(len(batch))
        return logits.float().tolist()

    scores: list[list[float]] = [[] for _ in sequences]
    for i, value in zip(order, in_batches(order, batch_size, score, "scoring")):
        scores[i] = value
    return scores


def save_reward_model(
    model, tokenizer, normalization: Normalization, metrics: dict[str, Any], config: RewardModelConfig, out_dir: Path
) -> None:
    """A standard PEFT adapter directory with the tokenizer, normalisation and metrics, put in place whole."""
    with built_beside(out_dir) as built:
        model.save_pretrained(built)  # adapter_config.json + adapter_model.safetensors, the score head included
        tokenizer.save_pretrained(built)
        (built / NORMALIZATION_FILE).write_text(json.dumps(asdict(normalization), indent=2) + "\n")
        (built / METRICS_FILE).write_text(json.dumps({**metrics, "config": asdict(config)}, indent=2) + "\n")


def load_adapter(
    model_path: str, adapter_dir: Path, trainable: bool = False, base: ModelConfig | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A saved reward model's adapter and head on the base model loaded as `base` says; trainable to continue fitting them."""
    from peft import PeftModel

    tokenizer = load_tokenizer(adapter_dir)
    classifier = load_classifier(model_path, tokenizer, base or ModelConfig(), trained_config(adapter_dir).get("heads", 1))  # versions before ensembles had one
    if trainable:
        classifier = prepare_for_training(classifier)
    try:
        model = PeftModel.from_pretrained(classifier, adapter_dir, is_trainable=trainable)
    except (OSError, ValueError, RuntimeError) as e:  # e.g. an adapter made for another base model
        raise ModelError(f"cannot load the reward model in {adapter_dir} on {model_path!r}: {' '.join(str(e).split())}") from None
    return model, tokenizer


def load_lora(model_path: str, adapter_dir: Path, base: ModelConfig) -> LoraRewardModel:
    """A saved LoRA reward model, in eval mode, on the base model at model_path loaded as `base` says and on its device."""
    model, tokenizer = load_adapter(model_path, Path(adapter_dir), base=base)
    if base.quantization == "none":  # a quantised base is on its device already
        model = model.to(device(base))
    return LoraRewardModel(model.eval(), tokenizer, read_normalization(adapter_dir), trained_config(adapter_dir)["max_length"])


def read_lora_adapter(adapter_dir: Path) -> RewardAdapter:
    """A saved LoRA reward model taken apart: its adapter's settings and weights on a causal LM, its head, normalisation
    and max_length."""
    from peft import LoraConfig
    from safetensors.torch import load_file

    lora = LoraConfig.from_pretrained(str(adapter_dir))
    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    head = next((v for k, v in weights.items() if k.endswith("score.weight")), None)
    if head is None:
        raise ModelError(f"{adapter_dir} is not a reward model: it has no score head")
    return RewardAdapter(
        path=adapter_dir,
        lora=replace(lora, task_type="CAUSAL_LM", modules_to_save=None),
        lora_weights={k: v for k, v in weights.items() if "lora_" in k},
        head=head,
        normalization=read_normalization(adapter_dir),
        max_length=trained_config(adapter_dir)["max_length"],
    )


# 3. Fit


def build_model(
    model_path: str, config: RewardModelConfig, base: ModelConfig | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model, loaded as `base` says (dtype, quantization), as a sequence classifier with config.heads
    outputs, wrapped in a fresh LoRA adapter.

    The heads (`score`, one linear layer) are new and trained in full (modules_to_save), so they are
    saved with the adapter. Their random initialisation follows config.seed.
    """
    from peft import LoraConfig, TaskType, get_peft_model

    tokenizer = load_tokenizer(model_path)
    torch.manual_seed(config.seed)
    base = base or ModelConfig()
    classifier = prepare_for_training(load_classifier(model_path, tokenizer, base, config.heads), config.checkpointing(base))
    lora = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules(),
        modules_to_save=["score"],
    )
    return get_peft_model(classifier, lora), tokenizer


class _ProgressCallback(TrainerCallback):
    """Collects each optimiser step's loss and passes on {"step", "total_steps", "loss", "accuracy"}.

    accuracy is the share of the step's pairs whose chosen response scored higher: a noisy
    training curve beside the loss, not the held-out figure.
    """

    def __init__(self, on_progress: ProgressFn | None):
        self.on_progress = on_progress
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
            if self.on_progress is not None:
                self.on_progress({
                    "step": state.global_step, "total_steps": state.max_steps,
                    "loss": float(logs["loss"]), "accuracy": float(logs["accuracy"]),
                })


def bootstrap_weights(row: Row, heads: int, seed: int) -> list[float]:
    """Row `row`'s weight in each head's loss: 0 or 2 at random, or 1 with a single head.

    Drawn from the row's content, so a row keeps its weights in every version: a warm-started
    head goes on fitting the same resampling of the votes.
    """
    if heads == 1:
        return [1.0]
    key = json.dumps([seed, row.prompt, *ranked_answers(row)[0]], ensure_ascii=False)
    bits = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    return [2.0 * ((bits >> k) & 1) for k in range(heads)]


def plackett_luce_loss(scores: torch.Tensor, ranks: torch.Tensor, present: torch.Tensor | None = None) -> torch.Tensor:
    """A ranking's negative log-likelihood under Plackett-Luce: the best answer is picked first from all K with
    probability softmax(scores), the next from those left, and so on; equal ranks are a tie, taken as Breslow's
    approximation does, every tied answer picked from the same set (its group and all below it).

    scores: (..., K), one ranking's answers in any order; ranks: (..., K), 1 the best; present: (..., K), False
    for the padding of a ranking shorter than K, which then counts as if it were not there. With K = 2 and no tie
    it is -log sigmoid(r_better - r_worse), Bradley-Terry's loss, exactly; a ranking of K answers weighs as one item.
    """
    below = ranks[..., None, :] >= ranks[..., :, None]  # (..., K, K): answer j is picked from among i's set
    if present is not None:
        # Padding is in no set but its own, with score 0: its term is 0 - 0, and no set is empty, whose
        # logsumexp of -inf alone would give NaN gradients even where its term were masked.
        pair_present = present[..., None, :] & present[..., :, None]
        below = (below & pair_present) | torch.eye(ranks.shape[-1], dtype=torch.bool, device=ranks.device)
        scores = scores.masked_fill(~present, 0.0)
    denominators = torch.logsumexp(scores[..., None, :].masked_fill(~below, float("-inf")), dim=-1)  # (..., K)
    return -(scores - denominators).sum(dim=-1)


def _bootstrap_trainer():
    """Defined on first use: importing trl takes seconds."""
    from trl import RewardTrainer

    class BootstrapRewardTrainer(RewardTrainer):
        """TRL's RewardTrainer with H heads, each row weighted per head by its bootstrap weight.

        The loss is the mean over rows and heads of w_ih times row i's loss under head h: for a pair,
        -log sigmoid(r_h(chosen) - r_h(rejected)), CrowdBT's where its confidence is below 1; for a
        ranking, its Plackett-Luce loss. With one head, weights 1 and pairs alone it is TRL's loss.
        The logged accuracy is the heads' mean's, of each row's first answer over its second.
        """

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            weights = inputs.pop("weights")  # (B, H)
            confidence = inputs.pop("confidence")  # (B,)
            answers, ranks, ranking = inputs.pop("answers"), inputs.pop("ranks"), inputs.pop("ranking")  # (B, K), (B, K), (B,)
            outputs = model(**inputs, use_cache=False)
            scores = outputs.logits[answers.clamp(min=0)].transpose(1, 2)  # (B, H, K)
            margin = scores[..., 0] - scores[..., 1]  # (B, H): a pair's chosen over its rejected
            losses = label_noise_loss(margin, confidence[:, None].to(scores.dtype))
            if ranking.any():
                ranked = plackett_luce_loss(scores, ranks[:, None, :], (answers >= 0)[:, None, :])
                losses = torch.where(ranking[:, None], ranked, losses)
            loss = (weights.to(scores.dtype) * losses).mean()
            mode = "train" if self.model.training else "eval"
            with torch.no_grad():
                margin = margin.mean(dim=-1)
                accuracy = self.accelerator.gather_for_metrics((margin > 0).float().mean()).mean().item()
                self._metrics[mode]["accuracy"].append(accuracy)
                self._metrics[mode]["margin"].append(self.accelerator.gather_for_metrics(margin.mean()).mean().item())
            return (loss, outputs) if return_outputs else loss

    return BootstrapRewardTrainer


def _fit(
    model, tokenizer, encoded: EncodedPairs, weights: list[list[float]], confidence: list[float], ranking: list[bool],
    config: RewardModelConfig, on_progress: ProgressFn | None, on_cpu: bool,
) -> list[float]:
    """Bradley-Terry fit with TRL's RewardTrainer on the pre-encoded rows, each head weighing each row by
    weights (N, H), each pair's label right with probability `confidence` (N), and the rows where `ranking`
    says so fitted as rankings, Plackett-Luce; the loss of each step.

    Under accelerate launch the Trainer is data-parallel: each process takes its part of every
    batch, so config.batch_size stays the global batch and must split evenly.
    """
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import RewardConfig

    processes = distributed.world_size()
    if config.batch_size % processes:
        raise ModelError(f"[reward_model] batch_size = {config.batch_size} does not split evenly across {processes} processes: "
                         f"make it a multiple of {processes}")

    dataset = Dataset.from_dict({
        "chosen_ids": encoded.chosen_ids,
        "rejected_ids": encoded.rejected_ids,
        "more_ids": encoded.more_ids,
        "ranks": encoded.ranks,
        "ranking": ranking,
        "weights": weights,
        "confidence": confidence,
        "length": [max(map(len, [c, r, *more])) for c, r, more in zip(encoded.chosen_ids, encoded.rejected_ids, encoded.more_ids)],
    })
    progress = _ProgressCallback(on_progress)
    with tempfile.TemporaryDirectory(prefix="tether-rm-") as scratch:  # the Trainer wants an output_dir; nothing is kept
        args = RewardConfig(
            output_dir=scratch,
            num_train_epochs=config.epochs,
            per_device_train_batch_size=config.batch_size // processes,
            gradient_accumulation_steps=config.gradient_accumulation,
            learning_rate=config.learning_rate,
            lr_scheduler_type="linear",
            max_length=config.max_length,  # every sequence already fits: the filter must keep all
            seed=config.seed,
            # Batches of pairs of like length (shuffled in groups of 50 batches) spend less on padding.
            train_sampling_strategy="group_by_length",
            remove_unused_columns=False,  # keeps "length" for the sampler, and the rest for collate_rows and the loss
            logging_steps=1,
            save_strategy="no",
            eval_strategy="no",
            report_to="none",
            disable_tqdm=True,
            gradient_checkpointing=config.gradient_checkpointing,
            # transformers 5 checkpoints without reentry by default, which on the default model still kept 2.8 GB of a
            # 16 x 130-token batch's 6.7 GB; reentrant checkpointing (PEFT's k-bit recipe) kept 0.9 GB.
            gradient_checkpointing_kwargs={"use_reentrant": True},
            disable_dropout=False,  # TRL's default would silently zero lora_dropout
            bf16=uses_bf16(config.precision),
            use_cpu=on_cpu,
        )
        # TRL refuses a classifier of more than one output, for its own scalar loss; the loss here is
        # compute_loss's, which takes the K heads.
        model.config.num_labels = 1
        try:
            trainer = _bootstrap_trainer()(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[progress])
        finally:
            model.config.num_labels = config.heads
        trainer.remove_callback(PrinterCallback)  # progress goes to on_progress, not stdout
        trainable_in_float32(trainer.model)
        if len(trainer.train_dataset) != len(dataset):
            raise ModelError(f"RewardTrainer dropped {len(dataset) - len(trainer.train_dataset)} of {len(dataset)} pairs")
        fitted = 0

        def counting_collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
            nonlocal fitted
            fitted += len(rows)
            return collate_rows(rows, tokenizer.pad_token_id)

        trainer.data_collator = counting_collate
        trainer.train()
        distributed.report_share(fitted, "rows fitted")
        # Mixed precision wraps model.forward in autocast; scoring must see the float32 model that loads later.
        trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    model.eval()
    return progress.losses


def collate_rows(rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """A batch of encoded rows as one right-padded batch of every answer, as TRL's preference collator pads a pair's
    two, with `answers` (B, K): each row's answers' places in it, best first, -1 past a row's last; `ranks` (B, K),
    0 past the last; and each row's weights, confidence and whether it is a ranking."""
    sequences = [row["chosen_ids"] for row in rows] + [row["rejected_ids"] for row in rows]
    width = max(len(row["ranks"]) for row in rows)
    answers = torch.full((len(rows), width), -1)
    ranks = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        answers[i, :2] = torch.tensor([i, len(rows) + i])
        for k, ids in enumerate(row["more_ids"], start=2):
            answers[i, k] = len(sequences)
            sequences.append(ids)
        ranks[i, : len(row["ranks"])] = torch.tensor(row["ranks"])
    input_ids = pad_sequence([torch.tensor(ids) for ids in sequences], batch_first=True, padding_value=pad_token_id)
    attention_mask = pad_sequence([torch.ones(len(ids), dtype=torch.long) for ids in sequences], batch_first=True, padding_value=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "answers": answers, "ranks": ranks,
            "ranking": torch.tensor([row["ranking"] for row in rows]), "weights": torch.tensor([row["weights"] for row in rows]),
            "confidence": torch.tensor([row["confidence"] for row in rows])}


# 4. The whole run


def train_reward_model(
    model_path: str,
    train_rows: list[Row],
    eval_rows: list[Row],
    config: RewardModelConfig,
    out_dir: Path,
    on_progress: ProgressFn | None = None,
    warm_start: WarmStart | None = None,
    base: ModelConfig | None = None,
) -> dict[str, Any]:
    """Fit a reward model on the base model loaded as `base` says (dtype, quantization; float32 when not given),
    evaluate it on eval_rows, and save it to out_dir; its metrics.

    From scratch it fits every train row; given warm_start, it continues from that reward model
    on warm_start's new and replayed rows. Either way the normalisation is taken over the rows it
    fitted. model_path is a local model directory (train.common.models.resolve_model_path gives
    one) or a hub id. out_dir must not exist or be empty. It is built beside itself and renamed
    into place once complete, so a run that fails or is killed leaves no reward model behind.
    """
    if not train_rows:
        raise ModelError("no preference pairs to train on")
    if warm_start is not None and not warm_start.new_train:
        raise ModelError(
            f"no new pairs to train on since reward model v{warm_start.version}"
            + (f": its {len(warm_start.new_eval)} new pairs are all on held-out prompts" if warm_start.new_eval else "")
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"{out_dir} already exists and is not empty")
    started = time.perf_counter()
    base = base or ModelConfig()
    config = replace(config, gradient_checkpointing=config.checkpointing(base))  # saved as it ran
    new_votes = None
    if warm_start is None:
        model, tokenizer = build_model(model_path, config, base)
        fit_rows = train_rows
    else:
        model, tokenizer = load_adapter(model_path, warm_start.adapter_dir, trainable=True, base=base)
        # The previous version as it was saved: did it agree with the people who voted since?
        adapter_dir = warm_start.adapter_dir
        previous = LoraRewardModel(model.eval(), tokenizer, read_normalization(adapter_dir), trained_config(adapter_dir)["max_length"])
        new_votes = previous.pairwise_accuracy(as_pairs(warm_start.new_train + warm_start.new_eval), config.batch_size * 2)
        fit_rows = warm_start.new_train + warm_start.replayed
    encoded = encode_pairs(tokenizer, train_rows, config.max_length)
    fitted = encoded if fit_rows is train_rows else encode_pairs(tokenizer, fit_rows, config.max_length)

    fit_started = time.perf_counter()
    weights = [bootstrap_weights(row, config.heads, config.seed) for row in fit_rows]
    confidence = [getattr(row, "confidence", 1.0) for row in fit_rows]
    ranking = [isinstance(row, RankingRow) for row in fit_rows]
    losses = _fit(model, tokenizer, fitted, weights, confidence, ranking, config, on_progress, on_cpu=device(base).type == "cpu")
    train_seconds = time.perf_counter() - fit_started

    # Over rows this run fitted, new and replayed, so that the cost stays that of a round where
    # scoring every row so far would grow with all the votes; at most NORMALIZATION_PAIRS of them,
    # drawn at random, which puts the std within about 6%.
    sample = random.Random(config.seed).sample(range(len(fit_rows)), min(len(fit_rows), NORMALIZATION_PAIRS))
    sequences = [ids for i in sample for ids in (fitted.chosen_ids[i], fitted.rejected_ids[i], *fitted.more_ids[i])]
    normalization = normalization_of(score_sequences(model, tokenizer.pad_token_id, sequences, config.batch_size * 2))
    held_out = LoraRewardModel(model, tokenizer, normalization, config.max_length).pairwise_accuracy(as_pairs(eval_rows), config.batch_size * 2)

    tail = max(1, len(losses) // 10)  # the first and last tenth of the steps show whether the loss moved
    metrics = {
        "train_loss": sum(losses) / len(losses),
        "train_loss_start": sum(losses[:tail]) / tail,
        "train_loss_end": sum(losses[-tail:]) / tail,
        "eval_accuracy": held_out.accuracy,
        "eval_mean_margin": held_out.mean_margin,
        "eval_loss": held_out.loss,
        "eval_calibration_error": held_out.calibration_error,
        "heads": config.heads,
        "reward_mean": normalization.mean,
        "reward_std": normalization.std,
        "pairs_train": sum(isinstance(row, PreferenceRow) for row in train_rows),
        "rankings_train": sum(isinstance(row, RankingRow) for row in train_rows),  # each one Plackett-Luce item
        "pairs_eval": len(as_pairs(eval_rows)),  # a held-out ranking's pairs, each answers not tied
        "truncated": encoded.truncated,
        "truncated_eval": held_out.truncated,
        "responses_cut": encoded.responses_cut,
        "steps": len(losses),
        "train_seconds": train_seconds,
        "pairs_per_second": len(fit_rows) * config.epochs / train_seconds,  # rows: a ranking counts as one
        "warm_start_from": warm_start.version if warm_start else None,
        "pairs_new": len(warm_start.new_train) if warm_start else len(train_rows),  # training pairs fitted for the first time
        "pairs_replayed": len(warm_start.replayed) if warm_start else 0,
        "new_votes_from": warm_start.version if new_votes else None,
        "new_votes_accuracy": new_votes.accuracy if new_votes else None,  # the previous version's, before this run trained
        "new_votes_pairs": new_votes.pairs if new_votes else None,
    }
    metrics["seconds"] = time.perf_counter() - started
    if distributed.is_main():  # every process holds the same weights after a data-parallel fit
        save_reward_model(model, tokenizer, normalization, metrics, config, out_dir)
    return metrics
