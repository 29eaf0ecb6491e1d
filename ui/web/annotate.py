"""The annotate view, for everyone: a prompt, two responses, and a vote by key or by click; or, for a task of
K answers ([queue] answers_per_task), the answers and a ranking made by key or by drag."""

import functools
import html
import json
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from annotate.queue import Action
from store.queue import Assignment
from store.rankings import answer_label
from store.users import User
from ui.owner.server import Refused, Server
from ui.web.common import count, log_refusal, user_errors, with_error_ids

# Screen choice, button label, key. The keys are shown on the buttons and read by KEYS_JS.
CHOICES = [
    ("left", "A is better", "1"),
    ("right", "B is better", "2"),
    ("tie", "Tie", "3"),
    ("both_bad", "Both are bad", "4"),
]
SKIP_KEY = "5"
STRENGTHS = {"slightly better": "slight", "much better": "much"}

# A task to rank: the rank list (#rank-list) is ordered in the page, best first, and read when the ranking is
# submitted (RANKING_JS). Keys: a letter picks its answer, the arrow keys move the picked one up or down, = ties
# it with the one above (again: unties), Enter submits. By mouse: drag an answer to its place, click = to tie.
# With a rank list on screen the digit shortcuts of a pair do nothing, but for skip.
KEYS_JS = """
<script>
(() => {
  const items = () => [...document.querySelectorAll("#rank-list .tether-rank-item")];
  const renumber = () => {
    let rank = 0;
    items().forEach((item, i) => {
      if (i === 0) item.dataset.tie = "false";
      if (item.dataset.tie !== "true") rank = i + 1;
      item.querySelector(".tether-rank-no").textContent = item.dataset.tie === "true" ? rank + "=" : rank;
    });
  };
  const pick = (item) => {
    items().forEach((other) => other.classList.toggle("tether-picked", other === item));
  };
  const picked = () => document.querySelector("#rank-list .tether-picked");
  window.tetherRanking = () =>
    items().map((item, i) => (i === 0 ? "" : item.dataset.tie === "true" ? " = " : " > ") + item.dataset.label).join("");
  document.addEventListener("keydown", (event) => {
    const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(event.target.tagName) || event.target.isContentEditable;
    if (typing || event.ctrlKey || event.metaKey || event.altKey) return;
    const ranking = items().length > 0;
    let button = null;
    if (ranking && /^[a-z]$/i.test(event.key)) {
      const item = items().find((x) => x.dataset.label === event.key.toUpperCase());
      if (item) { event.preventDefault(); pick(item); }
      return;
    }
    const item = picked();
    if (ranking && item && (event.key === "ArrowUp" || event.key === "ArrowDown")) {
      event.preventDefault();
      const up = event.key === "ArrowUp";
      const next = up ? item.previousElementSibling : item.nextElementSibling;
      if (next) { up ? next.before(item) : next.after(item); renumber(); }
      return;
    }
    if (ranking && item && event.key === "=") {
      event.preventDefault();
      item.dataset.tie = item.dataset.tie === "true" ? "false" : "true";
      renumber();
      return;
    }
    if (ranking && event.key === "Enter") button = document.getElementById("submit-ranking");
    else if (!ranking || event.key === "5") button = document.getElementById("key-" + event.key);
    if (button) { event.preventDefault(); button.click(); }
  });
  document.addEventListener("click", (event) => {
    const item = event.target.closest && event.target.closest("#rank-list .tether-rank-item");
    if (!item) return;
    pick(item);
    if (event.target.closest(".tether-tie")) { item.dataset.tie = item.dataset.tie === "true" ? "false" : "true"; renumber(); }
  });
  document.addEventListener("dragstart", (event) => {
    const item = event.target.closest && event.target.closest("#rank-list .tether-rank-item");
    if (item) { pick(item); event.dataTransfer.setData("text/plain", item.dataset.label); }
  });
  document.addEventListener("dragover", (event) => {
    if (event.target.closest && event.target.closest("#rank-list .tether-rank-item")) event.preventDefault();
  });
  document.addEventListener("drop", (event) => {
    const target = event.target.closest && event.target.closest("#rank-list .tether-rank-item");
    const dragged = items().find((x) => x.dataset.label === event.dataTransfer.getData("text/plain"));
    if (!target || !dragged || target === dragged) return;
    event.preventDefault();
    // The dragged answer takes the place of the one dropped on, which moves toward where it came from.
    const moving_up = items().indexOf(dragged) > items().indexOf(target);
    moving_up ? target.before(dragged) : target.after(dragged);
    renumber();
  });
})();
</script>
"""
# Run in the page as the ranking is submitted: the order on screen replaces the hidden ranking input.
RANKING_JS = "(token, ranking) => [token, window.tetherRanking()]"

CSS = """
.tether-turn { margin: 0 0 .6em 0; }
.tether-role { font-weight: 600; font-size: .85em; text-transform: uppercase; opacity: .7; }
.tether-text { white-space: pre-wrap; overflow-wrap: anywhere; font-family: inherit; margin: .2em 0 0 0; }
.tether-side { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: .8em; min-height: 8em; }
.tether-side h3 { margin: 0 0 .4em 0; }
.tether-cut { margin: .4em 0 0 0; font-size: .85em; font-style: italic; opacity: .7; }
.tether-answers { display: grid; grid-template-columns: repeat(auto-fit, minmax(18em, 1fr)); gap: .6em; }
.tether-rank { list-style: none; padding: 0; margin: 0; display: flex; flex-direction: column; gap: .3em; }
.tether-rank-item { border: 1px solid var(--border-color-primary); border-radius: 6px; padding: .3em .6em; cursor: grab;
                    display: flex; gap: .8em; align-items: center; user-select: none; }
.tether-rank-item.tether-picked { outline: 2px solid var(--color-accent); }
.tether-rank-no { min-width: 1.5em; font-weight: 600; }
.tether-rank-label { font-weight: 600; }
/* A task to rank hides the pair's vote buttons, strength and comment; a pair hides the ranking's controls. */
.gradio-container:has(#rank-list .tether-rank-item) :is(.tether-vote, #vote-details) { display: none; }
.gradio-container:not(:has(#rank-list .tether-rank-item)) #ranking-controls { display: none; }
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


def render_answers(answers: tuple[tuple[str, bool], ...]) -> str:
    """A task's answers side by side, each under the letter it is ranked by."""
    return '<div class="tether-answers">' + "".join(render_side(answer_label(i), text, finished) for i, (text, finished) in enumerate(answers)) + "</div>"


def render_rank_list(answers: int, token: str) -> str:
    """The ranking to order, best first: at first A, B, C... as shown. Only letters: no text from a model.
    It names its lease, so that the next task's list, though its items are alike, is new HTML that the page
    draws afresh, not the last list as the annotator left it."""
    items = "".join(
        f'<li class="tether-rank-item" draggable="true" data-label="{answer_label(i)}" data-tie="false">'
        f'<span class="tether-rank-no">{i + 1}</span><span class="tether-rank-label">{answer_label(i)}</span>'
        f'<button type="button" class="tether-tie" title="Tie with the answer above [=]">=</button></li>'
        for i in range(answers)
    )
    return f'<ol class="tether-rank" data-lease="{html.escape(token)}" aria-label="Your ranking, best first">{items}</ol>'


@dataclass
class AnnotateView:
    """What the annotate view shows, in the order of its output components."""

    token: str
    prompt: str
    left: str
    right: str
    progress: str
    message: str
    answers: str = ""  # a task's answers; empty for a pair
    rank_list: str = ""  # a task's ranking to order; empty for a pair

    def outputs(self) -> tuple:
        # The strength and comment inputs are cleared for the next pair.
        return self.token, self.prompt, self.left, self.right, self.progress, self.message, None, "", self.answers, self.rank_list

    @staticmethod
    def refusal(message: str) -> tuple:
        """Only the message line changes: the pair, and what was typed or ranked, stay on screen to try again."""
        keep = gr.skip()
        return keep, keep, keep, keep, keep, html.escape(message), keep, keep, keep, keep


def shown(server: Server, user: User, action: Action) -> tuple:
    """Act on the queue, then show the pair it leaves on the annotator's screen, with the progress line
    from the queue's counters. A refused vote or skip did nothing: the pair to answer instead is shown, with why."""
    outcome, votes, left = server.annotate(action)
    message = outcome.refused
    if message:
        log_refusal(f"{action.kind} by {user.name}", message)
        outcome, votes, left = server.annotate(Action("serve", user.name))
    return _view(user, outcome.assignment, votes, left + (outcome.assignment is not None), message)


def _view(user: User, assignment: Assignment | None, votes: int, left: int, message: str) -> tuple:
    progress = f"{html.escape(user.name)}: {count(votes, 'vote')} today · {left} left to answer"  # pairs and tasks to rank
    message = html.escape(message)
    if assignment is None:
        done = "<p>No pairs are waiting for you. Thank you! Check back later.</p>"
        return AnnotateView("", done, "", "", progress, message).outputs()
    if assignment.answers:
        return AnnotateView(assignment.token, render_prompt(assignment.prompt_messages), "", "", progress, message,
                            render_answers(assignment.answers), render_rank_list(len(assignment.answers), assignment.token)).outputs()
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
    def rank_answers(token: str | None, ranking: str | None, request: gr.Request) -> tuple:
        user = server.user(request.username)
        with user_errors():  # as a vote's fields: refused before it joins a batch
            action = Action("rank", user.name, _token(token), ranking="" if ranking is None else ranking)
        return shown(server, user, action)

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
        answers = gr.HTML(elem_id="answers")
        with gr.Row(elem_id="ranking-controls"):
            rank_list = gr.HTML(elem_id="rank-list")
            with gr.Column(scale=0, min_width=260):
                gr.Markdown("Best first. A letter picks an answer, ↑ ↓ move it, = ties it with the one above; "
                            "or drag it, and click = to tie.")
                submit_ranking = gr.Button("Submit ranking [Enter]", elem_id="submit-ranking", variant="primary")
        with gr.Row():
            buttons = {
                choice: gr.Button(f"{label} [{key}]", elem_id=f"key-{key}", elem_classes=["tether-vote"],
                                  variant="primary" if choice in ("left", "right") else "secondary")
                for choice, label, key in CHOICES
            }
            skip_button = gr.Button(f"Skip [{SKIP_KEY}]", elem_id=f"key-{SKIP_KEY}", variant="secondary")
        with gr.Row(elem_id="vote-details"):
            strength = gr.Radio(list(STRENGTHS), label="Strength (optional)", value=None)
            comment = gr.Textbox(label="Comment (optional)", max_lines=3)
        token = gr.Textbox(visible=False)
        ranking = gr.Textbox(visible=False)

    view = [token, prompt, left, right, progress, message, strength, comment, answers, rank_list]
    for choice, button in buttons.items():
        button.click(vote_for(server, choice), inputs=[token, strength, comment], outputs=view, **ANNOTATE_EVENT, api_name=f"vote_{choice}")
    submit_ranking.click(rank_answers, inputs=[token, ranking], outputs=view, js=RANKING_JS, **ANNOTATE_EVENT, api_name="rank")
    skip_button.click(skip_pair, inputs=[token], outputs=view, **ANNOTATE_EVENT, api_name="skip")
    app.load(next_pair, outputs=view, **ANNOTATE_EVENT, api_name="next_pair")
