"""Every model path on a 4-bit and an 8-bit base (bitsandbytes, on this machine's CPU), on the tiny model.

The reference of PPO, DPO and GRPO is the quantised base with the adapters off, so PPO's first KL
is 0 and DPO's first loss is log 2 on it too; adapters trained on it are plain float32 PEFT files.
"""

import gc
import json
import math
import os
import subprocess
import sys
from contextlib import closing

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from store import open_database
from tests.conftest import (
    DEMO_PROMPTS, PPO_PROMPTS, REPO, read_parquet, run_tether, score_with_plain_peft, set_settings, short_training, toy_preferences, vote_every_pair,
)
from tests.train.test_adapters import lora_adapter
from train.common.config import DPOConfig, GenerationConfig, GRPOConfig, ModelConfig, PPOConfig, RewardModelConfig
from train.common.device import check_runs_here
from train.common.errors import ModelError
from train.common.models import load_model, prepare_for_training
from train.common.snapshot import PreferenceRow
from train.policy.dpo import train_dpo
from train.policy.generate import end_of_turn_ids
from train.policy.grpo import train_grpo
from train.policy.ppo import AdaptiveKL, RewardScorer, build, optimizer_for, ppo_step, trainable_parameters
from train.reward.layout import trained_config
from train.reward.lora import train_reward_model
from train.reward.versions import load_reward_model, read_reward_adapter
from train.runtime.job_configs import GenerateJob
from train.runtime.jobdir import write_job

QUANTIZATIONS = ["4bit", pytest.param("8bit", marks=pytest.mark.deep)]  # 8-bit, the rarer, in the deep tier
DPO_PROMPTS = [[{"role": "user", "content": f"Say something about topic {i}."}] for i in range(8)]
DPO_ROWS = [PreferenceRow(p, "music and light", "the end of the day", chosen_finished=True, rejected_finished=True) for p in DPO_PROMPTS]


def quantised(model_dir, quantization: str) -> ModelConfig:
    return ModelConfig(name_or_path=str(model_dir), device="cpu", quantization=quantization)


def is_quantised(model) -> bool:
    import bitsandbytes as bnb

    return any(isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)) for m in model.modules())


@pytest.mark.deep  # every job on a quantised base; the quick tier trains and loads adapters on 4-bit below
@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_every_job_registers_its_result_on_a_quantised_base(tiny_project, tmp_path, quantization):
    """Through the CLI: a simulated PPO round (generation, the reward model, PPO, and the evaluation's sampling of
    v1 and v0), scoring and evaluating with its reward model, then a DPO round and a GRPO round."""
    short_training(tiny_project)
    set_settings(tiny_project, "model", quantization=quantization)
    set_settings(tiny_project, "queue", overlap_share=0.5)
    set_settings(tiny_project, "round", start_from="newest")  # each round continues the last, whatever the votes rate
    set_settings(tiny_project, "dpo", batch_size=4, epochs=1, pairs="human", votes="all")
    set_settings(tiny_project, "grpo", steps=2, prompts_per_step=2, group_size=2, minibatches=1, epochs=1)
    project = ("--project", str(tiny_project))
    run_tether("prompts", "import", str(DEMO_PROMPTS), *project, check=True)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"Say something about the number {i}."}) + "\n" for i in range(3)))
    simulated = run_tether("simulate", "--judge", "concise", "--noise", "1.0", "--labels-per-round", "10", "--rounds", "1",
                           "--eval-prompts", str(eval_file), "--eval-samples", "2", "--report", str(tmp_path / "rounds.jsonl"),
                           "--optimizer", "ppo", *project)
    assert simulated.returncode == 0, simulated.stderr
    report = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [(r["round"], r["optimizer"], r["policy"]) for r in report] == [(1, "ppo", 1)]
    assert math.isfinite(report[0]["kl_to_v0"]) and 0 <= report[0]["win_rate"] <= 1

    scored = run_tether("rm", "score", *project)
    assert scored.returncode == 0, scored.stderr
    evaluated = run_tether("rm", "eval", "--data", str(toy_preferences(tmp_path / "prefs.jsonl")), *project)
    assert evaluated.returncode == 0 and "accuracy" in evaluated.stdout, evaluated.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rewards = [r for (r,) in con.execute("SELECT reward FROM completions WHERE policy_version IS NOT NULL").fetchall()]
    assert rewards and all(r is not None and math.isfinite(r) for r in rewards)

    vote_every_pair(tiny_project)
    dpo = run_tether("round", "--optimizer", "dpo", *project)
    assert dpo.returncode == 0 and dpo.stdout.startswith("round 2: policy v2 from v1; ") and "robust DPO (label_smoothing 0." in dpo.stdout, dpo.stderr
    vote_every_pair(tiny_project)  # the round's new pairs, v2 against v1
    grpo = run_tether("round", "--optimizer", "grpo", *project)
    assert grpo.returncode == 0 and grpo.stdout.startswith("round 3: policy v3 from v2; ") and "reward model v3" in grpo.stdout, grpo.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rounds = con.execute("SELECT id, status, optimizer, policy_to FROM rounds ORDER BY id").fetchall()
        reward_models = con.execute("SELECT version FROM reward_models ORDER BY version").fetchall()
    assert rounds == [(1, "done", "ppo", 1), (2, "done", "dpo", 2), (3, "done", "grpo", 3)]
    assert reward_models == [(1,), (2,), (3,)]  # every round trains one, for its predictor if not for its optimiser
    # The jobs' logs, which the operator reads, say nothing of libraries' internals (checkpointing PPO's update
    # once warned of the cache, which only sampling uses).
    logs = "".join(log.read_text() for log in (tiny_project / "jobs").glob("*/worker.log"))
    assert "PPO" in logs or "responses sampled" in logs
    assert not any(line in logs for line in ("Caching is incompatible", "kernels-community", "FutureWarning"))


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_at_step_0_ppos_kl_to_the_quantised_base_is_0_and_the_adapters_train(peaked_model_dir, favoured, quantization):
    model, tokenizer = load_model(quantised(peaked_model_dir, quantization))
    config = PPOConfig(batch_size=8, minibatch_size=4, max_new_tokens=6, temperature=1.0, learning_rate=1e-3, epochs=1)
    reward = read_reward_adapter(favoured[1])
    wrapped = build(model, reward, config)
    assert is_quantised(wrapped.peft_model)
    trained = [p for group in trainable_parameters(wrapped) for p in group]
    before = [p.detach().clone() for p in trained]
    optimizer = optimizer_for(wrapped, config)
    stats, rollout = ppo_step(wrapped, RewardScorer(tokenizer, reward.normalization, reward.max_length), optimizer, PPO_PROMPTS * 4,
                              config, AdaptiveKL(0.1, 0, 1), end_of_turn_ids(model, tokenizer), torch.Generator().manual_seed(0))
    assert abs(stats["kl"]) <= 1e-5
    assert torch.allclose(rollout.logprobs, rollout.ref_logprobs, atol=1e-5)
    assert all(p.dtype == torch.float32 for p in trained)
    assert any(not torch.equal(b, p) for b, p in zip(before, trained))


def checkpoint_maps(model_dir) -> set[str]:
    """This process's memory maps of the model's weights file."""
    with open("/proc/self/maps") as maps:
        return {line.split()[0] for line in maps if str(model_dir / "model.safetensors") in line}


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_a_quantised_base_on_the_cpu_keeps_no_map_of_its_weights_file(tiny_model_dir, quantization):
    """A tensor left viewing the file would keep every page of it that quantising read resident through the job."""
    before = checkpoint_maps(tiny_model_dir)
    model, _ = load_model(ModelConfig(name_or_path=str(tiny_model_dir), quantization=quantization, device="cpu"))
    assert is_quantised(model)
    assert checkpoint_maps(tiny_model_dir) - before == set()
    assert model(input_ids=torch.tensor([[5, 6, 7]])).logits.isfinite().all()


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_gradients_flow_through_a_quantised_training_base_after_a_pass_without_them(tiny_model_dir, quantization):
    """bitsandbytes repacks a 4-bit layer for a CPU kernel without a backward at its first eval-mode pass without
    gradients (on CPUs with AVX512-BF16); PPO's rollout is such a pass, and its update must still reach every layer."""

    def input_gradient(rollout_first: bool) -> torch.Tensor:
        model = prepare_for_training(load_model(quantised(tiny_model_dir, quantization))[0])
        ids = torch.tensor([[5, 6, 7, 8, 9]])
        model.eval()
        if rollout_first:
            with torch.no_grad():
                model(ids)
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
        model(inputs_embeds=embeds).logits.float().square().sum().backward()
        return embeds.grad

    assert torch.allclose(input_gradient(rollout_first=True), input_gradient(rollout_first=False), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_dpos_first_loss_on_a_quantised_base_is_log_2_and_its_adapter_is_float32(tiny_model_dir, tmp_path, quantization):
    model, tokenizer = load_model(quantised(tiny_model_dir, quantization))
    result = train_dpo(model, tokenizer, DPO_ROWS, DPOConfig(epochs=1, batch_size=4), tmp_path / "v1", on_cpu=True)
    first = result["steps"][0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert first["chosen_reward"] == pytest.approx(0, abs=1e-5) and first["rejected_reward"] == pytest.approx(0, abs=1e-5)
    # TRL casts a quantised base's adapter to bfloat16; Tether trains and saves it in float32, as on any base.
    assert {w.dtype for w in load_file(tmp_path / "v1" / "adapter_model.safetensors").values()} == {torch.float32}


def sequence_logprob(model, tokenizer, prompt, response) -> float:
    """log pi(response | prompt) summed over the response's tokens and its EOS."""
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    ids = torch.tensor([prompt_ids + tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]])
    with torch.no_grad():
        logprobs = model(ids).logits[0, :-1].float().log_softmax(-1)
    targets = ids[0, 1:]
    return logprobs[torch.arange(len(targets)), targets][len(prompt_ids) - 1 :].sum().item()


def margin(model, tokenizer) -> float:
    """The mean log-probability margin of the chosen over the rejected response of DPO_ROWS."""
    return sum(sequence_logprob(model, tokenizer, r.prompt, r.chosen) - sequence_logprob(model, tokenizer, r.prompt, r.rejected)
               for r in DPO_ROWS) / len(DPO_ROWS)


# How far a quantised base moves what an adapter computes, against plain peft on float32: the largest gap over
# the cases in normalised reward units (training-reward stds), and the gap in the mean chosen-over-rejected
# log-probability margin, in nats. Measured on this tiny random model, whose 64-wide layers are a hard case for
# NF4: trained on the quantised base and read on float32, 0.26 and 0.11 on 4-bit, 0.022 and 0.003 on 8-bit; trained
# on float32 and read on the quantised base, 0.22 and 0.02 on 4-bit, 0.031 and 0.001 on 8-bit. The tolerances
# leave room for other CPUs' kernels.
SCORE_TOLERANCE = {"4bit": 0.4, "8bit": 0.05}
MARGIN_TOLERANCE = {"4bit": 0.25, "8bit": 0.02}


WORDS = ["apple", "river", "stone", "cloud"]
RM_ROWS = [PreferenceRow([{"role": "user", "content": f"Tell me about {WORDS[i % 4]} number {i}."}],
                         f"{WORDS[i % 3]} and {WORDS[(i + 1) % 4]} thanks", f"{WORDS[i % 3]} and {WORDS[(i + 1) % 4]} sorry")
           for i in range(16)]
RM_CASES = [(r.prompt, reply) for r in RM_ROWS[10:] for reply in (r.chosen, r.rejected)]
RM_CONFIG = RewardModelConfig(learning_rate=1e-3, epochs=2, batch_size=8, lora_dropout=0.0, max_length=64, seed=3)
DPO_CONFIG = DPOConfig(epochs=2, batch_size=4, learning_rate=5e-3, beta=0.1)


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_adapters_trained_on_a_quantised_base_load_with_plain_peft_on_a_float32_base(tiny_model_dir, tmp_path, quantization):
    from peft import PeftModel

    base = quantised(tiny_model_dir, quantization)
    train_reward_model(str(tiny_model_dir), RM_ROWS[:12], RM_ROWS[12:], RM_CONFIG, tmp_path / "rm", base=base)
    assert trained_config(tmp_path / "rm")["gradient_checkpointing"] is True  # 'auto' on a quantised base
    cases = RM_CASES
    ours = load_reward_model(str(tiny_model_dir), tmp_path / "rm", base).score(*zip(*cases))
    plain = [p["normalised"] for p in score_with_plain_peft(tiny_model_dir, tmp_path / "rm", cases, tmp_path)]
    gap = max(abs(a - b) for a, b in zip(ours, plain))
    print(f"{quantization}: reward scores on the quantised base and plain peft's on float32 differ by at most {gap:.4f}")
    assert gap <= SCORE_TOLERANCE[quantization], (ours, plain)

    train_dpo(*load_model(base), DPO_ROWS, DPO_CONFIG, tmp_path / "v1", on_cpu=True)
    float_base, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir), device="cpu"))
    before = margin(float_base, tokenizer)
    on_float = margin(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(tmp_path / "v1")).eval(), tokenizer)
    on_quantised = margin(load_model(base, str(tmp_path / "v1"))[0], tokenizer)
    print(f"{quantization}: the policy's margin {on_quantised:.4f} on the quantised base, {on_float:.4f} with plain peft on float32, "
          f"{before:.4f} before training")
    assert on_float > before + 0.5
    assert abs(on_float - on_quantised) <= MARGIN_TOLERANCE[quantization]


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_adapters_trained_on_a_float32_base_load_on_a_quantised_one(tiny_model_dir, tmp_path, quantization):
    base, full = quantised(tiny_model_dir, quantization), ModelConfig(name_or_path=str(tiny_model_dir), device="cpu")
    train_reward_model(str(tiny_model_dir), RM_ROWS[:12], RM_ROWS[12:], RM_CONFIG, tmp_path / "rm")
    on_full = load_reward_model(str(tiny_model_dir), tmp_path / "rm", full).score(*zip(*RM_CASES))
    on_quantised = load_reward_model(str(tiny_model_dir), tmp_path / "rm", base).score(*zip(*RM_CASES))
    gap = max(abs(a - b) for a, b in zip(on_full, on_quantised))
    print(f"{quantization}: a float32-trained reward model's scores on the quantised base differ by at most {gap:.4f}")
    assert gap <= SCORE_TOLERANCE[quantization], (on_full, on_quantised)

    train_dpo(*load_model(full), DPO_ROWS, DPO_CONFIG, tmp_path / "v1", on_cpu=True)
    model, tokenizer = load_model(full, str(tmp_path / "v1"))
    trained = margin(model, tokenizer)
    on_quantised_margin = margin(load_model(base, str(tmp_path / "v1"))[0], tokenizer)
    print(f"{quantization}: a float32-trained policy's margin {trained:.4f}, {on_quantised_margin:.4f} on the quantised base")
    assert abs(trained - on_quantised_margin) <= MARGIN_TOLERANCE[quantization]


def base_parameters_alive(model_dir) -> int:
    """Base-model parameters (adapters aside) held by every live model loaded from model_dir, each tensor once."""
    gc.collect()
    held = {}
    for o in gc.get_objects():
        if issubclass(type(o), PreTrainedModel) and o.config.name_or_path == str(model_dir):  # type(): no deprecated attribute is read
            held |= {p.data_ptr(): p.numel() for name, p in o.named_parameters() if "lora_" not in name}
    return sum(held.values())


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_grpo_holds_one_copy_of_the_quantised_base(peaked_model_dir, favoured, tmp_path, quantization):
    model, tokenizer = load_model(quantised(peaked_model_dir, quantization))
    one_copy = base_parameters_alive(peaked_model_dir)
    held = []
    config = GRPOConfig(steps=2, prompts_per_step=2, group_size=2, minibatches=1, epochs=1, max_new_tokens=2, temperature=1.0, seed=1)
    result = train_grpo(model, tokenizer, PPO_PROMPTS, read_reward_adapter(favoured[1]), config, tmp_path / "policy",
                        on_step=lambda stats: held.append(base_parameters_alive(peaked_model_dir)), on_cpu=True)
    assert len(result["steps"]) == 2 and all(math.isfinite(s["score"]) for s in result["steps"])
    assert one_copy > 0 and held == [one_copy, one_copy]
    assert is_quantised(model)


def test_where_bitsandbytes_cannot_quantise_on_this_cpu_the_setting_is_named(monkeypatch):
    from train.common import device

    monkeypatch.setattr(device, "_cpu_problem", lambda quantization: "no kernel for this CPU")
    with pytest.raises(ModelError, match=r'^\[model\] quantization = "8bit" does not run on this machine\'s CPU with bitsandbytes '
                                         r'\S+ \(no kernel for this CPU\): set quantization = "none"$'):
        check_runs_here(ModelConfig(quantization="8bit", device="cpu"))
    check_runs_here(ModelConfig(quantization="none", device="cpu"))


@pytest.mark.deep  # three commands a case; the CPU's own refusal is named in the quick tier, above
@pytest.mark.parametrize("quantization, fake, message", [
    ("4bit", 'raise ImportError("No module named bitsandbytes")', '[model] quantization = "4bit" needs bitsandbytes, which does not import here'),
    ("8bit", '__version__ = "0.42.0"', '[model] quantization = "8bit" needs bitsandbytes 0.46.1 or later, and this environment has 0.42.0'),
])
def test_where_bitsandbytes_cannot_run_quantization_is_refused_in_one_line_and_nothing_is_registered(
        tiny_project, tmp_path, quantization, fake, message):
    shadow = tmp_path / "shadow" / "bitsandbytes"  # a bitsandbytes that fails to import, or an old one, before the installed one
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(fake + "\n")
    env = {"PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    project = ("--project", str(tiny_project))
    run_tether("prompts", "import", str(DEMO_PROMPTS), *project, check=True)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), *project, check=True)
    set_settings(tiny_project, "model", quantization=quantization)
    for command in ("generate",), ("rm", "train", "--include-imported"), ("simulate", "--judge", "concise", "--rounds", "1", "--eval-prompts", str(DEMO_PROMPTS)):
        refused = run_tether(*command, *project, env=env)
        assert refused.returncode == 1, (command, refused.stderr)
        assert refused.stderr.strip().splitlines()[-1].startswith(f"Error: {message}"), refused.stderr
        assert "Traceback" not in refused.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    assert not (tiny_project / "jobs").exists() or not any((tiny_project / "jobs").iterdir())


# 4bit, the probe's control, in the deep tier: test_every_job_registers_its_result_on_a_quantised_base runs 4-bit jobs
@pytest.mark.parametrize("quantization", ["none", pytest.param("4bit", marks=pytest.mark.deep)])
def test_only_a_job_on_a_quantised_base_imports_bitsandbytes(tiny_model_dir, tmp_path, quantization):
    # Its import costs a job 4.5 s of CPU, and PEFT imports it to make any LoRA layer where it is installed.
    lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=0)
    config = GenerateJob(model=ModelConfig(name_or_path=str(tiny_model_dir), device="cpu", quantization=quantization),
                         generation=GenerationConfig(max_new_tokens=4, per_prompt=2), policy_version=1,
                         policy_adapter_path=str(tmp_path / "adapter"), against=None, reward_model=RewardModelConfig(),
                         reward_adapter_path=None, pairs_per_prompt=None, unpaired_prompts=[])
    prompts = pa.Table.from_pylist([{"prompt_id": 1, "messages": json.dumps(DPO_PROMPTS[0])}])
    write_job(tmp_path / "job", config, {"prompts": prompts})
    # The worker process as `python -m train.worker JOB_DIR`, saying at its exit whether bitsandbytes was imported.
    probe = ("import atexit, runpy, sys; atexit.register(lambda: print(sys.modules.get('bitsandbytes') is not None)); "
             "sys.argv = ['train.worker', sys.argv[1]]; runpy.run_module('train.worker', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "job")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0 and done.stdout.split()[-1:] == [str(quantization != "none")], done.stderr[-2000:]
    assert len(read_parquet(tmp_path / "job" / "completions.parquet")) == 2
