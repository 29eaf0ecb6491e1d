"""Probe for issue 48: how fast each way of sampling PPO's rollouts runs, and whether a LoRA merge comes back exact.

On a random-weight Llama (bench_gpu.py's 1B shape; --tiny: its 2-layer one, for a CPU), one
batch of --batch prompts sampled to exactly --new-tokens tokens (temperature 1, top-k 0, top-p 1),
each way in its own process, timed after a warm-up:
- eager: the base model, transformers' dynamic KV cache (today's plain generation);
- lora: the policy's LoRA unmerged, through PEFT (today's rollouts);
- merged: the LoRA merged into the weights for the batch, then unmerged (merge and unmerge timed
  apart, and whether every base weight came back bit for bit);
- static, lora-static, merged-static: the same with a static KV cache, which transformers
  compiles (CUDA graphs) on a GPU.
Each compiled way is also timed on a batch with a shorter prompt width, to see what a new shape costs.

    python scripts/probe_sampling.py            # on a CUDA GPU
    python scripts/probe_sampling.py --tiny     # on a CPU: checks that it runs
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WAYS = ("eager", "lora", "merged", "static", "lora-static", "merged-static")


def child(options) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench_arms import random_policy
    from bench_gpu import prompts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(options.model_dir, dtype=torch.bfloat16).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(options.model_dir)
    tokenizer.padding_side = "left"
    way = options.way
    result = {"way": way}
    if way.startswith(("lora", "merged")):
        model = random_policy(model)
    batch = (prompts() * options.batch)[: options.batch]
    encoded = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] for m in batch]
    short = sorted(encoded, key=len)[: options.batch // 2] * 2  # a narrower padded width: a new shape

    def run(ids) -> float:
        inputs = tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt").to(device)
        static = {"cache_implementation": "static"} if way.endswith("static") else {}
        sync()
        started = time.perf_counter()
        with torch.inference_mode():
            model.generate(**inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_new_tokens=options.new_tokens,
                           max_new_tokens=options.new_tokens, pad_token_id=tokenizer.pad_token_id, **static)
        sync()
        return time.perf_counter() - started

    if way.startswith("merged"):
        touched = {n: p.detach().clone() for n, p in model.named_parameters() if "base_layer.weight" in n}
        sync()
        started = time.perf_counter()
        model.merge_adapter()
        sync()
        result["merge_s"] = time.perf_counter() - started
    result["first_s"] = run(encoded)
    seconds = [run(encoded) for _ in range(2)]
    result["tokens_per_second"] = options.batch * options.new_tokens / min(seconds)
    result["new_shape_first_s"] = run(short)
    result["new_shape_second_s"] = run(short)
    if way.startswith("merged"):
        sync()
        started = time.perf_counter()
        model.unmerge_adapter()
        sync()
        result["unmerge_s"] = time.perf_counter() - started
        result["weights_changed_after_unmerge"] = sum(
            not torch.equal(p, touched[n]) for n, p in model.named_parameters() if n in touched)
        result["weights_touched"] = len(touched)
    result["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return result


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the 2-layer model, for a CPU")
    parser.add_argument("--batch", type=int, default=64, help="prompts in the batch [default: 64]")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens sampled per prompt [default: 128]")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS), help="which ways run [default: all]")
    parser.add_argument("--way", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.way:
        return print("RESULT " + json.dumps(child(options)), flush=True)
    from bench_gpu import SHAPES, build_model

    with tempfile.TemporaryDirectory(prefix="probe-sampling-") as scratch:
        model_dir = Path(scratch) / "model"
        build_model(model_dir, SHAPES["tiny" if options.tiny else "1B"])
        for way in options.ways:
            command = [sys.executable, __file__, "--way", way, "--model-dir", str(model_dir),
                       "--batch", str(options.batch), "--new-tokens", str(options.new_tokens)]
            done = subprocess.run(command, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            print(lines[-1][7:] if lines else json.dumps({"way": way, "failed": done.stderr[-1500:]}), flush=True)


if __name__ == "__main__":
    main()
