"""The Data view: the pairs in each state, each annotator's work, how far annotators agree, and the AI judge."""

import gradio as gr

from annotate.agreement import agreement_with_people, fleiss_kappa, percent_agreement
from store.db import utcnow
from store.stats import annotator_stats, overlapped_choices
from ui.owner.jobs import submit_judging
from ui.owner.server import Server
from ui.web.common import QUIET, figure, rounded, user_errors, with_error_ids


def build_data(server: Server, timer: gr.Timer, operator_tab: gr.Tab) -> None:
    """Data is the view the Operator tab opens on: it loads when either is opened, and follows the votes on `timer`."""

    @with_error_ids
    def operator_data(request: gr.Request) -> tuple:
        server.operator(request.username)
        # The pair states from the queue's counters; the scans on a snapshot, beside the writer, so
        # that a refresh does not hold up the annotators' votes.
        states = server.db(server.queue.pair_states, utcnow())
        annotators = [
            [s.name, s.votes, rounded(s.median_seconds, 1), rounded(s.skip_rate, 3), rounded(s.tie_rate, 3)]
            for s in server.snapshot(annotator_stats)
        ]
        items = server.snapshot(overlapped_choices)
        kappa, agreement = fleiss_kappa(items), percent_agreement(items)
        summary = (
            f"{len(items)} pairs with two or more votes · Fleiss' kappa {figure(kappa)} · "
            f"raw agreement {figure(agreement, percent=True)}"
        )
        judges = "\n".join(f"{judge}: {agreement}" for judge, agreement in server.snapshot(agreement_with_people).items())
        return [[state, n] for state, n in states.items()], annotators, summary, judges or "No AI judge has voted on a pair people voted on."

    @with_error_ids
    def ask_the_judge(request: gr.Request) -> str:
        server.operator(request.username)
        with user_errors():
            job = submit_judging(server.project, server.db, read=server.snapshot)
        return f"Queued job {job.id}: the AI judge votes on the pairs it has not voted on; its progress shows under Jobs."

    with gr.Tab("Data") as tab:
        refresh = gr.Button("Refresh")
        states = gr.Dataframe(headers=["pair state", "pairs"], label="Pairs", interactive=False)
        annotators = gr.Dataframe(
            headers=["annotator", "votes", "median s / vote", "skip rate", "tie rate"], label="Annotators", interactive=False
        )
        agreement = gr.Textbox(label="Agreement on overlapped pairs", interactive=False)
        with gr.Row(equal_height=True):
            judges = gr.Textbox(label="AI judges' agreement with people, on pairs both voted on where people chose a side "
                                      "(their votes are kept apart: [reward_model] ai_votes says whether they train)",
                                interactive=False, scale=4)
            judge = gr.Button("Ask the AI judge", scale=1)
        judged = gr.Textbox(label="Result", interactive=False)

    outputs = [states, annotators, agreement, judges]
    refresh.click(operator_data, outputs=outputs, api_name="operator_data", api_visibility="undocumented")
    gr.on([operator_tab.select, tab.select, timer.tick], operator_data, outputs=outputs, **QUIET)
    judge.click(ask_the_judge, outputs=[judged], api_name="ask_the_judge", api_visibility="undocumented")
