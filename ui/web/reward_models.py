"""The Reward models view: train one on the votes, score completions with the newest, and each version's figures and curves."""

import gradio as gr
import pandas as pd

from annotate.ratings import measured_share
from store.jobs import metric_series
from store.reward_models import list_reward_models
from ui.owner.history import reward_model_note
from ui.owner.jobs import submit_scoring
from ui.owner.round_jobs import submit_reward_training
from ui.owner.round_report import scoring_kind
from ui.owner.server import Server
from ui.web.common import QUIET, rounded, user_errors, with_error_ids

VERSION_COLUMNS = ["version", "model", "held-out accuracy", "calibration error", "heads", "train pairs", "held-out pairs", "truncated", "pairs/s",
                   "snapshot"]


def build_reward_models(server: Server) -> None:
    @with_error_ids
    def train_reward_model(include_imported: bool, request: gr.Request) -> str:
        server.operator(request.username)
        with user_errors():
            job = submit_reward_training(server.project, server.db, include_imported=include_imported, read=server.snapshot)
        return f"Queued job {job.id}: its progress shows under Jobs."

    @with_error_ids
    def score_completions(request: gr.Request) -> str:
        server.operator(request.username)
        with user_errors():
            job = submit_scoring(server.project, server.db)
        return f"Queued job {job.id}: its progress shows under Jobs."

    @with_error_ids
    def reward_models(run: int | None, request: gr.Request) -> tuple:
        """The versions with their metrics, and the training curves of one run (the newest unless chosen)."""
        server.operator(request.username)
        versions = server.db(list_reward_models)
        table = [
            [rm.version, scoring_kind(rm), measured_share(rm.metrics.get("eval_accuracy"), rm.metrics.get("pairs_eval")),
             rounded(rm.metrics.get("eval_calibration_error"), 3),
             rm.metrics.get("heads", 1), rm.metrics.get("pairs_train"), rm.metrics.get("pairs_eval"), rm.metrics.get("truncated"),
             rounded(rm.metrics.get("pairs_per_second"), 2), rm.snapshot[:12]]
            for rm in versions
        ]
        shown = next((rm for rm in versions if rm.version == run), versions[0] if versions else None)
        curves = []
        if shown is not None:
            for name, label in (("loss", "loss"), ("train_accuracy", "batch accuracy")):
                curves += [{"step": step, "value": value, "curve": label} for step, value in server.db(metric_series, shown.metrics["job"], name)]
        choice = gr.update(choices=[rm.version for rm in versions], value=shown.version if shown else None)
        note = reward_model_note(server.db, server.project.config.reward_model) or "No reward model yet."
        return table, note, choice, pd.DataFrame(curves, columns=["step", "value", "curve"])

    with gr.Tab("Reward models") as tab:
        with gr.Row():
            include_imported = gr.Checkbox(label="Also train on imported preference data")
            train = gr.Button("Train a reward model")
            score = gr.Button("Score completions with the newest")
        queued = gr.Textbox(label="Result", interactive=False)
        refresh = gr.Button("Refresh")
        versions = gr.Dataframe(headers=VERSION_COLUMNS, label="Reward-model versions, newest first", interactive=False, wrap=True)
        newest = gr.Textbox(label="The newest version: which model scores, and whether it steers the loop", interactive=False)
        with gr.Row():
            run = gr.Dropdown(label="Training run of version", choices=[], scale=1)
            curves = gr.LinePlot(x="step", y="value", color="curve", title="Training loss and batch accuracy per step", scale=4)

    train.click(train_reward_model, inputs=[include_imported], outputs=[queued], api_name="train_reward_model", api_visibility="undocumented")
    score.click(score_completions, outputs=[queued], api_name="score_completions", api_visibility="undocumented")
    shown = dict(inputs=[run], outputs=[versions, newest, run, curves])
    refresh.click(reward_models, **shown, api_name="reward_models", api_visibility="undocumented")
    tab.select(reward_models, **shown, **QUIET)
    run.input(reward_models, **shown, api_visibility="undocumented")
