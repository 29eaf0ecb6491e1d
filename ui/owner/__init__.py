"""The database owner: the one writer, job submission and the runner, rounds, simulate, recovery, backup, control,
config and project. It imports neither gradio nor click."""
