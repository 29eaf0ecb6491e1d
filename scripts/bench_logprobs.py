"""Peak memory of one PPO update: the selective log-softmax against the full one it replaced.

The full arm computes log_softmax over the whole vocabulary in float32, a (B, R, V) tensor kept for
the backward pass, and reads the response tokens from it; the selective arm (train.policy.generate's,
which PPO uses) takes each sequence's logsumexp from a float32 copy of that sequence's logits alone. Both run the same
update on the same sampled batch of the default model, each in its own child process, and report
the growth of resident memory over the update, sampled every 5 ms, and its wall time.

    python scripts/bench_logprobs.py --batch 8 --tokens 64
"""

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_arms import run_arm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def full_log_softmax(logits, tokens, temperature):
    """The baseline: the whole (B, R, V) log-softmax in float32, read at the tokens."""
    import torch.nn.functional as F

    return F.log_softmax(logits.float() / temperature, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def resident_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def arm(name: str, batch: int, tokens: int) -> dict:
    import torch

    import train.policy.ppo as ppo
    from train.common.config import ModelConfig, PPOConfig, RewardModelConfig
    from train.common.models import load_model, resolve_model_path
    from train.policy.generate import end_of_turn_ids
    from train.reward.layout import METRICS_FILE, NORMALIZATION_FILE
    from train.reward.lora import build_model
    from train.reward.versions import read_reward_adapter

    if name == "full":
        ppo.selective_log_softmax = full_log_softmax
    reward_dir = Path(tempfile.mkdtemp()) / "rm"  # an untrained head: the update's memory does not depend on its values
    reward, tokenizer = build_model(resolve_model_path(ModelConfig().name_or_path), RewardModelConfig(heads=1))
    reward.save_pretrained(reward_dir)
    tokenizer.save_pretrained(reward_dir)
    (reward_dir / NORMALIZATION_FILE).write_text(json.dumps({"mean": [0.0], "std": [1.0]}))
    (reward_dir / METRICS_FILE).write_text(json.dumps({"config": {"max_length": 512, "heads": 1}}))
    prompts = [json.loads(line) for line in (ROOT / "scripts" / "demo_prompts.jsonl").read_text().splitlines()][:batch]
    prompts = [p.get("messages") or [{"role": "user", "content": p["prompt"]}] for p in prompts]
    model, tokenizer = load_model(ModelConfig())
    config = PPOConfig(batch_size=batch, minibatch_size=4, epochs=1, max_new_tokens=tokens)
    reward = read_reward_adapter(reward_dir)
    wrapped = ppo.build(model, reward, config)
    scorer = ppo.RewardScorer(tokenizer, reward.normalization, 512)
    torch.manual_seed(0)
    sampled = ppo.sample(wrapped, tokenizer, prompts, config, end_of_turn_ids(model, tokenizer))
    rollout, _ = ppo.evaluate(wrapped, scorer, prompts, sampled, config)
    ppo.add_rewards(rollout, config.kl_coef)
    ppo.add_advantages(rollout, config.gamma, config.lam)
    optimizer = ppo.optimizer_for(wrapped, config)

    before, peak, running = resident_bytes(), [0], [True]

    def watch() -> None:
        while running[0]:
            peak[0] = max(peak[0], resident_bytes())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.perf_counter()
    ppo.update(wrapped, optimizer, rollout, config, torch.Generator().manual_seed(0))
    seconds = time.perf_counter() - started
    running[0] = False
    watcher.join()
    return {"update_gb": (peak[0] - before) / 2**30, "seconds": seconds, "response_tokens": int(rollout.response_mask.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="Responses in the update.")
    parser.add_argument("--tokens", type=int, default=64, help="Longest response, in tokens.")
    parser.add_argument("--arm", choices=["full", "selective"], help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.arm:
        print(json.dumps(arm(options.arm, options.batch, options.tokens)))
        return
    results = {
        name: run_arm(name, [sys.executable, __file__, "--arm", name, "--batch", str(options.batch), "--tokens", str(options.tokens)])
        for name in ("full", "selective")
    }
    for name, r in results.items():
        print(f"{name:9}  update +{r['update_gb']:.2f} GB over its start, {r['seconds']:.1f} s, {r['response_tokens']} response tokens")
    full, selective = results["full"], results["selective"]
    print(f"selective / full: memory growth {selective['update_gb'] / full['update_gb']:.2f}x, time {selective['seconds'] / full['seconds']:.2f}x")


if __name__ == "__main__":
    main()
