"""What rounds did: each round's figures (its reward model, its optimiser's last step, people's win rate of the new
version, its candidates), the ratings of every version, the warnings an operator should read, and the report."""

import re
from dataclasses import dataclass
from typing import Any

from annotate.ratings import Game, LengthControlled, Vote, WinRate, bradley_terry, head_to_head, length_controlled, measured_share
from store.completions import completions_of, paired_texts
from store.jobs import job_metrics, metric_series, round_jobs
from store.policies import POLICY_JOBS, get_policy, policy_versions
from store.prompts import prompts_to_generate
from store.reward_models import RewardModel, list_reward_models
from store.rounds import AVERAGE, Candidate, Round, list_rounds, round_candidates
from store.stats import version_games, version_votes
from train.common.config import RewardModelConfig
from ui.owner.config import TetherConfig
from ui.owner.jobs import Run
from ui.owner.round import MIN_VOTES, rollback_target
from ui.owner.round_report import scoring_kind, trust_status


@dataclass(frozen=True)
class RoundSummary:
    round: Round
    reward_accuracy: float | None  # held-out pairwise accuracy of the round's reward model
    reward_pairs: int | None  # the held-out pairs it was measured on
    optimizer: str | None  # the kind of the job that trained the new policy: "ppo", "dpo" or "grpo"
    settings: dict[str, Any]  # the settings that job ran with
    policy_job: int | None
    # The registered version's KL to v0 on the predictor's answers, the one measure [round] kl_budget holds (for a round
    # from before the predictor, PPO's or GRPO's at its last step).
    kl: float | None
    kl_to_parent: float | None  # KL to the version PPO started from, on its training batch at its last step
    ended: float | None  # share of PPO's or GRPO's responses that ended within the length budget, at the last step
    score_gain: float | None  # reward-model score at PPO's or GRPO's last step minus at its first
    margin: float | None  # DPO's implicit reward margin of chosen over rejected, the mean over its steps
    pair_accuracy: float | None  # DPO's share of pairs whose chosen response has the larger implicit reward, the mean over its steps
    pairs: tuple[int, int] | None  # DPO's pairs from votes and pairs the reward model ranked
    label_smoothing: float | None  # the share of flipped labels DPO's robust loss corrected for; 0 for plain DPO
    win_rate: WinRate | None  # human votes on v+1 against v
    length_controlled: LengthControlled | None  # the same votes' win rate at equal length
    # The round's reward model's accuracy on the votes that came after it was trained (mostly on
    # v+1's answers), as the next reward-model version recorded it; None until one does.
    new_votes_accuracy: float | None
    new_votes_pairs: int | None
    reward_model_kind: str | None  # which reward model scored: "head" or "LoRA", and for kind "auto" which of the two steered
    candidates: list[Candidate]  # the policies the round trained, with the predictor's verdict on each

    @property
    def registered_average(self) -> bool:
        """The round registered its candidates' average, which has no training of its own."""
        return any(c.chosen and c.optimizer == AVERAGE for c in self.candidates)


def round_history(run: Run) -> list[RoundSummary]:
    votes = run(version_votes)
    games = [vote[:3] for vote in votes]
    reward_models = {rm.version: rm for rm in run(list_reward_models)}
    candidates = run(round_candidates, None)
    return [_summarise(run, round_, games, votes, reward_models, [c for c in candidates if c.round == round_.id])
            for round_ in run(list_rounds)]


def round_summary(run: Run, round_id: int) -> RoundSummary:
    """One round's figures: its human win rate, raw and length-controlled, and its reward model's accuracy on the new votes."""
    return next(s for s in round_history(run) if s.round.id == round_id)


def _summarise(run: Run, round_: Round, games: list[Game], votes: list[Vote], reward_models: dict[int, RewardModel],
               candidates: list[Candidate]) -> RoundSummary:
    jobs = run(round_jobs, round_.id)
    registered = next((c for c in candidates if c.chosen), None)
    if candidates:  # the one the round registered, if any; the candidates' average stands for its first's training
        trained = None if registered is None else candidates[0].job if registered.optimizer == AVERAGE else registered.job
        policy_job = next((j for j in jobs if j.id == trained), None)
    else:  # a round from before candidates: its one policy job
        policy_job = next((j for j in jobs if j.kind in POLICY_JOBS), None)
    metrics = reward_models[round_.reward_version].metrics if round_.reward_version in reward_models else {}
    accuracy, held_out = metrics.get("eval_accuracy"), metrics.get("pairs_eval")
    kl = kl_to_parent = ended = score_gain = margin = pair_accuracy = pairs = smoothing = None
    if policy_job is not None and policy_job.status == "done":
        last = run(job_metrics, policy_job.id)
        # Over all DPO's steps, not its last batch's few pairs; in its first epoch each batch is scored before it is learnt.
        margin, pair_accuracy = (_mean([v for _, v in run(metric_series, policy_job.id, name)]) for name in ("margin", "accuracy"))
        if "pairs_human" in last:
            pairs = (int(last["pairs_human"]), int(last["pairs_reward_model"]))
        smoothing = last.get("label_smoothing")
        kl, kl_to_parent, ended = last.get("kl"), last.get("kl_to_start"), last.get("finished")
        scores = [v for _, v in run(metric_series, policy_job.id, "score")]
        score_gain = scores[-1] - scores[0] if scores else None
    if registered is not None and registered.optimizer == AVERAGE:  # a candidate's last step is not the average's
        kl_to_parent = ended = None
    if registered is not None and registered.kl_to_v0 is not None:
        kl = registered.kl_to_v0
    win_rate = controlled = None
    if round_.policy_to is not None:
        win_rate = head_to_head(games, round_.policy_to, round_.policy_from)
        controlled = length_controlled(votes, round_.policy_to, round_.policy_from)
    new_votes = _new_votes_metrics(round_.reward_version, reward_models)
    kind = None
    if round_.reward_version in reward_models:
        metrics = reward_models[round_.reward_version].metrics
        kind = SHORT_KINDS[metrics.get("kind", "lora")] + (f", {SHORT_KINDS[metrics['steering']]} steering" if metrics.get("kind") == "auto" else "")
    return RoundSummary(
        round_, accuracy, held_out, policy_job.kind if policy_job else None, policy_job.config[policy_job.kind] if policy_job else {},
        policy_job.id if policy_job else None, kl, kl_to_parent, ended,
        score_gain, margin, pair_accuracy, pairs, smoothing,
        win_rate, controlled, new_votes.get("new_votes_accuracy"), new_votes.get("new_votes_pairs"), kind, candidates,
    )


SHORT_KINDS = {"head": "head", "lora": "LoRA", "auto": "auto"}


def reward_model_note(run: Run, config: RewardModelConfig) -> str | None:
    """The newest reward model: which model scores for it and whether it steers the loop, and why, in words."""
    versions = run(list_reward_models)
    if not versions:
        return None
    return f"reward model v{versions[0].version}: {scoring_kind(versions[0])}; {trust_status(versions[0], config)}"


def _new_votes_metrics(reward_version: int | None, reward_models: dict[int, RewardModel]) -> dict[str, Any]:
    """The metrics of the first reward model after `reward_version` that measured it on the votes since."""
    if reward_version is None:
        return {}
    # A version trained from scratch records None: it had no previous version to measure.
    later = sorted(v for v, rm in reward_models.items() if v > reward_version and rm.metrics.get("new_votes_accuracy") is not None)
    return reward_models[later[0]].metrics if later else {}


def ratings(run: Run) -> dict[int, float]:
    """Arena-style Bradley-Terry ratings of every policy version in the cross-version votes; v0 is 1000."""
    return bradley_terry(run(version_games))


MIN_NEW_VOTES_ACCURACY = 0.55  # below it, the reward model no longer agrees with people on the new answers


LENGTH_DRIFT = 1.5  # new mean length over old, either way


REPETITION_DRIFT = 0.10  # rise in the share of repeated word trigrams


def round_warnings(run: Run, history: list[RoundSummary], start_from: str) -> list[str]:
    """What needs an operator's eye in finished rounds: people rating the new policy below the one it
    started from, a reward model that no longer agrees with people, drift in length or repetition
    between the old and new policy's answers; and, last, a better version than the newest, which the
    next round starts from with [round] start_from = "best" and which to roll back to otherwise."""
    games = run(version_games)
    scores = bradley_terry(games)
    warnings = []
    for summary in history:
        round_ = summary.round
        if round_.policy_to is None:
            continue
        name = f"round {round_.id} (v{round_.policy_to} from v{round_.policy_from})"
        warnings += [f"{name}: {w}" for w in _warnings_of(run, summary, scores)]
    newest = run(get_policy, None).version
    if (target := rollback_target(games, newest)) is not None:
        below = f"people rate the newest policy v{newest} ({scores[newest]:.0f}) below v{target} ({scores[target]:.0f})"
        warnings.append(f"{below}: the next round starts from v{target} ([round] start_from = \"best\")" if start_from == "best" else
                        f"{below}: roll back to v{target} (`tether rollback {target}`, or Roll back in the Loop view) so the next "
                        "round starts from it")
    return warnings


def _warnings_of(run: Run, summary: RoundSummary, scores: dict[int, float]) -> list[str]:
    warnings = []
    if below := _rated_below_parent(summary, scores):
        if summary.score_gain is not None and summary.score_gain > 0:
            below += f", although the reward model's score rose by {summary.score_gain:.2f} during PPO: a sign of reward hacking"
        warnings.append(below)
    accuracy, pairs = summary.new_votes_accuracy, summary.new_votes_pairs
    if accuracy is not None and pairs is not None and pairs >= MIN_VOTES and accuracy < MIN_NEW_VOTES_ACCURACY:
        warnings.append(
            f"reward model v{summary.round.reward_version} agrees with people on only {accuracy:.0%} of the {pairs} votes "
            f"that came after it was trained: it no longer tracks what people prefer in the new policy's answers"
        )
    return warnings + _drift_warnings(run, summary.round)


def _rated_below_parent(summary: RoundSummary, scores: dict[int, float]) -> str | None:
    """Whether people rate the round's new version below the one it started from, in words with the figures.

    Both signs need MIN_VOTES votes on the round's pairs: a rating from a vote or two
    is noise, and Bradley-Terry's prior makes a single lost vote a gap of some 190 points.
    """
    new, old, win = summary.round.policy_to, summary.round.policy_from, summary.win_rate
    if win is None or win.votes < MIN_VOTES:
        return None
    rated_below = new in scores and old in scores and scores[new] < scores[old]
    lost = win.rate < 0.5
    if not rated_below and not lost:
        return None
    figures = [f"won {win.rate:.0%} [{win.low:.0%}, {win.high:.0%}] of {win.votes} votes against v{old}"]
    if new in scores and old in scores:
        figures.append(f"Bradley-Terry rating {scores[new]:.0f} against v{old}'s {scores[old]:.0f}")
    return f"people rate v{new} below v{old}: it " + ", ".join(figures)


def _drift_warnings(run: Run, round_: Round) -> list[str]:
    """Drift in length or repetition between the old and new policy's answers to the round's pairs."""
    texts = run(paired_texts, round_.policy_to, round_.policy_from)
    old, new = texts[round_.policy_from], texts[round_.policy_to]
    if not old or not new:
        return []
    warnings = []
    old_length, new_length = _mean_length(old), _mean_length(new)
    if old_length and new_length and max(new_length / old_length, old_length / new_length) >= LENGTH_DRIFT:
        warnings.append(f"responses drifted in length, {old_length:.0f} to {new_length:.0f} tokens on average")
    old_repeats, new_repeats = repeated_trigram_share(old), repeated_trigram_share(new)
    if new_repeats - old_repeats >= REPETITION_DRIFT:
        warnings.append(f"repeated phrases rose from {old_repeats:.0%} to {new_repeats:.0%} of word trigrams")
    return warnings


def _mean_length(completions: list[tuple[int | None, str]]) -> float | None:
    return _mean([n for n, _ in completions if n is not None])


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def repeated_trigram_share(completions: list[tuple[int | None, str]]) -> float:
    """The share of word trigrams that repeat an earlier one in the same response: a measure of degenerate loops."""
    total = repeated = 0
    for _, text in completions:
        words = re.findall(r"\w+", text.lower())
        trigrams = list(zip(words, words[1:], words[2:]))
        total += len(trigrams)
        repeated += len(trigrams) - len(set(trigrams))
    return repeated / total if total else 0.0


def round_report(run: Run, config: TetherConfig) -> list[str]:
    """The round history as a text table, the ratings, the newest reward model and the warnings, line by line."""
    history = round_history(run)
    if not history:
        return ["no rounds yet: start one with `tether round`"]
    rows = [describe(s) for s in history]
    notes = [f"round {row['round']}: {why}" for row in rows if (why := row.pop("why"))]
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in rows[0]}
    lines = ["  ".join(k.ljust(w) for k, w in widths.items())]
    lines += ["  ".join(str(row[k]).ljust(w) for k, w in widths.items()) for row in rows]
    lines += notes
    if scores := ratings(run):
        lines.append("ratings (Bradley-Terry, v0 = 1000): " + ", ".join(f"v{v} {r:.0f}" for v, r in sorted(scores.items())))
    if ended := ended_answers(run):
        lines.append("answers that ended, not cut at the length limit: "
                     + ", ".join(f"v{v} {done / total:.0%} of {total}" for v, (done, total) in ended.items()))
    if note := reward_model_note(run, config.reward_model):
        lines.append(note)
    lines += [f"warning: {warning}" for warning in round_warnings(run, history, config.round.start_from)]
    return lines


def ended_answers(run: Run) -> dict[int, tuple[int, int]]:
    """Of each policy version's answers to the active prompts, how many ended, and of how many: annotators can only
    judge an answer that ends, and a version that learned to end its answers shows here."""
    ended = {}
    for version in run(policy_versions):
        answers = run(completions_of, version, [p.id for p in run(prompts_to_generate, version, None)])
        if answers:
            ended[version] = (sum(a.finished for a in answers), len(answers))
    return ended


def describe(summary: RoundSummary) -> dict[str, Any]:
    """One row of the round history, as the CLI and the app show it."""
    round_, win, lc = summary.round, summary.win_rate, summary.length_controlled
    return {
        "round": round_.id,
        "status": round_.status,
        "policy": f"v{round_.policy_from} → v{round_.policy_to}" if round_.policy_to is not None else f"v{round_.policy_from} →",
        "ran": round_.optimizer.upper() + (" (auto)" if round_.chosen_by_auto else ""),
        "reward model": f"v{round_.reward_version} ({summary.reward_model_kind})" if summary.reward_model_kind else "",
        "RM accuracy": "" if summary.reward_pairs is None else measured_share(summary.reward_accuracy, summary.reward_pairs),
        "optimizer": _settings(summary),
        "KL to v0": "" if summary.kl is None else f"{summary.kl:.2f}",
        "KL to parent": "" if summary.kl_to_parent is None else f"{summary.kl_to_parent:.2f}",
        "ended": _percent(summary.ended),
        "win rate": "" if win is None or win.rate is None else f"{win.rate:.0%} [{win.low:.0%}, {win.high:.0%}]",
        "length-controlled": "" if lc is None else f"{lc.rate:.0%} [{lc.low:.0%}, {lc.high:.0%}]",
        "votes": 0 if win is None else win.votes,
        "RM on new votes": "" if summary.new_votes_accuracy is None else measured_share(summary.new_votes_accuracy, summary.new_votes_pairs, "votes"),
        "candidates": candidates_text(summary.candidates),
        "why": round_.note or "",
    }


def candidates_text(candidates: list[Candidate]) -> str:
    """The predictor's verdict on a round's candidates in one line: each one's predicted win rate over the round's
    start, the registered one marked."""
    if not candidates:
        return ""
    if all(c.win_rate is None for c in candidates):
        return f"{len(candidates)} trained, not yet rated"
    shown = [f"{c.optimizer.upper()} {c.win_rate:.0%} [{c.low:.0%}, {c.high:.0%}]" + (" registered" if c.chosen else "")
             for c in candidates if c.win_rate is not None]
    return ", ".join(shown) + ("" if any(c.chosen for c in candidates) else "; none registered")


SHOWN_SETTINGS = {
    "ppo": ("steps", "batch_size", "learning_rate", "kl_coef", "target_kl"),
    "dpo": ("pairs", "beta", "votes", "epochs", "batch_size", "learning_rate"),
    "grpo": ("steps", "prompts_per_step", "group_size", "learning_rate", "beta"),
}


def _settings(summary: RoundSummary) -> str:
    if summary.optimizer is None:
        return ""
    shown = ", ".join(f"{k} {summary.settings[k]}" for k in SHOWN_SETTINGS[summary.optimizer] if k in summary.settings)
    if summary.label_smoothing is not None:
        shown += f", label_smoothing {summary.label_smoothing:.2f}" + (" (auto)" if summary.settings.get("label_smoothing") == "auto" else "")
    if summary.pairs is not None:
        shown += f"; trained on {summary.pairs[0]} human pairs and {summary.pairs[1]} ranked by the reward model"
    return f"{summary.optimizer.upper()}: {shown}"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"
