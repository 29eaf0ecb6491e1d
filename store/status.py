"""What a project holds, counted."""

from dataclasses import dataclass

from store.db import Connection, schema_version
from store.policies import policy_versions, reward_model_versions


@dataclass(frozen=True)
class ProjectCounts:
    schema_version: int
    prompts: int
    active_prompts: int
    completions: int
    pairs: int
    pairs_wanting_votes: int
    votes: int  # people's (and simulated and imported ones), not the AI judge's
    ai_votes: int
    tasks: int  # of more than two answers, to rank
    rankings: int
    policy_versions: list[int]
    reward_model_versions: list[int]


def project_counts(con: Connection) -> ProjectCounts:
    prompts, active, completions, pairs, wanting, votes, ai_votes, tasks, rankings = con.execute("""
        SELECT
            (SELECT count(*) FROM prompts),
            (SELECT count(*) FROM prompts WHERE active),
            (SELECT count(*) FROM completions),
            (SELECT count(*) FROM pairs),
            (SELECT count(*) FROM pairs p WHERE NOT retired
             AND (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id AND c.source <> 'ai') < p.votes_wanted),
            (SELECT count(*) FROM comparisons WHERE source <> 'ai'),
            (SELECT count(*) FROM comparisons WHERE source = 'ai'),
            (SELECT count(*) FROM pairs WHERE answers IS NOT NULL),
            (SELECT count(*) FROM rankings)
    """).fetchone()
    return ProjectCounts(
        schema_version=schema_version(con),
        prompts=prompts,
        active_prompts=active,
        completions=completions,
        pairs=pairs,
        pairs_wanting_votes=wanting,
        votes=votes,
        ai_votes=ai_votes,
        tasks=tasks,
        rankings=rankings,
        policy_versions=policy_versions(con),
        reward_model_versions=reward_model_versions(con),
    )
