"""What the benchmarks share: running one arm in a child process and taking its own peak memory, a policy to
sample from, and the work directory and evaluation prompts of the loop benchmarks."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run_arm(name: str, command: list[str], env: dict[str, str] | None = None) -> dict:
    """Run an arm that prints its result as a JSON last line; that result and the child's peak resident memory."""
    print(f"running {name} ...", file=sys.stderr, flush=True)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    stdout = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"the {name} arm failed (wait status {status})")
    return {**json.loads(stdout.strip().splitlines()[-1]), "peak_gb": usage.ru_maxrss / 2**20}


def random_policy(model, rank: int = 16):
    """A PEFT policy on `model`: a LoRA adapter of `rank` on every linear layer, its B drawn at random as a trained
    policy's would be (B starts at zero, which would leave a fold or a merge nothing to do)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    policy = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear")).eval()
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
    return policy


def loop_setup(parser: argparse.ArgumentParser, args: argparse.Namespace, prefix: str) -> tuple[Path, Path, int]:
    """The work directory (args.workdir or a new temporary one), and in it eval.jsonl, the first args.eval_count
    prompts of args.eval_prompts; and that count."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    lines = [line for line in args.eval_prompts.read_text(encoding="utf-8").splitlines() if line.strip()][: args.eval_count]
    if len(lines) < args.eval_count:
        parser.error(f"{args.eval_prompts} has {len(lines)} prompts, fewer than --eval-count {args.eval_count}")
    eval_file = workdir / "eval.jsonl"
    eval_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"work directory {workdir}; {len(lines)} evaluation prompts from {args.eval_prompts}", flush=True)
    return workdir, eval_file, len(lines)
