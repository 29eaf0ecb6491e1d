"""Building pairs to compare from completions."""

from collections import defaultdict
from itertools import combinations

from annotate.queue import QueueConfig, preference_spread

from store import Connection, transaction
from store.completions import Completion, NewCompletion, NewPair, NewTask, add_completions, add_pairs, add_tasks, completions_of

SAME_POLICY = "same_policy"
CROSS_VERSION = "cross_version"


def pair_within_prompts(completions: list[Completion], queue: QueueConfig, pairs_per_prompt: int | None = None) -> list[NewPair]:
    """Pair up completions of the same prompt and policy: two by two in the order given or, given
    pairs_per_prompt, that many pairs per prompt chosen by the reward model's heads.

    A completion whose text repeats one already seen for its prompt is left out: a pair of
    identical texts asks the annotator nothing. An odd one out stays unpaired. A share of the
    pairs, set by the queue config, wants several votes so that agreement can be measured.
    """
    groups: dict[tuple[int, int], list[Completion]] = defaultdict(list)
    for completion in completions:
        group = groups[completion.prompt_id, completion.policy_version]
        if all(completion.text != other.text for other in group):
            group.append(completion)
    return [
        NewPair(a.prompt_id, a.id, b.id, SAME_POLICY, queue.draw_votes_wanted())
        for group in groups.values()
        for a, b in (zip(group[0::2], group[1::2]) if pairs_per_prompt is None else most_disputed(group, pairs_per_prompt))
    ]


def tasks_within_prompts(completions: list[Completion], queue: QueueConfig) -> tuple[list[NewTask], list[NewPair]]:
    """Group completions of the same prompt and policy into tasks of [queue] answers_per_task to rank, in the
    order given; a group of three or more left over is a smaller task, one of two a pair. Repeated texts are left
    out, as in pair_within_prompts."""
    groups: dict[tuple[int, int], list[Completion]] = defaultdict(list)
    for completion in completions:
        group = groups[completion.prompt_id, completion.policy_version]
        if all(completion.text != other.text for other in group):
            group.append(completion)
    k = queue.answers_per_task
    tasks, pairs = [], []
    for group in groups.values():
        for chunk in (group[i:i + k] for i in range(0, len(group), k)):
            if len(chunk) > 2:
                tasks.append(NewTask(chunk[0].prompt_id, [c.id for c in chunk], SAME_POLICY, queue.draw_votes_wanted()))
            elif len(chunk) == 2:
                pairs.append(NewPair(chunk[0].prompt_id, chunk[0].id, chunk[1].id, SAME_POLICY, queue.draw_votes_wanted()))
    return tasks, pairs


def most_disputed(group: list[Completion], count: int) -> list[tuple[Completion, Completion]]:
    """Up to `count` pairs of the group, no completion in two, each in turn the one on which the reward
    model's heads disagree most (preference_spread); in the order given where unscored."""
    candidates = sorted(
        combinations(group, 2), key=lambda pair: -(preference_spread(pair[0].reward_heads, pair[1].reward_heads) or 0.0)
    )
    chosen, used = [], set()
    for a, b in candidates:
        if len(chosen) < count and a.id not in used and b.id not in used:
            chosen.append((a, b))
            used |= {a.id, b.id}
    return chosen


def pair_across_versions(newer: list[Completion], older: list[Completion], queue: QueueConfig) -> list[NewPair]:
    """Pair each newer-version completion with an older-version one of the same prompt, one to one.

    The votes on these pairs are the human win rate of the newer version. A prompt's extra
    completions on either side stay unpaired, as do identical texts.
    """
    by_prompt: dict[int, list[Completion]] = defaultdict(list)
    for completion in older:
        by_prompt[completion.prompt_id].append(completion)
    pairs = []
    for completion in newer:
        candidates = by_prompt[completion.prompt_id]
        match = next((other for other in candidates if other.text != completion.text), None)
        if match is not None:
            candidates.remove(match)
            pairs.append(NewPair(completion.prompt_id, completion.id, match.id, CROSS_VERSION, queue.draw_votes_wanted()))
    return pairs


def add_completions_with_pairs(
    con: Connection, completions: list[NewCompletion], queue: QueueConfig, against: int | None = None,
    pairs_per_prompt: int | None = None, unpaired_prompts: set[int] = frozenset(),
) -> tuple[list[Completion], list[NewPair]]:
    """Store new completions and the pairs built from them, in one transaction.

    Pairs are within each prompt (pairs_per_prompt of them chosen by the reward model, when given),
    or, given `against`, each new completion against one of that policy version on the same prompt.
    With [queue] answers_per_task above 2, completions within a prompt are grouped into tasks to rank
    instead, unless the reward model picks the pairs. The pairs returned are the tasks' leads as well. The answers to
    `unpaired_prompts` are stored unpaired within their prompt, for a later version's to be paired against.
    """
    tasks: list[NewTask] = []
    with transaction(con):
        stored = add_completions(con, completions)
        within = [c for c in stored if c.prompt_id not in unpaired_prompts]
        if against is None and pairs_per_prompt is None and queue.answers_per_task > 2:
            tasks, pairs = tasks_within_prompts(within, queue)
        elif against is None:
            pairs = pair_within_prompts(within, queue, pairs_per_prompt)
        else:
            pairs = pair_across_versions(stored, completions_of(con, against, sorted({c.prompt_id for c in stored})), queue)
        add_pairs(con, pairs)
        add_tasks(con, tasks)
    return stored, pairs + [NewPair(t.prompt_id, t.answers[0], t.answers[1], t.strategy, t.votes_wanted) for t in tasks]
