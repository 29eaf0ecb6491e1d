"""How a response is put to a reward model of either kind: its prompt through the chat template, then the response.

A response is encoded with its prompt through the chat template, the response as the assistant
turn closed by EOS; over max_length the prompt loses its start. The LoRA reward model reads its
score at that EOS; the head reads the base's states over the response (train.reward.features).
"""

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from train.common.snapshot import Messages, PreferenceRow, RankingRow, ranked_answers


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



def pad_right(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)  # (B, T)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[row, : len(sequence)] = 1
    return input_ids, attention_mask
