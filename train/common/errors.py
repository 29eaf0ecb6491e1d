class ModelError(Exception):
    """A model that cannot be found or used, told in one line."""
