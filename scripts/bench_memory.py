"""Peak memory of reward-model training: glibc's default allocator settings against the workers' own, and both
against the expected peak that `tether status` prints (train.runtime.memory).

Both arms run Tether's reward-model training (the `tether` arm of bench_rm.py) on the same pairs with the same
settings, each in its own child process so that its peak resident memory is its own, in one invocation
because this machine is noisy. The first arm runs with glibc's defaults, the second with the environment a
worker gets with [worker] release_memory (train.runtime.jobdir.ALLOCATOR_ENV). The pairs are the first --pairs of the shared HH file, whose
prompts are long: nearly every batch fills --max-length, which is the length the expectation assumes.

    python scripts/bench_memory.py --pairs 32 --batch-size 8 --max-length 256
"""

import argparse
import os
import sys
from pathlib import Path

from bench_arms import run_arm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def expected_gb(max_length: int, batch_size: int) -> float:
    """train.runtime.memory's peak for a reward-model job on the default model, at full length."""
    from train.common.config import DEFAULT_MODEL, ModelConfig, RewardModelConfig
    from train.common.models import resolve_model_path
    from train.runtime.memory import GB, Estimator, model_shape
    from ui.owner.config import TetherConfig

    config = TetherConfig(model=ModelConfig(), reward_model=RewardModelConfig(max_length=max_length, batch_size=batch_size))
    estimator = Estimator(model_shape(resolve_model_path(DEFAULT_MODEL)), config, prompt_tokens=max_length, on_gpu=False)
    return estimator.reward_model().peak / GB


def main() -> None:
    from train.runtime.jobdir import ALLOCATOR_ENV

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=32, help="training pairs: the first N of the HH file [default: 32]")
    parser.add_argument("--max-length", type=int, default=256, help="longest prompt + response in tokens [default: 256]")
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per step [default: 8]")
    options = parser.parse_args()

    command = [sys.executable, str(ROOT / "scripts" / "bench_rm.py"), "--arm", "tether", "--pairs", str(options.pairs),
               "--eval-pairs", "8", "--max-length", str(options.max_length), "--batch-size", str(options.batch_size)]
    glibc = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    results = {"glibc": run_arm("glibc's defaults", command, glibc), "worker": run_arm("the workers' settings", command, glibc | ALLOCATOR_ENV)}
    expected = expected_gb(options.max_length, options.batch_size)
    print(f"{options.pairs} HH pairs, batch {options.batch_size}, max_length {options.max_length}, {os.cpu_count()} CPUs; "
          f"expected peak {expected:.2f} GB")
    print(f"{'':8} {'seconds':>8} {'pairs/s':>8} {'peak GB':>8} {'expected / peak':>16}")
    for name, r in results.items():
        r["pairs_per_second"] = r["pairs_trained"] / r["train_seconds"]
        print(f"{name:8} {r['train_seconds']:8.1f} {r['pairs_per_second']:8.3f} {r['peak_gb']:8.2f} {expected / r['peak_gb']:16.2f}")
    ours, glibc_default = results["worker"], results["glibc"]
    print(f"peak memory ratio worker / glibc: {ours['peak_gb'] / glibc_default['peak_gb']:.2f}x")
    print(f"throughput ratio worker / glibc: {ours['pairs_per_second'] / glibc_default['pairs_per_second']:.2f}x")


if __name__ == "__main__":
    main()
