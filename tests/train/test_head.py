"""The few-vote reward model: features read off the frozen base, cached once, and a Bayesian Bradley-Terry head on them."""

import torch
from peft import LoraConfig, get_peft_model

from train.reward.encoding import encode
from train.reward.features import FeatureCache, FeatureSpec, cached_features, layer_indices, pool, pooled_states, response_features
from train.reward.head import fit_head

from tests.conftest import CHAT_PROMPTS, load_plain

ANSWERS = ["Plants use light.", "Cats purr when they are calm and happy, and sometimes when hurt.", "Hello!"]


def planted_votes(votes: int, flip: float, seed: int, width: int = 20) -> tuple[torch.Tensor, ...]:
    """Votes on pairs of random feature vectors by a planted linear reward, each flipped with probability `flip`:
    (chosen, rejected, the planted weights, held-out features)."""
    generator = torch.Generator().manual_seed(seed)
    truth = torch.randn(width, generator=generator)
    a, b = torch.randn(votes, width, generator=generator), torch.randn(votes, width, generator=generator)
    a_better = ((a - b) @ truth > 0) ^ (torch.rand(votes, generator=generator) < flip)
    chosen, rejected = torch.where(a_better[:, None], a, b), torch.where(a_better[:, None], b, a)
    return chosen * 3 + 1, rejected * 3 + 1, truth / 3, torch.randn(500, width, generator=generator) * 3 + 1  # features off scale


def correlation(x: torch.Tensor, y: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([x.double(), y.double()]))[0, 1].item()


def test_the_head_learns_a_planted_reward_from_noisy_votes_and_its_heads_spread_narrows_with_more_votes():
    spreads = []
    for votes in (80, 640):
        chosen, rejected, truth, held = planted_votes(votes, flip=0.3, seed=votes)
        head = fit_head(chosen, rejected, torch.full((votes,), 0.7), list(range(votes)), heads=6)
        scores = head.raw_scores(held)  # (500, 6)
        assert correlation(scores.mean(dim=1), held @ truth) > (0.5 if votes == 80 else 0.85)
        spreads.append((scores - scores.mean(dim=1, keepdim=True)).std().item())
        # The heads come in antithetic pairs around the MAP head: their mean is it, so the reward is the posterior's mode.
        assert torch.allclose(head.weight[:3] + head.weight[3:], 2 * head.weight.mean(dim=0).expand(3, -1), atol=1e-5)
    assert spreads[1] < spreads[0] * 0.7


def test_votes_that_carry_no_signal_give_a_head_that_says_so():
    generator = torch.Generator().manual_seed(0)
    chosen, rejected = torch.randn(60, 30, generator=generator), torch.randn(60, 30, generator=generator)  # labels at random
    head = fit_head(chosen, rejected, torch.full((60,), 0.7), list(range(60)), heads=4)
    margins = head.raw_scores(chosen).mean(dim=1) - head.raw_scores(rejected).mean(dim=1)
    assert head.alpha >= 1e6  # the evidence puts the prior's weight far above anything the votes say
    assert torch.sigmoid(margins).sub(0.5).abs().max() < 0.01  # so every pair stays a coin flip to it


def test_cross_validation_and_the_bootstrap_fit_the_same_planted_reward():
    chosen, rejected, truth, held = planted_votes(200, flip=0.3, seed=1)
    by_evidence = fit_head(chosen, rejected, torch.full((200,), 0.7), [i % 20 for i in range(200)], heads=4)
    assert correlation(by_evidence.raw_scores(held).mean(dim=1), held @ truth) > 0.7
    for prior, posterior in (("cv", "laplace"), ("evidence", "bootstrap")):
        other = fit_head(chosen, rejected, torch.full((200,), 0.7), [i % 20 for i in range(200)], heads=4, prior=prior, posterior=posterior)
        assert correlation(other.raw_scores(held).mean(dim=1), held @ truth) > 0.6
        assert correlation(other.raw_scores(held).mean(dim=1), by_evidence.raw_scores(held).mean(dim=1)) > 0.8


def test_features_are_the_base_states_averaged_over_the_answer_whatever_the_batch_and_with_adapters_off(tiny_model_dir):
    model, tokenizer = load_plain(tiny_model_dir)
    prompts = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(len(ANSWERS))]
    spec = FeatureSpec(layers=(0, 2), pooling="mean", max_length=64)
    kept = []  # which layers' states each forward pass kept
    hook = model.register_forward_hook(
        lambda module, args, output: kept.append([i for i, s in enumerate(output.hidden_states) if s is not None]))
    batched = response_features(model, tokenizer, prompts, ANSWERS, spec, batch_size=3)
    hook.remove()
    assert batched.shape == (3, 2 * model.config.hidden_size)
    assert kept == [[0, 2]]  # the read layers' alone, not every layer's
    for i, (prompt, answer) in enumerate(zip(prompts, ANSWERS)):
        encoded = encode(tokenizer, prompt, answer, 64)
        with torch.no_grad():
            states = model(torch.tensor([encoded.input_ids]), output_hidden_states=True).hidden_states
        by_hand = torch.cat([states[layer][0, -encoded.response_tokens :].mean(dim=0) for layer in (0, 2)])
        assert torch.allclose(batched[i], by_hand, atol=1e-5)
    last = pooled_states(model, tokenizer, prompts, ANSWERS, (2,), ("last",), 64, batch_size=3)[:, 0, 0]
    assert torch.allclose(last[0], model(torch.tensor([encode(tokenizer, prompts[0], ANSWERS[0], 64).input_ids]),
                                         output_hidden_states=True).hidden_states[2][0, -1], atol=1e-5)
    # A policy's adapter on the base changes its outputs, never the features a head reads.
    policy = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    with torch.no_grad(), policy.disable_adapter():
        base_logits = policy(torch.tensor([[1, 2, 3]])).logits
    with torch.no_grad():
        assert not torch.allclose(policy(torch.tensor([[1, 2, 3]])).logits, base_logits)
    assert torch.allclose(response_features(policy, tokenizer, prompts, ANSWERS, spec, batch_size=1), batched, atol=1e-5)


def test_pooling_reads_states_on_the_models_device_with_the_token_counts_on_the_cpu():
    # As PPO's scoring calls it on a GPU (the H100 run found it failing there); "meta" stands in for a second device.
    states = tuple(torch.zeros(2, 5, 4, device="meta") for _ in range(3))
    lengths = torch.tensor([5, 3], device="meta")
    pooled = pool(states, (0, 2), ("mean", "last"), lengths, torch.tensor([2, 1]))
    assert pooled.shape == (2, 2, 2, 4) and pooled.device.type == "meta"


def test_each_answer_is_read_once_and_cached_per_reading(tiny_model_dir, tmp_path):
    model, tokenizer = load_plain(tiny_model_dir)
    spec = FeatureSpec(layers=layer_indices((0, 0.5, 1), model.config.num_hidden_layers), pooling="mean", max_length=64)
    assert spec.layers == (0, 1, 2)
    prompts = [CHAT_PROMPTS[0]] * 3
    cache = FeatureCache(tmp_path, {"model": "tiny", **spec.__dict__})
    first, read, cached = cached_features(model, tokenizer, prompts, [*ANSWERS[:2], ANSWERS[0]], spec, 4, cache, "job-1")
    assert (read, cached) == (2, 0) and torch.equal(first[0], first[2])  # an answer asked twice is read once
    again, read, cached = cached_features(model, tokenizer, prompts, ANSWERS, spec, 4, cache, "job-2")
    assert (read, cached) == (1, 2) and torch.allclose(again[:2], first[:2])  # only the new answer is read
    assert sorted(p.name for p in cache.folder.iterdir()) == ["job-1.parquet", "job-2.parquet"]
    other = FeatureCache(tmp_path, {"model": "tiny", **FeatureSpec((2,), "mean", 64).__dict__})
    assert other.folder != cache.folder and cached_features(model, tokenizer, prompts, ANSWERS, FeatureSpec((2,), "mean", 64), 4, other, "job-3")[1] == 3
