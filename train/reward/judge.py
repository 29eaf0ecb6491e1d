"""An AI judge: a causal LM asked which of two answers is better, read from its next-token logits.

The question ([judge] template, with the conversation and both answers) goes to the judge's
chat template as one user turn, with the assistant's turn opened. The judge's preference for
the first answer in that order is the difference of its logits for "A" and "B". Each pair is
asked in both orders, and the two log-odds that a is better are averaged: a judge that leans
towards a place by some log-odds b says s + b in one order and s - b in the other, so the bias
cancels, and swapping a pair's answers gives exactly the complementary probability.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from train.common.config import JudgeConfig
from train.common.errors import ModelError
from train.common.snapshot import Messages
from train.runtime.batching import in_batches

LETTERS = ("A", "B")
ELLIPSIS = "…"  # marks where a cut conversation or answer lost text


@dataclass(frozen=True)
class PairToJudge:
    prompt: Messages
    answer_a: str
    answer_b: str


@dataclass(frozen=True)
class Judgement:
    p_a: float  # probability that answer a is better, both orders' log-odds averaged
    p_a_first: float  # the same from the order a, b alone
    p_a_second: float  # from the order b, a alone
    prompt_cut: bool  # the conversation lost its start to fit [judge] max_length
    answers_cut: bool  # the answers alone were too long, and lost their ends

    @property
    def choice(self) -> str:
        return "a" if self.p_a > 0.5 else "b" if self.p_a < 0.5 else "tie"


def conversation_text(prompt: Messages) -> str:
    """The conversation as {prompt} shows it: a lone user message as it is, a longer one turn by turn."""
    if len(prompt) == 1 and prompt[0]["role"] == "user":
        return prompt[0]["content"]
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in prompt)


def letter_ids(tokenizer: PreTrainedTokenizerBase, model_name: str) -> tuple[int, int]:
    """The token ids of "A" and "B" as the judge's answer would begin; each must be one token."""
    ids = []
    for letter in LETTERS:
        encoded = tokenizer(letter, add_special_tokens=False)["input_ids"]
        if len(encoded) != 1:
            raise ModelError(f"the judge model {model_name!r} has no single token for {letter!r} (it encodes as {encoded}): "
                             "choose another [judge] model")
        ids.append(encoded[0])
    return ids[0], ids[1]


class Encoder:
    """Token ids of a pair's question in either order, cut to [judge] max_length the same way in both."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: JudgeConfig):
        self.tokenizer, self.config = tokenizer, config

    def question(self, conversation: str, first: str, second: str) -> list[int]:
        content = self.config.template.format(prompt=conversation, answer_a=first, answer_b=second)
        messages = [{"role": "user", "content": content}]
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])

    def both_orders(self, pair: PairToJudge) -> tuple[list[int], list[int], bool, bool]:
        """(a first, b first, conversation cut, answers cut). The conversation loses its start first, since what is
        judged are the answers; only where they alone are too long do they lose their ends, the longer one first.
        Each cut is made on the original text, more tokens at each try, until the longer order fits."""
        conversation, a, b = conversation_text(pair.prompt), pair.answer_a, pair.answer_b
        over = self._over(conversation, a, b)
        answers_cut = False
        conversation_ids, dropped = self._tokens(conversation), 0
        while over > 0 and dropped < len(conversation_ids):
            dropped = min(len(conversation_ids), dropped + over)
            conversation = ELLIPSIS + self.tokenizer.decode(conversation_ids[dropped:]) if dropped < len(conversation_ids) else ""
            over = self._over(conversation, a, b)
        a_ids, b_ids = self._tokens(pair.answer_a), self._tokens(pair.answer_b)
        total, removed = len(a_ids) + len(b_ids), 0
        while over > 0:
            if removed == total:
                raise ModelError(f"[judge] max_length ({self.config.max_length}) is shorter than the judge's template alone: "
                                 "raise it, or shorten [judge] template")
            removed, answers_cut = min(total, removed + over), True
            cap = _fair_cap(len(a_ids), len(b_ids), total - removed)
            a, b = self._end_cut(a_ids, cap), self._end_cut(b_ids, cap)
            over = self._over(conversation, a, b)
        return self.question(conversation, a, b), self.question(conversation, b, a), dropped > 0, answers_cut

    def _over(self, conversation: str, a: str, b: str) -> int:
        longest = max(len(self.question(conversation, a, b)), len(self.question(conversation, b, a)))
        return longest - self.config.max_length

    def _tokens(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _end_cut(self, ids: list[int], cap: int) -> str:
        if len(ids) <= cap:
            return self.tokenizer.decode(ids)
        return self.tokenizer.decode(ids[:cap]) + ELLIPSIS if cap else ""


def _fair_cap(a: int, b: int, allowed: int) -> int:
    """The most tokens each answer keeps so that the two keep `allowed` in all: the shorter whole where it fits
    beside the longer one cut to the same length or more, else both cut to half."""
    short = min(a, b)
    return allowed - short if allowed - short >= short else allowed // 2


def judge_pairs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: list[PairToJudge],
    config: JudgeConfig,
    model_name: str,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[Judgement]:
    """The judge's verdict on each pair, in pair order; on_progress(done, total) counts questions asked."""
    letter_a, letter_b = letter_ids(tokenizer, model_name)
    encoder = Encoder(tokenizer, config)
    encoded = [encoder.both_orders(pair) for pair in pairs]
    questions = [ids for first, second, _, _ in encoded for ids in (first, second)]  # pair i at 2i (a first), 2i + 1
    # Longest first, so questions of like length share a batch and little compute goes on padding.
    order = sorted(range(len(questions)), key=lambda i: -len(questions[i]))

    def first_minus_second(batch: list[int]) -> list[float]:
        """Log-odds that the first-placed answer is better: logit("A") - logit("B") at the next token."""
        padded = tokenizer.pad({"input_ids": [questions[i] for i in batch]}, padding=True, return_tensors="pt").to(model.device)
        ids, mask = padded["input_ids"], padded["attention_mask"]  # (B, T), left-padded
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # each sequence counts from its first real token
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits[:, -1].float()  # (B, V)
        return (logits[:, letter_a] - logits[:, letter_b]).tolist()

    done = (lambda count: on_progress(count, len(questions))) if on_progress else None
    sorted_odds = in_batches(order, config.batch_size, first_minus_second, "judging", done)
    odds = [0.0] * len(questions)
    for i, value in zip(order, sorted_odds):
        odds[i] = value
    return [
        Judgement(p_a=_sigmoid((odds[2 * k] - odds[2 * k + 1]) / 2), p_a_first=_sigmoid(odds[2 * k]),
                  p_a_second=_sigmoid(-odds[2 * k + 1]), prompt_cut=prompt_cut, answers_cut=answers_cut)
        for k, (_, _, prompt_cut, answers_cut) in enumerate(encoded)
    ]


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
