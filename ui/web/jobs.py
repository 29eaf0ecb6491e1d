"""The Jobs view: every job with its progress, refreshed on the operator's timer; a job's log; cancel one."""

import gradio as gr

from store.jobs import get_job, list_jobs
from train.runtime.jobdir import log_tail
from ui.owner.project import job_dir
from ui.owner.server import Server
from ui.web.common import QUIET, figure, progress_bar, refused, user_errors, whole_number, with_error_ids

JOB_COLUMNS = ["job", "kind", "status", "progress", "step", "loss", "created", "error"]


def _job_number(job_id: float | None) -> int:
    if (number := whole_number(job_id)) is None:
        raise refused("Give a job's number from the table.")
    return number


def build_jobs(server: Server, timer: gr.Timer) -> None:
    @with_error_ids
    def job_table(request: gr.Request) -> list[list]:
        server.operator(request.username)
        rows = []
        for j in server.db(list_jobs):
            step = loss = ""
            latest = server.jobs.latest_progress.get(j.id, {})
            if j.status == "running" and "step" in latest:
                step, loss = f"{latest['step']}/{latest['total_steps']}", figure(latest.get("loss"))
            rows.append([j.id, j.kind, j.status, progress_bar(j.progress), step, loss,
                         j.created_at.strftime("%Y-%m-%d %H:%M:%S"), (j.error or "").split("\n")[0]])
        return rows

    @with_error_ids
    def job_log(job_id: float | None, request: gr.Request) -> str:
        server.operator(request.username)
        with user_errors():
            job = server.db(get_job, _job_number(job_id))
        return log_tail(job_dir(server.project, job.id), lines=40)

    @with_error_ids
    def cancel_job(job_id: float | None, request: gr.Request) -> list[list]:
        server.operator(request.username)
        with user_errors():
            server.db(get_job, job_id := _job_number(job_id))
        server.jobs.cancel(job_id)
        return job_table(request)

    with gr.Tab("Jobs"):
        jobs = gr.Dataframe(headers=JOB_COLUMNS, label="Jobs, newest first", interactive=False)
        with gr.Row():
            job_id = gr.Number(label="Job", precision=0, minimum=1)
            show_log = gr.Button("Show log")
            cancel = gr.Button("Cancel job", variant="stop")
        log = gr.Textbox(label="Log tail", lines=12, interactive=False)
    timer.tick(job_table, outputs=[jobs], api_name="jobs", **QUIET)
    show_log.click(job_log, inputs=[job_id], outputs=[log], api_name="job_log", api_visibility="undocumented")
    cancel.click(cancel_job, inputs=[job_id], outputs=[jobs], api_name="cancel_job", api_visibility="undocumented")
