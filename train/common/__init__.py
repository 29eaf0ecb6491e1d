"""What every job shares.

    config.py    the model side's settings, read from tether.toml (free of torch, so reading them stays quick)
    snapshot.py  the frozen inputs a job trains on, as Parquet (free of torch: the export writes the same rows)
    models.py    loading the base model and its tokenizer, the default converted once from its GGUF
    errors.py    ModelError: a model that cannot be found or used, told in one line
"""
