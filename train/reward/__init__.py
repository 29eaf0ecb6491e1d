"""Reward models: how well a response answers its prompt, learnt from people's votes; and the AI judge.

Two kinds ([reward_model] kind), behind one face that callers use, train.reward.versions (fit, load to score, take
apart) and train.reward.scores.RewardModel (score):
    lora.py      a LoRA adapter and K scalar heads on the base, fitted Bradley-Terry style with TRL's RewardTrainer
    head.py      a Bayesian linear head on the frozen base's features (features.py), for a few noisy votes
Neither imports the other. What both share: encoding.py (a response put to a reward model), votes.py (what they fit,
split by prompt), scores.py (normalised scores and pairwise figures), layout.py (a version's files).
judge.py asks a causal LM which of two answers is better, for AI votes beside people's.
"""
