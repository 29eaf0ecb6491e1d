"""Pairs across policy versions: what the round's human win rate is voted on."""

from annotate.pairs import CROSS_VERSION, pair_across_versions
from annotate.queue import QueueConfig
from store.completions import Completion


def completion(id: int, prompt: int, version: int, text: str) -> Completion:
    return Completion(id, prompt, version, text, token_count=3, finished=True)


def test_each_new_completion_meets_an_old_one_of_its_prompt_once():
    newer = [completion(10, 1, 1, "new a"), completion(11, 1, 1, "new b"), completion(12, 2, 1, "same"), completion(13, 3, 1, "lonely")]
    older = [completion(1, 1, 0, "old a"), completion(2, 1, 0, "old b"), completion(3, 2, 0, "same"), completion(4, 2, 0, "other")]
    pairs = pair_across_versions(newer, older, QueueConfig(overlap_share=0.0))
    assert [(p.prompt_id, p.completion_a, p.completion_b) for p in pairs] == [(1, 10, 1), (1, 11, 2), (2, 12, 4)]
    assert {p.strategy for p in pairs} == {CROSS_VERSION} and {p.votes_wanted for p in pairs} == {1}
    # an identical text is never its opponent, and a prompt the old version never answered gets no pair
    assert pair_across_versions([completion(12, 2, 1, "same")], [completion(3, 2, 0, "same")], QueueConfig()) == []


def test_with_reward_model_heads_a_prompt_gets_the_pairs_its_heads_disagree_on_most():
    from annotate.pairs import pair_within_prompts

    def scored(id: int, heads: list[float]) -> Completion:
        return Completion(id, 1, 0, f"answer {id}", token_count=3, finished=True, reward_heads=heads)

    group = [scored(1, [0.0, 0.0]), scored(2, [0.1, 0.0]), scored(3, [3.0, -3.0]), scored(4, [-1.0, 1.0])]
    config = QueueConfig(overlap_share=0.0)
    one = pair_within_prompts(group, config, pairs_per_prompt=1)
    assert [(p.completion_a, p.completion_b) for p in one] == [(3, 4)]  # the heads split most on 3 against 4
    two = pair_within_prompts(group, config, pairs_per_prompt=2)
    assert [(p.completion_a, p.completion_b) for p in two] == [(3, 4), (1, 2)]  # no completion in two pairs
    # Without a count, two by two in order, as before any reward model.
    assert [(p.completion_a, p.completion_b) for p in pair_within_prompts(group, config)] == [(1, 2), (3, 4)]
