"""The votes a reward model of either kind fits: pairs and rankings, split by prompt into trained on and held out,
each label right with its row's confidence.

A pair whose label is right only with probability c < 1 is fitted CrowdBT-style (Chen et al. 2013):
-log(c sigmoid(d) + (1 - c) sigmoid(-d)), so a vote at c = 0.5 teaches nothing and at c = 1 it is plain
Bradley-Terry.
"""

import hashlib
import json

import torch
import torch.nn.functional as F

from train.common.snapshot import Messages, PreferenceRow, RankingRow

Row = PreferenceRow | RankingRow  # what a reward model fits: a pair, or with [reward_model] rankings = "plackett_luce" a ranking


def split_by_prompt(rows: list[Row], eval_share: float) -> tuple[list[Row], list[Row]]:
    """(train, eval): the prompts whose hash falls below eval_share, with all their pairs, go to eval.

    A prompt's side follows from its messages alone, not from the other rows, so it keeps its side
    as votes come in: a warm-started version never trains on what an earlier one held out. Each
    part keeps the rows' order. With eval_share > 0 and two or more prompts, each part gets at
    least one prompt: if the hashes put all on one side, the prompt nearest the line crosses it.
    """
    by_prompt: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_prompt.setdefault(_prompt_key(row.prompt), []).append(i)
    position = {key: _eval_position(key) for key in by_prompt}
    held = {key for key, p in position.items() if p < eval_share}
    if eval_share > 0 and len(position) >= 2:
        if not held:
            held = {min(position, key=position.get)}
        elif len(held) == len(position):
            held.remove(max(position, key=position.get))
    eval_indices = {i for key in held for i in by_prompt[key]}
    train = [row for i, row in enumerate(rows) if i not in eval_indices]
    return train, [row for i, row in enumerate(rows) if i in eval_indices]


def _eval_position(prompt_key: str) -> float:
    """Where a prompt falls in [0, 1) for the held-out split: a fixed function of its messages.

    The hash is salted so that the reward model's held-out prompts are independent of the prompts
    rounds hold back from PPO (which use the plain content hash against their own share).
    """
    digest = hashlib.sha256(("reward-model-eval\n" + prompt_key).encode()).hexdigest()
    return int(digest[:8], 16) / 16**8


def _prompt_key(prompt: Messages) -> str:
    """The canonical messages JSON, as prompts' content hashes are taken."""
    return json.dumps(prompt, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def as_pairs(rows: list[Row]) -> list[PreferenceRow]:
    """The rows as pairs, for pairwise accuracy: a ranking as the pairs of its answers that are not tied."""
    return [pair for row in rows for pair in (row.pairs() if isinstance(row, RankingRow) else [row])]


def label_noise_loss(margin: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """-log(c sigmoid(margin) + (1 - c) sigmoid(-margin)): the likelihood of a label that is right with probability c.

    At c = 1 it is Bradley-Terry's -log sigmoid(margin) exactly (log(1 - c) = -inf drops out of logaddexp).
    """
    return -torch.logaddexp(confidence.log() + F.logsigmoid(margin), torch.log1p(-confidence) + F.logsigmoid(-margin))
