"""The Gradio app: the annotate view for everyone, the operator views for operators.

Each view is a module of its own beside this one, with its handlers above its layout. The
handlers call the database's owner, `ui.owner.server.Server`, which alone reads and writes.
"""

import os
import signal
from contextlib import asynccontextmanager
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from ui.owner import control
from ui.owner.auth import ClientAddress
from ui.owner.project import Project
from ui.owner.server import Server
from ui.web.accounts import build_accounts
from ui.web.annotate import CSS, KEYS_JS, build_annotate
from ui.web.common import LOGGED_CHARACTERS, log_refusal, refused, with_error_ids, wrong_input
from ui.web.data import build_data
from ui.web.export import build_export
from ui.web.generate import build_generate
from ui.web.guard import BodyLimit, OperatorUploads, SameOrigin
from ui.web.jobs import build_jobs
from ui.web.loop import build_loop
from ui.web.prompts import build_prompts
from ui.web.reward_models import build_reward_models

DATA_REFRESH_SECONDS = 10
GRADIO_FILES = "gradio-files"  # the project's folder for Gradio's uploads and downloads, its owner's alone


class Blocks(gr.Blocks):
    """Gradio's Blocks, but a call whose input is not of the type its handler takes (null where text is due, a list
    where a number is, an object where true or false is) is refused before the handler runs, and so is one Gradio's
    own checks refuse (a value not among a dropdown's choices, too few values): as Tether refuses one, its reason to
    the caller, one line to the log. Gradio logs a traceback for each of its own, and an operator could not tell an
    attack from a fault of Tether's.

    The annotate view's events take their inputs as sent (preprocess=False), and check them themselves: their refusals
    are in the view's message line."""

    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):
        try:
            if block_fn.preprocess and (wrong := wrong_input(block_fn.fn, inputs, block_fn.inputs)):
                raise TypeError(wrong)
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except Exception as e:
            detail = e.message if isinstance(e, gr.Error) else e
            log_refusal(block_fn.name, f"its input is not what it takes: {detail}")
            reason = " ".join(str(detail).split())[:LOGGED_CHARACTERS]
            raise refused(f"Refused: this call's input is not what it takes ({reason})") from None


def build_app(server: Server) -> gr.Blocks:
    @with_error_ids
    def operator_controls(request: gr.Request) -> tuple:
        """At sign-in: the operator tab and its refreshes, for operators only."""
        operator = server.user(request.username).role == "operator"
        return gr.Tab(visible=operator), gr.Timer(active=operator), gr.Timer(active=operator)

    keep = server.project.config.server.export_seconds
    # delete_cache: Gradio's own copies of the export files go after the same time as ours.
    with Blocks(title="Tether", delete_cache=(keep, keep)) as app:
        gr.Markdown("## Tether: which response is better?")
        build_annotate(server, app)
        # Refresh the operator's views; switched on at sign-in for operators only.
        timer = gr.Timer(2, active=False)
        data_timer = gr.Timer(DATA_REFRESH_SECONDS, active=False)  # the Data view's scans cost more: less often
        with gr.Tab("Operator", visible=False) as operator_tab:
            build_data(server, data_timer, operator_tab)
            build_prompts(server)
            build_generate(server)
            build_reward_models(server)
            build_jobs(server, timer)
            build_loop(server, timer, app)
            build_accounts(server)
            build_export(server)
        app.load(operator_controls, outputs=[operator_tab, timer, data_timer], api_visibility="private")
    return app


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # Gradio shuts down cleanly on it


def launch(server: Server, host: str, port: int, prevent_thread_lock: bool = False) -> gr.Blocks:
    """Serve the app for this server's project; it blocks until stopped unless prevent_thread_lock."""
    app = build_app(server)
    app.queue(default_concurrency_limit=64)
    settings = server.project.config.server

    @asynccontextmanager
    async def guarded(gradio_app: Any):
        """At start, before the first request is taken: sessions that end, and SameOrigin around Gradio's CORS layer."""
        gradio_app.middleware_stack = SameOrigin(gradio_app.middleware_stack, settings.trusted_origins)
        gradio_app.tokens = server.sessions
        yield

    app.launch(
        server_name=host, server_port=port, auth=server.sign_in.check, auth_message="Sign in to Tether.",
        footer_links=[], ssr_mode=False, head=KEYS_JS, css=CSS, show_error=True, max_threads=80,
        max_file_size=int(settings.max_upload_mb * 2**20), prevent_thread_lock=True,
        app_kwargs={"middleware": [Middleware(ClientAddress), Middleware(BodyLimit, limit=settings.max_request_kb * 1024),
                                   Middleware(OperatorUploads, server=server)],
                    "routes": control.routes(server), "lifespan": guarded},
    )
    if app.server_app.tokens is not server.sessions:  # uvicorn serves on, unguarded, when a lifespan fails
        app.close()
        raise RuntimeError("the app could not install its request checks, so it does not serve")
    control.announce(server.project, app.local_url, server.control_token)
    if not prevent_thread_lock:
        app.block_thread()
    return app


def run(project: Project, host: str, port: int) -> None:
    # What the server writes (the database's new files, jobs, uploads, exports) is its owner's alone,
    # and so is what was there before: the database holds the password hashes.
    os.umask(0o077)
    project.root.chmod(0o700)
    gradio_files = project.root / GRADIO_FILES
    gradio_files.mkdir(mode=0o700, exist_ok=True)
    gradio_files.chmod(0o700)  # one made before, by hand, may be open to others
    os.environ["GRADIO_TEMP_DIR"] = str(gradio_files)  # read as the app is built, not when gradio is imported
    # SIGTERM (service managers, `kill`) stops the app as Ctrl-C does; a background process
    # started by a script ignores SIGINT, so it is restored too.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server = Server(project)
    try:
        launch(server, host, port)
    finally:
        server.close()
