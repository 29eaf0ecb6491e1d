"""The Export view: the votes as preference data, to download."""

import shutil

import gradio as gr

from ui.owner.server import Server
from ui.web.common import user_errors, with_error_ids


def build_export(server: Server) -> None:
    @with_error_ids
    def export_data(fmt: str, include_ties: bool, min_agreement: float, request: gr.Request) -> str:
        server.operator(request.username)
        with user_errors():
            out = server.export(fmt, include_ties, min_agreement or None)
        if fmt == "hf":  # a datasets directory downloads as one zip file
            return shutil.make_archive(str(out), "zip", out)
        return str(out)

    with gr.Tab("Export"):
        fmt = gr.Radio(["hf", "parquet", "jsonl"], value="hf", label="Format")
        include_ties = gr.Checkbox(label="Raw export: every vote, ties and both-bad included")
        min_agreement = gr.Slider(0, 1, value=0, step=0.05, label="Minimum agreement")
        export_button = gr.Button("Export")
        download = gr.File(label="Download", interactive=False)
    export_button.click(export_data, inputs=[fmt, include_ties, min_agreement], outputs=[download],
                        api_name="export", api_visibility="undocumented")
