"""The Loop view: start, watch and cancel rounds, schedule them, judge each by people's votes, and roll back.

The round table shows what an operator decides on, each round's verdict; how a round ran (its
reward model, optimiser and settings) is one click away, so the table reads at 1280 px.
"""

import gradio as gr
import pandas as pd

from store.jobs import get_job, metric_series
from store.reward_models import list_reward_models
from store.rounds import current_job_id, get_round, running_round
from store.stats import votes_before_versions
from train.runtime.jobdir import read_events
from ui.owner.config import OPTIMIZERS
from ui.owner.history import RoundSummary, describe, ratings, reward_model_note, round_history, round_warnings
from ui.owner.project import job_dir
from ui.owner.rollback import roll_back
from ui.owner.round import start_round
from ui.owner.round_report import JOB_NAMES
from ui.owner.server import Server
from ui.web.common import QUIET, progress_bar, refused, rounded, user_errors, whole_number, with_error_ids

# The round table's columns (keys of ui.owner.history.describe) with their headers: people's verdict on each round.
ROUND_COLUMNS = [
    ("round", "round"), ("policy", "policy"), ("ran", "optimiser"), ("win rate", "win rate [95% CI]"), ("length-controlled", "length-controlled [95% CI]"),
    ("votes", "votes"), ("KL to v0", "KL to v0"), ("ended", "responses ended in training"),
]
# How each round ran, in a second table one click away; the long settings text last.
SETTINGS_COLUMNS = [
    ("round", "round"), ("status", "status"), ("reward model", "reward model"), ("RM accuracy", "RM accuracy"),
    ("RM on new votes", "RM accuracy on new votes"), ("KL to parent", "KL to parent at PPO's last step"), ("optimizer", "optimizer and settings"),
    ("candidates", "candidates, predicted win rate over the start"), ("why", "why it ran so"),
]
# Each candidate of the shown round, and the predictor's verdict on it.
CANDIDATE_COLUMNS = ["job", "optimiser", "seed", "predicted win rate over the start [interval]", "KL to v0", "answers ended", "verdict"]
# The reward-model choice that starts a round by training a new one.
NEW_REWARD_MODEL = ("a new one, trained on every vote so far", 0)

# The statistics the view plots per step of each optimiser, with their titles.
CURVES = {
    "ppo": {
        "score": "Reward-model score",
        "kl": "KL to the starting model (v0)",
        "kl_to_start": "KL to the version PPO started from",
        "finished": "Share of responses that ended",
        "entropy": "Entropy",
        "response_length": "Response length (tokens)",
    },
    "dpo": {
        "loss": "DPO loss",
        "margin": "Implicit reward margin, chosen minus rejected",
        "accuracy": "Share of pairs whose chosen answer has the larger implicit reward",
        "chosen_reward": "Implicit reward of the chosen answers",
        "rejected_reward": "Implicit reward of the rejected answers",
    },
    "grpo": {
        "score": "Reward-model score, penalties included",
        "score_std": "Standard deviation of the scores",
        "kl_per_token": "KL to the starting model (v0), per token",
        "finished": "Share of responses that ended",
        "response_length": "Response length (tokens)",
        "clip_ratio": "Share of tokens whose ratio was clipped",
    },
}
PLOTS = max(len(curves) for curves in CURVES.values())


def build_loop(server: Server, timer: gr.Timer, app: gr.Blocks) -> None:
    """The view, top to bottom: the running round's line, the rounds, the controls, and one round's training. It loads
    when the page loads for an operator, when opened, and whenever the round's status line changes."""

    @with_error_ids
    def show_rounds(shown_round: int | None, request: gr.Request) -> tuple:
        server.operator(request.username)
        return loop_view(server, shown_round)

    @with_error_ids
    def show_rounds_at_load(shown_round: int | None, request: gr.Request) -> tuple:
        """At page load: the view for an operator, and nothing for anyone else, who never sees it."""
        if server.user(request.username).role != "operator":
            return tuple(gr.skip() for _ in outputs)
        return loop_view(server, shown_round)

    with gr.Tab("Loop") as tab:
        status, cancel, refresh = _round_line(server, timer)
        tables = _round_tables()
        reward_version = _round_controls(server, cancel)
        shown, samples, candidates, plots = _round_training()

    outputs = [*tables, shown, samples, candidates, reward_version, *plots]  # loop_view's order
    refresh.click(show_rounds, inputs=[shown], outputs=outputs, api_name="rounds", api_visibility="undocumented")
    shown.input(show_rounds, inputs=[shown], outputs=outputs, api_visibility="undocumented")
    tab.select(show_rounds, inputs=[shown], outputs=outputs, **QUIET)
    app.load(show_rounds_at_load, inputs=[shown], outputs=outputs, api_visibility="private", show_progress="hidden")
    # The status line changes when a round starts, moves on or ends: the tables follow it (the cancel button too, in
    # _round_line).
    status.change(show_rounds, inputs=[shown], outputs=outputs, **QUIET)


def _round_line(server: Server, timer: gr.Timer) -> tuple[gr.Textbox, gr.Button, gr.Button]:
    """The running round's status line, kept current by the timer, with the cancel and refresh buttons."""

    @with_error_ids
    def round_status(request: gr.Request) -> str:
        """One line on the running round, if any, and the scheduler."""
        server.operator(request.username)
        every = server.project.config.round.every_comparisons
        schedule = f"the scheduler starts a round every {every} new comparisons" if every else "the scheduler is off"
        if every and (waiting := server.jobs.scheduler_waiting):  # a Textbox shows it as text: nothing to escape
            schedule += f", but {waiting}"
        round_ = server.db(running_round)
        if round_ is None:
            return f"No round running; {schedule}."
        job_id = server.db(current_job_id, round_.id)
        if job_id is None:  # between one job's end and the next one's start
            return f"Round {round_.id} from policy v{round_.policy_from}: queuing its next step; {schedule}."
        job = server.db(get_job, job_id)
        latest = server.jobs.latest_progress.get(job.id, {})
        step = f", step {latest['step']}/{latest['total_steps']}" if job.status == "running" and "step" in latest else ""
        return (f"Round {round_.id} from policy v{round_.policy_from}: {JOB_NAMES[job.kind]} (job {job.id}) {job.status} "
                f"{progress_bar(job.progress)}{step}; {schedule}.")

    @with_error_ids
    def cancel_usable(request: gr.Request) -> dict:
        """The cancel button acts only while a round runs."""
        server.operator(request.username)
        return gr.update(interactive=server.db(running_round) is not None)

    with gr.Row(equal_height=True):
        status = gr.Textbox(label="Round", interactive=False, scale=4)
        cancel = gr.Button("Cancel the round", variant="stop", interactive=False, scale=1)  # usable while a round runs
        refresh = gr.Button("Refresh", scale=1)
    timer.tick(round_status, outputs=[status], api_name="round_status", **QUIET)
    status.change(cancel_usable, outputs=[cancel], **QUIET)
    return status, cancel, refresh


def _round_tables() -> list[gr.Component]:
    """The rounds, newest first: people's verdict on each, how each ran, the versions' ratings and the warnings; filled
    by loop_view."""
    history = gr.Dataframe(
        headers=[header for _, header in ROUND_COLUMNS],
        label="Rounds, newest first: the human win rate of each new policy over the one it started from, "
              "also at equal length (a logistic model of the votes with the length difference as a covariate)",
        interactive=False,
    )
    with gr.Accordion("Settings of each round", open=False):
        # Widths set, or the settings text takes the width and squeezes the short columns to a letter.
        settings = gr.Dataframe(
            headers=[header for _, header in SETTINGS_COLUMNS], label="How each round ran, newest first", interactive=False, wrap=True,
            column_widths=["5%", "6%", "7%", "8%", "9%", "6%", "20%", "19%", "20%"],
        )
    with gr.Row():
        scores = gr.Dataframe(headers=["policy", "rating"], label="Bradley-Terry ratings from cross-version votes (v0 = 1000)",
                              interactive=False, scale=1)
        warnings = gr.Textbox(label="The reward model in use, and warnings", lines=4, interactive=False, scale=3)
    curve = gr.LinePlot(x="votes cast", y="rating", tooltip=["version", "votes cast", "rating"], x_title="people's votes cast before the version",
                        y_title="people's rating (Bradley-Terry, v0 = 1000)", label="Each version's rating by people against the votes cast so far")
    return [history, settings, scores, warnings, curve]


def _round_controls(server: Server, cancel: gr.Button) -> gr.Dropdown:
    """Start a round, schedule rounds, roll back, and cancel the running round (`cancel`, on the status line), each
    saying what it did in one result line; the reward-model choice, which loop_view keeps current."""

    @with_error_ids
    def start(reward_version: float | None, optimizer: str | None, request: gr.Request) -> str:
        server.operator(request.username)
        version = whole_number(reward_version)
        if reward_version is not None and version is None:
            raise refused("Choose the round's reward model from the list.")
        with user_errors():
            round_id, job = start_round(server.project, server.db, reward_version=version or None, read=server.snapshot, optimizer=optimizer)
        if job is None:
            return f"Round {round_id} trained nothing: {server.db(get_round, round_id).note}."
        return f"Started round {round_id}: its first job is {job.id} ({JOB_NAMES[job.kind]})."

    @with_error_ids
    def cancel_round(request: gr.Request) -> str:
        server.operator(request.username)
        return f"Cancelled round {server.cancel_round()}."

    @with_error_ids
    def set_schedule(every: float | None, request: gr.Request) -> str:
        """Change [round] every_comparisons, now and in tether.toml."""
        server.operator(request.username)
        if (every := whole_number(every)) is None:
            raise refused("The number of comparisons must be a whole number, 0 or more.")
        server.set_schedule(every)
        return f"A round starts every {every} new comparisons." if every else "The scheduler is off."

    @with_error_ids
    def rollback(version: float | None, request: gr.Request) -> str:
        """Register a copy of an earlier policy version as the newest, so the next round starts from it."""
        server.operator(request.username)
        if (version := whole_number(version)) is None:
            raise refused("Give the policy version to roll back to: a whole number, 0 or more.")
        with user_errors():
            policy = roll_back(server.project, server.db, version)
        return f"Rolled back: policy v{policy.version} is a copy of v{version}, and the next round starts from it."

    with gr.Row():
        # allow_custom_value: a version registered since the page loaded is still accepted; the server checks it.
        reward_version = gr.Dropdown(label="Reward model for the round", choices=[NEW_REWARD_MODEL], value=NEW_REWARD_MODEL[1],
                                     allow_custom_value=True)
        # The server refuses any other value, whatever a client sends.
        optimizer = gr.Radio(label="Optimiser", choices=[(name.upper(), name) for name in OPTIMIZERS],
                             value=server.project.config.round.optimizer)
        start_button = gr.Button("Start a round", variant="primary")
    with gr.Row():
        every = gr.Number(label="Start a round every N new comparisons (0: off)", precision=0, minimum=0)
        save_every = gr.Button("Save the schedule")
        rollback_version = gr.Number(label="Policy version to roll back to (a copy becomes the newest; nothing is deleted)",
                                     precision=0, minimum=0)
        rollback_button = gr.Button("Roll back")
    result = gr.Textbox(label="Result", interactive=False)
    start_button.click(start, inputs=[reward_version, optimizer], outputs=[result], api_name="start_round", api_visibility="undocumented")
    cancel.click(cancel_round, outputs=[result], api_name="cancel_round", api_visibility="undocumented")
    save_every.click(set_schedule, inputs=[every], outputs=[result], api_name="set_schedule", api_visibility="undocumented")
    rollback_button.click(rollback, inputs=[rollback_version], outputs=[result], api_name="rollback", api_visibility="undocumented")
    return reward_version


def _round_training() -> tuple[gr.Dropdown, gr.Dataframe, gr.Dataframe, list[gr.LinePlot]]:
    """One round's training, the newest unless chosen: the round to show, its curves, its samples and its candidates;
    filled by loop_view."""
    shown = gr.Dropdown(label="Training steps of round", choices=[])
    plots = []
    for row in (range(3), range(3, PLOTS)):
        with gr.Row():
            plots += [gr.LinePlot(x="step", y="value", show_label=True) for _ in row]
    # Titled and shown by loop_view for a round whose optimiser logged samples.
    samples = gr.Dataframe(headers=["step", "prompt", "response", "score"], interactive=False, wrap=True, visible=False)
    candidates = gr.Dataframe(headers=CANDIDATE_COLUMNS, interactive=False, wrap=True, visible=False)
    return shown, samples, candidates, plots


def loop_view(server: Server, shown_round: int | None) -> tuple:
    """The round table and the settings of each round, the ratings, the warnings, the ratings against the votes cast,
    and the training curves and samples of one round (the newest unless chosen), in build_loop's order of outputs."""
    history = round_history(server.db)
    rows = [describe(summary) for summary in reversed(history)]
    table = [[row[key] for key, _ in ROUND_COLUMNS] for row in rows]
    settings = [[row[key] for key, _ in SETTINGS_COLUMNS] for row in rows]
    rated, before = ratings(server.db), server.db(votes_before_versions)
    scores = [[f"v{v}", round(r)] for v, r in sorted(rated.items(), key=lambda item: -item[1])]
    curve = pd.DataFrame([(f"v{v}", before[v], round(r)) for v, r in sorted(rated.items()) if v in before],
                         columns=["version", "votes cast", "rating"])  # where each version stands on the learning curve
    length = server.project.config.length_warning()
    note = reward_model_note(server.db, server.project.config.reward_model)
    warnings = "\n".join(([note] if note else []) + ([length] if length else []) + round_warnings(server.db, history, server.project.config.round.start_from)) or "None."
    trained = [summary for summary in history if _curves_job(summary) is not None]
    shown = next((s for s in trained if s.round.id == shown_round), trained[-1] if trained else None)
    choice = gr.update(choices=[s.round.id for s in trained], value=shown.round.id if shown else None)
    reward_choices = gr.update(choices=[NEW_REWARD_MODEL] + [(f"v{rm.version}", rm.version) for rm in server.db(list_reward_models)])
    return (table, settings, scores, warnings, curve, choice, _samples(server, shown), _candidates(shown), reward_choices, *_plots(server, shown))


def _curves_job(summary: RoundSummary) -> tuple[int, str] | None:
    """The training job whose curves stand for a round, and its optimiser: the candidate it registered, else the one the
    predictor rated best, else its first; a round from before candidates, its one policy job."""
    if summary.policy_job is not None:
        return summary.policy_job, summary.optimizer
    rated = sorted(summary.candidates, key=lambda c: -1 if c.win_rate is None else -c.win_rate)
    return (rated[0].job, rated[0].optimizer) if rated else None


def _candidates(shown: RoundSummary | None) -> dict:
    """The shown round's candidates, with the predictor's figures and verdict on each; hidden for a round without."""
    if shown is None or not shown.candidates:
        return gr.update(value=[], visible=False)
    rows = [[c.job, c.optimizer.upper(), "" if c.seed is None else c.seed, "" if c.win_rate is None else f"{c.win_rate:.0%} [{c.low:.0%}, {c.high:.0%}]",
             rounded(c.kl_to_v0, 2), "" if c.ended is None else f"{c.ended:.0%}", c.verdict or "not yet rated"] for c in shown.candidates]
    return gr.update(value=rows, label=f"Candidates of round {shown.round.id}, from v{shown.round.policy_from}", visible=True)


def _plots(server: Server, shown: RoundSummary | None) -> list[dict]:
    """The shown round's optimiser's curves, one plot each; the plots left over are hidden."""
    job, optimizer = _curves_job(shown) if shown else (None, None)
    curves = CURVES[optimizer] if shown else {}
    steps = _steps(server, job, list(curves)) if shown else pd.DataFrame()
    plots = [gr.update(value=steps[["step", name]].rename(columns={name: "value"}), label=title, visible=True)
             for name, title in curves.items()]
    return plots + [gr.update(value=pd.DataFrame(columns=["step", "value"]), visible=False)] * (PLOTS - len(plots))


def _steps(server: Server, job_id: int, names: list[str]) -> pd.DataFrame:
    """A training job's per-step statistics: from the database once it is done, from its worker's events while it runs."""
    job = server.db(get_job, job_id)
    if job.status == "done":
        series = {name: dict(server.db(metric_series, job.id, name)) for name in names}
        rows = [{"step": step, **{name: series[name].get(step) for name in names}} for step in sorted(series[names[0]])]
    else:
        events = read_events(job_dir(server.project, job.id), 0)[0]
        rows = [{"step": e["step"], **{name: e.get(name) for name in names}} for e in events if "step" in e]
    return pd.DataFrame(rows, columns=["step", *names])


def _samples(server: Server, shown: RoundSummary | None) -> dict:
    """The responses the shown round's optimiser logged at its latest step, with their scores, under a title
    that names it. Only PPO logs samples: for a DPO or GRPO round, or before PPO's first step, the table is hidden."""
    if shown is None:
        return gr.update(value=[], visible=False)
    job, optimizer = _curves_job(shown)
    events = read_events(job_dir(server.project, job), 0)[0]
    latest = next((e for e in reversed(events) if "samples" in e), None)
    rows = [[latest["step"], s["prompt"], s["response"], rounded(s["score"], 3)] for s in latest["samples"]] if latest else []
    label = f"Responses sampled at {JOB_NAMES[optimizer]}'s latest step, round {shown.round.id}"
    return gr.update(value=rows, label=label, visible=bool(rows))
