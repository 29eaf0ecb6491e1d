"""How pairs are queued for annotators: the serving strategy, leases and overlap, and the queue the server keeps in memory."""

import dataclasses
import heapq
import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any, Callable

from store.db import Connection, transaction
from store.gold import gold_pairs, gold_seen
from store.queue import (
    Assignment, Lease, OpenPair, QueueError, close_leases, insert_leases, insert_skips, lease_record, new_token,
    open_leases, open_pairs, pair_totals, seen_pairs, served_texts, votes_by_annotator_since,
)
from store.rankings import (
    Ranked, earlier_ranking, insert_rankings, outcome, parse_ranking, ranking_row, ranks_of, task_pairs,
)
from store.votes import Vote, checked_comment, earlier_vote, insert_votes, stored_choice, vote_row


def preference_spread(heads_a: list[float] | None, heads_b: list[float] | None) -> float | None:
    """How much a reward model's heads disagree on whether a beats b: the std across heads of each head's
    Bradley-Terry probability sigmoid(a_k - b_k), on raw scores (the units each head was fitted in).

    Near 0 where the heads agree, sure or unsure alike, so a pair whose answer every head already
    knows asks people nothing new. 0 for a single head; None until both are scored.
    """
    if heads_a is None or heads_b is None or len(heads_a) != len(heads_b):
        return None
    probabilities = [1 / (1 + math.exp(max(-60.0, min(60.0, b - a)))) for a, b in zip(heads_a, heads_b)]
    if len(probabilities) < 2:
        return 0.0
    mean = sum(probabilities) / len(probabilities)
    return math.sqrt(sum((p - mean) ** 2 for p in probabilities) / (len(probabilities) - 1))


def _most_uncertain_first(pair: OpenPair, r: float) -> tuple:
    spread = preference_spread(pair.heads_a, pair.heads_b)
    return (1, r) if spread is None else (0, -spread, r)  # unscored pairs after the scored ones, in random order


# Each strategy's order as a sort key; the random part breaks ties.
SORT_KEYS: dict[str, Callable[[OpenPair, float], tuple]] = {
    "random": lambda pair, r: (r,),
    "newest_policy_first": lambda pair, r: (-pair.newest_policy, r),
    "uncertain": lambda pair, r: (math.inf if pair.reward_gap is None else pair.reward_gap, r),
    "active": _most_uncertain_first,
}


# Why a vote or a skip is refused, each reason in one place. "here is another": the reply shows the next pair.
NOT_YOURS = "this pair was not served to you"
RETIRED = "this pair was retired; here is another"
TAKEN = "your time on this pair ran out and others have answered it; here is another"
SKIPPED = "you skipped this pair"
ANSWERED = "you have answered this pair already"
WANTS_RANKING = "this task wants a ranking of its answers, not a vote"
WANTS_VOTE = "this pair wants a vote, not a ranking"

MAX_TOKEN_CHARS = 64  # a lease's token (store.queue.new_token) is 22


@dataclass
class QueueConfig:
    strategy: str = field(
        default="active",
        metadata={"help": "Which pairs annotators see, and in what order: 'active' (once a reward model steers, as "
                          "[reward_model] trust says, each pair is chosen from `candidates` answers per pair wanted, as the "
                          "two on which the reward model's heads disagree most, and the pairs they disagree on most are "
                          "served first: a vote there teaches the most; random pairs until then), 'random', "
                          "'newest_policy_first' (pairs with the newest policy's completions first) or 'uncertain' "
                          "(closest reward-model scores first)."},
    )
    candidates: int = field(
        default=4,
        metadata={"help": "With 'active' and a reward model that steers: answers sampled for each pair to annotate, of "
                          "which the reward model picks the two its heads disagree on most. More finds more informative pairs for more "
                          "generation time; 2 samples no more than random pairs, and the heads then choose only how a prompt's answers are "
                          "matched into its pairs."},
    )
    answers_per_task: int = field(
        default=2,
        metadata={"help": "Answers to one prompt that an annotator sees at once: 2 is a pair to vote on; 3 to 6 are "
                          "shown anonymised and shuffled as A, B, C... to rank best to worst, ties allowed (by keyboard: "
                          "the letter picks an answer, the arrow keys move it, = ties it with the one above, Enter "
                          "submits; or by drag). A ranking is stored once and counts as a vote on each of its "
                          "K(K-1)/2 pairs. New completions of a prompt and policy are grouped K at a time (generate "
                          "at least K per prompt; a group of 2 left over is a pair); pairs of two versions, and "
                          "pairs a steering reward model picks, stay pairs."},
    )
    lease_seconds: int = field(default=600, metadata={"help": "A served pair left unanswered this long goes back to the queue."})
    overlap_share: float = field(default=0.2, metadata={"help": "Share of new pairs that several annotators vote on, to measure agreement."})
    overlap_votes: int = field(default=2, metadata={"help": "Votes wanted on each overlapped pair."})
    gold_share: float = field(
        default=0.1,
        metadata={"help": "Share of the pairs served that are gold pairs (a known answer: `tether gold`), each served to an "
                          "annotator once, while any is left that they have not seen. Their answers measure each "
                          "annotator's reliability; with no gold pairs it does nothing."},
    )
    flag_reliability_below: float = field(
        default=0.6,
        metadata={"help": "An annotator whose estimated reliability (the chance their vote picks the better answer) is "
                          "below this is flagged to operators in the Data view and by `tether gold status`. Their votes are "
                          "kept; [reward_model] weight_by_trust counts them by their reliability."},
    )

    def __post_init__(self):
        if self.strategy not in SORT_KEYS:
            raise ValueError(f"strategy must be one of {', '.join(SORT_KEYS)}, got {self.strategy!r}")
        if self.candidates < 2:
            raise ValueError(f"candidates must be at least 2, got {self.candidates}")
        if not 2 <= self.answers_per_task <= 6:
            raise ValueError(f"answers_per_task must be between 2 and 6, got {self.answers_per_task}")
        if self.lease_seconds < 1:
            raise ValueError(f"lease_seconds must be at least 1, got {self.lease_seconds}")
        if not 0 <= self.overlap_share <= 1:
            raise ValueError(f"overlap_share must be between 0 and 1, got {self.overlap_share}")
        if self.overlap_votes < 2:
            raise ValueError(f"overlap_votes must be at least 2, got {self.overlap_votes}")
        if not 0 <= self.gold_share <= 1:
            raise ValueError(f"gold_share must be between 0 and 1, got {self.gold_share}")
        if not 0 <= self.flag_reliability_below <= 1:
            raise ValueError(f"flag_reliability_below must be between 0 and 1, got {self.flag_reliability_below}")

    def draw_votes_wanted(self) -> int:
        return self.overlap_votes if random.random() < self.overlap_share else 1


@dataclass(slots=True)
class _Pair:
    prompt_id: int
    completion_a: int
    completion_b: int
    votes_wanted: int
    votes: int
    key: tuple
    live: int = 0  # leases live: not closed and not run out
    leases: list[str] = field(default_factory=list)  # leases not closed, run out or not
    gold: bool = False  # served to each annotator once, at [queue] gold_share, never in the strategy's order
    answers: tuple[int, ...] = ()  # a task to rank: its completions; empty for a pair

    @property
    def room(self) -> int:
        return 1 if self.gold else self.votes_wanted - self.votes - self.live


@dataclass(frozen=True)
class Action:
    """One annotator's request: 'serve' (the pair or task to show), a 'vote' or 'skip' on the pair leased as
    `token`, or a 'rank' of the task leased as `token`."""

    kind: str
    annotator: str
    token: str = ""
    choice: str = ""  # a vote's side of the screen, 'tie' or 'both_bad'
    strength: str | None = None
    comment: str | None = None
    source: str = "app"  # stored with a vote: 'app' for people, 'simulate' for simulated annotators
    serve_next: bool = True  # lease the annotator's next pair after a vote or skip (one who stops wants none)
    ranking: str = ""  # a rank's order of the letters shown, best first: "C > A = D > B" (store.rankings.parse_ranking)

    def __post_init__(self):
        # Refused here, before the action joins a batch: a field of the wrong type would fail inside
        # the batch's one transaction, and every action in it with it.
        if not isinstance(self.token, str) or len(self.token) > MAX_TOKEN_CHARS:
            got = f"{len(self.token):,} characters" if isinstance(self.token, str) else type(self.token).__name__
            raise QueueError(f"the pair's token must be text of at most {MAX_TOKEN_CHARS} characters, got {got}")
        if self.kind == "vote":
            checked_comment(self.choice, self.strength, self.comment)


@dataclass(frozen=True)
class Outcome:
    assignment: Assignment | None  # the pair to show next; None when none is left for this annotator
    vote: Vote | Ranked | None  # a vote, or a ranking
    refused: str  # why the vote or skip was refused, and then nothing was done; empty when done


@dataclass(frozen=True, slots=True)
class _Showing:
    lease: Lease
    prompt_id: int
    shown: tuple[int, ...]  # completions in the order shown: left and right of a pair, A, B, C... of a task


def shown_order(token: str, answers: tuple[int, ...]) -> list[int]:
    """A task's answers in the order one lease shows them: shuffled, the same for the lease each time it is shown
    (the shuffle is seeded by its token), and differently for each lease."""
    order = list(answers)
    random.Random(token).shuffle(order)
    return order


@dataclass
class _Writes:
    """What a batch of actions stores, all written after its last action."""

    leases: list[Lease] = field(default_factory=list)
    votes: list[tuple] = field(default_factory=list)  # vote_row each
    rankings: list[tuple] = field(default_factory=list)  # ranking_row each
    skips: list[tuple[int, str]] = field(default_factory=list)
    closed: dict[str, tuple[str, Vote | Ranked | None]] = field(default_factory=dict)  # token: annotator, and the vote or None for a skip

    def store(self, con: Connection, now: datetime) -> None:
        insert_leases(con, self.leases)
        insert_votes(con, self.votes)
        insert_rankings(con, self.rankings)
        insert_skips(con, self.skips, now)
        close_leases(con, list(self.closed), now)


def _assignment(showing: _Showing, messages: dict[int, str], texts: dict[int, tuple[str, bool]]) -> Assignment:
    """What the annotator is shown: a pair's left and right, or a task's answers (its first two as left and right)."""
    left, right = texts[showing.shown[0]], texts[showing.shown[1]]
    answers = tuple(texts[c] for c in showing.shown) if len(showing.shown) > 2 else ()
    return Assignment(showing.lease.token, showing.lease.pair_id, messages[showing.prompt_id], left[0], right[0],
                      showing.lease.served_at, left[1], right[1], answers)


class LiveQueue:
    """The queue as the one writer keeps it in memory, so that serving a pair, checking a vote and
    counting what is left never scan the tables.

    DuckDB stays the truth: each change is written and committed there first, and `load` rebuilds
    this from it. Only pairs that still want votes are held; a pair leaves when its last wanted
    vote comes in. Serving walks the strategy's order from the first pair still wanting votes,
    passing over pairs leased to capacity and pairs the annotator has seen, so its cost is bounded
    by the open leases and the annotator's own unfinished pairs, not by the size of the project.
    `now` must not go backwards between calls: leases run out in the order of their expiry.
    """

    def __init__(self, config: QueueConfig):
        self.config = config
        self._stale = True

    @classmethod
    def load(cls, con: Connection, config: QueueConfig, now: datetime) -> "LiveQueue":
        queue = cls(config)
        queue._rebuild(con, now)
        return queue

    def _rebuild(self, con: Connection, now: datetime) -> None:
        self.pairs: dict[int, _Pair] = {}
        self.leases: dict[str, Lease] = {}  # not closed, on pairs held here
        self.live: set[str] = set()  # tokens of the leases not run out
        self.expiries: list[tuple[datetime, str]] = []  # a heap of the live leases' ends
        self.seen: dict[str, set[int]] = defaultdict(set)  # per annotator, pairs still held here
        self.leased_to: dict[str, list[str]] = defaultdict(list)  # per annotator, leases not closed
        self.order: list[int] = []
        self.head = 0  # order[:head] are all answered
        self.available = 0  # pairs with room for another lease
        self.last_pair_id = 0
        self.day = now.date()
        self.votes_on_day: Counter[str] = Counter(votes_by_annotator_since(con, datetime.combine(self.day, time())))
        self._add_pairs(con, now)
        gold = gold_pairs(con)
        self.gold = [g.pair_id for g in gold]
        for g in gold:
            self.pairs[g.pair_id] = _Pair(g.prompt_id, g.completion_a, g.completion_b, votes_wanted=0, votes=0, key=(), gold=True)
        for annotator, pair_id in gold_seen(con):
            if pair_id in self.pairs:
                self.seen[annotator].add(pair_id)
        for lease in sorted(open_leases(con), key=lambda x: x.served_at):
            if lease.pair_id in self.pairs:
                self._hold(lease, live=lease.expires_at > now)
        self._stale = False

    def add_new_pairs(self, con: Connection, now: datetime) -> int:
        """Take in the pairs stored since the last look (a generation job's); return how many."""
        if self._stale:
            self._rebuild(con, now)
            return 0
        return self._add_pairs(con, now)

    def _add_pairs(self, con: Connection, now: datetime) -> int:
        new = open_pairs(con, after=self.last_pair_id)
        if not new:
            return 0
        key = SORT_KEYS[self.config.strategy]
        for pair in new:
            self.pairs[pair.id] = _Pair(pair.prompt_id, pair.completion_a, pair.completion_b, pair.votes_wanted,
                                        pair.votes, key(pair, random.random()), answers=tuple(pair.answers or ()))
            self.available += 1
        for annotator, pair_id in seen_pairs(con, after=self.last_pair_id):
            if pair_id in self.pairs:
                self.seen[annotator].add(pair_id)
        self.last_pair_id = new[-1].id
        new_ids = sorted((p.id for p in new), key=lambda i: self.pairs[i].key)
        kept = [i for i in self.order[self.head:] if i in self.pairs]
        self.order = list(heapq.merge(kept, new_ids, key=lambda i: self.pairs[i].key))
        self.head = 0
        return len(new)

    def reorder(self, con: Connection, now: datetime) -> None:
        """Sort again by fresh scores (after a reward model scored completions), for the orders that use them."""
        if self.config.strategy in ("uncertain", "active"):
            self._rebuild(con, now)

    def refresh(self, con: Connection, now: datetime) -> None:
        """Load again from the database: after pairs were marked gold."""
        self._rebuild(con, now)

    # ---- what annotators do ----

    def act(self, con: Connection, actions: list[Action], now: datetime) -> list[Outcome]:
        """Do annotators' actions in order, in one transaction, and return each one's outcome.

        An action refused changes nothing; the others go on. Their rows are written together after
        the last action, one statement per table, so a batch costs DuckDB about what one action does.
        If the batch fails after this memory was changed (the disk is full, say), the database kept
        none of it, so this is rebuilt from the database before the next use.
        """
        if self._stale:
            self._rebuild(con, now)
        self._run_out(now)
        writes = _Writes()
        try:
            with transaction(con):
                done = [self._do(con, writes, action, now) for action in actions]
                writes.store(con, now)
                shown = [showing for _, showing, _ in done if showing]
                messages, texts = served_texts(con, {s.prompt_id for s in shown}, {c for s in shown for c in s.shown})
        except BaseException:
            self._stale = True
            raise
        return [Outcome(showing and _assignment(showing, messages, texts), vote, refused) for vote, showing, refused in done]

    def _do(self, con: Connection, writes: _Writes, action: Action, now: datetime) -> tuple[Vote | Ranked | None, _Showing | None, str]:
        try:
            vote = None
            if action.kind == "vote":
                vote = self._vote(con, writes, action, now)
            elif action.kind == "rank":
                vote = self._rank(con, writes, action, now)
            elif action.kind == "skip":
                self._skip(con, writes, action)
            showing = self._lease_for(writes, action.annotator, now) if action.kind == "serve" or action.serve_next else None
            return vote, showing, ""
        except QueueError as e:  # raised before anything changed
            return None, None, str(e)

    def _vote(self, con: Connection, writes: _Writes, action: Action, now: datetime) -> Vote:
        """Store the vote; submitting it twice stores it once."""
        comment = checked_comment(action.choice, action.strength, action.comment)
        lease = self.leases.get(action.token)
        if lease is None:
            return self._answered_before(con, writes, action)
        if lease.annotator != action.annotator:
            raise QueueError(NOT_YOURS)
        pair = self.pairs[lease.pair_id]
        if lease.token not in self.live and pair.room <= 0:
            raise QueueError(TAKEN)
        if pair.answers:
            raise QueueError(WANTS_RANKING)
        choice = stored_choice(action.choice, lease.shown_left == pair.completion_a)
        writes.votes.append(vote_row(lease.pair_id, action.annotator, choice, action.strength, comment,
                                     now - lease.served_at, lease.token, action.source, now))
        self._answered(writes, lease, Vote(lease.pair_id, choice, repeated=True), now)
        return Vote(lease.pair_id, choice, repeated=False)

    def _rank(self, con: Connection, writes: _Writes, action: Action, now: datetime) -> Ranked:
        """Store the ranking once, and its outcome on each of the task's pairs as a comparison, with no token
        (the ranking's token makes it idempotent); the lead pair's carries the time it took."""
        lease = self.leases.get(action.token)
        if lease is None:
            return self._answered_before(con, writes, action)
        if lease.annotator != action.annotator:
            raise QueueError(NOT_YOURS)
        pair = self.pairs[lease.pair_id]
        if lease.token not in self.live and pair.room <= 0:
            raise QueueError(TAKEN)
        if not pair.answers:
            raise QueueError(WANTS_VOTE)
        shown = shown_order(lease.token, pair.answers)
        ranks = ranks_of([[shown[position] for position in group] for group in parse_ranking(action.ranking, len(shown))])
        elapsed = now - lease.served_at
        for pair_id, a, b in task_pairs(con, lease.pair_id):
            writes.votes.append(vote_row(pair_id, action.annotator, outcome(ranks[a], ranks[b]), None, None,
                                         elapsed if pair_id == lease.pair_id else None, None, action.source, now))
        best_first = sorted(ranks, key=ranks.get)
        ranked = Ranked(lease.pair_id, best_first, [ranks[c] for c in best_first], repeated=False)
        writes.rankings.append(ranking_row(ranked, pair.prompt_id, action.annotator, elapsed, lease.token, action.source, now))
        self._answered(writes, lease, dataclasses.replace(ranked, repeated=True), now)
        return ranked

    def _answered(self, writes: _Writes, lease: Lease, answer: Vote | Ranked, now: datetime) -> None:
        """Close the lease with its vote or ranking, and count it."""
        writes.closed[lease.token] = (lease.annotator, answer)
        self._close(lease)
        self._adjust(lease.pair_id, votes=1)
        if now.date() != self.day:
            self.day = now.date()
            self.votes_on_day.clear()
        self.votes_on_day[lease.annotator] += 1

    def _skip(self, con: Connection, writes: _Writes, action: Action) -> None:
        """Close the lease, and never serve this pair to this annotator again."""
        lease = self.leases.get(action.token)
        if lease is None:
            self._answered_before(con, writes, action)
        if lease.annotator != action.annotator:
            raise QueueError(NOT_YOURS)
        writes.skips.append((lease.pair_id, action.annotator))
        writes.closed[lease.token] = (action.annotator, None)
        self._close(lease)

    def _answered_before(self, con: Connection, writes: _Writes, action: Action) -> Vote | Ranked:
        """For a token that is not an open lease here: the vote or ranking stored with it (a double submit stores
        nothing new), or why it cannot be answered, from this batch or the database."""
        closed = ANSWERED if action.kind == "skip" else SKIPPED
        if action.token in writes.closed:
            annotator, vote = writes.closed[action.token]
            if annotator != action.annotator:
                raise QueueError(NOT_YOURS)
            if vote is None or action.kind == "skip":
                raise QueueError(closed)
            if isinstance(vote, Ranked) != (action.kind == "rank"):
                raise QueueError(ANSWERED)
            return vote
        if action.kind == "vote" and (vote := earlier_vote(con, action.annotator, action.token)):
            return vote
        if action.kind == "rank" and (ranked := earlier_ranking(con, action.annotator, action.token)):
            return ranked
        stored = lease_record(con, action.token)
        if stored is None or stored.annotator != action.annotator:
            raise QueueError(NOT_YOURS)
        if stored.retired:
            raise QueueError(RETIRED)
        if stored.closed:
            raise QueueError(closed)
        raise QueueError(TAKEN)

    def _lease_for(self, writes: _Writes, annotator: str, now: datetime) -> _Showing | None:
        """The annotator's open lease if they have one, else a new lease on the next pair in order."""
        for token in reversed(self.leased_to.get(annotator, [])):  # the newest first
            if token in self.live:
                return self._showing(self.leases[token])
        pair_id = self._gold_for(annotator) if self.gold and random.random() < self.config.gold_share else None
        if pair_id is None:
            pair_id = self._next_pair_for(annotator)
        if pair_id is None:
            return None
        pair = self.pairs[pair_id]
        token = new_token()
        shown_left = shown_order(token, pair.answers)[0] if pair.answers else random.choice([pair.completion_a, pair.completion_b])
        lease = Lease(token, pair_id, annotator, now, now + timedelta(seconds=self.config.lease_seconds), shown_left)
        writes.leases.append(lease)
        self._hold(lease, live=True)
        return self._showing(lease)

    def _showing(self, lease: Lease) -> _Showing:
        pair = self.pairs[lease.pair_id]
        if pair.answers:
            return _Showing(lease, pair.prompt_id, tuple(shown_order(lease.token, pair.answers)))
        right = pair.completion_b if lease.shown_left == pair.completion_a else pair.completion_a
        return _Showing(lease, pair.prompt_id, (lease.shown_left, right))

    def pairs_left(self, annotator: str, now: datetime) -> int:
        """Pairs this annotator could still be served, from counters."""
        self._run_out(now)
        seen = self.seen.get(annotator, set())
        for pair_id in [p for p in seen if p not in self.pairs]:
            seen.discard(pair_id)  # answered by everyone who should: kept no longer
        return self.available - sum(1 for p in seen if self.pairs[p].room > 0 and not self.pairs[p].gold)

    def pair_states(self, con: Connection, now: datetime) -> dict[str, int]:
        """Pairs by state, as store.stats.pair_states counts them, from this queue and two counts."""
        self._run_out(now)
        total, retired = pair_totals(con)
        wanting = [pair for pair in self.pairs.values() if not pair.gold]  # a gold pair has the votes it wants of its own
        leased = sum(1 for pair in wanting if pair.live)
        return {"waiting": len(wanting) - leased, "leased": leased, "done": total - retired - len(wanting), "retired": retired}

    def votes_today(self, annotator: str, now: datetime) -> int:
        return self.votes_on_day[annotator] if now.date() == self.day else 0

    def release(self, annotator: str, now: datetime) -> None:
        """The annotator's leases run out now (the account was disabled), so their pairs go back to the queue."""
        for token in self.leased_to.get(annotator, []):
            lease = self.leases[token]
            if token in self.live:
                lease.expires_at = now
                self._end_live(lease)

    # ---- inside ----

    def _gold_for(self, annotator: str) -> int | None:
        """A gold pair this annotator has not been served, at random; None when they have seen them all."""
        seen = self.seen.get(annotator, ())
        unseen = [pair_id for pair_id in self.gold if pair_id not in seen]
        return random.choice(unseen) if unseen else None

    def _next_pair_for(self, annotator: str) -> int | None:
        order, pairs = self.order, self.pairs
        while self.head < len(order) and order[self.head] not in pairs:
            self.head += 1
        seen = self.seen.get(annotator, ())
        chosen, gone, end = None, 0, len(order)
        for end in range(self.head, len(order)):
            pair = pairs.get(order[end])
            if pair is None:
                gone += 1
            elif pair.room > 0 and order[end] not in seen:
                chosen = order[end]
                break
        if gone > 256:  # answered pairs behind one nobody can take yet: drop them, so the next walk is short
            order[self.head:end] = [p for p in order[self.head:end] if p in pairs]
        return chosen

    def _hold(self, lease: Lease, live: bool) -> None:
        self.leases[lease.token] = lease
        self.pairs[lease.pair_id].leases.append(lease.token)
        self.leased_to[lease.annotator].append(lease.token)
        self.seen[lease.annotator].add(lease.pair_id)
        if live:
            self.live.add(lease.token)
            heapq.heappush(self.expiries, (lease.expires_at, lease.token))
            self._adjust(lease.pair_id, live=1)

    def _close(self, lease: Lease) -> None:
        del self.leases[lease.token]
        self.pairs[lease.pair_id].leases.remove(lease.token)
        self.leased_to[lease.annotator].remove(lease.token)
        if lease.token in self.live:
            self._end_live(lease)

    def _end_live(self, lease: Lease) -> None:
        self.live.discard(lease.token)
        self._adjust(lease.pair_id, live=-1)

    def _run_out(self, now: datetime) -> None:
        while self.expiries and self.expiries[0][0] <= now:
            _, token = heapq.heappop(self.expiries)
            lease = self.leases.get(token)
            if lease is not None and token in self.live and lease.expires_at <= now:
                self._end_live(lease)

    def _adjust(self, pair_id: int, votes: int = 0, live: int = 0) -> None:
        """Count a vote or a lease on a pair; a pair with all its votes leaves."""
        pair = self.pairs[pair_id]
        pair.live += live
        if pair.gold:  # it stays, for the annotators who have not answered it
            return
        had_room = pair.room + live > 0
        pair.votes += votes
        self.available += (pair.room > 0) - had_room
        if pair.votes >= pair.votes_wanted:
            del self.pairs[pair_id]
            for token in pair.leases:  # run out: a late vote on one is refused from the database's record
                lease = self.leases.pop(token)
                self.leased_to[lease.annotator].remove(token)
                self.live.discard(token)

    def state(self, now: datetime) -> dict[str, Any]:
        """What this queue holds, in a form to compare with another: to check it against a rebuild."""
        self._run_out(now)
        seen = {a: sorted(p for p in pairs if p in self.pairs) for a, pairs in sorted(self.seen.items())}
        return {
            "pairs": {i: [p.votes, p.votes_wanted, p.live, sorted(p.leases)] for i, p in sorted(self.pairs.items())},
            "leases": {t: [x.pair_id, x.annotator, t in self.live] for t, x in sorted(self.leases.items())},
            "leased_to": {a: sorted(tokens) for a, tokens in sorted(self.leased_to.items()) if tokens},
            "seen": {a: pairs for a, pairs in seen.items() if pairs},
            "available": self.available,
            "votes_today": dict(sorted((a, n) for a, n in self.votes_on_day.items() if n)) if now.date() == self.day else {},
        }
