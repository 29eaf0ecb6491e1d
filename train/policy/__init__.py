"""The policy: a LoRA adapter on the base, trained by one of three optimisers, each tethered to the starting model.

    ppo.py       PPO, Tether's own, against the reward model, with a per-token KL penalty
    dpo.py       DPO on the votes and on pairs the reward model ranked, with TRL's DPOTrainer
    grpo.py      GRPO against the reward model, with TRL's GRPOTrainer
    adapters.py  a TRL-trained round's adapter: made or continued, then saved as plain PEFT
    generate.py  sampling completions from a policy version
    predict.py   a round's predictor: how often each candidate would beat the round's start, by the reward model
"""
