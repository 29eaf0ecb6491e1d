"""A batch that runs out of GPU memory is halved and tried again, in generation, scoring and PPO's rollouts.

There is no GPU here, so the tiny model is given a memory limit: a hook on its transformer raises
torch's own OutOfMemoryError for any forward pass over more than two sequences, as CUDA's
allocator raises it.
"""

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from tests.conftest import CHAT_PROMPTS
from train.common.config import GenerationConfig, ModelConfig
from train.common.errors import ModelError
from train.common.models import load_model, load_tokenizer
from train.policy.generate import end_of_turn_ids, generate
from train.policy.ppo import sample
from train.reward.lora import LoraRewardModel
from train.reward.scores import Normalization
from train.runtime import batching


@pytest.fixture(autouse=True)
def fresh_batch_sizes(monkeypatch):
    monkeypatch.setattr(batching, "_fitted", {})  # what one test halved must not carry into the next


def limit_memory(transformer: torch.nn.Module, most: int = 2):
    def hook(module, args, kwargs):
        ids = next(t for t in (*args, kwargs.get("input_ids"), kwargs.get("inputs_embeds")) if t is not None)
        if ids.shape[0] > most:
            raise torch.OutOfMemoryError(f"CUDA out of memory: the test's limit is {most} sequences")
    return transformer.register_forward_pre_hook(hook, with_kwargs=True)


def test_generation_halves_a_batch_that_runs_out_of_memory_and_keeps_every_completion(tiny_model_dir, capsys):
    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    config = GenerationConfig(temperature=0, max_new_tokens=6, batch_size=8, per_prompt=2)
    expected = generate(model, tokenizer, CHAT_PROMPTS, GenerationConfig(temperature=0, max_new_tokens=6, batch_size=2, per_prompt=2), progress=False)
    limit_memory(model.model)
    results = generate(model, tokenizer, CHAT_PROMPTS, config, progress=False)
    assert results == expected and len(results) == 6
    assert capsys.readouterr().err.count("out of GPU memory in generation: batch size halved to") == 2  # 8 -> 4 -> 2
    # The size that fitted is kept for the rest of the job: no more failed tries.
    assert generate(model, tokenizer, CHAT_PROMPTS, config, progress=False) == expected
    assert "out of GPU memory" not in capsys.readouterr().err


def test_scoring_halves_a_batch_that_runs_out_of_memory_with_the_same_scores(tiny_model_dir, capsys):
    tokenizer = load_tokenizer(tiny_model_dir)
    classifier = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).eval()
    classifier.config.pad_token_id = tokenizer.pad_token_id
    reward_model = LoraRewardModel(classifier, tokenizer, Normalization([0.0], [1.0]), 64)
    prompts, responses = [p for p in CHAT_PROMPTS for _ in range(3)], [f"answer number {i}" for i in range(9)]
    expected = reward_model.raw_scores(prompts, responses, batch_size=8)
    limit_memory(classifier.model)
    assert sum(reward_model.raw_scores(prompts, responses, batch_size=8), []) == pytest.approx(sum(expected, []), abs=1e-5)
    assert "out of GPU memory in scoring: batch size halved to 2" in capsys.readouterr().err


def test_ppo_rollouts_halve_a_batch_that_runs_out_of_memory(wrapped, capsys):
    model, tokenizer, config, _ = wrapped
    limit_memory(model.peft_model.get_base_model().model)
    eos = end_of_turn_ids(model.peft_model, tokenizer)
    query_ids, _, response_ids, response_mask, finished = sample(model, tokenizer, CHAT_PROMPTS * 4, config, eos)
    assert query_ids.shape[0] == response_ids.shape[0] == 12 and response_mask.sum(dim=1).min() >= 1
    # Parts sampled apart are padded to one width: past each response's end is padding alone.
    assert torch.all(response_ids[response_mask == 0] == tokenizer.pad_token_id)
    assert "out of GPU memory in PPO's rollouts: batch size halved to 3" in capsys.readouterr().err  # 12 -> 6 -> 3 -> 1


def test_a_single_sequence_that_does_not_fit_is_one_clear_error(tiny_model_dir):
    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_model_dir)))
    limit_memory(model.model, most=0)
    with pytest.raises(ModelError, match="generation ran out of GPU memory on a batch of 1"):
        generate(model, tokenizer, CHAT_PROMPTS, GenerationConfig(max_new_tokens=4, batch_size=4), progress=False)
