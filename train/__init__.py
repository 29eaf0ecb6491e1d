"""Models: loading, generation, reward-model training, PPO, and the job worker that runs them in one process or several.

This package reads and writes files; it never opens the database.
"""

import logging
import warnings

# Lines about libraries' own internals, which no Tether setting changes, are kept off the user's terminal:
# - bitsandbytes, imported on a CPU with AVX512-BF16, looks for an optional 4-bit kernel on the Hugging Face hub,
#   which Tether never downloads and turns off to train (train.models.prepare_for_training);
# - PEFT 0.21 and TRL call transformers' deprecated names for checkpointing (transformers 5.24).
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message="`(is_)?gradient_checkpointing(_enable)?` is deprecated", category=FutureWarning)
