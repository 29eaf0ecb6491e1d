"""The Gradio app: the annotate view for everyone, the operator views for operators.

This process is the database's one writer: every read and write goes through `Server.db`,
which serialises them on one connection. Handlers come first, the layout after them.
"""

import functools
import html
import json
import secrets
import shutil
import signal
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
import pandas as pd
from starlette.middleware import Middleware

from annotate.agreement import fleiss_kappa, percent_agreement
from annotate.export import export_preferences
from annotate.queue import Action
from store import StoreError
from store.db import NotSaved, utcnow
from store.prompts import import_prompt_file
from store.queue import Assignment
from store.rounds import current_job_id, running_round
from store.jobs import get_job, list_jobs, metric_series
from store.reward_models import list_reward_models
from store.stats import annotator_stats, overlapped_choices
from store.users import ROLES, User, account_events, add_user, list_users, set_disabled, set_password_hash
from train.errors import ModelError
from train.jobdir import log_tail, read_events
from ui.owner import control
from ui.owner.auth import ClientAddress, WeakPassword, hash_new_password
from ui.owner.jobs import JobError, job_dir, submit_generation, submit_reward_training, submit_scoring
from ui.owner.config import OPTIMIZERS
from ui.owner.project import Project
from ui.owner.rounds import STAGES, describe, ratings, roll_back, round_history, round_warnings, start_round
from ui.owner.server import Refused, Server

# Screen choice, button label, key. The keys are shown on the buttons and read by KEYS_JS.
CHOICES = [
    ("left", "A is better", "1"),
    ("right", "B is better", "2"),
    ("tie", "Tie", "3"),
    ("both_bad", "Both are bad", "4"),
]
SKIP_KEY = "5"
STRENGTHS = {"slightly better": "slight", "much better": "much"}

KEYS_JS = """
<script>
document.addEventListener("keydown", (event) => {
  const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(event.target.tagName) || event.target.isContentEditable;
  if (typing || event.ctrlKey || event.metaKey || event.altKey) return;
  const button = document.getElementById("key-" + event.key);
  if (button) { event.preventDefault(); button.click(); }
});
</script>
"""

CSS = """
.tether-turn { margin: 0 0 .6em 0; }
.tether-role { font-weight: 600; font-size: .85em; text-transform: uppercase; opacity: .7; }
.tether-text { white-space: pre-wrap; overflow-wrap: anywhere; font-family: inherit; margin: .2em 0 0 0; }
.tether-side { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: .8em; min-height: 8em; }
.tether-side h3 { margin: 0 0 .4em 0; }
"""


# The round history's columns in the Loop tab (keys of ui.owner.rounds.describe), with their headers: what
# people think of each round first, the long training settings last, so a narrow screen shows the verdict.
ROUND_COLUMNS = [
    ("round", "round"), ("status", "status"), ("policy", "policy"), ("win rate", "win rate [95% CI]"),
    ("length-controlled", "length-controlled [95% CI]"), ("votes", "votes"), ("reward model", "reward model"),
    ("RM accuracy", "RM accuracy"), ("RM on new votes", "RM accuracy on new votes"), ("KL to v0", "KL to v0"),
    ("KL to parent", "KL to parent"), ("ended", "responses ended in training"), ("optimizer", "optimizer and settings"),
]
# The reward-model choice that starts a round by training a new one.
NEW_REWARD_MODEL = ("a new one, trained on every vote so far", 0)
DATA_REFRESH_SECONDS = 10
ANNOTATE_EVENT = dict(queue=False, preprocess=False, postprocess=False, show_progress="hidden", api_visibility="undocumented")

# The statistics the Loop tab plots per step of each optimiser, with their titles.
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


def refused(message: str) -> gr.Error:
    """A message for the user that is not a fault of the server: logged without a traceback."""
    return gr.Error(message, print_exception=False)


# ---- rendering: everything from prompts, models and people is escaped ----

def render_prompt(messages_json: str) -> str:
    turns = [
        f'<div class="tether-turn"><div class="tether-role">{html.escape(m["role"])}</div>'
        f'<div class="tether-text">{html.escape(m["content"])}</div></div>'
        for m in json.loads(messages_json)
    ]
    return "".join(turns)


def render_side(label: str, text: str) -> str:
    return f'<div class="tether-side"><h3>{label}</h3><div class="tether-text">{html.escape(text)}</div></div>'


@dataclass
class AnnotateView:
    """What the annotate tab shows, in the order of its output components."""

    token: str
    prompt: str
    left: str
    right: str
    progress: str
    message: str

    def outputs(self) -> tuple:
        # The strength and comment inputs are cleared for the next pair.
        return self.token, self.prompt, self.left, self.right, self.progress, self.message, None, ""

    @staticmethod
    def refusal(message: str) -> tuple:
        """Only the message line changes: the pair, and what was typed, stay on screen to try again."""
        keep = gr.skip()
        return keep, keep, keep, keep, keep, html.escape(message), keep, keep


def with_error_ids(handler: Callable[..., Any]) -> Callable[..., Any]:
    """An unexpected error reaches the user as a short message with an id; its details go to the server log under that id."""

    @functools.wraps(handler)  # Gradio reads the handler's signature for its gr.Request parameter
    def reported(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except gr.Error:
            raise
        except Refused as e:
            raise refused(str(e)) from None
        except Exception as e:
            error_id = secrets.token_hex(4)
            print(f"error {error_id} in {handler.__name__}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            if isinstance(e, NotSaved):  # a full disk, most often: the user should know nothing was recorded
                raise refused(f"The server could not save this, so nothing of it was recorded (error {error_id}). "
                               "Try again in a minute; if it goes on, give your operator this error id.") from None
            raise refused(f"Something went wrong on the server (error {error_id}). Try again; if it goes on, "
                           "give your operator this error id.") from None

    return reported


def _report_unexpected_errors(cls: type) -> type:
    for name, member in list(vars(cls).items()):
        if callable(member) and not name.startswith("_"):
            setattr(cls, name, with_error_ids(member))
    return cls


@_report_unexpected_errors
class Handlers:
    """Every event's handler. Each one finds the caller from the request, on the server."""

    def __init__(self, server: Server):
        self.server = server

    def next_pair(self, request: gr.Request) -> tuple:
        user = self.server.user(request.username)
        return self._then_show(user, Action("serve", user.name))

    def vote(self, choice: str, token: str, strength: str | None, comment: str, request: gr.Request) -> tuple:
        """Store the vote and lease the next pair in one transaction: if it cannot be saved, neither is, and
        the annotator is told; a vote is never stored while its reply is an error."""
        user = self.server.user(request.username)
        return self._then_show(user, Action("vote", user.name, token, choice, STRENGTHS.get(strength or ""), comment))

    def skip_pair(self, token: str, request: gr.Request) -> tuple:
        user = self.server.user(request.username)
        return self._then_show(user, Action("skip", user.name, token))

    def _then_show(self, user: User, action: Action) -> tuple:
        """Act on the queue, then show the pair it leaves on the annotator's screen, with the progress line
        from the queue's counters. A refused vote or skip did nothing: the pair to answer instead is shown, with why."""
        outcome, votes, left = self.server.annotate(action)
        message = outcome.refused
        if message:
            outcome, votes, left = self.server.annotate(Action("serve", user.name))
        return self._show(user, outcome.assignment, votes, left + (outcome.assignment is not None), message)

    def _show(self, user: User, assignment: Assignment | None, votes: int, left: int, message: str) -> tuple:
        progress = f"{html.escape(user.name)}: {_count(votes, 'vote')} today · {_count(left, 'pair')} left"
        message = html.escape(message)
        if assignment is None:
            done = "<p>No pairs are waiting for you. Thank you! Check back later.</p>"
            return AnnotateView("", done, "", "", progress, message).outputs()
        return AnnotateView(
            assignment.token,
            render_prompt(assignment.prompt_messages),
            render_side("A", assignment.left_text),
            render_side("B", assignment.right_text),
            progress,
            message,
        ).outputs()

    def operator_controls(self, request: gr.Request) -> tuple:
        """At sign-in: the operator tab and its refreshes, for operators only."""
        operator = self.server.user(request.username).role == "operator"
        return gr.Tab(visible=operator), gr.Timer(active=operator), gr.Timer(active=operator)

    # Operator handlers: each checks the caller's role before doing anything.

    def operator_data(self, request: gr.Request) -> tuple:
        self.server.operator(request.username)
        # The pair states from the queue's counters; the scans on a snapshot, beside the writer, so
        # that a refresh does not hold up the annotators' votes.
        states = self.server.db(self.server.queue.pair_states, utcnow())
        annotators = [
            [s.name, s.votes, _round(s.median_seconds, 1), _round(s.skip_rate, 3), _round(s.tie_rate, 3)]
            for s in self.server.snapshot(annotator_stats)
        ]
        items = self.server.snapshot(overlapped_choices)
        kappa, agreement = fleiss_kappa(items), percent_agreement(items)
        summary = (
            f"{len(items)} pairs with two or more votes · Fleiss' kappa {_figure(kappa)} · "
            f"raw agreement {_figure(agreement, percent=True)}"
        )
        return [[state, count] for state, count in states.items()], annotators, summary


    def import_prompts(self, upload: str | None, request: gr.Request) -> str:
        self.server.operator(request.username)
        if not upload:
            raise refused("Choose a file first.")
        with user_errors():
            result = self.server.db(import_prompt_file, Path(upload))
        return f"Imported {result.added} prompts ({result.duplicates} already present)."


    def generate_pairs(self, limit: float, per_prompt: float, request: gr.Request) -> str:
        self.server.operator(request.username)
        with user_errors():
            job = submit_generation(self.server.project, self.server.db, int(limit), int(per_prompt))
        return f"Queued job {job.id}: its progress shows under Jobs."

    def job_table(self, request: gr.Request) -> list[list]:
        self.server.operator(request.username)
        rows = []
        for j in self.server.db(list_jobs):
            step = loss = ""
            latest = self.server.jobs.latest_progress.get(j.id, {})
            if j.status == "running" and "step" in latest:
                step, loss = f"{latest['step']}/{latest['total_steps']}", _figure(latest.get("loss"))
            rows.append([j.id, j.kind, j.status, _progress_bar(j.progress), step, loss,
                         j.created_at.strftime("%Y-%m-%d %H:%M:%S"), (j.error or "").split("\n")[0]])
        return rows

    def job_log(self, job_id: float, request: gr.Request) -> str:
        self.server.operator(request.username)
        with user_errors():
            job = self.server.db(get_job, int(job_id))
        return log_tail(job_dir(self.server.project, job.id), lines=40)

    def cancel_job(self, job_id: float, request: gr.Request) -> list[list]:
        self.server.operator(request.username)
        with user_errors():
            self.server.db(get_job, int(job_id))
        self.server.jobs.cancel(int(job_id))
        return self.job_table(request)

    def train_reward_model(self, include_imported: bool, request: gr.Request) -> str:
        self.server.operator(request.username)
        with user_errors():
            job = submit_reward_training(self.server.project, self.server.db, include_imported, read=self.server.snapshot)
        return f"Queued job {job.id}: its progress shows under Jobs."

    def score_completions(self, request: gr.Request) -> str:
        self.server.operator(request.username)
        with user_errors():
            job = submit_scoring(self.server.project, self.server.db)
        return f"Queued job {job.id}: its progress shows under Jobs."

    def reward_models(self, run: int | None, request: gr.Request) -> tuple:
        """The versions with their metrics, and the training curves of one run (the newest unless chosen)."""
        self.server.operator(request.username)
        versions = self.server.db(list_reward_models)
        table = [
            [rm.version, _figure(rm.metrics.get("eval_accuracy"), percent=True), rm.metrics.get("pairs_train"), rm.metrics.get("pairs_eval"),
             rm.metrics.get("truncated"), _round(rm.metrics.get("reward_mean"), 3), _round(rm.metrics.get("reward_std"), 3),
             _round(rm.metrics.get("pairs_per_second"), 2), rm.snapshot[:12]]
            for rm in versions
        ]
        shown = next((rm for rm in versions if rm.version == run), versions[0] if versions else None)
        curves = []
        if shown is not None:
            for name, label in (("loss", "loss"), ("train_accuracy", "batch accuracy")):
                curves += [{"step": step, "value": value, "curve": label} for step, value in self.server.db(metric_series, shown.metrics["job"], name)]
        choice = gr.update(choices=[rm.version for rm in versions], value=shown.version if shown else None)
        return table, choice, pd.DataFrame(curves, columns=["step", "value", "curve"])

    def loop_status(self, request: gr.Request) -> str:
        """One line on the running round, if any, and the scheduler."""
        self.server.operator(request.username)
        every = self.server.project.config.round.every_comparisons
        schedule = f"the scheduler starts a round every {every} new comparisons" if every else "the scheduler is off"
        round_ = self.server.db(running_round)
        if round_ is None:
            return f"No round running; {schedule}."
        job_id = self.server.db(current_job_id, round_.id)
        if job_id is None:  # between one job's end and the next one's start
            return f"Round {round_.id} from policy v{round_.policy_from}: queuing its next step; {schedule}."
        job = self.server.db(get_job, job_id)
        latest = self.server.jobs.latest_progress.get(job.id, {})
        step = f", step {latest['step']}/{latest['total_steps']}" if job.status == "running" and "step" in latest else ""
        return (f"Round {round_.id} from policy v{round_.policy_from}: {STAGES[job.kind]} (job {job.id}) {job.status} "
                f"{_progress_bar(job.progress)}{step}; {schedule}.")

    def loop_data(self, shown_round: int | None, request: gr.Request) -> tuple:
        """The round history, the ratings, the warnings, and the training curves of one round (the newest unless chosen)."""
        self.server.operator(request.username)
        history = round_history(self.server.db)
        table = [[row[key] for key, _ in ROUND_COLUMNS] for row in map(describe, reversed(history))]
        scores = sorted(ratings(self.server.db).items(), key=lambda item: -item[1])
        length = self.server.project.config.length_warning()
        warnings = "\n".join(([length] if length else []) + round_warnings(self.server.db, history)) or "None."
        trained = [summary for summary in history if summary.policy_job is not None]
        shown = next((s for s in trained if s.round.id == shown_round), trained[-1] if trained else None)
        curves = CURVES[shown.optimizer] if shown else {}
        steps = self._steps(shown.policy_job, list(curves)) if shown else pd.DataFrame()
        plots = [gr.update(value=steps[["step", name]].rename(columns={name: "value"}), label=title, visible=True)
                 for name, title in curves.items()]
        plots += [gr.update(value=pd.DataFrame(columns=["step", "value"]), visible=False)] * (PLOTS - len(plots))
        samples = self._samples(shown.policy_job) if shown else []
        choice = gr.update(choices=[s.round.id for s in trained], value=shown.round.id if shown else None)
        reward_choices = gr.update(choices=[NEW_REWARD_MODEL] + [(f"v{rm.version}", rm.version) for rm in self.server.db(list_reward_models)])
        return (table, [[f"v{v}", round(r)] for v, r in scores], warnings, choice, samples, reward_choices, *plots)

    def _steps(self, job_id: int, names: list[str]) -> pd.DataFrame:
        """A training job's per-step statistics: from the database once it is done, from its worker's events while it runs."""
        job = self.server.db(get_job, job_id)
        if job.status == "done":
            series = {name: dict(self.server.db(metric_series, job.id, name)) for name in names}
            rows = [{"step": step, **{name: series[name].get(step) for name in names}} for step in sorted(series[names[0]])]
        else:
            events = read_events(job_dir(self.server.project, job.id), 0)[0]
            rows = [{"step": e["step"], **{name: e.get(name) for name in names}} for e in events if "step" in e]
        return pd.DataFrame(rows, columns=["step", *names])

    def _samples(self, job_id: int) -> list[list]:
        """The responses the worker logged at a PPO job's latest step, with their scores."""
        events = read_events(job_dir(self.server.project, job_id), 0)[0]
        latest = next((e for e in reversed(events) if "samples" in e), None)
        return [[latest["step"], s["prompt"], s["response"], _round(s["score"], 3)] for s in latest["samples"]] if latest else []

    def start_round(self, reward_version: float | None, optimizer: str | None, request: gr.Request) -> str:
        self.server.operator(request.username)
        with user_errors():
            job = start_round(self.server.project, self.server.db, int(reward_version) if reward_version else None, self.server.snapshot,
                              optimizer)
        return f"Started round {job.round}: its first job is {job.id} ({STAGES[job.kind]})."

    def cancel_round(self, request: gr.Request) -> str:
        self.server.operator(request.username)
        return f"Cancelled round {self.server.cancel_round()}."

    def roll_back(self, version: float | None, request: gr.Request) -> str:
        """Register a copy of an earlier policy version as the newest, so the next round starts from it."""
        self.server.operator(request.username)
        if version is None or version < 0 or version != int(version):
            raise refused("Give the policy version to roll back to: a whole number, 0 or more.")
        with user_errors():
            policy = roll_back(self.server.project, self.server.db, int(version))
        return f"Rolled back: policy v{policy.version} is a copy of v{int(version)}, and the next round starts from it."

    def set_schedule(self, every: float | None, request: gr.Request) -> str:
        """Change [round] every_comparisons, now and in tether.toml."""
        self.server.operator(request.username)
        if every is None or every < 0 or every != int(every):
            raise refused("The number of comparisons must be a whole number, 0 or more.")
        self.server.set_schedule(int(every))
        return f"A round starts every {int(every)} new comparisons." if every else "The scheduler is off."

    def export_data(self, fmt: str, include_ties: bool, min_agreement: float, request: gr.Request) -> str:
        self.server.operator(request.username)
        folder = self.server.export_folder()
        out = folder / ("preferences" if fmt == "hf" else f"preferences.{fmt}")
        with user_errors():
            self.server.db(export_preferences, out, fmt, include_ties, min_agreement or None)
        if fmt == "hf":  # a datasets directory downloads as one zip file
            return shutil.make_archive(str(out), "zip", out)
        return str(out)

    def accounts(self, request: gr.Request) -> tuple:
        """Every account, and the newest changes to them."""
        self.server.operator(request.username)
        users = [[u.name, u.role, "disabled" if u.disabled else "active"] for u in self.server.db(list_users)]
        log = [[e.at.strftime("%Y-%m-%d %H:%M:%S"), e.account, e.action, e.actor] for e in self.server.db(account_events, 200)]
        return users, log

    def add_account(self, name: str, role: str, password: str, request: gr.Request) -> tuple:
        operator = self.server.operator(request.username)
        with user_errors():
            self.server.db(add_user, name.strip(), role, hash_new_password(password), operator.name, utcnow())
        return f"Added {role} {name.strip()}.", "", *self.accounts(request)

    def disable_account(self, name: str, request: gr.Request) -> tuple:
        operator = self.server.operator(request.username)
        if name.strip() == operator.name:
            raise refused("You cannot disable your own account.")
        with user_errors():
            self.server.db(set_disabled, name.strip(), True, operator.name, utcnow())
        self.server.account_changed(name.strip())
        return f"Disabled {name.strip()}: its open sessions are refused from now on.", "", *self.accounts(request)

    def enable_account(self, name: str, request: gr.Request) -> tuple:
        operator = self.server.operator(request.username)
        with user_errors():
            self.server.db(set_disabled, name.strip(), False, operator.name, utcnow())
        self.server.account_changed(name.strip())
        return f"Enabled {name.strip()}.", "", *self.accounts(request)

    def set_account_password(self, name: str, password: str, request: gr.Request) -> tuple:
        operator = self.server.operator(request.username)
        with user_errors():
            self.server.db(set_password_hash, name.strip(), hash_new_password(password), operator.name, utcnow())
        self.server.account_changed(name.strip())
        return f"Set a new password for {name.strip()}.", "", *self.accounts(request)


@contextmanager
def user_errors() -> Iterator[None]:
    """Show Tether's own errors (bad input, a model that won't load) as messages, not crashes."""
    try:
        yield
    except NotSaved:
        raise  # not the user's input: reported by id
    except (StoreError, ModelError, JobError, WeakPassword) as e:
        raise refused(str(e)) from None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _progress_bar(progress: float, width: int = 20) -> str:
    filled = round(progress * width)
    return "█" * filled + "░" * (width - filled) + f" {progress:.0%}"


def _figure(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0%}" if percent else f"{value:.3f}"


# ---- layout ----

def build_annotate_tab(handlers: Handlers) -> list:
    """The annotate tab; returns the components a pair is shown in, in AnnotateView's order."""
    guidelines = handlers.server.project.config.server.guidelines
    progress = gr.HTML(elem_id="progress")
    message = gr.HTML(elem_id="message")
    with gr.Accordion("Guidelines", open=False):
        gr.Markdown(guidelines)
    prompt = gr.HTML(elem_id="prompt")
    with gr.Row(equal_height=True):
        left = gr.HTML(elem_id="side-a")
        right = gr.HTML(elem_id="side-b")
    with gr.Row():
        buttons = {
            choice: gr.Button(f"{label} [{key}]", elem_id=f"key-{key}", variant="primary" if choice in ("left", "right") else "secondary")
            for choice, label, key in CHOICES
        }
        skip_button = gr.Button(f"Skip [{SKIP_KEY}]", elem_id=f"key-{SKIP_KEY}", variant="secondary")
    with gr.Row():
        strength = gr.Radio(list(STRENGTHS), label="Strength (optional)", value=None)
        comment = gr.Textbox(label="Comment (optional)", max_lines=3)
    token = gr.Textbox(visible=False)

    view = [token, prompt, left, right, progress, message, strength, comment]
    # Unqueued: a vote is one POST answered at once. Through Gradio's queue it would be a second
    # request and an event stream, doubling Gradio's share of a vote's cost; the one writer's lock
    # puts votes in order anyway. No pre- or postprocessing: Gradio runs each in a worker thread per
    # component, and these values (text, and the strength's label) go through as they are.
    for choice, button in buttons.items():
        button.click(
            _vote_for(handlers, choice), inputs=[token, strength, comment], outputs=view, **ANNOTATE_EVENT,
            api_name=f"vote_{choice}",
        )
    skip_button.click(
        refusals_in_the_message_line(handlers.skip_pair), inputs=[token], outputs=view, **ANNOTATE_EVENT, api_name="skip",
    )
    return view


def _vote_for(handlers: Handlers, choice: str) -> Callable:
    # A named function per button: Gradio finds the gr.Request parameter by inspecting it.
    @refusals_in_the_message_line
    def vote(token: str, strength: str | None, comment: str, request: gr.Request) -> tuple:
        return handlers.vote(choice, token, strength, comment, request)

    return vote


def refusals_in_the_message_line(handler: Callable[..., tuple]) -> Callable[..., tuple]:
    """The annotate tab's events are unqueued, and Gradio shows no error for an unqueued event: so a
    refusal (a disabled account, a full disk, an error id) comes back in the tab's message line."""

    @functools.wraps(handler)
    def shown(*args: Any, **kwargs: Any) -> tuple:
        try:
            return handler(*args, **kwargs)
        except gr.Error as e:
            return AnnotateView.refusal(e.message)

    return shown


def build_operator_tab(handlers: Handlers, timer: gr.Timer, data_timer: gr.Timer, operator_tab: gr.Tab) -> None:
    with gr.Tab("Data") as data_tab:
        refresh = gr.Button("Refresh")
        states = gr.Dataframe(headers=["pair state", "pairs"], label="Pairs", interactive=False)
        annotators = gr.Dataframe(
            headers=["annotator", "votes", "median s / vote", "skip rate", "tie rate"], label="Annotators", interactive=False
        )
        agreement = gr.Textbox(label="Agreement on overlapped pairs", interactive=False)
        refresh.click(
            handlers.operator_data, outputs=[states, annotators, agreement],
            api_name="operator_data", api_visibility="undocumented",
        )
        # Data is the view the Operator tab opens on: it loads when either is opened, and follows the votes.
        for opened in (operator_tab, data_tab):
            opened.select(handlers.operator_data, outputs=[states, annotators, agreement], api_visibility="undocumented",
                          show_progress="hidden")
        data_timer.tick(handlers.operator_data, outputs=[states, annotators, agreement], api_visibility="undocumented",
                        show_progress="hidden")
    with gr.Tab("Prompts"):
        upload = gr.File(label="Prompt file (.jsonl, .csv, .parquet)", file_types=[".jsonl", ".csv", ".parquet", ".gz"])
        import_button = gr.Button("Import")
        import_result = gr.Textbox(label="Result", interactive=False)
        import_button.click(
            handlers.import_prompts, inputs=[upload], outputs=[import_result],
            api_name="import_prompts", api_visibility="undocumented",
        )
    with gr.Tab("Generate"):
        limit = gr.Number(label="Prompts (those with the fewest completions first)", value=20, precision=0, minimum=1)
        per_prompt = gr.Number(label="Completions per prompt", value=2, precision=0, minimum=2)
        generate_button = gr.Button("Generate completions and pairs")
        generate_result = gr.Textbox(label="Result", interactive=False)
        generate_button.click(
            handlers.generate_pairs, inputs=[limit, per_prompt], outputs=[generate_result],
            api_name="generate", api_visibility="undocumented",
        )
    with gr.Tab("Reward models") as models_tab:
        with gr.Row():
            include_imported = gr.Checkbox(label="Also train on imported preference data")
            train = gr.Button("Train a reward model")
            score = gr.Button("Score completions with the newest")
        queued = gr.Textbox(label="Result", interactive=False)
        refresh_models = gr.Button("Refresh")
        versions = gr.Dataframe(
            headers=["version", "held-out accuracy", "train pairs", "held-out pairs", "truncated", "reward mean", "reward std", "pairs/s", "snapshot"],
            label="Reward-model versions, newest first", interactive=False,
        )
        with gr.Row():
            run = gr.Dropdown(label="Training run of version", choices=[], scale=1)
            curves = gr.LinePlot(x="step", y="value", color="curve", title="Training loss and batch accuracy per step", scale=4)
        train.click(handlers.train_reward_model, inputs=[include_imported], outputs=[queued], api_name="train_reward_model", api_visibility="undocumented")
        score.click(handlers.score_completions, outputs=[queued], api_name="score_completions", api_visibility="undocumented")
        refresh_models.click(handlers.reward_models, inputs=[run], outputs=[versions, run, curves], api_name="reward_models", api_visibility="undocumented")
        models_tab.select(handlers.reward_models, inputs=[run], outputs=[versions, run, curves], api_visibility="undocumented", show_progress="hidden")
        run.input(handlers.reward_models, inputs=[run], outputs=[versions, run, curves], api_visibility="undocumented")
    with gr.Tab("Jobs"):
        jobs = gr.Dataframe(
            headers=["job", "kind", "status", "progress", "step", "loss", "created", "error"], label="Jobs, newest first", interactive=False,
        )
        with gr.Row():
            job_id = gr.Number(label="Job", precision=0, minimum=1)
            show_log = gr.Button("Show log")
            cancel = gr.Button("Cancel job", variant="stop")
        log = gr.Textbox(label="Log tail", lines=12, interactive=False)
        timer.tick(handlers.job_table, outputs=[jobs], api_name="jobs", api_visibility="undocumented", show_progress="hidden")
        show_log.click(handlers.job_log, inputs=[job_id], outputs=[log], api_name="job_log", api_visibility="undocumented")
        cancel.click(handlers.cancel_job, inputs=[job_id], outputs=[jobs], api_name="cancel_job", api_visibility="undocumented")
    with gr.Tab("Loop") as loop_tab:
        build_loop_tab(handlers, timer, loop_tab)
    with gr.Tab("Accounts") as accounts_tab:
        build_accounts_tab(handlers, accounts_tab)
    with gr.Tab("Export"):
        fmt = gr.Radio(["hf", "parquet", "jsonl"], value="hf", label="Format")
        include_ties = gr.Checkbox(label="Raw export: every vote, ties and both-bad included")
        min_agreement = gr.Slider(0, 1, value=0, step=0.05, label="Minimum agreement")
        export_button = gr.Button("Export")
        download = gr.File(label="Download", interactive=False)
        export_button.click(
            handlers.export_data, inputs=[fmt, include_ties, min_agreement], outputs=[download],
            api_name="export", api_visibility="undocumented",
        )


def build_accounts_tab(handlers: Handlers, tab: gr.Tab) -> None:
    with gr.Row():
        name = gr.Textbox(label="Account name", max_lines=1)
        role = gr.Radio(list(ROLES), value="annotator", label="Role (for a new account)")
        password = gr.Textbox(label="Password (for a new account or a new password)", type="password", max_lines=1)
    with gr.Row():
        add = gr.Button("Add account", variant="primary")
        set_password = gr.Button("Set password")
        enable = gr.Button("Enable")
        disable = gr.Button("Disable", variant="stop")
    result = gr.Textbox(label="Result", interactive=False)
    users = gr.Dataframe(headers=["account", "role", "status"], label="Accounts", interactive=False)
    log = gr.Dataframe(headers=["when (UTC)", "account", "change", "by"], label="Changes to accounts, newest first", interactive=False)
    # The password box is emptied after every action, so it is not sent twice by mistake.
    outputs = [result, password, users, log]
    tab.select(handlers.accounts, outputs=[users, log], api_name="accounts", api_visibility="undocumented")
    add.click(handlers.add_account, inputs=[name, role, password], outputs=outputs, api_name="add_account", api_visibility="undocumented")
    set_password.click(handlers.set_account_password, inputs=[name, password], outputs=outputs,
                       api_name="set_account_password", api_visibility="undocumented")
    enable.click(handlers.enable_account, inputs=[name], outputs=outputs, api_name="enable_account", api_visibility="undocumented")
    disable.click(handlers.disable_account, inputs=[name], outputs=outputs, api_name="disable_account", api_visibility="undocumented")


def build_loop_tab(handlers: Handlers, timer: gr.Timer, tab: gr.Tab) -> None:
    status = gr.Textbox(label="Round", interactive=False)
    with gr.Row():
        # allow_custom_value: a version registered since the page loaded is still accepted; the server checks it.
        reward_version = gr.Dropdown(label="Reward model for the round", choices=[NEW_REWARD_MODEL], value=NEW_REWARD_MODEL[1],
                                     allow_custom_value=True)
        # The server refuses any other value, whatever a client sends.
        optimizer = gr.Radio(label="Optimiser", choices=[(name.upper(), name) for name in OPTIMIZERS],
                             value=handlers.server.project.config.round.optimizer)
        start = gr.Button("Start a round", variant="primary")
        cancel = gr.Button("Cancel the round", variant="stop")
    with gr.Row():
        every = gr.Number(label="Start a round every N new comparisons (0: off)", precision=0, minimum=0)
        save_every = gr.Button("Save the schedule")
    result = gr.Textbox(label="Result", interactive=False)
    refresh = gr.Button("Refresh")
    history = gr.Dataframe(
        headers=[header for _, header in ROUND_COLUMNS],
        label="Rounds, newest first: the human win rate of each new policy over the one it started from, "
              "also at equal length (a logistic model of the votes with the length difference as a covariate)",
        interactive=False, wrap=True,
    )
    with gr.Row():
        scores = gr.Dataframe(headers=["policy", "rating"], label="Bradley-Terry ratings from cross-version votes (v0 = 1000)", interactive=False, scale=1)
        warnings = gr.Textbox(label="Warnings", lines=4, interactive=False, scale=3)
    with gr.Row():
        rollback_version = gr.Number(label="Policy version to roll back to (a copy becomes the newest; nothing is deleted)", precision=0, minimum=0)
        rollback = gr.Button("Roll back")
    shown = gr.Dropdown(label="Training steps of round", choices=[])
    plots = []
    for row in (range(3), range(3, PLOTS)):
        with gr.Row():
            plots += [gr.LinePlot(x="step", y="value", show_label=True) for _ in row]
    samples = gr.Dataframe(headers=["step", "prompt", "response", "score"], label="Responses sampled at PPO's latest step", interactive=False, wrap=True)
    outputs = [history, scores, warnings, shown, samples, reward_version, *plots]
    timer.tick(handlers.loop_status, outputs=[status], api_name="round_status", api_visibility="undocumented", show_progress="hidden")
    # The view loads when opened, and again whenever the round's state line changes.
    tab.select(handlers.loop_data, inputs=[shown], outputs=outputs, api_visibility="undocumented", show_progress="hidden")
    status.change(handlers.loop_data, inputs=[shown], outputs=outputs, api_visibility="undocumented", show_progress="hidden")
    start.click(handlers.start_round, inputs=[reward_version, optimizer], outputs=[result], api_name="start_round", api_visibility="undocumented")
    cancel.click(handlers.cancel_round, outputs=[result], api_name="cancel_round", api_visibility="undocumented")
    save_every.click(handlers.set_schedule, inputs=[every], outputs=[result], api_name="set_schedule", api_visibility="undocumented")
    rollback.click(handlers.roll_back, inputs=[rollback_version], outputs=[result], api_name="rollback", api_visibility="undocumented")
    refresh.click(handlers.loop_data, inputs=[shown], outputs=outputs, api_name="rounds", api_visibility="undocumented")
    shown.input(handlers.loop_data, inputs=[shown], outputs=outputs, api_visibility="undocumented")


def build_app(server: Server) -> gr.Blocks:
    handlers = Handlers(server)
    keep = server.project.config.server.export_seconds
    # delete_cache: Gradio's own copies of the export files go after the same time as ours.
    with gr.Blocks(title="Tether", delete_cache=(keep, keep)) as app:
        gr.Markdown("## Tether: which response is better?")
        with gr.Tab("Annotate"):
            view = build_annotate_tab(handlers)
        # Refresh the operator's views; switched on at sign-in for operators only.
        timer = gr.Timer(2, active=False)
        data_timer = gr.Timer(DATA_REFRESH_SECONDS, active=False)  # the Data view's scans cost more: less often
        with gr.Tab("Operator", visible=False) as operator_tab:
            build_operator_tab(handlers, timer, data_timer, operator_tab)
        app.load(handlers.operator_controls, outputs=[operator_tab, timer, data_timer], api_visibility="private")
        app.load(refusals_in_the_message_line(handlers.next_pair), outputs=view, **ANNOTATE_EVENT, api_name="next_pair")
    return app


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # Gradio shuts down cleanly on it


def launch(server: Server, host: str, port: int, prevent_thread_lock: bool = False) -> gr.Blocks:
    """Serve the app for this server's project; it blocks until stopped unless prevent_thread_lock."""
    app = build_app(server)
    app.queue(default_concurrency_limit=64)
    app.launch(
        server_name=host, server_port=port, auth=server.sign_in.check, auth_message="Sign in to Tether.",
        footer_links=[], ssr_mode=False, head=KEYS_JS, css=CSS, show_error=True, max_threads=80,
        max_file_size=int(server.project.config.server.max_upload_mb * 2**20), prevent_thread_lock=True,
        app_kwargs={"middleware": [Middleware(ClientAddress)], "routes": control.routes(server)},
    )
    server.sessions = app.server_app.tokens
    control.announce(server.project, app.local_url, server.control_token)
    if not prevent_thread_lock:
        app.block_thread()
    return app


def run(project: Project, host: str, port: int) -> None:
    # SIGTERM (service managers, `kill`) stops the app as Ctrl-C does; a background process
    # started by a script ignores SIGINT, so it is restored too.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server = Server(project)
    try:
        launch(server, host, port)
    finally:
        server.close()
