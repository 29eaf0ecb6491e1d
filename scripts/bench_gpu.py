"""GPU throughput and memory of reward-model training, PPO and generation, in bf16 and 4-bit, against TRL's PPO.

Nothing is downloaded. Each model is a Llama with random weights built from a config: about 1B
parameters (Llama-3.2-1B's shape with a 32k vocabulary) and about 3B (Llama-3.2-3B's). Its
tokenizer is a byte-level BPE trained on the demo prompts, padded with filler tokens to the
config's vocabulary. Speed does not depend on what the weights say: a random model rarely says
EOS, so every response runs to --max-new-tokens, the same in every arm.

For each model and each weight format (bf16; 4-bit NF4 through bitsandbytes, on CUDA only) it
reports:
- rm: the LoRA reward model's training pairs/s (train_reward_model, one epoch over --pairs
  synthetic pairs of the demo prompts) and peak GPU memory;
- head: the few-vote reward model, [reward_model] kind = "head" (train_head_model on the same
  pairs): seconds for the whole job (the base's load, every answer's features, the fit), of them
  the fit's, and peak GPU memory;
- ppo: PPO's generated tokens/s over --steps steps (train_ppo against the rm arm's LoRA reward
  model, as TRL's arm reads it; with --ppo-reward head, against the head arm's, the product's
  default), the share of step time spent generating, and peak GPU memory;
- generate: Tether's generate() tokens/s, sampling from a policy (a rank-16 LoRA on every linear
  layer, with B drawn at random so that it changes the model), against model.generate on the
  base with transformers' dynamic cache (today's plain generation), on the same batches and
  sampling, in one process, each timed after a first call (whose seconds, a compile's included,
  are reported).
Against the device's limits (its peak figures looked up from its name, or given by flag):
generation's and PPO's tokens/s as a share of the memory-bandwidth bound for their batch (each
decode step reads the block weights, the LM head and the batch's key-value cache once), PPO's
time split between sampling, scoring and its update, and the reward model's training FLOP/s
as a share of the bf16 peak (4 FLOPs a block weight a token: forward, and backward to the
activations only, since the base is frozen; 6 with gradient checkpointing's recompute).
Then, on the 1B model in bf16, TRL 1.12.0's PPOTrainer with the same settings (scripts/bench_ppo.py's
TRL arm, in its own environment) and Tether's ratios to it (targets: >= 1.3x tokens/s, <= 0.7x
peak memory), and 4-bit's peak memory against bf16's on the 3B model (target: <= 0.45x).

Each arm runs in its own child process, so its peak memory is its own: torch's peak allocated
GPU memory on CUDA, the peak resident memory on a CPU.

    python scripts/bench_gpu.py                       # on a CUDA GPU, every figure
    python scripts/bench_gpu.py --tiny --skip-trl     # a 2-layer model on the CPU: checks that it runs
"""

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from bench_arms import random_policy, run_arm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS_FILE = ROOT / "scripts" / "demo_prompts.jsonl"
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Llama 3.2's 1B and 3B shapes (grouped-query attention, 8 KV heads), with a 32k vocabulary.
SHAPES = {
    "1B": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000},
    "3B": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 32000},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},
}
# Nominal peaks from the vendors' data sheets: memory bandwidth in TB/s and dense bf16 TFLOP/s; the first entry whose
# name the device's contains.
PEAKS = [("H200", 4.8, 989), ("H100 PCIe", 2.0, 756), ("H100", 3.35, 989), ("A100-SXM4-40GB", 1.555, 312), ("A100", 2.0, 312),
         ("L40S", 0.864, 362), ("L4", 0.3, 121), ("A10", 0.6, 125)]
FORMATS = {"bf16": "none", "4bit": "4bit"}  # name -> [model] quantization, both on bfloat16 weights
ARMS = ("rm", "head", "ppo", "generate")
REWARD_ARMS = {"lora": "rm", "head": "head"}  # --ppo-reward -> the arm that trains it, in the folder of its name


def prompts() -> list[list[dict]]:
    # Read directly, not through store/: the store imports duckdb, which a bare GPU machine lacks.
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    return [row["messages"] if "messages" in row else [{"role": "user", "content": row["prompt"]}] for row in rows]


def build_model(path: Path, shape: dict) -> None:
    """A random-weight Llama of this shape in bfloat16, with a ChatML tokenizer of its vocabulary, saved at path."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [json.dumps(m) for m in prompts()]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    ))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML)
    tokenizer.add_tokens([f"<x{i}>" for i in range(shape["vocab_size"] - len(tokenizer))])
    config = LlamaConfig(**shape, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # a 3B model initialises in seconds on a GPU
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def synthetic_rows(count: int, words: int, seed: int) -> list:
    """Preference rows on the demo prompts with random-word responses of about `words` words."""
    from train.common.snapshot import PreferenceRow

    rng = random.Random(seed)
    vocabulary = "the a of to and in is it that for on with as was at by this be are from or".split()
    text = lambda: " ".join(rng.choice(vocabulary) for _ in range(words))  # noqa: E731
    return [PreferenceRow(rng.choice(prompts()), text(), text()) for _ in range(count)]


def peak_gpu_gb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def arm_rm(model_dir: Path, out: Path, quantization: str, options) -> dict:
    from train.common.config import ModelConfig, RewardModelConfig
    from train.reward.lora import train_reward_model

    # One head: the TRL arm merges this reward model into a scalar classifier.
    config = RewardModelConfig(heads=1, batch_size=options.rm_batch_size, epochs=1, max_length=options.rm_max_length,
                               gradient_checkpointing={"true": True, "false": False}.get(options.gradient_checkpointing, "auto"))
    from transformers import AutoTokenizer

    from train.reward.encoding import encode_pairs

    rows = synthetic_rows(options.pairs, options.max_new_tokens, seed=0)
    base = ModelConfig(dtype="bfloat16", quantization=quantization)
    metrics = train_reward_model(str(model_dir), rows, [], config, out, base=base)
    encoded = encode_pairs(AutoTokenizer.from_pretrained(model_dir), rows, options.rm_max_length)
    tokens = sum(len(c) + len(r) for c, r in zip(encoded.chosen_ids, encoded.rejected_ids))
    return {"pairs_per_second": metrics["pairs_per_second"], "tokens_per_pair": tokens / len(rows),
            "checkpointing": config.checkpointing(base), "peak_gpu_gb": peak_gpu_gb()}


def arm_head(model_dir: Path, out: Path, quantization: str, options) -> dict:
    from train.common.config import ModelConfig, RewardModelConfig
    from train.reward.head import train_head_model

    config = RewardModelConfig(kind="head", batch_size=options.rm_batch_size, max_length=options.rm_max_length)
    rows = synthetic_rows(options.pairs, options.max_new_tokens, seed=0)
    metrics = train_head_model(str(model_dir), rows, [], config, out, base=ModelConfig(dtype="bfloat16", quantization=quantization))
    return {"seconds": metrics["seconds"], "fit_seconds": metrics["train_seconds"], "peak_gpu_gb": peak_gpu_gb()}


def arm_ppo(model_dir: Path, reward_dir: Path, quantization: str, options) -> dict:
    from train.common.config import ModelConfig
    from train.common.models import load_model
    from train.policy.ppo import train_ppo

    base = ModelConfig(name_or_path=str(model_dir), dtype="bfloat16", quantization=quantization, compile=options.compile)
    model, tokenizer = load_model(base)
    if options.profile_update:
        profile_updates()
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as scratch:
        steps = train_ppo(model, tokenizer, prompts(), reward_dir, ppo_config(options), Path(scratch) / "policy")["steps"]
    seconds = sum(s["seconds"] for s in steps)
    later = steps[1:] or steps  # past the first step, which compiles where sampling is compiled
    return {"tokens_per_second": sum(s["generated_tokens"] for s in steps) / seconds,
            "later_tokens_per_second": sum(s["generated_tokens"] for s in later) / sum(s["seconds"] for s in later),
            "first_step_seconds": steps[0]["seconds"],
            "generate_share": sum(s["generate_seconds"] for s in steps) / seconds,
            "score_share": sum(s["score_seconds"] for s in steps) / seconds,
            "update_share": sum(s["update_seconds"] for s in steps) / seconds, "steps": len(steps),
            "generated_tokens": sum(s["generated_tokens"] for s in steps), "train_seconds": seconds, "peak_gpu_gb": peak_gpu_gb()}


def profile_updates() -> None:
    """Each PPO update under torch's profiler, its 25 costliest operators (by time on the CPU, which launches the GPU's
    kernels) printed to stderr: where an update's time goes when the arithmetic does not explain it."""
    import torch

    import train.policy.ppo

    update = train.policy.ppo.update

    def profiled(*args, **kwargs):
        activities = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * torch.cuda.is_available()
        with torch.profiler.profile(activities=activities) as profile:
            result = update(*args, **kwargs)
        print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr, flush=True)
        return result

    train.policy.ppo.update = profiled  # ppo_step looks it up in its module at each call


def arm_generate(model_dir: Path, quantization: str, options) -> dict:
    """Tether's generate() from a policy, and model.generate from the base with the dynamic cache, on the same prompts,
    batch and sampling, each timed after a first call."""
    import torch

    from train.common.config import GenerationConfig, ModelConfig
    from train.common.models import load_model
    from train.policy.generate import end_of_turn_ids, generate

    base = ModelConfig(name_or_path=str(model_dir), dtype="bfloat16", quantization=quantization, compile=options.compile)
    model, tokenizer = load_model(base)
    policy = random_policy(model)
    batch = (prompts() * options.generate_batch)[: options.generate_batch]
    config = GenerationConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=options.max_new_tokens,
                              batch_size=options.generate_batch, per_prompt=1, seed=0)
    eos = sorted(end_of_turn_ids(model, tokenizer))
    encoded = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] for m in batch]
    inputs = tokenizer.pad({"input_ids": encoded}, padding=True, return_tensors="pt").to(model.device)

    def raw() -> int:
        with torch.inference_mode(), policy.disable_adapter():
            output = model.generate(**inputs, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, cache_implementation="dynamic",
                                    max_new_tokens=options.max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
        responses = output[:, inputs["input_ids"].shape[1] :]
        is_eos = torch.isin(responses, torch.tensor(eos, device=responses.device))
        return int(torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, responses.shape[1]).sum())

    def ours() -> int:
        return sum(g.token_count for g in generate(policy, tokenizer, batch, config, progress=False))

    timings, first_seconds = {}, {}
    for name, run in (("raw", raw), ("tether", ours), ("raw", raw), ("tether", ours)):  # the first of each warms up
        synchronize()
        started = time.perf_counter()
        tokens = run()
        synchronize()
        first_seconds.setdefault(name, time.perf_counter() - started)
        timings[name] = tokens / (time.perf_counter() - started)
    return {"tokens_per_second": timings["tether"], "raw_tokens_per_second": timings["raw"], "first_call_seconds": first_seconds["tether"],
            "compiled": model.generation_config.cache_implementation == "static" and model.device.type == "cuda",
            "peak_gpu_gb": peak_gpu_gb()}


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def arm_trl_setup(model_dir: Path, reward_dir: Path, workdir: Path) -> dict:
    """What bench_ppo.py's TRL arm reads: setup.json, and the reward model merged into a full sequence classifier."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    workdir.mkdir(exist_ok=True)
    (workdir / "setup.json").write_text(json.dumps({"model_path": str(model_dir), "prompts": prompts(), "dtype": "bfloat16"}))
    base = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.bfloat16)
    base.config.pad_token_id = AutoTokenizer.from_pretrained(model_dir).pad_token_id
    PeftModel.from_pretrained(base, reward_dir).merge_and_unload().save_pretrained(workdir / "reward-merged")
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(workdir / "reward-merged")
    return {}


def ppo_config(options):
    from train.common.config import PPOConfig

    return PPOConfig(steps=options.steps, batch_size=options.batch_size, minibatch_size=options.minibatch_size,
                     max_new_tokens=options.max_new_tokens, target_kl=0.0, seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model instead of the 1B and 3B ones, and small batches: runs on a CPU")
    parser.add_argument("--tiny-layers", type=int, default=2,
                        help="the --tiny model's depth [default: 2]; at 16, the 1B's, its PPO update on a CPU is bound by "
                             "dispatching operators, as the 1B's is by launching kernels on a GPU")
    parser.add_argument("--sizes", nargs="+", choices=["1B", "3B"], default=["1B", "3B"], help="model sizes [default: 1B 3B]")
    parser.add_argument("--compile", choices=["auto", "true", "false"], default="true",
                        help="[model] compile for the ppo and generate arms; 'auto' compiles only a job of 1,500 decode steps or "
                             "more, which these short runs stand for [default: true]")
    parser.add_argument("--profile-update", action="store_true", help="print each PPO update's costliest operators to stderr")
    parser.add_argument("--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS),
                        help="weight formats on a GPU [default: both]; a CPU runs bf16 alone")
    parser.add_argument("--skip-trl", action="store_true", help="leave out TRL's PPOTrainer (it installs TRL 1.12.0 in .bench/)")
    parser.add_argument("--pairs", type=int, default=256, help="reward-model training pairs [default: 256]")
    parser.add_argument("--rm-batch-size", type=int, default=16, help="reward-model batch [default: 16]")
    parser.add_argument("--rm-max-length", type=int, default=512, help="reward-model max_length [default: 512]")
    parser.add_argument("--gradient-checkpointing", choices=["auto", "true", "false"], default="auto",
                        help="the reward model's [reward_model] gradient_checkpointing; 'auto' is on for a 4-bit base [default: auto]")
    parser.add_argument("--steps", type=int, default=8, help="PPO steps [default: 8]")
    parser.add_argument("--batch-size", type=int, default=32, help="PPO responses a step [default: 32]")
    parser.add_argument("--minibatch-size", type=int, default=8, help="PPO responses an optimiser step [default: 8]")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="response length, PPO and generation [default: 128]")
    parser.add_argument("--generate-batch", type=int, default=64, help="generation batch [default: 64]")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                        help="which arms run [default: all]; ppo needs the reward model it reads")
    parser.add_argument("--ppo-reward", choices=list(REWARD_ARMS), default="lora",
                        help="the reward model PPO optimises: the rm arm's LoRA model, as TRL's arm does, or the head arm's [default: lora]")
    parser.add_argument("--peak-bandwidth", type=float, help="the device's memory bandwidth in TB/s [default: looked up from its name]")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 TFLOP/s [default: looked up from its name]")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--quantization", help=argparse.SUPPRESS)
    options = parser.parse_args()
    options.compile = {"true": True, "false": False}.get(options.compile, "auto")
    if options.tiny:
        options.sizes = ["tiny"]
        options.pairs, options.rm_batch_size, options.rm_max_length = min(options.pairs, 16), min(options.rm_batch_size, 4), 128
        options.steps, options.batch_size, options.minibatch_size = min(options.steps, 2), min(options.batch_size, 4), 2
        options.max_new_tokens, options.generate_batch = min(options.max_new_tokens, 16), min(options.generate_batch, 8)
    if options.arm:
        return print(json.dumps(child(options)))
    if "ppo" in options.arms and REWARD_ARMS[options.ppo_reward] not in options.arms:
        parser.error(f"--arms ppo with --ppo-reward {options.ppo_reward} needs the arm that trains that reward model")
    if not options.skip_trl and (options.ppo_reward != "lora" or not {"rm", "ppo"} <= set(options.arms)):
        parser.error("TRL's arm reads the rm arm's reward model and compares with the ppo arm on it: give --skip-trl")

    import torch

    formats = {name: FORMATS[name] for name in options.formats} if torch.cuda.is_available() else {"bf16": "none"}
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (4-bit needs CUDA: left out)"
    peaks = device_peaks(device, options)
    results: dict[tuple[str, str, str], dict] = {}
    shapes = {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        work = Path(scratch)
        for size in options.sizes:
            model_dir = work / size
            run_child(options, "build", model_dir, work, "none")
            if peaks:  # what the limits are computed from, read while the model is here
                shapes[size] = shape_of(model_dir)
            for name, quantization in formats.items():
                for arm in options.arms:
                    results[size, name, arm] = run_child(options, arm, model_dir, work / f"{size}-{name}", quantization)
            if not options.skip_trl and size in ("1B", "tiny"):
                results[size, "bf16", "trl"] = run_trl(options, model_dir, work / f"{size}-bf16")
            run_child(options, "remove", model_dir, work, "none")  # 6 GB for the 3B model
    report(options, results, device, formats)
    if peaks:
        report_limits(options, results, formats, shapes, *peaks)


def shape_of(model_dir: Path) -> dict:
    """What the limits depend on: the weights a decode step reads, a token's key-value cache and the demo prompts' length."""
    from transformers import AutoTokenizer

    from train.runtime.memory import NF4_BYTES, model_shape

    shape = model_shape(str(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [len(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
               for m in prompts()]
    head = shape.vocab * shape.hidden * 2  # the LM head, bf16 in both formats
    return {"step_bytes": {"bf16": shape.block_parameters * 2 + head, "4bit": shape.block_parameters * NF4_BYTES + head},
            "kv_bytes_per_token": shape.layers * 2 * shape.kv_width * 2, "block_parameters": shape.block_parameters,
            "prompt_tokens": sum(lengths) / len(lengths)}


def device_peaks(device: str, options) -> tuple[float, float] | None:
    """(bytes/s, FLOP/s): the flags', else the first PEAKS entry the device's name contains; None for a CPU or an unknown GPU."""
    looked_up = next(((bandwidth, tflops) for name, bandwidth, tflops in PEAKS if name in device), (None, None))
    bandwidth, tflops = options.peak_bandwidth or looked_up[0], options.peak_tflops or looked_up[1]
    if bandwidth is None or tflops is None:
        print(f"no peak figures for {device}: give --peak-bandwidth and --peak-tflops to see each throughput against them",
              file=sys.stderr)
        return None
    return bandwidth * 1e12, tflops * 1e12


def bandwidth_bound(shape: dict, name: str, batch: int, options, bandwidth: float) -> float:
    """Tokens/s no sampler can pass at this batch: a decode step reads the weights and the batch's cache at its mean length."""
    context = shape["prompt_tokens"] + options.max_new_tokens / 2
    return batch * bandwidth / (shape["step_bytes"][name] + batch * context * shape["kv_bytes_per_token"])


def report_limits(options, results: dict, formats: dict, shapes: dict, bandwidth: float, flops: float) -> None:
    print(f"against the device's limits ({bandwidth / 1e12:.2f} TB/s, {flops / 1e12:.0f} bf16 TFLOP/s; the bounds are estimates):")
    for size in options.sizes:
        for name in formats:
            shape, parts = shapes[size], []
            if gen := results.get((size, name, "generate")):
                bound = bandwidth_bound(shape, name, options.generate_batch, options, bandwidth)
                parts.append(f"generation {gen['tokens_per_second']:,.0f} tokens/s = {gen['tokens_per_second'] / bound:.1%} of {bound:,.0f} "
                             f"(batch {options.generate_batch}; first call {gen['first_call_seconds']:.1f} s, "
                             f"{'compiled' if gen['compiled'] else 'not compiled'})")
            if ppo := results.get((size, name, "ppo")):
                bound = bandwidth_bound(shape, name, options.batch_size, options, bandwidth)
                parts.append(f"PPO {ppo['tokens_per_second']:,.0f} tokens/s = {ppo['tokens_per_second'] / bound:.1%} of {bound:,.0f} "
                             f"(batch {options.batch_size}; past the first step, of {ppo['first_step_seconds']:.1f} s, "
                             f"{ppo['later_tokens_per_second']:,.0f}), its time {ppo['generate_share']:.0%} sampling, "
                             f"{ppo['score_share']:.0%} scoring, {ppo['update_share']:.0%} update")
            if rm := results.get((size, name, "rm")):
                per_token = (6 if rm["checkpointing"] else 4) * shape["block_parameters"]
                achieved = rm["pairs_per_second"] * rm["tokens_per_pair"] * per_token
                parts.append(f"reward model {achieved / 1e12:.1f} TFLOP/s = {achieved / flops:.1%} of the peak")
            if parts:
                print(f"  {size} {name}: " + "; ".join(parts))


def run_child(options, arm: str, model_dir: Path, workdir: Path, quantization: str) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, *sys.argv[1:], "--arm", arm, "--model-dir", str(model_dir),
               "--workdir", str(workdir), "--quantization", quantization]
    result = run_arm(f"{arm} {model_dir.name} {quantization}", command)
    print(f"  {arm} {model_dir.name} {quantization}: {json.dumps(result)}", file=sys.stderr, flush=True)  # kept if a later arm fails
    return result


def child(options) -> dict:
    model_dir, workdir, quantization = options.model_dir, options.workdir, options.quantization
    if options.arm == "build":
        size = model_dir.name
        build_model(model_dir, SHAPES[size] | ({"num_hidden_layers": options.tiny_layers} if size == "tiny" else {}))
        return {}
    if options.arm == "remove":
        import shutil

        shutil.rmtree(model_dir)
        return {}
    if options.arm == "rm":
        return arm_rm(model_dir, workdir / "rm", quantization, options)
    if options.arm == "head":
        return arm_head(model_dir, workdir / "head", quantization, options)
    if options.arm == "ppo":
        return arm_ppo(model_dir, workdir / REWARD_ARMS[options.ppo_reward], quantization, options)
    if options.arm == "generate":
        return arm_generate(model_dir, quantization, options)
    if options.arm == "trl-setup":
        return arm_trl_setup(model_dir, workdir / "rm", workdir / "trl")
    raise SystemExit(f"unknown arm {options.arm}")


def run_trl(options, model_dir: Path, workdir: Path) -> dict:
    """bench_ppo.py's TRL arm, in TRL 1.12.0's environment, on this model with this run's PPO settings."""
    from bench_ppo import trl_python

    run_child(options, "trl-setup", model_dir, workdir, "none")
    command = [str(trl_python()), str(ROOT / "scripts" / "bench_ppo.py"), "--arm", "trl", "--workdir", str(workdir / "trl"),
               "--steps", str(options.steps), "--batch-size", str(options.batch_size), "--minibatch-size", str(options.minibatch_size),
               "--max-new-tokens", str(options.max_new_tokens), "--seed", "0"]
    result = run_arm(f"trl {model_dir.name}", command)
    return result | {"tokens_per_second": result["generated_tokens"] / result["train_seconds"]}


def report(options, results: dict, device: str, formats: dict) -> None:
    def memory(r: dict) -> float:
        return r["peak_gpu_gb"] if r.get("peak_gpu_gb") is not None else r["peak_gb"]

    def cells(size: str, name: str) -> list[str]:
        rm, head, ppo, gen = (results.get((size, name, arm)) for arm in ARMS)
        return [f"{rm['pairs_per_second']:10.2f} {memory(rm):7.2f}" if rm else f"{'-':>10} {'-':>7}",
                f"{head['seconds']:7.1f} {head['fit_seconds']:6.2f} {memory(head):7.2f}" if head else f"{'-':>7} {'-':>6} {'-':>7}",
                f"{ppo['tokens_per_second']:9.1f} {ppo['generate_share']:9.0%} {memory(ppo):8.2f}" if ppo else f"{'-':>9} {'-':>9} {'-':>8}",
                f"{gen['tokens_per_second']:9.1f} {gen['raw_tokens_per_second']:9.1f} {gen['tokens_per_second'] / gen['raw_tokens_per_second']:6.2f}x"
                if gen else f"{'-':>9} {'-':>9} {'-':>7}"]

    memory_kind = "peak GPU GB" if "CPU" not in device else "peak RSS GB"
    print(f"{device}; PPO: {options.steps} steps of {options.batch_size} responses, minibatch {options.minibatch_size}, "
          f"{options.max_new_tokens} new tokens, reward model {options.ppo_reward}; reward models: {options.pairs} pairs, "
          f"batch {options.rm_batch_size}, max_length {options.rm_max_length}; generation batch {options.generate_batch}")
    print(f"{'model':6} {'format':6} {'RM pairs/s':>10} {'RM mem':>7} {'head s':>7} {'fit s':>6} {'hd mem':>7} {'PPO tok/s':>9} "
          f"{'gen share':>9} {'PPO mem':>8} {'gen tok/s':>9} {'dyn tok/s':>9} {'gen/dyn':>7}   ({memory_kind})")
    for size in options.sizes:
        for name in formats:
            print(f"{size:6} {name:6} " + " ".join(cells(size, name)))
    for size in options.sizes:
        for name in formats:
            if gen := results.get((size, name, "generate")):
                print(f"generation from a policy / the base's dynamic-cache generate, {size} {name}: "
                      f"{gen['tokens_per_second'] / gen['raw_tokens_per_second']:.2f}x")
    trl_size = next((s for s in options.sizes if (s, "bf16", "trl") in results), None)
    if trl_size:
        ours, trl = results[trl_size, "bf16", "ppo"], results[trl_size, "bf16", "trl"]
        print(f"TRL 1.12.0 PPOTrainer, {trl_size} bf16: {trl['tokens_per_second']:.1f} tokens/s, {memory(trl):.2f} GB")
        print(f"PPO throughput tether / TRL, {trl_size} bf16: {ours['tokens_per_second'] / trl['tokens_per_second']:.2f}x (target >= 1.3x)")
        print(f"PPO peak memory tether / TRL, {trl_size} bf16: {memory(ours) / memory(trl):.2f}x (target <= 0.7x)")
    if {"4bit", "bf16"} <= formats.keys() and "3B" in options.sizes:
        for arm in ("rm", "head", "ppo"):
            if arm in options.arms:
                ratio = memory(results["3B", "4bit", arm]) / memory(results["3B", "bf16", arm])
                print(f"4-bit / bf16 peak memory, 3B {arm}: {ratio:.2f}x (target <= 0.45x)")


if __name__ == "__main__":
    main()
