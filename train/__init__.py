"""The model side: every job the database's owner hands to a worker, run from its job directory.

    worker.py   the entry point, `python -m train.worker JOB_DIR`: reads the job, runs it, writes its result
    reward/     reward models, of two kinds behind one face (reward.versions), and the AI judge
    policy/     the policy's optimisers (PPO, DPO, GRPO), sampling from it, and the predictor of a round's candidates
    runtime/    what a job runs on: its directory, its processes and GPUs, its memory, batches that shrink
    common/     what every job shares: the settings (tether.toml's model side), the frozen inputs, loading the base,
                files put in place whole

Lowest first, common, runtime, reward, policy and the worker: each imports only from itself and those before it
(tests/test_layout.py).

This package reads and writes files; it never opens the database.
"""

import logging
import warnings

# Lines about libraries' own internals, which no Tether setting changes, are kept off the user's terminal:
# - bitsandbytes, imported on a CPU with AVX512-BF16, looks for an optional 4-bit kernel on the Hugging Face hub,
#   which Tether never downloads and turns off to train (train.common.models.prepare_for_training);
# - PEFT 0.21 and TRL call transformers' deprecated names for checkpointing (transformers 5.24).
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message="`(is_)?gradient_checkpointing(_enable)?` is deprecated", category=FutureWarning)
