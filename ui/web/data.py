"""The Data view: the pairs in each state, each annotator's work and reliability, how far annotators agree, and the AI judge."""

import gradio as gr

from annotate.agreement import agreement_with_people, fleiss_kappa, percent_agreement, project_flip_rate
from annotate.trust import project_reliability
from store.db import utcnow
from store.gold import agreed_pairs, gold_answers, mark_gold
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
        flips = server.snapshot(project_flip_rate).in_use(server.project.config.reward_model.flip_rate)
        summary = (
            f"{len(items)} pairs with two or more votes · Fleiss' kappa {figure(kappa)} · "
            f"raw agreement {figure(agreement, percent=True)} · flip rate, the chance a vote picks the worse answer: {flips}"
        )
        below = server.project.config.queue.flag_reliability_below
        reliability, gold = server.snapshot(lambda con: (project_reliability(con), len(gold_answers(con))))
        trust = [
            [r.annotator, rounded(r.reliability, 2), r.informative_votes, f"{r.gold_correct} / {r.gold_answered}",
             f"below {below:.2f}" if r.reliability < below else ""]
            for r in reliability.values()
        ]
        flagged = [r.annotator for r in reliability.values() if r.reliability < below]
        trust_summary = f"{gold} gold pairs · flagged: {', '.join(flagged) if flagged else 'no one'}"
        judges = "\n".join(f"{judge}: {agreement}" for judge, agreement in server.snapshot(agreement_with_people).items())
        return ([[state, n] for state, n in states.items()], annotators, summary, trust, trust_summary,
                judges or "No AI judge has voted on a pair people voted on.")

    @with_error_ids
    def mark_agreed_gold(request: gr.Request) -> str:
        user = server.operator(request.username)
        wanted = server.project.config.queue.overlap_votes
        marked = server.db(lambda con: mark_gold(con, agreed_pairs(con, wanted), "agreed", user.name, utcnow()))
        server.db(server.queue.refresh, utcnow())
        return f"Marked {marked} pairs gold: those with {wanted} or more votes, all alike."

    @with_error_ids
    def ask_the_judge(request: gr.Request) -> str:
        server.operator(request.username)
        with user_errors():
            job = submit_judging(server.project, server.db, read=server.snapshot)
        return f"Queued job {job.id}: the AI judge votes on the pairs it has not voted on; its progress shows under Jobs."

    @with_error_ids
    def check_project(request: gr.Request) -> str:
        server.operator(request.username)
        report = server.control_action("check")
        if report["problems"]:
            return "Not whole:\n" + "\n".join(f"- {problem}" for problem in report["problems"])
        return "Whole. Checked:\n" + "\n".join(f"- {line}" for line in report["checked"])

    with gr.Tab("Data") as tab:
        refresh = gr.Button("Refresh")
        states = gr.Dataframe(headers=["pair state", "pairs"], label="Pairs", interactive=False)
        annotators = gr.Dataframe(
            headers=["annotator", "votes", "median s / vote", "skip rate", "tie rate"], label="Annotators", interactive=False
        )
        agreement = gr.Textbox(label="Agreement on overlapped pairs", interactive=False)
        reliability = gr.Dataframe(
            headers=["annotator", "reliability", "measured on votes", "gold right", "flagged"],
            label="Reliability: the chance a vote picks the better answer, from gold pairs and agreement with others",
            interactive=False, elem_id="reliability",
        )
        gold = gr.Textbox(label="Gold pairs and flagged annotators", interactive=False, elem_id="gold-summary")
        mark = gr.Button("Mark pairs everyone agreed on as gold")
        marked = gr.Textbox(label="Gold", interactive=False)
        with gr.Row(equal_height=True):
            judges = gr.Textbox(label="AI judges' agreement with people, on pairs both voted on where people chose a side "
                                      "(their votes are kept apart: [reward_model] ai_votes says whether they train)",
                                interactive=False, scale=4)
            judge = gr.Button("Ask the AI judge", scale=1)
        judged = gr.Textbox(label="Result", interactive=False)
        with gr.Row(equal_height=True):
            checked = gr.Textbox(label="Whether the project is whole: the database, settings, registered versions' files "
                                       "(as `tether check`)", interactive=False, scale=4)
            check = gr.Button("Check the project", scale=1)

    outputs = [states, annotators, agreement, reliability, gold, judges]
    mark.click(mark_agreed_gold, outputs=[marked], api_name="mark_agreed_gold", api_visibility="undocumented")
    refresh.click(operator_data, outputs=outputs, api_name="operator_data", api_visibility="undocumented")
    gr.on([operator_tab.select, tab.select, timer.tick], operator_data, outputs=outputs, **QUIET)
    judge.click(ask_the_judge, outputs=[judged], api_name="ask_the_judge", api_visibility="undocumented")
    check.click(check_project, outputs=[checked], api_name="check_project", api_visibility="undocumented")
