"""Simulated annotators driving the loop: votes from a judge plus noise, then a round, R times.

The simulated annotators take pairs from the same queue as people do (a lease per pair, the
overlap the queue config asks for) and answer through the same vote path, with source
'simulate'. After each round the new policy and the starting one answer a held-out set of
evaluation prompts, and the judge, without noise, says which answer is better.
"""

import dataclasses
import json
import random
from dataclasses import dataclass

from annotate.judges import Judge, prefers_first
from annotate.ratings import wilson_interval
from store.db import utcnow
from store.policies import Policy
from store.queue import serve
from store.votes import record_vote
from train.generate import generate
from train.models import load_model
from ui.project import Project

Messages = list[dict[str, str]]


def last_user_message(messages: Messages) -> str:
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


def cast_votes(project: Project, judge: Judge, noise: float, annotators: list[str], labels: int, rng: random.Random) -> int:
    """Up to `labels` votes by the simulated annotators in turn; fewer when no one has a pair left. Returns how many."""
    queue = project.config.queue
    cast = 0
    idle = set()  # annotators the queue had nothing for
    turn = 0
    while cast < labels and len(idle) < len(annotators):
        annotator = annotators[turn % len(annotators)]
        turn += 1
        if annotator in idle:
            continue
        assignment = project.run(serve, annotator, queue.strategy, queue.lease_seconds, utcnow())
        if assignment is None:
            idle.add(annotator)
            continue
        prompt = last_user_message(json.loads(assignment.prompt_messages))
        left = prefers_first(judge, prompt, assignment.left_text, assignment.right_text, noise, rng)
        project.run(record_vote, annotator, assignment.token, "left" if left else "right", None, None, utcnow(), "simulate")
        cast += 1
    return cast


@dataclass(frozen=True)
class JudgeEvaluation:
    win_rate: float  # of the candidate over the baseline, ties counting half
    low: float  # Wilson 95% interval
    high: float
    pairs: int
    mean_score: float  # the judge's mean score of the candidate's answers


def sample_answers(project: Project, policy: Policy, prompts: list[Messages], per_prompt: int, seed: int) -> list[str]:
    """per_prompt answers to each prompt from a policy version, grouped by prompt; the same seed for every version."""
    config = dataclasses.replace(project.config.generation, per_prompt=per_prompt, seed=seed)
    adapter = str(project.root / policy.adapter_path) if policy.adapter_path else None
    model, tokenizer = load_model(project.config.model, adapter)
    return [g.text for g in generate(model, tokenizer, prompts, config)]


def judge_against(judge: Judge, prompts: list[Messages], candidate: list[str], baseline: list[str]) -> JudgeEvaluation:
    """The judge's verdict on each candidate answer against the baseline's answer at the same place."""
    per_prompt = len(candidate) // len(prompts)
    wins = 0.0
    scores = []
    for i, (new, old) in enumerate(zip(candidate, baseline, strict=True)):
        prompt = last_user_message(prompts[i // per_prompt])
        new_score, old_score = judge(prompt, new), judge(prompt, old)
        scores.append(new_score)
        wins += 1.0 if new_score > old_score else 0.5 if new_score == old_score else 0.0
    rate = wins / len(candidate)
    low, high = wilson_interval(rate, len(candidate))
    return JudgeEvaluation(rate, low, high, len(candidate), sum(scores) / len(scores))
