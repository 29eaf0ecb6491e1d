"""Building pairs to compare from completions."""

from collections import defaultdict

from annotate.queue import QueueConfig

from store import Connection, transaction
from store.completions import Completion, NewCompletion, NewPair, add_completions, add_pairs, completions_of

SAME_POLICY = "same_policy"
CROSS_VERSION = "cross_version"


def pair_within_prompts(completions: list[Completion], queue: QueueConfig) -> list[NewPair]:
    """Pair up completions of the same prompt and policy, two by two in the order given.

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
        for a, b in zip(group[0::2], group[1::2])
    ]


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
    con: Connection, completions: list[NewCompletion], queue: QueueConfig, against: int | None = None
) -> tuple[list[Completion], list[NewPair]]:
    """Store new completions and the pairs built from them, in one transaction.

    Pairs are within each prompt, or, given `against`, each new completion against one of that
    policy version on the same prompt.
    """
    with transaction(con):
        stored = add_completions(con, completions)
        if against is None:
            pairs = pair_within_prompts(stored, queue)
        else:
            pairs = pair_across_versions(stored, completions_of(con, against, sorted({c.prompt_id for c in stored})), queue)
        add_pairs(con, pairs)
    return stored, pairs
