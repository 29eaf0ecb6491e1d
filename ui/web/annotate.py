"""The annotate view, for everyone: a prompt, two responses, and a vote by key or by click."""

import functools
import html
import json
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from annotate.queue import Action
from store.queue import Assignment
from store.users import User
from ui.owner.server import Refused, Server
from ui.web.common import count, user_errors, with_error_ids

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
.tether-cut { margin: .4em 0 0 0; font-size: .85em; font-style: italic; opacity: .7; }
"""

# Unqueued: a vote is one POST answered at once. Through Gradio's queue it would be a second
# request and an event stream, doubling Gradio's share of a vote's cost; the one writer's lock
# puts votes in order anyway. No pre- or postprocessing: Gradio runs each in a worker thread per
# component, and these values (text, and the strength's label) go through as they are.
ANNOTATE_EVENT = dict(queue=False, preprocess=False, postprocess=False, show_progress="hidden", api_visibility="undocumented")


# ---- rendering: everything from prompts, models and people is escaped ----

def render_prompt(messages_json: str) -> str:
    turns = [
        f'<div class="tether-turn"><div class="tether-role">{html.escape(m["role"])}</div>'
        f'<div class="tether-text">{html.escape(m["content"])}</div></div>'
        for m in json.loads(messages_json)
    ]
    return "".join(turns)


def render_side(label: str, text: str, finished: bool = True) -> str:
    """One response; one cut at the length limit says so, so the annotator knows its end is missing, not wrong.
    A response whose end is unknown (an imported one) is shown as it is."""
    cut = "" if finished else '<div class="tether-cut">cut off at the length limit</div>'
    return f'<div class="tether-side"><h3>{label}</h3><div class="tether-text">{html.escape(text)}</div>{cut}</div>'


@dataclass
class AnnotateView:
    """What the annotate view shows, in the order of its output components."""

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


def shown(server: Server, user: User, action: Action) -> tuple:
    """Act on the queue, then show the pair it leaves on the annotator's screen, with the progress line
    from the queue's counters. A refused vote or skip did nothing: the pair to answer instead is shown, with why."""
    outcome, votes, left = server.annotate(action)
    message = outcome.refused
    if message:
        outcome, votes, left = server.annotate(Action("serve", user.name))
    return _view(user, outcome.assignment, votes, left + (outcome.assignment is not None), message)


def _view(user: User, assignment: Assignment | None, votes: int, left: int, message: str) -> tuple:
    progress = f"{html.escape(user.name)}: {count(votes, 'vote')} today · {count(left, 'pair')} left"
    message = html.escape(message)
    if assignment is None:
        done = "<p>No pairs are waiting for you. Thank you! Check back later.</p>"
        return AnnotateView("", done, "", "", progress, message).outputs()
    return AnnotateView(
        assignment.token,
        render_prompt(assignment.prompt_messages),
        render_side("A", assignment.left_text, assignment.left_finished),
        render_side("B", assignment.right_text, assignment.right_finished),
        progress,
        message,
    ).outputs()


def refusals_in_the_message_line(handler: Callable[..., tuple]) -> Callable[..., tuple]:
    """The annotate view's events are unqueued, and Gradio shows no error for an unqueued event: so a
    refusal (a disabled account, a full disk, an error id) comes back in the view's message line."""

    reported = with_error_ids(handler)

    @functools.wraps(handler)
    def in_line(*args: Any, **kwargs: Any) -> tuple:
        try:
            return reported(*args, **kwargs)
        except gr.Error as e:
            return AnnotateView.refusal(e.message)

    return in_line


def vote_for(server: Server, choice: str) -> Callable[..., tuple]:
    """The handler of one vote button. Storing the vote and leasing the next pair are one transaction:
    if it cannot be saved, neither is, and the annotator is told; a vote is never stored while its reply is an error."""

    # A named function per button: Gradio finds the gr.Request parameter by inspecting it.
    @refusals_in_the_message_line
    def vote(token: str | None, strength: str | None, comment: str | None, request: gr.Request) -> tuple:
        user = server.user(request.username)
        with user_errors():  # a malformed field (these arrive unprocessed, as any JSON) is refused before it joins a batch
            action = Action("vote", user.name, _token(token), choice, _strength(strength), comment)
        return shown(server, user, action)

    return vote


def _token(token: str | None) -> str:
    return "" if token is None else token  # None: the page has no pair (Action refuses what is not text)


def _strength(label: str | None) -> str | None:
    """The stored strength for the radio button's label."""
    if label is None or label == "":
        return None
    if not isinstance(label, str) or label not in STRENGTHS:
        raise Refused(f"the strength must be one of {', '.join(map(repr, STRENGTHS))} or none")
    return STRENGTHS[label]


def build_annotate(server: Server, app: gr.Blocks) -> None:
    """The annotate view, which shows the annotator's next pair when the page loads."""

    @refusals_in_the_message_line
    def next_pair(request: gr.Request) -> tuple:
        user = server.user(request.username)
        return shown(server, user, Action("serve", user.name))

    @refusals_in_the_message_line
    def skip_pair(token: str | None, request: gr.Request) -> tuple:
        user = server.user(request.username)
        with user_errors():
            action = Action("skip", user.name, _token(token))
        return shown(server, user, action)

    with gr.Tab("Annotate"):
        progress = gr.HTML(elem_id="progress")
        message = gr.HTML(elem_id="message")
        with gr.Accordion("Guidelines", open=False):
            gr.Markdown(server.project.config.server.guidelines)
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
    for choice, button in buttons.items():
        button.click(vote_for(server, choice), inputs=[token, strength, comment], outputs=view, **ANNOTATE_EVENT, api_name=f"vote_{choice}")
    skip_button.click(skip_pair, inputs=[token], outputs=view, **ANNOTATE_EVENT, api_name="skip")
    app.load(next_pair, outputs=view, **ANNOTATE_EVENT, api_name="next_pair")
