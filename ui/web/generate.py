"""The Generate view: completions of the newest policy, paired for the annotators, as a job."""

import gradio as gr

from ui.owner.round_jobs import submit_generation
from ui.owner.server import Server
from ui.web.common import refused, user_errors, whole_number, with_error_ids


def build_generate(server: Server) -> None:
    @with_error_ids
    def generate_pairs(limit: float | None, per_prompt: float | None, request: gr.Request) -> str:
        server.operator(request.username)
        limit, per_prompt = whole_number(limit), whole_number(per_prompt)
        if limit is None or per_prompt is None:
            raise refused("Give the prompts and the completions per prompt as whole numbers.")
        with user_errors():
            job = submit_generation(server.project, server.db, limit=limit, per_prompt=per_prompt)
        return f"Queued job {job.id}: its progress shows under Jobs."

    with gr.Tab("Generate"):
        limit = gr.Number(label="Prompts (those with the fewest completions first)", value=20, precision=0, minimum=1)
        per_prompt = gr.Number(label="Completions per prompt", value=2, precision=0, minimum=2)
        generate_button = gr.Button("Generate completions and pairs")
        result = gr.Textbox(label="Result", interactive=False)
    generate_button.click(generate_pairs, inputs=[limit, per_prompt], outputs=[result], api_name="generate", api_visibility="undocumented")
