"""PPO: Tether's train_ppo against TRL 1.12.0's PPOTrainer used directly.

TRL 1.12.0 is the last TRL with PPO (`trl.experimental.ppo`), so that arm runs in its own virtual
environment, .bench/trl-1.12.0, made on first use with TRL_REQUIREMENTS. Each arm runs in its own
child process so that its peak memory is its own, both in the same invocation, because this
machine is noisy.

Both arms run --steps PPO steps on the default model with a LoRA policy of the same rank, alpha
and target modules (all linear layers), on the demo prompts: --batch-size responses a step,
sampled at the same temperature (top-k and top-p off) up to --max-new-tokens, --epochs passes of
an optimiser step per minibatch of --minibatch-size (TRL's batch is per_device_train_batch_size,
split into num_mini_batches), the same learning rate, a fixed KL coefficient (Tether's
target_kl 0), and the same clip ranges, value-loss weight, GAE gamma and lambda and missing-EOS
penalty. The reference is the base with the adapters disabled in both.
Reward quality is irrelevant to speed, so the reward model is untrained: a fresh LoRA adapter on
the base and a random score head, saved in Tether's format for Tether, and merged into a full
sequence classifier for TRL, which copies it for its reward and value models.

What differs, by design of each trainer:
- models: Tether holds one base with the policy's and reward model's adapters and a value head on
  the policy's states; TRL holds the base with the policy adapter, and two more full models, the
  value model (trained in full) and the reward model. That is what the memory comparison measures;
- log-probs: TRL takes the rollout's from generate's scores; Tether recomputes them, with the
  entropy, in a forward pass;
- TRL decays the learning rate linearly and never clips gradients; Tether keeps it constant and
  clips at max_grad_norm. AdamW's epsilon is 1e-8 in TRL, 1e-5 in Tether;
- prompts: TRL shuffles the file and takes batches without replacement; Tether draws each batch
  of distinct prompts afresh, so the prompts, and so the response lengths, differ between arms;
- precision: Tether scores and updates in bfloat16 autocast on a CPU with AMX or AVX512-BF16
  (its precision "auto"). TRL's bf16 is left at its default, on, but PPOTrainer builds its own
  Accelerator without mixed precision, so it computes in float32 whatever the flag says. Its
  gradient_checkpointing default stays on, but PPOTrainer.train never turns it on: neither arm
  checkpoints;
- attention: Tether uses eager attention on a CPU, whose backward is faster there than SDPA's at
  these lengths; TRL keeps transformers' default, SDPA.

With --repeats N the arms alternate N times (TRL, Tether, TRL, ...) and the ratios compare each
arm's median, since a stall of the shared machine during one arm moves a single run's ratio by
a third.

Throughput is response tokens generated during training per second of it: tokens through each
response's first EOS, or all --max-new-tokens without one, counted alike in both arms (Tether's
generated_tokens; TRL's rollouts as its policy's generate returns them). Training seconds are
Tether's PPO steps summed and TRL's trainer.train(); loading models and setting up are left out.

With --baseline DIR, the Tether arm of another checkout (say `git worktree add /tmp/before main`)
runs beside this one's, on the same reward model and prompts, and the ratio of this tree's
throughput to it is printed: how a change moves PPO's speed, measured in one run. --skip-trl
leaves TRL's arm out.

    .venv/bin/python scripts/bench_ppo.py --steps 8
    .venv/bin/python scripts/bench_ppo.py --skip-trl --baseline /tmp/before --repeats 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench_arms import run_arm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# train.common.config has no torch or transformers, so the TRL environment imports it as well.
from train.common.config import PPOConfig

PROMPTS_FILE = ROOT / "scripts" / "demo_prompts.jsonl"
TRL_VENV = ROOT / ".bench" / "trl-1.12.0"
# The newest releases of TRL's dependencies on the day TRL 1.12.0 came out (26 August 2026).
# torch 2.13.0 is the CPU build from the local wheel; unpinned, pip pulls CUDA's gigabytes.
TRL_REQUIREMENTS = ["torch==2.13.0", "trl==1.12.0", "transformers==5.16.1", "peft==0.20.0", "accelerate==1.14.0", "datasets==5.0.1"]


def trl_python() -> Path:
    """The TRL environment's python, installed the first time and whenever TRL_REQUIREMENTS change."""
    python, stamp = TRL_VENV / "bin" / "python", TRL_VENV / "requirements.txt"
    wanted = "\n".join(TRL_REQUIREMENTS) + "\n"
    if stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"installing {', '.join(TRL_REQUIREMENTS)} into {TRL_VENV} ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(TRL_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *TRL_REQUIREMENTS], check=True)
    stamp.write_text(wanted)  # last, so an interrupted install is redone
    return python


def ppo_config(options: argparse.Namespace) -> PPOConfig:
    return PPOConfig(
        steps=options.steps, batch_size=options.batch_size, minibatch_size=options.minibatch_size, epochs=options.epochs,
        learning_rate=options.learning_rate, max_new_tokens=options.max_new_tokens, temperature=options.temperature,
        lora_r=options.lora_r, lora_alpha=options.lora_alpha, kl_coef=options.kl_coef, target_kl=0.0, seed=options.seed,
    )


def prepare(workdir: Path, config: PPOConfig) -> None:
    """What both arms read from workdir: setup.json (model path, prompts) and the untrained reward model.

    reward/ is in Tether's format; reward-merged/ is the same model as a full sequence classifier.
    """
    from store.prompt_files import read_prompt_file
    from train.common.config import DEFAULT_MODEL, RewardModelConfig
    from train.common.models import resolve_model_path
    from train.reward.layout import METRICS_FILE, NORMALIZATION_FILE
    from train.reward.lora import build_model
    from train.reward.scores import Normalization

    model_path = resolve_model_path(DEFAULT_MODEL)
    prompts = [p.messages for p in read_prompt_file(PROMPTS_FILE)]
    (workdir / "setup.json").write_text(json.dumps({"model_path": model_path, "prompts": prompts}))
    # One head: TRL's PPO reads a scalar reward model. Its rank follows --lora-r, as the policy's does.
    rm_config = RewardModelConfig(heads=1, lora_r=config.lora_r, lora_alpha=config.lora_alpha, seed=config.seed)
    model, tokenizer = build_model(model_path, rm_config)
    reward_dir = workdir / "reward"
    model.save_pretrained(reward_dir)
    tokenizer.save_pretrained(reward_dir)
    (reward_dir / NORMALIZATION_FILE).write_text(json.dumps(asdict(Normalization(mean=[0.0], std=[1.0]))))
    (reward_dir / METRICS_FILE).write_text(json.dumps({"config": asdict(rm_config)}))
    model.merge_and_unload().save_pretrained(workdir / "reward-merged")
    tokenizer.save_pretrained(workdir / "reward-merged")


def run_tether(workdir: Path, setup: dict, config: PPOConfig) -> dict:
    from train.common.config import ModelConfig
    from train.common.models import load_model
    from train.policy.ppo import train_ppo

    model, tokenizer = load_model(ModelConfig(name_or_path=setup["model_path"], device="cpu"))
    out_dir = Path(tempfile.mkdtemp(prefix="tether-policy-", dir=workdir))  # a new one for each of --repeats
    steps = train_ppo(model, tokenizer, setup["prompts"], workdir / "reward", config, out_dir)["steps"]
    return {"steps": len(steps), "generated_tokens": sum(s["generated_tokens"] for s in steps),
            "train_seconds": sum(s["seconds"] for s in steps)}


def run_trl(workdir: Path, setup: dict, config: PPOConfig) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl.experimental.ppo import PPOConfig as TRLPPOConfig
    from trl.experimental.ppo import PPOTrainer

    model_path = setup["model_path"]
    dtype = getattr(torch, setup.get("dtype", "float32"))  # scripts/bench_gpu.py runs this arm in bfloat16 on a GPU
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    value_model, reward_model = (AutoModelForSequenceClassification.from_pretrained(workdir / "reward-merged", num_labels=1,
                                                                                    dtype=dtype) for _ in range(2))
    queries = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
               for m in setup["prompts"]]
    args = TRLPPOConfig(
        output_dir=str(workdir / "trl"), total_episodes=config.steps * config.batch_size,
        per_device_train_batch_size=config.batch_size, num_mini_batches=config.batch_size // config.minibatch_size,
        num_ppo_epochs=config.epochs, learning_rate=config.learning_rate, response_length=config.max_new_tokens,
        temperature=config.temperature, kl_coef=config.kl_coef, cliprange=config.clip_range,
        cliprange_value=config.clip_range_value, vf_coef=config.vf_coef, gamma=config.gamma, lam=config.lam,
        missing_eos_penalty=config.missing_eos_penalty, stop_token="eos", seed=config.seed,
        use_cpu=not torch.cuda.is_available(), save_strategy="no", report_to="none", logging_steps=1, disable_tqdm=True,
    )
    lora = LoraConfig(task_type="CAUSAL_LM", r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules="all-linear")
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy, ref_model=None, reward_model=reward_model,
                         train_dataset=Dataset.from_dict({"input_ids": queries}), value_model=value_model, peft_config=lora)
    generated = count_generated(trainer.policy_model, tokenizer.eos_token_id)
    started = time.perf_counter()
    trainer.train()
    return {"steps": trainer.state.global_step, "generated_tokens": sum(generated),
            "train_seconds": time.perf_counter() - started,
            "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None}


def count_generated(model, eos_id: int) -> list[int]:
    """Wraps model.generate to count each call's response tokens as Tether counts them; the list fills as it runs."""
    import torch

    counts: list[int] = []
    generate = model.generate

    def counting_generate(*args, **kwargs):
        output = generate(*args, **kwargs)
        responses = output.sequences[:, kwargs["input_ids"].shape[1] :]  # (B, R)
        is_eos = responses == eos_id
        lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, responses.shape[1])  # through the first EOS
        counts.append(int(lengths.sum()))
        return output

    model.generate = counting_generate
    return counts


def arm(name: str, workdir: Path, config: PPOConfig) -> None:
    """One arm, in this (child) process: its result as one JSON line on stdout."""
    setup = json.loads((workdir / "setup.json").read_text())
    runner = run_tether if name == "tether" else run_trl
    print(json.dumps(runner(workdir, setup, config)))


def measure(name: str, python: Path, workdir: Path, options: argparse.Namespace, script: Path = Path(__file__)) -> dict:
    """Run one arm of `script` (this one, or a baseline checkout's) in a child process with this invocation's PPO
    settings; its result and its own peak resident memory."""
    settings = ("steps", "batch_size", "minibatch_size", "epochs", "max_new_tokens", "lora_r", "lora_alpha", "learning_rate",
                "temperature", "kl_coef", "seed")
    flags = [part for key in settings for part in (f"--{key.replace('_', '-')}", str(getattr(options, key)))]
    command = [str(python), str(script), *flags, "--arm", "tether" if name == "baseline" else name, "--workdir", str(workdir)]
    return run_arm(name, command)


def main() -> None:
    defaults = PPOConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="PPO steps [default: 8]")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per step, one response each [default: 8]")
    parser.add_argument("--minibatch-size", type=int, default=defaults.minibatch_size,
                        help=f"responses per optimiser step [default: {defaults.minibatch_size}]")
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help=f"passes over each batch [default: {defaults.epochs}]")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="longest response, in tokens [default: 48]")
    parser.add_argument("--lora-r", type=int, default=defaults.lora_r, help=f"LoRA rank [default: {defaults.lora_r}]")
    parser.add_argument("--lora-alpha", type=int, default=defaults.lora_alpha, help=f"LoRA alpha [default: {defaults.lora_alpha}]")
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate, help=f"AdamW learning rate [default: {defaults.learning_rate}]")
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help=f"sampling temperature [default: {defaults.temperature}]")
    parser.add_argument("--kl-coef", type=float, default=defaults.kl_coef, help=f"fixed KL coefficient [default: {defaults.kl_coef}]")
    parser.add_argument("--seed", type=int, default=defaults.seed, help=f"random seed [default: {defaults.seed}]")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each arm, alternating; ratios of medians [default: 1]")
    parser.add_argument("--skip-trl", action="store_true", help="leave out TRL's arm (and its environment)")
    parser.add_argument("--baseline", type=Path, help="a checkout of Tether whose PPO runs beside this one's, for the ratio of the two")
    parser.add_argument("--arm", choices=["tether", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.repeats < 1:
        parser.error("--repeats must be at least 1")
    baseline_script = options.baseline / "scripts" / "bench_ppo.py" if options.baseline else None
    if baseline_script and not baseline_script.is_file():
        parser.error(f"--baseline {options.baseline}: no scripts/bench_ppo.py there; give a checkout of Tether")
    if options.skip_trl and not options.baseline:
        parser.error("--skip-trl leaves Tether's arm with nothing to compare with: give --baseline too")
    config = ppo_config(options)  # checks the settings before anything is installed or run
    if options.arm:
        return arm(options.arm, options.workdir, config)

    python = None if options.skip_trl else trl_python()
    runs: dict[str, list[dict]] = {"trl": [], "baseline": [], "tether": []}
    with tempfile.TemporaryDirectory(prefix="bench-ppo-") as scratch:
        workdir = Path(scratch)
        prepare(workdir, config)
        for _ in range(options.repeats):
            if python:
                runs["trl"].append(measure("trl", python, workdir, options))
            if baseline_script:
                runs["baseline"].append(measure("baseline", Path(sys.executable), workdir, options, baseline_script))
            runs["tether"].append(measure("tether", Path(sys.executable), workdir, options))
    print(f"{config.steps} steps of {config.batch_size} responses, {config.epochs} epochs of minibatch {config.minibatch_size}, "
          f"max {config.max_new_tokens} new tokens, LoRA r {config.lora_r}, {os.cpu_count()} CPUs")
    print(f"{'':8} {'run':>3} {'steps':>6} {'tokens':>7} {'tok/resp':>8} {'seconds':>8} {'tokens/s':>9} {'peak GB':>8}")
    for name, results in runs.items():
        for number, r in enumerate(results, 1):
            r["tokens_per_second"] = r["generated_tokens"] / r["train_seconds"]
            per_response = r["generated_tokens"] / (r["steps"] * config.batch_size)
            print(f"{name:8} {number:3d} {r['steps']:6d} {r['generated_tokens']:7d} {per_response:8.1f} {r['train_seconds']:8.1f} "
                  f"{r['tokens_per_second']:9.2f} {r['peak_gb']:8.2f}")
    medians = {name: {key: statistics.median(r[key] for r in results) for key in ("tokens_per_second", "peak_gb")}
               for name, results in runs.items() if results}
    ours, of = medians["tether"], f" (medians of {options.repeats} runs)" if options.repeats > 1 else ""
    if trl := medians.get("trl"):
        print(f"throughput ratio tether / TRL{of}: {ours['tokens_per_second'] / trl['tokens_per_second']:.2f}x (target >= 1.3x)")
        print(f"peak memory ratio tether / TRL{of}: {ours['peak_gb'] / trl['peak_gb']:.2f}x (target <= 0.7x)")
    if before := medians.get("baseline"):
        print(f"throughput ratio tether / baseline {options.baseline}{of}: {ours['tokens_per_second'] / before['tokens_per_second']:.2f}x")
        print(f"peak memory ratio tether / baseline{of}: {ours['peak_gb'] / before['peak_gb']:.2f}x")


if __name__ == "__main__":
    main()
