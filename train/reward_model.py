"""The saved reward model: its files, how a response is encoded and scored, and loading it.

Training (train.reward) writes it; `tether rm score` and `rm eval`, GRPO and PPO read it, all
through this module. A reward model is a directory:

    adapter_config.json, adapter_model.safetensors   a plain PEFT adapter on the base model as a
                                                     sequence classifier with K outputs (its heads),
                                                     the `score` head included
    tokenizer files                                  with the pad token it was trained with
    reward_normalization.json                        per head, mean and std of its raw rewards in training
    metrics.json                                     its metrics, and the config it trained with (K is
                                                     config.heads)

With plain transformers and peft it loads as
`PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base, num_labels=K), dir)`.

A response is encoded with its prompt through the chat template, the response as the assistant
turn closed by EOS; over max_length the prompt loses its start. Each head's score is its output at
the last non-pad token, and (raw - mean) / std, per head, makes it comparable across versions.
The heads are an ensemble (train.reward fits each on its own bootstrap weighting of the votes):
the reward is the mean of their normalised scores, and their spread is its uncertainty.
"""

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from train.batching import in_batches
from train.config import ModelConfig, RewardModelConfig
from train.errors import ModelError
from train.files import built_beside
from train.hardware import device
from train.models import from_pretrained, give_pad_token, prepare_for_training, set_pad_token
from train.snapshot import Messages, PreferenceRow, RankingRow, ranked_answers

NORMALIZATION_FILE = "reward_normalization.json"
METRICS_FILE = "metrics.json"
HEAD_FILE = "head.safetensors"  # a head on the base's features (train.head) in place of an adapter
STEERING_FILE = "steering.json"  # a version of both kinds ([reward_model] kind = "auto"): which one scores


@dataclass(frozen=True)
class Normalization:
    """Per head, the offset and divisor that put a raw score in the reward's units: the heads' mean has mean 0
    and std 1 on the reward model's training data."""

    mean: list[float]
    std: list[float]

    def apply(self, raw: torch.Tensor) -> torch.Tensor:
        """(N, K) raw head scores to normalised ones."""
        return (raw - torch.tensor(self.mean, device=raw.device)) / torch.tensor(self.std, device=raw.device)


def normalization_of(raw: list[list[float]]) -> Normalization:
    """From raw (N, K): each head's mean and (population) std, its std then scaled by the std of the heads' mean
    of so-normalised scores, so that the reward (that mean) has std 1 however much the heads agree. A std of
    0, from identical scores, becomes 1."""
    scores = torch.tensor(raw, dtype=torch.float64)
    mean, std = scores.mean(dim=0), scores.std(dim=0, correction=0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    spread = ((scores - mean) / std).mean(dim=-1).std(correction=0).item()
    return Normalization(mean=mean.tolist(), std=(std * (spread if spread > 0 else 1.0)).tolist())


def reward_and_uncertainty(normalised: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) normalised head scores to (N,) rewards, their mean, and (N,) uncertainties, their spread
    (the sample std across heads; 0 for a single head)."""
    spread = normalised.std(dim=-1) if normalised.shape[-1] > 1 else torch.zeros_like(normalised[..., 0])
    return normalised.mean(dim=-1), spread


# Encoding


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    prompt_cut: bool  # the prompt lost tokens from its start (or all of them) to fit max_length
    response_cut: bool  # the response alone was over max_length and lost its end
    response_tokens: int  # the response's tokens (its EOS included) at the end of input_ids


@dataclass(frozen=True)
class EncodedPairs:
    chosen_ids: list[list[int]]  # each row's best answer: a pair's chosen
    rejected_ids: list[list[int]]  # its next: a pair's rejected
    more_ids: list[list[list[int]]]  # a ranking's third answer on, best first; none for a pair
    ranks: list[list[int]]  # each row's answers' ranks, in the same order: [1, 2] for a pair
    truncated: int  # rows with at least one sequence cut, prompt or response
    responses_cut: int  # of those, rows where a response alone was over max_length


def encode(tokenizer: PreTrainedTokenizerBase, prompt: Messages | str, response: str, max_length: int) -> Encoded:
    """Prompt through the chat template with the assistant header, then the response and EOS.

    This is the template's rendering of the conversation up to and including the assistant turn's
    end-of-turn token, which is where the score is read. Over max_length, the prompt is cut from
    the left so that the response survives whole; a response that alone is longer loses its end.
    """
    return _fit_length(_prompt_ids(tokenizer, prompt), _response_ids(tokenizer, response), max_length)


def encode_pairs(tokenizer: PreTrainedTokenizerBase, rows: list[PreferenceRow | RankingRow], max_length: int) -> EncodedPairs:
    """Every row's answers, best first, in row order: none is dropped, the cut ones are counted."""
    chosen_ids, rejected_ids, more_ids, ranks = [], [], [], []
    truncated = responses_cut = 0
    for row in rows:
        prompt_ids = _prompt_ids(tokenizer, row.prompt)  # once for all its answers
        texts, row_ranks = ranked_answers(row)
        encoded = [_fit_length(prompt_ids, _response_ids(tokenizer, text), max_length) for text in texts]
        chosen_ids.append(encoded[0].input_ids)
        rejected_ids.append(encoded[1].input_ids)
        more_ids.append([e.input_ids for e in encoded[2:]])
        ranks.append(row_ranks)
        truncated += any(e.prompt_cut or e.response_cut for e in encoded)
        responses_cut += any(e.response_cut for e in encoded)
    return EncodedPairs(chosen_ids, rejected_ids, more_ids, ranks, truncated, responses_cut)


def _prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: Messages | str) -> list[int]:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(rendered["input_ids"])


def _response_ids(tokenizer: PreTrainedTokenizerBase, response: str) -> list[int]:
    return tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def _fit_length(prompt_ids: list[int], response_ids: list[int], max_length: int) -> Encoded:
    if len(response_ids) > max_length:
        return Encoded(response_ids[:max_length], prompt_cut=bool(prompt_ids), response_cut=True, response_tokens=max_length)
    room = max_length - len(response_ids)  # tokens left for the prompt
    kept = prompt_ids[len(prompt_ids) - room :] if len(prompt_ids) > room else prompt_ids
    return Encoded(kept + response_ids, prompt_cut=len(kept) < len(prompt_ids), response_cut=False, response_tokens=len(response_ids))


# Scoring


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


def pad_right(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)  # (B, T)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[row, : len(sequence)] = 1
    return input_ids, attention_mask


@dataclass(frozen=True)
class PairwiseResult:
    accuracy: float | None  # share of pairs with r_chosen > r_rejected (the reward: the heads' normalised mean); None for no pairs
    mean_margin: float | None  # mean of r_chosen - r_rejected in normalised units (training-reward stds)
    loss: float | None  # the ensemble's Bradley-Terry loss: mean -log p, p = the heads' mean sigmoid(raw chosen - raw rejected)
    calibration_error: float | None  # expected calibration error of p over CALIBRATION_BINS bins of confidence
    pairs: int
    truncated: int


CALIBRATION_BINS = 5  # of confidence max(p, 1 - p), 0.5 to 1: few, since held-out pairs are few


def calibration_error(probabilities: torch.Tensor) -> float:
    """Expected calibration error of the probabilities that the chosen response wins: per bin of confidence,
    |mean confidence - share right|, weighted by the bin's share of pairs."""
    confidence = torch.maximum(probabilities, 1 - probabilities)
    right = (probabilities > 0.5).double()
    bins = ((confidence - 0.5) * 2 * CALIBRATION_BINS).long().clamp(max=CALIBRATION_BINS - 1)
    error = 0.0
    for b in range(CALIBRATION_BINS):
        members = bins == b
        if members.any():
            error += members.double().mean().item() * abs(confidence[members].mean().item() - right[members].mean().item())
    return error


@dataclass
class RewardModel:
    """A reward model ready to score: the classifier, its tokenizer, its offsets and its training max_length."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    normalization: Normalization
    max_length: int  # sequences are truncated as in training, or the scores would not be the trained ones

    def raw_scores(self, prompts: list[Messages | str], responses: list[str], batch_size: int = 16) -> list[list[float]]:
        """Each head's score of each response to its prompt, (N, K) before normalisation."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        if not prompts:
            return []
        sequences = [encode(self.tokenizer, p, r, self.max_length).input_ids for p, r in zip(prompts, responses)]
        return score_sequences(self.model, self.tokenizer.pad_token_id, sequences, batch_size)

    def score_with_uncertainty(
        self, prompts: list[Messages | str], responses: list[str], batch_size: int = 16
    ) -> tuple[list[float], list[float]]:
        """Each response's reward, the mean of its normalised head scores (comparable across reward-model
        versions), and its uncertainty, their spread across heads."""
        raw = self.raw_scores(prompts, responses, batch_size)
        if not raw:
            return [], []
        reward, spread = reward_and_uncertainty(self.normalization.apply(torch.tensor(raw, dtype=torch.float64)))
        return reward.tolist(), spread.tolist()

    def score(self, prompts: list[Messages | str], responses: list[str], batch_size: int = 16) -> list[float]:
        """Each response's reward: the mean of its normalised head scores."""
        return self.score_with_uncertainty(prompts, responses, batch_size)[0]

    def pairwise_accuracy(
        self, rows: list[PreferenceRow], batch_size: int = 16, on_scored: Callable[[int], None] | None = None
    ) -> PairwiseResult:
        """How often the chosen response scores above the rejected one; a tie counts as wrong.

        on_scored, if given, is called with the number of sequences scored after each batch (two per pair).
        """
        if not rows:
            return pairwise_result(torch.empty(0, 0), torch.empty(0, 0), self.normalization, 0)
        encoded = encode_pairs(self.tokenizer, rows, self.max_length)
        sequences = encoded.chosen_ids + encoded.rejected_ids
        raw = torch.tensor(score_sequences(self.model, self.tokenizer.pad_token_id, sequences, batch_size, on_scored), dtype=torch.float64)
        return pairwise_result(raw[: len(rows)], raw[len(rows) :], self.normalization, encoded.truncated)


def pairwise_result(chosen: torch.Tensor, rejected: torch.Tensor, normalization: Normalization, truncated: int) -> PairwiseResult:
    """The pairwise figures of raw head scores (N, K) of each pair's chosen and rejected response."""
    if not len(chosen):
        return PairwiseResult(accuracy=None, mean_margin=None, loss=None, calibration_error=None, pairs=0, truncated=0)
    chosen, rejected = chosen.double(), rejected.double()
    margins = reward_and_uncertainty(normalization.apply(chosen))[0] - reward_and_uncertainty(normalization.apply(rejected))[0]
    probabilities = torch.sigmoid(chosen - rejected).mean(dim=-1)  # (N,) the ensemble's P(chosen wins)
    return PairwiseResult(
        accuracy=(margins > 0).double().mean().item(),
        mean_margin=margins.mean().item(),
        loss=-probabilities.log().mean().item(),
        calibration_error=calibration_error(probabilities),
        pairs=len(chosen),
        truncated=truncated,
    )


# Saving and loading


def save_reward_model(
    model, tokenizer, normalization: Normalization, metrics: dict[str, Any], config: RewardModelConfig, out_dir: Path
) -> None:
    """A standard PEFT adapter directory with the tokenizer, normalisation and metrics, put in place whole."""
    with built_beside(out_dir) as built:
        model.save_pretrained(built)  # adapter_config.json + adapter_model.safetensors, the score head included
        tokenizer.save_pretrained(built)
        (built / NORMALIZATION_FILE).write_text(json.dumps(asdict(normalization), indent=2) + "\n")
        (built / METRICS_FILE).write_text(json.dumps({**metrics, "config": asdict(config)}, indent=2) + "\n")


def steering_dir(version_dir: Path) -> Path:
    """The reward model that scores for a version's directory: the directory itself, or, for a version of both kinds
    ([reward_model] kind = "auto"), the kind its steering.json names, in the folder of that name."""
    steering = Path(version_dir) / STEERING_FILE
    return Path(version_dir) / json.loads(steering.read_text())["kind"] if steering.exists() else Path(version_dir)


def is_head(model_dir: Path) -> bool:
    """Whether a reward model is a head on the base's features (train.head) rather than a LoRA adapter."""
    return (Path(model_dir) / HEAD_FILE).exists()


def read_normalization(adapter_dir: Path) -> Normalization:
    return Normalization(**json.loads((Path(adapter_dir) / NORMALIZATION_FILE).read_text()))


def trained_config(adapter_dir: Path) -> dict[str, Any]:
    """The [reward_model] settings a reward model was trained with. It scores at their max_length, or its
    scores are not the trained ones, and has config.heads heads."""
    return json.loads((steering_dir(adapter_dir) / METRICS_FILE).read_text())["config"]


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a base model or a saved reward model, padding on the right with a pad distinct from EOS."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the tokenizer of {str(path)!r}: {' '.join(str(e).split())}") from None
    if not tokenizer.chat_template:
        raise ModelError(f"model {str(path)!r} has no chat template: Tether needs a chat (instruct) model")
    give_pad_token(tokenizer)  # a pad equal to EOS would make the score skip the EOS that ends each response
    # Right padding: the real tokens keep positions 0..n-1, as they have unpadded.
    tokenizer.padding_side = "right"
    return tokenizer


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


def load_reward_model(model_path: str, adapter_dir: Path, base: ModelConfig | None = None) -> RewardModel:
    """A saved reward model, in eval mode, on the base model at model_path loaded as `base` says and on its device
    (float32 on the CPU when not given)."""
    base = base or ModelConfig(device="cpu")
    adapter_dir = steering_dir(adapter_dir)
    if is_head(adapter_dir):
        from train.head import load_head_model  # it reads features with train.reward_model's encoding

        return load_head_model(model_path, adapter_dir, base)
    model, tokenizer = load_adapter(model_path, Path(adapter_dir), base=base)
    if base.quantization == "none":  # a quantised base is on its device already
        model = model.to(device(base))
    return RewardModel(model.eval(), tokenizer, read_normalization(adapter_dir), trained_config(adapter_dir)["max_length"])


@dataclass(frozen=True)
class RewardAdapter:
    """A saved reward model taken apart, for a causal LM that carries its adapter beside others (PPO's)."""

    path: Path
    lora: Any  # peft.LoraConfig of its adapter on a causal LM: the head is `head` here, not a module to save; None for a head on features
    lora_weights: dict[str, torch.Tensor]  # its LoRA weights, under the keys PEFT saved them with
    head: torch.Tensor  # (K, H) the score heads' weights; (K, D) on features
    normalization: Normalization
    max_length: int
    bias: torch.Tensor | None = None  # (K,) a head on features: its offsets
    features: Any = None  # train.features.FeatureSpec: where a head on features reads the base, with every adapter off


def read_reward_adapter(adapter_dir: Path) -> RewardAdapter:
    """A saved reward model's adapter settings and weights, its head, normalisation and max_length."""
    from peft import LoraConfig
    from safetensors.torch import load_file

    adapter_dir = steering_dir(adapter_dir)
    if is_head(adapter_dir):
        from train.head import read_head

        head, spec = read_head(adapter_dir)
        return RewardAdapter(adapter_dir, None, {}, head.weight, read_normalization(adapter_dir), spec.max_length, head.bias, spec)
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
