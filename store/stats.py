"""What operators watch: pair states, per-annotator figures and the votes behind agreement."""

from dataclasses import dataclass
from datetime import datetime

from store.db import Connection


@dataclass(frozen=True)
class AnnotatorStats:
    name: str
    votes: int
    median_seconds: float | None
    skip_rate: float | None
    tie_rate: float | None


def pair_states(con: Connection, now: datetime) -> dict[str, int]:
    """Pairs by state: waiting (needs votes), leased (served, awaiting an answer), done, retired; a task to rank is one."""
    rows = con.execute(
        """
        WITH counted AS (
            SELECT p.retired, p.votes_wanted,
                   (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id AND c.source <> 'ai') AS votes,
                   (SELECT count(*) FROM assignments s
                    WHERE s.pair_id = p.id AND s.closed_at IS NULL AND s.expires_at > ?) AS leases
            FROM pairs p
            WHERE p.task IS NULL  -- a task to rank counts once, as its lead
        )
        SELECT CASE WHEN retired THEN 'retired'
                    WHEN votes >= votes_wanted THEN 'done'
                    WHEN leases > 0 THEN 'leased'
                    ELSE 'waiting' END AS state,
               count(*)
        FROM counted GROUP BY state
        """,
        [now],
    ).fetchall()
    return {"waiting": 0, "leased": 0, "done": 0, "retired": 0} | dict(rows)


def annotator_stats(con: Connection) -> list[AnnotatorStats]:
    rows = con.execute(
        """
        WITH votes AS (
            SELECT annotator, count(*) AS n, median(elapsed_ms) / 1000.0 AS median_seconds,
                   avg(CASE WHEN choice = 'tie' THEN 1.0 ELSE 0.0 END) AS tie_rate
            FROM comparisons WHERE source NOT IN ('import', 'ai')
              AND pair_id NOT IN (SELECT id FROM pairs WHERE task IS NOT NULL)  -- a ranking once, by its lead pair's vote
            GROUP BY annotator
        ), skipped AS (
            SELECT annotator, count(*) AS n FROM skips GROUP BY annotator
        )
        SELECT coalesce(v.annotator, s.annotator), coalesce(v.n, 0), v.median_seconds,
               coalesce(s.n, 0) / (coalesce(s.n, 0) + coalesce(v.n, 0)), v.tie_rate
        FROM votes v FULL JOIN skipped s ON s.annotator = v.annotator
        ORDER BY 1
        """
    ).fetchall()
    return [AnnotatorStats(*row) for row in rows]


def overlapped_choices(con: Connection) -> list[list[str]]:
    """The choices on every pair that two or more annotators voted on; the AI judge's votes are not an annotator's here."""
    rows = con.execute(
        "SELECT list(choice ORDER BY annotator) FROM comparisons WHERE source <> 'ai' GROUP BY pair_id HAVING count(*) >= 2 "
        "ORDER BY pair_id"
    ).fetchall()
    return [row[0] for row in rows]


def version_games(con: Connection) -> list[tuple[int, int, str]]:
    """(policy version of A, of B, choice) of every vote on a pair whose two completions come from different versions."""
    return [vote[:3] for vote in version_votes(con)]


def version_votes(con: Connection) -> list[tuple[int, int, str, int | None, int | None]]:
    """The cross-version votes as in `version_games`, each with the token counts of A and of B."""
    return con.execute(
        """
        SELECT ca.policy_version, cb.policy_version, c.choice, ca.token_count, cb.token_count
        FROM comparisons c
        JOIN pairs p ON p.id = c.pair_id
        JOIN completions ca ON ca.id = p.completion_a
        JOIN completions cb ON cb.id = p.completion_b
        WHERE ca.policy_version IS NOT NULL AND cb.policy_version IS NOT NULL AND ca.policy_version <> cb.policy_version
          AND c.source <> 'ai'
        ORDER BY c.id
        """
    ).fetchall()


def votes_before_versions(con: Connection) -> dict[int, int]:
    """Each policy version's count of people's votes cast before it was made (a ranking once, by its lead pair's vote):
    where it stands on the learning curve."""
    rows = con.execute(
        """
        SELECT p.version, count(c.id)
        FROM policies p
        LEFT JOIN comparisons c ON c.created_at < p.created_at AND c.source <> 'ai'
             AND c.pair_id NOT IN (SELECT id FROM pairs WHERE task IS NOT NULL)
        GROUP BY p.version ORDER BY p.version
        """
    ).fetchall()
    return dict(rows)
