"""How policy versions compare in human votes: head-to-head win rates and Bradley-Terry ratings.

A game is one vote on a pair of completions from two versions: (version of A, version of B,
choice). A tie and "both are bad" count as half a win to each side, as in Chatbot Arena.
"""

import math
from collections import defaultdict
from dataclasses import dataclass

Game = tuple[int, int, str]  # (version of A, version of B, choice: 'a', 'b', 'tie' or 'both_bad')
Z_95 = 1.959964


@dataclass(frozen=True)
class WinRate:
    wins: int
    losses: int
    ties: int  # ties and both-bad
    rate: float | None  # (wins + ties / 2) / votes; None without votes
    low: float | None  # Wilson 95% interval
    high: float | None

    @property
    def votes(self) -> int:
        return self.wins + self.losses + self.ties


def head_to_head(games: list[Game], version: int, opponent: int) -> WinRate:
    """How often `version` beat `opponent` in the votes on pairs of the two."""
    wins = losses = ties = 0
    for a, b, choice in games:
        if {a, b} != {version, opponent}:
            continue
        if choice in ("tie", "both_bad"):
            ties += 1
        elif (choice == "a") == (a == version):
            wins += 1
        else:
            losses += 1
    n = wins + losses + ties
    if n == 0:
        return WinRate(0, 0, 0, None, None, None)
    rate = (wins + ties / 2) / n
    low, high = wilson_interval(rate, n)
    return WinRate(wins, losses, ties, rate, low, high)


def wilson_interval(share: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial share over n trials."""
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bradley_terry(games: list[Game], anchor: int = 0, prior_ties: float = 0.5, iterations: int = 1000) -> dict[int, float]:
    """Arena-style ratings of every version in the games: Elo scale, `anchor` (when present) at 1000.

    The maximum-likelihood Bradley-Terry strengths by Hunter's (2004) MM updates, with
    `prior_ties` virtual ties between each two versions that met, so that a version that won
    every vote still gets a finite rating.
    """
    wins: dict[int, float] = defaultdict(float)
    meetings: dict[tuple[int, int], float] = defaultdict(float)
    for a, b, choice in games:
        score_a = {"a": 1.0, "b": 0.0}.get(choice, 0.5)
        wins[a] += score_a
        wins[b] += 1 - score_a
        meetings[min(a, b), max(a, b)] += 1
    for pair in meetings:
        meetings[pair] += 2 * prior_ties
        for version in pair:
            wins[version] += prior_ties
    opponents: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (x, y), n in meetings.items():
        opponents[x].append((y, n))
        opponents[y].append((x, n))
    versions = sorted(wins)
    strength = {v: 1.0 for v in versions}
    for _ in range(iterations):
        updated = {v: wins[v] / sum(n / (strength[v] + strength[w]) for w, n in opponents[v]) for v in versions}
        total = sum(updated.values())
        strength = {v: s * len(versions) / total for v, s in updated.items()}
    base = strength.get(anchor, strength[versions[0]]) if versions else 1.0
    return {v: 1000 + 400 * math.log10(strength[v] / base) for v in versions}
