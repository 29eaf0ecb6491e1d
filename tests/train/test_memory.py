"""The expected-memory figure: each part of it against what PyTorch, bitsandbytes and peft report for real models."""

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from store.jobs import job_metrics, list_jobs
from tests.conftest import DEMO_PROMPTS, run_tether, set_settings
from train.common.config import Hardware, ModelConfig, RewardModelConfig
from train.common.models import from_pretrained, prepare_for_training
from train.reward.lora import build_model
from train.runtime.memory import Estimator, fit_to_memory, model_shape, round_memory
from ui.owner.project import init_project, job_dir, load_project


def estimator(project_root, reward_model: RewardModelConfig | None = None, **model) -> Estimator:
    config = load_project(project_root).config
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, **model), reward_model=reward_model or config.reward_model)
    return Estimator(model_shape(config.model.name_or_path), config, prompt_tokens=20, on_gpu=False)


def test_the_shape_counts_every_parameter_of_the_model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    shape = model_shape(str(tiny_model_dir))
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert (shape.hidden, shape.intermediate, shape.layers, shape.vocab) == (64, 128, 2, model.config.vocab_size)
    assert shape.kv_width == 2 * 16  # two key-value heads of 64 / 4


@pytest.mark.parametrize("quantization", ["none", "4bit", "8bit"])
def test_the_weights_are_what_the_loaded_base_holds(tiny_project, tiny_model_dir, quantization):
    """Loaded as every job loads it, then made ready to train; transformers counts its tensors' bytes."""
    config = ModelConfig(name_or_path=str(tiny_model_dir), quantization=quantization)
    model = from_pretrained(AutoModelForCausalLM, str(tiny_model_dir), config)
    expected = estimator(tiny_project, name_or_path=str(tiny_model_dir), quantization=quantization)
    assert expected.weights(training=False) == pytest.approx(model.get_memory_footprint(return_buffers=False), rel=0.02)
    model = prepare_for_training(model)
    assert expected.weights(training=True) == pytest.approx(model.get_memory_footprint(return_buffers=False), rel=0.02)


def test_a_quantised_base_holds_a_fraction_of_the_float32_weights_that_grows_with_the_share_of_its_blocks(tiny_project, tiny_model_dir):
    full = estimator(tiny_project, name_or_path=str(tiny_model_dir)).weights(training=True)
    four = estimator(tiny_project, name_or_path=str(tiny_model_dir), quantization="4bit").weights(training=True)
    eight = estimator(tiny_project, name_or_path=str(tiny_model_dir), quantization="8bit").weights(training=True)
    # The tiny model is mostly embeddings, which stay float32: its blocks alone shrink.
    shape = model_shape(str(tiny_model_dir))
    blocks = shape.block_parameters * 4
    assert full - four == pytest.approx(blocks * (1 - 0.5159 / 4), rel=0.01)
    assert four < eight < full


def test_a_quantised_base_checkpoints_the_reward_models_activations_unless_the_settings_say_otherwise(tiny_project, tiny_model_dir):
    """QLoRA's recipe: a base quantised to save memory also recomputes its activations, which are then most of it."""
    lora = RewardModelConfig(kind="lora")
    full = estimator(tiny_project, lora, name_or_path=str(tiny_model_dir)).reward_model()
    four = estimator(tiny_project, lora, name_or_path=str(tiny_model_dir), quantization="4bit").reward_model()
    assert four.activations < full.activations / 1.5  # of the tiny model's 2 layers, checkpointing keeps 1 at a time
    auto, off = RewardModelConfig(), RewardModelConfig(gradient_checkpointing=False)
    assert auto.checkpointing(ModelConfig(quantization="4bit")) and auto.checkpointing(ModelConfig(quantization="8bit"))
    assert not auto.checkpointing(ModelConfig()) and not off.checkpointing(ModelConfig(quantization="4bit"))
    with pytest.raises(ValueError, match="gradient_checkpointing must be true, false or 'auto', got 'sometimes'"):
        RewardModelConfig(gradient_checkpointing="sometimes")


@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_the_activations_are_what_a_reward_model_forward_pass_keeps_for_its_backward(tiny_model_dir, tiny_project, dropout):
    """PyTorch's own record of the tensors autograd saves (the model's parameters left out) on a real reward-model batch."""
    settings = RewardModelConfig(lora_dropout=dropout)
    model, _ = build_model(str(tiny_model_dir), settings)
    model.train()
    sequences, length = 8, 60
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def keep(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(3, model.config.vocab_size, (sequences, length))
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    expected = estimator(tiny_project, name_or_path=str(tiny_model_dir)).layer_activations(sequences * length, length, dropout)
    assert sum(saved.values()) == pytest.approx(expected, rel=0.2)


def test_the_adapters_count_what_peft_trains(tiny_model_dir, tiny_project):
    model, _ = build_model(str(tiny_model_dir), RewardModelConfig(lora_r=8))
    lora = sum(p.numel() for name, p in model.named_parameters() if p.requires_grad and "lora_" in name)
    assert estimator(tiny_project, name_or_path=str(tiny_model_dir)).lora_parameters(8) == lora


def test_status_and_init_say_the_rounds_expected_peak_and_its_largest_job(tmp_path, tiny_model_dir):
    project = tmp_path / "p"
    init = run_tether("init", str(project), "--model", str(tiny_model_dir))
    assert init.returncode == 0, init.stderr
    assert "expected memory: " in init.stdout and "GB of resident memory at the round's peak, in its" in init.stdout
    at_init = init.stdout.split("expected memory: ")[1]
    assert "for prompts of up to 192 tokens" in at_init  # [reward_model] max_length 256 less 64 of response: the worst case

    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(project), check=True)
    status = run_tether("status", "--project", str(project), check=True).stdout
    memory = next(line for line in status.splitlines() if line.startswith("memory"))
    assert "for prompts of up to 192 tokens" not in memory
    # [round] optimizer = "auto" runs DPO whether its reward model steers or not ([round] trusted_optimizer = "dpo").
    assert "DPO" in memory and "PPO" not in memory and "in its reward model job" not in memory
    set_settings(project, "round", trusted_optimizer="ppo")  # then it may run PPO or DPO: both count, and a head's job is smaller
    status = run_tether("status", "--project", str(project), check=True).stdout
    memory = next(line for line in status.splitlines() if line.startswith("memory"))
    assert "PPO" in memory and "DPO" in memory and "in its reward model job" not in memory

    assert "That is more than" not in memory

    set_settings(project, "reward_model", gradient_checkpointing=True)
    set_settings(project, "ppo", batch_size=64, minibatch_size=64)
    status = run_tether("status", "--project", str(project), check=True).stdout
    assert "in its PPO job" in next(line for line in status.splitlines() if line.startswith("memory"))

    set_settings(project, "reward_model", gradient_checkpointing=False, batch_size=10**6)
    status = run_tether("status", "--project", str(project), check=True).stdout
    memory = next(line for line in status.splitlines() if line.startswith("memory"))
    assert "in its reward model job" in memory and "That is more than the" in memory and "gradient_checkpointing" in memory


def test_status_says_why_it_cannot_estimate_a_model_whose_config_it_cannot_read(tmp_path, tiny_model_dir):
    project = tmp_path / "p"
    run_tether("init", str(project), "--model", str(tiny_model_dir), check=True)
    set_settings(project, "model", name_or_path="nobody/no-such-model-here")
    status = run_tether("status", "--project", str(project), env={"HF_HUB_OFFLINE": "1"})
    assert status.returncode == 0, status.stderr
    assert "memory        unknown: " in status.stdout


def llama_config(path, **sizes):
    """A model directory holding only a Llama config.json: the shape is all train.runtime.memory reads."""
    path.mkdir()
    LlamaConfig(**sizes).save_pretrained(path)
    return path


def test_init_lowers_the_settings_of_the_largest_job_until_a_round_fits_the_gpu(tmp_path):
    """A 0.5B-sized model on an 80 GB GPU: its head's job fits, and so would a LoRA reward model's batches of 1,024
    tokens once checkpointed, not without. An 8B-sized one on 24 GB: PPO's minibatch is halved down to 1."""
    small = llama_config(tmp_path / "small", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    project = init_project(tmp_path / "p80", str(small), Hardware("cuda", "GPU", 80))
    assert project.config.reward_model.kind == "head" and "lowered" not in project.profile
    lora = dataclasses.replace(project.config, reward_model=dataclasses.replace(project.config.reward_model, kind="lora"))
    assert fit_to_memory(lora, "ppo", on_gpu=True, available_gb=80) == ["[reward_model] gradient_checkpointing = true"]
    assert lora.reward_model.gradient_checkpointing is True and lora.reward_model.batch_size == 16

    large = llama_config(tmp_path / "large", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256)
    project = init_project(tmp_path / "p24", str(large), Hardware("cuda", "GPU", 24))
    # init fits the jobs "auto" runs, DPO's and not PPO's: PPO's are lowered for a round that runs it.
    assert "[dpo] batch_size = 1" in project.profile and "[ppo]" not in project.profile and project.config.ppo.minibatch_size == 8
    lowered = fit_to_memory(project.config, "ppo", on_gpu=True, available_gb=24)
    assert project.config.ppo.minibatch_size == 1 and "[ppo] minibatch_size = 1" in lowered
    assert project.config.ppo.gradient_checkpointing is True and "[ppo] gradient_checkpointing = true" in lowered
    jobs, _, _ = round_memory(project.config, "ppo", [], on_gpu=True)
    assert max(job.peak for job in jobs) > 24 * 2**30  # still too much: status says so, and what to lower next


def test_a_round_that_fits_keeps_the_profiles_settings(tmp_path, tiny_model_dir):
    project = init_project(tmp_path / "p", str(tiny_model_dir), Hardware("cuda", "GPU", 24))
    assert "lowered" not in project.profile and project.config.ppo.minibatch_size == 8


@pytest.mark.worker_process
def test_each_job_records_the_peak_memory_its_worker_measured(tiny_project):
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    run_tether("generate", "--limit", "2", "--project", str(tiny_project), check=True)
    project = load_project(tiny_project)
    [job] = project.run(list_jobs)
    assert 0.2 < project.run(job_metrics, job.id)["peak_memory_gb"] < 4  # torch, transformers and a tiny model
    assert "peak memory: peak_memory_gb" in (job_dir(project, job.id) / "worker.log").read_text()
