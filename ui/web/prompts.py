"""The Prompts view: import a prompt file."""

import gradio as gr

from ui.owner.server import Server
from ui.web.common import refused, user_errors, with_error_ids


def build_prompts(server: Server) -> None:
    @with_error_ids
    def import_prompts(upload: str | None, request: gr.Request) -> str:
        server.operator(request.username)
        if not upload:
            raise refused("Choose a file first.")
        with user_errors():
            result = server.import_prompts(upload)
        return f"Imported {result.added} prompts ({result.duplicates} already present)."

    with gr.Tab("Prompts"):
        upload = gr.File(label="Prompt file (.jsonl, .csv, .parquet)", file_types=[".jsonl", ".csv", ".parquet", ".gz"])
        import_button = gr.Button("Import")
        result = gr.Textbox(label="Result", interactive=False)
    import_button.click(import_prompts, inputs=[upload], outputs=[result], api_name="import_prompts", api_visibility="undocumented")
