"""A head on the base's features as the reward of PPO, GRPO and `tether rm score`: one reading of the base everywhere."""

import pytest
import torch

from tests.conftest import PPO_PROMPTS, first_token_probs, load_plain
from train.common.config import PPOConfig, RewardModelConfig
from train.policy.ppo import RewardScorer, build, reward_scores, train_ppo
from train.reward.features import FeatureSpec, response_features
from train.reward.head import Head, save_head
from train.reward.scores import Normalization
from train.reward.versions import load_reward_model, read_reward_adapter

SPEC = FeatureSpec(layers=(0, 1, 2), pooling="mean", max_length=512)


@pytest.fixture(scope="session")
def favoured_head(peaked_model_dir, tmp_path_factory):
    """(token, reward_dir): the policy's third-likeliest first token, and a head on features that favours it as a
    one-token response: its heads point along that response's features less the other candidates', at 1, 0.5 and 1.5
    times the scale."""
    model, tokenizer = load_plain(peaked_model_dir)
    candidates = first_token_probs(peaked_model_dir).topk(20).indices
    token = candidates[2].item()
    texts = [tokenizer.decode([t]) for t in candidates.tolist()]
    direction = 0
    for prompt in PPO_PROMPTS:
        features = response_features(model, tokenizer, [prompt] * len(texts), texts, SPEC, batch_size=8)  # (20, D)
        favoured = candidates == token
        direction = direction + features[favoured][0] - features[~favoured].mean(dim=0)
    weight = torch.tensor([[1.0], [0.5], [1.5]]) * 8 * direction / direction.norm()  # (3, D)
    out = tmp_path_factory.mktemp("head") / "rm"
    save_head(Head(weight, torch.zeros(3), 1.0), SPEC, Normalization([0.0] * 3, [1.0] * 3), {"alpha": 1.0},
              RewardModelConfig(heads=3), out)
    return token, out


def test_ppo_grpo_and_rm_score_read_a_head_on_features_alike_without_a_reward_adapter(peaked_model_dir, favoured_head):
    from peft import get_peft_model

    from train.policy.adapters import policy_lora
    from train.policy.grpo import SharedReward

    token, reward_dir = favoured_head
    model, tokenizer = load_plain(peaked_model_dir)
    candidates = first_token_probs(peaked_model_dir).topk(20).indices
    texts = [tokenizer.decode([t]) for t in candidates.tolist()] + ["Music and light, and a long answer besides."]
    prompts = [PPO_PROMPTS[i % len(PPO_PROMPTS)] for i in range(len(texts))]
    rm = load_reward_model(str(peaked_model_dir), reward_dir)
    rewards, spreads = rm.score_with_uncertainty(prompts, texts)
    assert max(range(20), key=lambda i: rewards[i]) == 2 and min(spreads) >= 0  # the favoured token, the third likeliest

    reward = read_reward_adapter(reward_dir)
    assert reward.lora is None and reward.features == SPEC
    wrapped = build(model, reward, PPOConfig())
    assert set(wrapped.peft_model.peft_config) == {"policy"}  # no reward adapter: the head reads the base
    ppo, ppo_spreads = reward_scores(wrapped, RewardScorer(tokenizer, reward.normalization, reward.max_length, reward.features), prompts, texts)
    assert ppo.tolist() == pytest.approx(rewards, abs=1e-4) and ppo_spreads.tolist() == pytest.approx(spreads, abs=1e-4)

    base, tokenizer = load_plain(peaked_model_dir)
    policy = get_peft_model(base, policy_lora(None, 8, 16))
    shared = SharedReward(reward, tokenizer)
    shared.attach(policy)
    assert set(policy.peft_config) == {"default"}
    grpo_rewards, grpo_spreads = shared.score(prompts, texts)
    assert grpo_rewards == pytest.approx(rewards, abs=1e-4) and grpo_spreads == pytest.approx(spreads, abs=1e-4)


def test_ppo_raises_the_probability_of_the_token_a_head_on_features_favours(peaked_model_dir, favoured_head, tmp_path):
    token, reward_dir = favoured_head
    before = first_token_probs(peaked_model_dir)[token].item()
    model, tokenizer = load_plain(peaked_model_dir)
    config = PPOConfig(steps=12, batch_size=16, minibatch_size=8, max_new_tokens=1, temperature=1.0, learning_rate=3e-4,
                       kl_coef=0.01, target_kl=0, missing_eos_penalty=0.0, seed=1)
    result = train_ppo(model, tokenizer, PPO_PROMPTS, reward_dir, config, tmp_path / "policy")
    after = first_token_probs(peaked_model_dir, tmp_path / "policy")[token].item()
    scores = [s["score"] for s in result["steps"]]
    assert after > 2 * before, (before, after, [round(s, 2) for s in scores])
    assert sum(scores[-3:]) / 3 > sum(scores[:3]) / 3
