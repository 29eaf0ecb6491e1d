"""What every job shares, and the bottom layer of train: it imports nothing of runtime, reward or policy.

    config.py    the model side's settings, read from tether.toml (free of torch, so reading them stays quick)
    snapshot.py  the frozen inputs a job trains on, as Parquet (free of torch: the export writes the same rows)
    models.py    loading the base model and its tokenizers, the default converted once from its GGUF
    device.py    the device [model] names, and whether its GPU and quantisation settings run here (torch alone)
    files.py     files and directories put in place whole (standard library only: the owner and the export use it)
    errors.py    ModelError: a model that cannot be found or used, told in one line
"""
