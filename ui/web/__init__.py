"""The Gradio app: one module per view, each with its handlers beside its layout; they call the owner."""
