"""scripts/bench_gpu.py runs on the CPU with --tiny: every arm, in its own process, and the report."""

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.deep
def test_bench_gpu_runs_every_arm_on_the_cpu_with_tiny():
    # Peaks at a CPU's scale (1 GB/s, 10 GFLOP/s): at a GPU's, the tiny model's shares print as 0.0% or 0.1% and flake.
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_gpu.py"), "--tiny", "--skip-trl", "--peak-bandwidth", "0.001",
                           "--peak-tflops", "0.01"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("CPU (4-bit needs CUDA: left out)"), done.stdout
    # model, format, RM pairs/s, RM memory, head seconds, its fit's, head memory, PPO tokens/s, generation share, PPO memory,
    # gen tokens/s, raw tokens/s, ratio
    row = re.search(r"^tiny +bf16 +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +(\d+)% +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)x$",
                    done.stdout, re.M)
    assert row, done.stdout
    rm_pairs, rm_memory, head_seconds, fit_seconds, head_memory, ppo_tokens, generate_share, ppo_memory, ours, raw, ratio = map(float, row.groups())
    assert min(rm_pairs, rm_memory, head_seconds, head_memory, ppo_tokens, ppo_memory, ours, raw) > 0 and 0 < generate_share < 100
    assert fit_seconds <= head_seconds  # the fit is part of the head's job
    assert abs(ratio - ours / raw) < 0.02  # its ratio is of the unrounded rates
    # Each throughput against the limits given: shares of the bandwidth bound and the FLOP/s peak, and PPO's time split.
    limits = re.search(r"^  tiny bf16: generation [\d,]+ tokens/s = ([\d.]+)% of [\d,]+ .*; PPO [\d,]+ tokens/s = [\d.]+% of [\d,]+ .*"
                       r"its time (\d+)% sampling, (\d+)% scoring, (\d+)% update; reward model [\d.]+ TFLOP/s = ([\d.]+)% of the peak$",
                       done.stdout, re.M)
    assert limits, done.stdout
    generation_share, sampling, scoring, updating, flop_share = map(float, limits.groups())
    assert 0 < generation_share < 100 and 0 < flop_share < 100 and 97 <= sampling + scoring + updating <= 101
    assert "process 0 of 1: 16 rows fitted" in done.stderr and "process 0 of 1: 8 responses sampled over 2 steps" in done.stderr
