"""Tether's generation path against raw `model.generate`, same model, prompts and batch size.

Both runs sample the same number of sequences with the same settings; rounds alternate
between the two so that machine noise falls on both alike. Prints tokens/s and the ratio.
With --policy both sample from a policy, a rank-16 LoRA on every linear layer with B drawn at
random: raw `model.generate` through PEFT with the adapter unfolded, as Tether sampled a policy
before it folded the adapter into the weights (train.policy.generate.lora_folded).

    .venv/bin/python scripts/bench_generate.py --batch-size 16 --max-new-tokens 64
    .venv/bin/python scripts/bench_generate.py --policy
    .venv/bin/python scripts/bench_generate.py --per-prompt 8 --batch-size 32 --against-batch-size 16

--against-batch-size times Tether's path at another batch size in place of raw `model.generate`,
to choose [generation] batch_size.
"""

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
from bench_arms import random_policy

from train.common.config import GenerationConfig, ModelConfig
from train.common.models import load_model
from train.policy.generate import generate

DEMO_PROMPTS = Path(__file__).resolve().parent / "demo_prompts.jsonl"


def raw_generate(model, tokenizer, prompts, config: GenerationConfig) -> int:
    """The plain transformers way, batches in file order; returns tokens generated (EOS included)."""
    eos = tokenizer.eos_token_id
    total = 0
    for start in range(0, len(prompts), config.batch_size):
        batch = tokenizer.apply_chat_template(
            prompts[start : start + config.batch_size], add_generation_prompt=True,
            padding=True, return_tensors="pt", return_dict=True,
        )
        with torch.inference_mode():
            out = model.generate(
                **batch, do_sample=True, temperature=config.temperature, top_p=config.top_p,
                top_k=config.top_k, max_new_tokens=config.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
            )
        for row in out[:, batch["input_ids"].shape[1] :].tolist():
            total += row.index(eos) + 1 if eos in row else len(row)
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=ModelConfig().name_or_path, help="model id or path (default: the default model)")
    parser.add_argument("--prompts", type=Path, default=DEMO_PROMPTS, help="JSON Lines prompt file")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--per-prompt", type=int, default=1, help="answers to each prompt, as the evaluation and a round's pairs sample several")
    parser.add_argument("--against-batch-size", type=int, help="the baseline: Tether's path at this batch size, not raw model.generate")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each")
    parser.add_argument("--policy", action="store_true", help="sample from a LoRA policy, not the base")
    args = parser.parse_args()

    prompts = []
    for line in args.prompts.read_text().splitlines():
        row = json.loads(line)
        prompts.append(row.get("messages") or [{"role": "user", "content": row["prompt"]}])
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, per_prompt=args.per_prompt)
    baseline = "raw" if args.against_batch_size is None else f"batch {args.against_batch_size}"
    model, tokenizer = load_model(ModelConfig(name_or_path=args.model))
    if args.policy:
        model = random_policy(model)
    torch.manual_seed(0)
    raw_generate(model, tokenizer, prompts[: args.batch_size], config)  # warm-up

    totals = {baseline: [0, 0.0], "tether": [0, 0.0]}
    for round_ in range(args.rounds):
        for name in totals:
            torch.manual_seed(round_)
            start = time.perf_counter()
            if name == "raw":
                tokens = raw_generate(model, tokenizer, [p for p in prompts for _ in range(args.per_prompt)], config)
            else:
                batch_size = args.batch_size if name == "tether" else args.against_batch_size
                answers = generate(model, tokenizer, prompts, dataclasses.replace(config, batch_size=batch_size), progress=False)
                tokens = sum(g.token_count for g in answers)
            totals[name][0] += tokens
            totals[name][1] += time.perf_counter() - start
            print(f"round {round_ + 1} {name:>6}: {tokens} tokens in {time.perf_counter() - start:.1f} s")

    rates = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    sampled = "a LoRA policy" if args.policy else "the base"
    print(f"\n{len(prompts)} prompts, {args.per_prompt} answers each, from {sampled}, batch size {args.batch_size}, max {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads")
    for name, rate in rates.items():
        print(f"{name:>8}: {rate:7.1f} tokens/s")
    print(f"   ratio: {rates['tether'] / rates[baseline]:.2f}x (tether / {baseline})")


if __name__ == "__main__":
    main()
