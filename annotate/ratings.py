"""How policy versions compare in human votes: head-to-head win rates, length-controlled win rates
and Bradley-Terry ratings.

A game is one vote on a pair of completions from two versions: (version of A, version of B,
choice). A tie and "both are bad" count as half a win to each side, as in Chatbot Arena.
"""

import math
from collections import defaultdict
from dataclasses import dataclass

Game = tuple[int, int, str]  # (version of A, version of B, choice: 'a', 'b', 'tie' or 'both_bad')
Vote = tuple[int, int, str, int | None, int | None]  # a game and the token counts of A and of B
Z_95 = 1.959964
# Precision of the Gaussian prior on both coefficients of the length-controlled model: weak next
# to a handful of votes, but it keeps the fit finite when one side won every vote.
LENGTH_PRIOR = 0.1
Vector = tuple[float, float]
Matrix = tuple[Vector, Vector]


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


@dataclass(frozen=True)
class LengthControlled:
    rate: float  # the modelled win probability at equal length
    low: float  # 95% interval from the curvature of the fit at its optimum
    high: float
    length_effect: float  # log-odds per unit of (scaled) relative length difference; > 0: longer wins
    votes: int


def length_controlled(votes: list[Vote], version: int, opponent: int, prior: float = LENGTH_PRIOR) -> LengthControlled | None:
    """How often `version` would beat `opponent` if their answers were the same length: Chatbot Arena's style control.

    A Bradley-Terry (logistic) model of each vote on pairs of the two, P(version wins) =
    sigmoid(b0 + b1 * x), with x the relative length difference (mine - theirs) / (mine + theirs)
    scaled by its root mean square. b0 is the strength difference at zero length difference.
    The length is not centred, unlike Arena's: here every vote is oriented version-minus-opponent,
    so centring would take the very length effect we control for back into b0.
    """
    rows = []
    for a, b, choice, tokens_a, tokens_b in votes:
        if {a, b} != {version, opponent} or tokens_a is None or tokens_b is None:
            continue
        score_a = {"a": 1.0, "b": 0.0}.get(choice, 0.5)
        mine, theirs, score = (tokens_a, tokens_b, score_a) if a == version else (tokens_b, tokens_a, 1 - score_a)
        rows.append(((mine - theirs) / (mine + theirs) if mine + theirs else 0.0, score))
    if not rows:
        return None
    scale = math.sqrt(sum(x * x for x, _ in rows) / len(rows)) or 1.0
    rows = [(x / scale, y) for x, y in rows]
    (b0, b1), variance = _logistic_fit(rows, prior)
    half = Z_95 * math.sqrt(variance)
    return LengthControlled(_sigmoid(b0), _sigmoid(b0 - half), _sigmoid(b0 + half), b1, len(rows))


def _logistic_fit(rows: list[Vector], prior: float, iterations: int = 100) -> tuple[Vector, float]:
    """The maximum a posteriori (b0, b1) of y ~ sigmoid(b0 + b1 x), y in [0, 1], under N(0, 1/prior) priors,
    by Newton's method with step halving; and the variance of b0 from the inverse of the curvature there."""
    beta = (0.0, 0.0)
    for _ in range(iterations):
        gradient, hessian = _derivatives(rows, beta, prior)
        step = _solve(hessian, gradient)
        candidate = (beta[0] + step[0], beta[1] + step[1])
        while _log_posterior(rows, candidate, prior) < _log_posterior(rows, beta, prior) and abs(step[0]) + abs(step[1]) > 1e-12:
            step = (step[0] / 2, step[1] / 2)
            candidate = (beta[0] + step[0], beta[1] + step[1])
        beta = candidate
        if abs(step[0]) + abs(step[1]) < 1e-10:
            break
    (h00, h01), (_, h11) = _derivatives(rows, beta, prior)[1]
    return beta, h11 / (h00 * h11 - h01 * h01)


def _derivatives(rows: list[Vector], beta: Vector, prior: float) -> tuple[Vector, Matrix]:
    """The log posterior's gradient and its negated Hessian (the information) at beta."""
    g0, g1 = -prior * beta[0], -prior * beta[1]
    h00 = h11 = prior
    h01 = 0.0
    for x, y in rows:
        p = _sigmoid(beta[0] + beta[1] * x)
        w = p * (1 - p)
        g0 += y - p
        g1 += (y - p) * x
        h00 += w
        h01 += w * x
        h11 += w * x * x
    return (g0, g1), ((h00, h01), (h01, h11))


def _solve(matrix: Matrix, vector: Vector) -> Vector:
    (a, b), (c, d) = matrix
    det = a * d - b * c
    return (d * vector[0] - b * vector[1]) / det, (a * vector[1] - c * vector[0]) / det


def _log_posterior(rows: list[Vector], beta: Vector, prior: float) -> float:
    total = -prior * (beta[0] ** 2 + beta[1] ** 2) / 2
    for x, y in rows:
        z = beta[0] + beta[1] * x
        total += y * _log_sigmoid(z) + (1 - y) * _log_sigmoid(-z)
    return total


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def _log_sigmoid(z: float) -> float:
    return -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))


# A share of fewer trials is too few to measure: its 95% interval spans half the range or more.
MIN_MEASURED = 10


def measured_share(share: float | None, n: int | None, of: str = "pairs") -> str:
    """A share measured on n trials, as it should be read: '62.5% of 40 pairs [47%, 76%]', its 95% Wilson interval
    beside it; or, on fewer than MIN_MEASURED, that it is too few to measure."""
    if share is None or not n:
        return f"no {of} to measure on"
    if n < MIN_MEASURED:
        return f"too few {of} to measure ({n})"
    low, high = wilson_interval(share, n)
    return f"{share:.1%} of {n} {of} [{low:.0%}, {high:.0%}]"


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


def lead_probability(games: list[Game], better: int, worse: int, prior_ties: float = 0.5) -> float:
    """How sure the games make it that `better` is stronger than `worse`: the normal approximation to the
    Bradley-Terry fit (bradley_terry's, with its virtual ties), the difference of their log-strengths over its
    standard error from the fit's Fisher information. 0.5 when the games do not connect the two."""
    ratings = bradley_terry(games, prior_ties=prior_ties)
    if better not in ratings or worse not in ratings:
        return 0.5
    strength = {v: math.log(10) * (r - 1000) / 400 for v, r in ratings.items()}  # log-strengths
    meetings: dict[tuple[int, int], float] = defaultdict(float)
    for a, b, _ in games:
        if a != b:
            meetings[min(a, b), max(a, b)] += 1
    versions = sorted(ratings)
    index = {v: i for i, v in enumerate(versions)}
    information = [[0.0] * len(versions) for _ in versions]
    for (x, y), n in meetings.items():
        p = _sigmoid(strength[x] - strength[y])
        weight = (n + 2 * prior_ties) * p * (1 - p)
        i, j = index[x], index[y]
        information[i][i] += weight
        information[j][j] += weight
        information[i][j] -= weight
        information[j][i] -= weight
    # The strengths are fixed only up to a common offset: hold the first version's, the variance of a difference is the same.
    reduced = [row[1:] for row in information[1:]]
    contrast = [0.0] * len(versions)
    contrast[index[better]] += 1.0
    contrast[index[worse]] -= 1.0
    solution = _solve_linear(reduced, contrast[1:])
    variance = sum(c * x for c, x in zip(contrast[1:], solution)) if solution is not None else 0.0
    if variance <= 0:
        return 0.5
    z = (strength[better] - strength[worse]) / math.sqrt(variance)
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def _solve_linear(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """x with matrix @ x = vector by Gaussian elimination with partial pivoting; None where the matrix is singular."""
    n = len(vector)
    rows = [row[:] + [v] for row, v in zip(matrix, vector)]
    for column in range(n):
        pivot = max(range(column, n), key=lambda r: abs(rows[r][column]))
        if abs(rows[pivot][column]) < 1e-12:
            return None
        rows[column], rows[pivot] = rows[pivot], rows[column]
        for r in range(n):
            if r != column:
                factor = rows[r][column] / rows[column][column]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[column])]
    return [rows[i][n] / rows[i][i] for i in range(n)]
