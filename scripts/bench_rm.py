"""Reward-model training: Tether's train_reward_model against TRL's RewardTrainer used directly.

Both arms train the same base model with the same LoRA settings, batch, learning rate, epochs,
max_length, precision and gradient checkpointing, on the first --pairs comparisons of an HH file,
and are scored on its last --eval-pairs. Each arm runs in its own child process so that its peak
memory is its own. The baseline runs in the same invocation, because this machine is noisy.

TRL tokenises the conversations itself and drops every pair over max_length; Tether cuts long
prompts from the left and keeps every pair. Throughput is pairs trained per second of training;
accuracy is each arm's held-out pairwise accuracy, in its own tokenisation.

    python scripts/bench_rm.py --pairs 96 --eval-pairs 100
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_arms import run_arm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HH_FILE = ROOT.parent / "shared" / "data" / "hh-rlhf-harmless-1800.jsonl.gz"


def preference_rows(path: Path, first: int, last: int) -> tuple[list, list]:
    """(the first `first`, the last `last`) comparisons as PreferenceRows."""
    from store.pref_files import read_preference_file
    from train.common.snapshot import PreferenceRow

    rows = [PreferenceRow(p.prompt.messages, p.chosen, p.rejected) for p in read_preference_file(path)]
    if first + last > len(rows):
        raise SystemExit(f"{path} has {len(rows)} pairs, fewer than --pairs {first} + --eval-pairs {last}")
    return rows[:first], rows[len(rows) - last :]


def run_tether(model_path: str, train: list, held: list, config) -> dict:
    from train.reward.lora import train_reward_model

    with tempfile.TemporaryDirectory() as scratch:
        metrics = train_reward_model(model_path, train, held, config, Path(scratch) / "rm")
    return {"pairs_trained": metrics["pairs_train"], "train_seconds": metrics["train_seconds"],
            "accuracy": metrics["eval_accuracy"], "eval_pairs": metrics["pairs_eval"]}


def run_trl(model_path: str, train: list, held: list, config) -> dict:
    from datasets import Dataset
    from peft import LoraConfig, TaskType
    from trl import RewardConfig, RewardTrainer

    from train.common.snapshot import conversational
    from train.runtime.hardware import uses_bf16

    with tempfile.TemporaryDirectory() as scratch:
        args = RewardConfig(
            output_dir=scratch, num_train_epochs=config.epochs, per_device_train_batch_size=config.batch_size,
            per_device_eval_batch_size=config.batch_size * 2, learning_rate=config.learning_rate, lr_scheduler_type="linear",
            max_length=config.max_length, seed=config.seed, gradient_checkpointing=config.gradient_checkpointing,
            bf16=uses_bf16(config.precision), use_cpu=True, disable_dropout=False,
            logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        )
        lora = LoraConfig(task_type=TaskType.SEQ_CLS, r=config.lora_r, lora_alpha=config.lora_alpha,
                          lora_dropout=config.lora_dropout, target_modules=config.lora_target_modules(), modules_to_save=["score"])
        trainer = RewardTrainer(model=model_path, args=args, train_dataset=Dataset.from_list([conversational(r) for r in train]),
                                eval_dataset=Dataset.from_list([conversational(r) for r in held]), peft_config=lora)
        started = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - started
        evaluated = trainer.evaluate()
    return {"pairs_trained": len(trainer.train_dataset), "train_seconds": train_seconds,
            "accuracy": evaluated["eval_accuracy"], "eval_pairs": len(trainer.eval_dataset)}


def arm(name: str, options: argparse.Namespace) -> None:
    """One arm, in this (child) process: its result as one JSON line on stdout."""
    from train.common.config import DEFAULT_MODEL, RewardModelConfig
    from train.common.models import resolve_model_path
    from train.runtime.hardware import uses_bf16

    train, held = preference_rows(options.data, options.pairs, options.eval_pairs)
    config = RewardModelConfig(max_length=options.max_length, batch_size=options.batch_size, eval_share=0.0,
                              gradient_checkpointing=False)  # as "auto" is on a float32 base; TRL takes a bool
    runner = run_tether if name == "tether" else run_trl
    result = runner(resolve_model_path(DEFAULT_MODEL), train, held, config)
    print(json.dumps({**result, "bf16": uses_bf16(config.precision)}))


def measure(name: str, options: argparse.Namespace) -> dict:
    """Run one arm in a child process; its result and its own peak resident memory."""
    command = [sys.executable, __file__, "--arm", name, "--pairs", str(options.pairs), "--eval-pairs", str(options.eval_pairs),
               "--max-length", str(options.max_length), "--batch-size", str(options.batch_size), "--data", str(options.data)]
    return run_arm(name, command)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=96, help="training pairs: the first N of the file [default: 96]")
    parser.add_argument("--eval-pairs", type=int, default=100, help="held-out pairs: the last N of the file [default: 100]")
    parser.add_argument("--max-length", type=int, default=512, help="longest prompt + response in tokens [default: 512]")
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per step [default: 8]")
    parser.add_argument("--data", type=Path, default=HH_FILE, help="Anthropic HH file [default: the shared harmless 1,800]")
    parser.add_argument("--arm", choices=["tether", "trl"], help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.arm:
        return arm(options.arm, options)

    results = {name: measure(name, options) for name in ("trl", "tether")}
    print(f"{options.pairs} training pairs, {options.eval_pairs} held out, max_length {options.max_length}, "
          f"batch {options.batch_size}, bf16 {results['tether']['bf16']}, {os.cpu_count()} CPUs")
    print(f"{'':8} {'trained':>8} {'seconds':>8} {'pairs/s':>8} {'accuracy':>9} {'eval pairs':>10} {'peak GB':>8}")
    for name, r in results.items():
        r["pairs_per_second"] = r["pairs_trained"] / r["train_seconds"]
        print(f"{name:8} {r['pairs_trained']:8d} {r['train_seconds']:8.1f} {r['pairs_per_second']:8.3f} "
              f"{r['accuracy']:9.3f} {r['eval_pairs']:10d} {r['peak_gb']:8.2f}")
    ours, trl = results["tether"], results["trl"]
    print(f"throughput ratio tether / TRL: {ours['pairs_per_second'] / trl['pairs_per_second']:.2f}x (target >= 0.9x)")
    print(f"accuracy tether - TRL: {ours['accuracy'] - trl['accuracy']:+.3f} (target >= 0)")
    print(f"peak memory ratio tether / TRL: {ours['peak_gb'] / trl['peak_gb']:.2f}x")


if __name__ == "__main__":
    main()
