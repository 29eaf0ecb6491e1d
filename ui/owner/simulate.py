"""The loop with simulated annotators: votes from a judge plus noise, then a round, again and again.

The simulated annotators take pairs from the same queue, and vote through the same path, as
people in the app; when the queue runs dry the newest policy answers more prompts. After each
round the judge compares the new policy with the starting one and with its parent on the
evaluation prompts.
"""

import dataclasses
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from annotate.judges import Judge
from annotate.ratings import measured_share
from annotate.simulate import (
    Messages, Votes, cast_votes, expected_agreement, judge_against, last_user_message, noise_for_agreement, within_prompt_margins,
)
from store.jobs import job_metrics, metric_series, round_jobs
from store.policies import Policy, copied_version, get_policy
from store.prompts import prompts_to_generate
from store.reward_models import get_reward_model
from store.rounds import AVERAGE, Round, comparisons_made, list_rounds, round_candidates
from ui.owner.history import RoundSummary, round_history, round_report, round_summary
from ui.owner.jobs import run_to_end
from ui.owner.project import Project, job_dir
from ui.owner.round import run_round
from ui.owner.round_jobs import prompts_to_pair, steers, submit_generation
from ui.owner.round_report import JOB_NAMES


# Judged pairs per round, at the least: at a 60% win rate the Wilson 95% interval of 192 pairs is
# [53%, 67%], so it tells 60% from 50%.
EVAL_PAIRS = 192


@dataclass(frozen=True)
class Simulation:
    judge: Judge
    eval_prompts: list[Messages]  # the judge compares policies on these; keep them apart from the project's prompts
    # T: an annotator prefers A with probability sigmoid((judge(A) - judge(B)) / T). None: the T at which
    # votes on the starting policy's pairs side with the judge `agreement` of the time.
    noise: float | None = None
    agreement: float = 0.7  # the share careful human labellers agree with each other
    annotators: int = 3
    # Votes cast before each round, by its number; the last for every round after it
    labels_per_round: tuple[int, ...] = (96,)
    rounds: int = 3
    eval_samples: int | None = None  # answers per evaluation prompt from each policy; None: EVAL_PAIRS in all at the least
    seed: int = 0
    optimizer: str | None = None  # [round] optimizer when None
    strategy: str | None = None  # [queue] strategy when None
    report: Path | None = None  # where to append each round's figures, one JSON object per line
    judge_candidates: bool = False  # judge every candidate against the round's start, not only the registered or top-rated one
    baseline: int | None = None  # the version every round's win rate is measured over; None: the one serving at the start

    @property
    def answers_per_prompt(self) -> int:
        return self.eval_samples or math.ceil(EVAL_PAIRS / len(self.eval_prompts))

    def labels_before(self, number: int) -> int:
        """The votes cast before round `number` (from 1) of the project."""
        return self.labels_per_round[min(number, len(self.labels_per_round)) - 1]


def simulate(project: Project, sim: Simulation, say: Callable[[str], None]) -> None:
    """Run sim.rounds rounds, saying what each did; at the end the last round's pairs get votes too, and the round table
    follows. With 0 rounds, the next round's sim.labels_per_round votes on the starting policy's answers and nothing more.

    On a project with rounds already it goes on from them: the votes cast since the last done round began count
    towards the next, and with sim.baseline = 0 the win rates stay over v0, so a long run cut off goes on where it stopped."""
    if sim.strategy is not None:
        queue = dataclasses.replace(project.config.queue, strategy=sim.strategy)
        project = dataclasses.replace(project, config=dataclasses.replace(project.config, queue=queue))
    rng = random.Random(sim.seed)
    names = [f"simulated-{i}" for i in range(1, sim.annotators + 1)]
    prompts = sim.eval_prompts
    start = project.run(get_policy, None)
    base = start.version if sim.baseline is None else project.run(get_policy, sim.baseline).version
    per_prompt = sim.answers_per_prompt
    evaluated: dict[int, list] = {}
    # Each version's KL to v0 as the round measured it when it registered the version, on the predictor's answers: the
    # measure [round] kl_budget holds. Measuring it again on the evaluation answers took a third of the bench's time.
    kl_to_v0: dict[int, float | None] = {0: 0.0} | {
        s.round.policy_to: s.kl for s in round_history(project.run) if s.round.policy_to is not None}

    def answers_of(version: int) -> list:
        """A version's evaluation answers, sampled once: a rollback's copy answers as the version it copies."""
        if version not in evaluated:
            copied = project.run(copied_version, version)
            evaluated[version] = answers_of(copied) if copied is not None else sample_answers(
                project, project.run(get_policy, version), prompts, per_prompt, sim.seed, kl=False)[0]
        return evaluated[version]

    def kl_of(version: int) -> float | None:
        copied = project.run(copied_version, version)
        return kl_of(copied) if copied is not None else kl_to_v0.get(version)

    say(f"sampling {per_prompt} answers from v{base} to each of {len(prompts)} evaluation prompts")
    baseline = answers_of(base)
    say(f"round 0: policy v{base}, judge mean score "
        f"{judge_against(sim.judge, prompts, _texts(baseline), _texts(baseline)).mean_score:.3f}, {_ended(baseline)} of its answers ended")
    sim = with_noise(sim, within_prompt_margins(sim.judge, prompts, _texts(baseline)), base, say)

    done = len(_done_rounds(project))
    for number in range(done + 1, done + sim.rounds + 1):
        seconds: Counter = Counter()
        began = time.monotonic()
        votes = _cast(project, sim, names, rng, seconds, labels=max(sim.labels_before(number) - _untrained_votes(project), 0))
        round_ = run_round(project, optimizer=sim.optimizer, seconds=seconds)
        clock = time.monotonic()
        summary = round_summary(project.run, round_.id)
        served = round_.policy_to if round_.policy_to is not None else round_.policy_from
        if round_.policy_to is not None:
            kl_to_v0[round_.policy_to] = summary.kl
        answers, kl = answers_of(served), kl_of(served)
        start_answers = answers_of(round_.policy_from)
        follows = None if round_.reward_version is None else reward_model_follows_judge(project, round_.reward_version, sim.judge, prompts, answers)
        seconds["evaluation"] += time.monotonic() - clock
        clock = time.monotonic()
        candidates = _judged_candidates(project, sim, round_, start_answers, answers)
        seconds["judging candidates"] += time.monotonic() - clock
        over_v0 = judge_against(sim.judge, prompts, _texts(answers), _texts(baseline))
        over_start = judge_against(sim.judge, prompts, _texts(answers), _texts(start_answers))
        outcome = (f"policy v{served}: judge win rate over v{base} {over_v0.win_rate:.1%} [{over_v0.low:.1%}, {over_v0.high:.1%}] on "
                   f"{over_v0.pairs} answers, over v{round_.policy_from} {over_start.win_rate:.1%} [{over_start.low:.1%}, {over_start.high:.1%}]"
                   if round_.policy_to is not None else f"no version registered: v{served} serves on")
        say(
            f"round {number}: {votes.cast} votes, {_share(votes.agreement)} of them sided with the noiseless judge "
            f"({_share(votes.ceiling)} expected); "
            f"{training_summary(project, summary)}; {outcome}, "
            f"judge mean score {over_v0.mean_score:.3f}, KL to v0 {'unmeasured' if kl is None else f'{kl:.2f}'}, {_ended(answers)} of its answers ended"
            + ("" if follows is None else f"; on them the reward model's score correlates {follows:.2f} with the judge's within a prompt")
        )
        for c in candidates:
            say(f"  candidate job {c['job']} ({c['optimizer'].upper()}" + ("" if c["seed"] is None else f", seed {c['seed']}") + "): "
                + ("" if c["predicted"] is None else f"predicted {c['predicted']:.1%} [{c['low']:.1%}, {c['high']:.1%}] over "
                                                     f"v{round_.policy_from}, KL to v0 {c['kl_to_v0']:.2f}; ")
                + (f"judge {c['judge_over_start']:.1%} over v{round_.policy_from}; " if c["judge_over_start"] is not None else "")
                + c["verdict"])
        took = time.monotonic() - began
        memory = peak_memory(project, round_.id, round_.optimizer)
        say(f"round {number} took {took:.0f} s: " + ", ".join(f"{stage} {s:.0f} s" for stage, s in seconds.items())
            + "; peak resident memory " + ", ".join(f"{job} {gb['measured']:.2f} GB (expected {gb['expected']:.2f})" for job, gb in memory.items()))
        if sim.report is not None:
            figures = {"round": number, "optimizer": round_.optimizer, "why": round_.note, "label_smoothing": summary.label_smoothing,
                       "strategy": project.config.queue.strategy, "start": round_.policy_from, "registered": round_.policy_to is not None,
                       "policy": served, "votes": votes.cast, "reward_model_follows_judge": follows,
                       "noise": sim.noise, "agreement": votes.agreement, "expected_agreement": votes.ceiling,
                       "win_rate": over_v0.win_rate, "low": over_v0.low, "high": over_v0.high, "pairs": over_v0.pairs,
                       "over_start": over_start.win_rate, "over_start_low": over_start.low, "over_start_high": over_start.high,
                       "mean_score": over_v0.mean_score, "kl_to_v0": kl, "ended": sum(a.finished for a in answers) / len(answers),
                       "candidates": candidates, "seconds": took, "stages": dict(seconds), "peak_memory_gb": memory}
            with sim.report.open("a", encoding="utf-8") as f:
                f.write(json.dumps(figures) + "\n")
    # People's verdict on the last round comes from votes on its new-against-old pairs: cast them too. With no rounds
    # the votes are the run, on the starting policy's answers, as a team collects them before it trains once.
    votes = _cast(project, sim, names, rng, Counter(), labels=sim.labels_before(done + sim.rounds + 1), generate_more=sim.rounds == 0)
    if sim.rounds == 0:
        say(f"{votes.cast} votes on v{start.version}'s answers, {_share(votes.agreement)} of them sided with the noiseless judge")
    say("the rounds as people (the simulated annotators) saw them:")
    for line in round_report(project.run, project.config):
        say(line)


def _judged_candidates(project: Project, sim: Simulation, round_: Round, start_answers: list, registered_answers: list) -> list[dict]:
    """The round's candidates with the predictor's figures and the judge's win rate over the round's start on the
    evaluation prompts: the registered one's from its answers, and the one the predictor rated best where none was
    registered (what the round would have served without the predictor); every one's with sim.judge_candidates."""
    candidates = project.run(round_candidates, round_.id)
    rated = [c for c in candidates if c.win_rate is not None]
    top = max(rated, key=lambda c: c.win_rate).job if rated else None
    judged = []
    for c in candidates:
        over_start = None
        if c.chosen:
            over_start = judge_against(sim.judge, sim.eval_prompts, _texts(registered_answers), _texts(start_answers)).win_rate
        elif sim.judge_candidates or c.job == top and round_.policy_to is None:
            folder = job_dir(project, c.job) / (AVERAGE if c.optimizer == AVERAGE else "policy")
            answers, _ = sample_answers(project, folder, sim.eval_prompts, sim.answers_per_prompt, sim.seed, kl=False)
            over_start = judge_against(sim.judge, sim.eval_prompts, _texts(answers), _texts(start_answers)).win_rate
        judged.append({"job": c.job, "optimizer": c.optimizer, "seed": c.seed, "predicted": c.win_rate, "low": c.low, "high": c.high,
                       "kl_to_v0": c.kl_to_v0, "chosen": c.chosen, "top": c.job == top, "verdict": c.verdict,
                       "judge_over_start": over_start})
    return judged


def with_noise(sim: Simulation, margins: list[float], version: int, say: Callable[[str], None]) -> Simulation:
    """The simulation with its noise T: as given, or the T at which votes on these pairs (the starting policy's) side
    with the judge sim.agreement of the time where it tells them apart; saying which, and the agreement expected of it."""
    pairs = f"v{version}'s {len(margins)} pairs of answers to the same evaluation prompt"
    if sim.noise is not None:
        expected = f": votes on {pairs} would side with the judge {expected_agreement(margins, sim.noise):.1%} of the time" if margins else ""
        say(f"noise T = {sim.noise:g}, as given{expected}")
        return sim
    noise = noise_for_agreement(margins, sim.agreement)
    ties = sum(m == 0 for m in margins) / len(margins)
    say(f"noise T = {noise:.3g}: at it votes on {pairs} side with the judge {sim.agreement:.1%} of the time where it tells "
        f"them apart ({ties:.0%} are tied; on all, {expected_agreement(margins, noise):.1%}, a vote on a tie siding with it half the time)")
    return dataclasses.replace(sim, noise=noise)


def _done_rounds(project: Project) -> list[Round]:
    return [r for r in project.run(list_rounds) if r.status == "done"]


def _untrained_votes(project: Project) -> int:
    """Votes cast since the last done round began (or ever, before any): those a cut-off run cast on its last round's
    pairs, or for the round the cut failed, which the next round trains on instead."""
    done = _done_rounds(project)
    return project.run(comparisons_made) - (done[-1].comparisons_at_start if done else 0)


def _cast(project: Project, sim: Simulation, names: list[str], rng: random.Random, seconds: Counter, labels: int,
          generate_more: bool = True) -> Votes:
    """Up to `labels` votes; when the queue runs dry the newest policy answers the prompts again, unless told not to."""
    began = time.monotonic()
    votes = cast_votes(project.run, project.config.queue, sim.judge, sim.noise, names, labels, rng)
    seconds["votes"] += time.monotonic() - began
    while generate_more and votes.cast < labels:
        began = time.monotonic()
        prompts = prompts_to_pair(project, project.run, project.run(get_policy, None).version)
        per_prompt = _completions_per_prompt(project, labels - votes.cast, len(prompts))
        run_to_end(project, submit_generation(project, project.run, per_prompt=per_prompt, prompts=prompts), "more pairs")
        seconds["more pairs"] += time.monotonic() - began
        began = time.monotonic()
        before = votes.cast
        cast_votes(project.run, project.config.queue, sim.judge, sim.noise, names, labels - votes.cast, rng, votes)
        seconds["votes"] += time.monotonic() - began
        if votes.cast == before:
            break
    return votes


def _completions_per_prompt(project: Project, votes: int, prompts: int) -> int:
    """Completions of each of `prompts` prompts that make pairs enough for `votes` more votes, in one generation
    job: each job loads the model again, and a pair per prompt at a time took several."""
    queue = project.config.queue
    votes_per_pair = 1 + queue.overlap_share * (queue.overlap_votes - 1)
    return 2 * math.ceil(votes / votes_per_pair / max(prompts, 1))


def training_summary(project: Project, summary: RoundSummary) -> str:
    """What a round's training did, in words: DPO, or the reward model and PPO or GRPO; after what the round decided on
    its own, where it did."""
    return "; ".join(filter(None, [summary.round.note, _trained(project, summary)]))


def _trained(project: Project, summary: RoundSummary) -> str:
    """What the registered candidate's training did; the reward model alone when the round registered none."""
    round_ = summary.round
    reward_model = f"reward model v{round_.reward_version} held-out accuracy {measured_share(summary.reward_accuracy, summary.reward_pairs)}{_on_new_votes(project, round_)}"
    if summary.policy_job is None:
        return reward_model
    # The average has no training of its own: what its first candidate's did stands for it, and says so.
    first = "its first candidate's " if summary.registered_average else ""
    if summary.optimizer == "dpo":
        pairs = project.run(job_metrics, summary.policy_job)
        robust = f"robust DPO (label_smoothing {summary.label_smoothing:.2f})" if summary.label_smoothing else "DPO"
        steps = len(project.run(metric_series, summary.policy_job, "accuracy"))
        trained = (f"{robust} on {pairs['pairs']:.0f} pairs ({pairs['pairs_too_long']:.0f} too long), margin {summary.margin:+.3f} and "
                   f"accuracy {_share(summary.pair_accuracy)} on average over its {steps} steps")
        withheld = "" if summary.pairs[1] or steers(project.run(get_reward_model, round_.reward_version), project.config.reward_model) \
            else " (it does not steer yet)"
        return f"{reward_model}; {first}{trained}: {summary.pairs[0]} human pairs and {summary.pairs[1]} ranked by the reward model{withheld}"
    ended = [v for _, v in project.run(metric_series, summary.policy_job, "finished")]
    if summary.optimizer == "grpo":
        kl = project.run(job_metrics, summary.policy_job)["kl_per_token"]
        return (f"{reward_model}; {first}GRPO {len(ended)} steps, score {summary.score_gain:+.3f} from first step to last, "
                f"KL to v0 {kl:.3f} per token, responses ended {ended[0]:.0%} at its first step and {ended[-1]:.0%} at its last")
    last = project.run(job_metrics, summary.policy_job)
    kl = "" if summary.kl_to_parent is None else (  # None: the round registered its candidates' average, not this job's policy
        f", at its last step KL to v0 {last['kl']:.2f} and to v{round_.policy_from} {last['kl_to_start']:.2f} on its batch")
    return f"{reward_model}; {first}PPO {len(ended)} steps{kl}, responses ended {ended[0]:.0%} at its first step and {ended[-1]:.0%} at its last"


def peak_memory(project: Project, round_id: int, optimizer: str) -> dict[str, dict[str, float]]:
    """The peak resident memory in GB of each stage of a round (its largest job of that kind), as its worker measured it
    and as train.runtime.memory expected it for the project's prompts."""
    from train.runtime.memory import GB, round_memory

    prompts = [p.messages for p in project.run(prompts_to_generate, 0, None)]
    expected = {job.job: job.peak / GB for job in round_memory(project.config, optimizer, prompts)[0]}
    measured: dict[str, float] = {}
    for job in project.run(round_jobs, round_id):
        if (gb := project.run(job_metrics, job.id).get("peak_memory_gb")) is not None:  # a failed or cancelled job has none
            measured[JOB_NAMES[job.kind]] = max(measured.get(JOB_NAMES[job.kind], 0.0), gb)
    return {stage: {"measured": gb, "expected": expected[stage]} for stage, gb in measured.items()}


def _on_new_votes(project: Project, round_: Round) -> str:
    """How the reward model the round's one started from scored the votes it had not seen, when it was warm-started."""
    metrics = project.run(get_reward_model, round_.reward_version).metrics
    if metrics.get("new_votes_accuracy") is None:
        return ""
    return f", v{metrics['new_votes_from']} agreed with {_share(metrics['new_votes_accuracy'])} of the {metrics['new_votes_pairs']} new votes"


def sample_answers(project: Project, policy: Policy | Path, prompts: list[Messages], per_prompt: int, seed: int,
                   kl: bool = True) -> tuple[list, float | None]:
    """per_prompt answers (train.policy.generate.Generated) to each prompt from a policy version (or the adapter in a folder),
    grouped by prompt, the same seed for every version; and, where `kl`, the policy's KL to the base on them."""
    from train.common.models import decode_steps_for, load_model
    from train.policy.generate import generate, kl_to_base  # torch and transformers take seconds to import

    config = dataclasses.replace(project.config.generation, per_prompt=per_prompt, seed=seed)
    if isinstance(policy, Path):
        adapter = str(policy)
    else:
        adapter = str(project.root / policy.adapter_path) if policy.adapter_path else None
    steps = decode_steps_for(len(prompts) * per_prompt, config.batch_size, config.max_new_tokens)
    model, tokenizer = load_model(project.config.model, adapter, steps)
    answers = generate(model, tokenizer, prompts, config)
    if not kl:
        return answers, None
    if adapter is None or config.temperature == 0:  # the base itself, or greedy answers that are no sample of it
        return answers, 0.0 if adapter is None else float("nan")
    return answers, kl_to_base(model, tokenizer, prompts, answers, config.temperature, config.batch_size)


def reward_model_follows_judge(project: Project, version: int, judge: Judge, prompts: list[Messages], answers: list) -> float | None:
    """How closely a reward model's scores of a policy's answers follow the noiseless judge's: their Pearson
    correlation within each prompt (both less the prompt's mean: a Bradley-Terry reward is blind to a prompt's
    offset). None where either does not vary."""
    from train.common.models import resolve_model_path  # torch and transformers take seconds to import
    from train.reward.versions import load_reward_model

    base = project.config.model
    reward_model = load_reward_model(resolve_model_path(base.name_or_path), project.root / project.run(get_reward_model, version).adapter_path, base)
    per_prompt = len(answers) // len(prompts)
    asked = [prompts[i // per_prompt] for i in range(len(answers))]
    rewards = reward_model.score(asked, _texts(answers), project.config.reward_model.batch_size * 2)
    judged = [judge(last_user_message(prompt), a.text) for prompt, a in zip(asked, answers)]
    xs, ys = _within_prompt(rewards, per_prompt), _within_prompt(judged, per_prompt)
    spread = math.sqrt(sum(x * x for x in xs) * sum(y * y for y in ys))
    return None if spread == 0 else sum(x * y for x, y in zip(xs, ys)) / spread


def _within_prompt(values: list[float], per_prompt: int) -> list[float]:
    """Each value less the mean of its prompt's (values come grouped by prompt, per_prompt each)."""
    centred = []
    for start in range(0, len(values), per_prompt):
        group = values[start : start + per_prompt]
        centred += [v - sum(group) / len(group) for v in group]
    return centred


def _texts(answers: list) -> list[str]:
    return [a.text for a in answers]


def _ended(answers: list) -> str:
    return f"{sum(a.finished for a in answers) / len(answers):.0%}"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"
