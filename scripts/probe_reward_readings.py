"""Which reading of a response can a reward learn a judge from, with few noisy votes?

The reward model scores a response at one position, the end-of-turn token after it. This probe
asks how much a linear reward on the frozen starting model's features can learn there, against
the mean of the features over the response's tokens. It samples answers of the starting model to
the demo prompts (with the settings `tether init` writes), casts simulated votes on pairs of them
(sigmoid of the judge's margin over the noise, as `tether simulate` does), fits a Bradley-Terry
linear reward on each reading, and reports the share of pairs on held-out prompts that the reward
orders as the noiseless judge does. The end-of-turn reading is the baseline, in the same run.

    python scripts/probe_reward_readings.py --answers-per-prompt 16 --votes 96,384,1536
"""

import argparse
import dataclasses
import random
import sys
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotate.judges import BUILT_IN, prefers_first  # noqa: E402
from store.prompt_files import read_prompt_file  # noqa: E402
from train.config import Hardware, ModelConfig  # noqa: E402
from train.generate import generate  # noqa: E402
from train.models import load_model  # noqa: E402
from train.reward_model import encode  # noqa: E402
from ui.owner.config import settings_for  # noqa: E402


@torch.inference_mode()
def readings(model, tokenizer, prompt, texts: list[str], max_length: int) -> list[torch.Tensor]:
    """Per answer, the last hidden state at the end-of-turn token and its mean over the response, concatenated."""
    out = []
    for text in texts:
        encoded = encode(tokenizer, prompt, text, max_length)
        hidden = model(torch.tensor([encoded.input_ids]), output_hidden_states=True).hidden_states[-1][0]  # (T, H)
        out.append(torch.cat([hidden[-1], hidden[-encoded.response_tokens :].mean(dim=0)]))
    return out


def fit(differences: torch.Tensor, l2: float) -> torch.Tensor:
    """Bradley-Terry weights: the chosen minus the rejected features of each vote, one row each."""
    weights = torch.zeros(differences.shape[1], requires_grad=True)
    optimiser = torch.optim.LBFGS([weights], max_iter=100)

    def closure():
        optimiser.zero_grad()
        loss = torch.nn.functional.softplus(-differences @ weights).mean() + l2 * (weights**2).sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    return weights.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=Path, default=ROOT / "scripts" / "demo_prompts.jsonl", help="Prompt file to sample answers to.")
    parser.add_argument("--answers-per-prompt", type=int, default=16, help="Answers of the starting model per prompt.")
    parser.add_argument("--held-out-prompts", type=int, default=7, help="Prompts whose pairs only test, never train.")
    parser.add_argument("--judges", default="concise,positive,specific", help="Comma-separated built-in judges.")
    parser.add_argument("--votes", default="96,384,1536", help="Comma-separated numbers of simulated votes to fit on.")
    parser.add_argument("--noise", type=float, default=1.0, help="The simulated annotators' noise T.")
    parser.add_argument("--draws", type=int, default=4, help="Draws of votes per setting; the table gives their mean.")
    parser.add_argument("--l2", type=float, default=0.03, help="L2 penalty on the reward's weights.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    vote_counts = [int(n) for n in args.votes.split(",")]

    torch.manual_seed(args.seed)
    config, _ = settings_for(Hardware("cpu", "probe", 0), ModelConfig())
    prompts = [prompt.messages for prompt in read_prompt_file(args.prompts)]
    model, tokenizer = load_model(config.model)
    generation = dataclasses.replace(config.generation, per_prompt=args.answers_per_prompt, seed=args.seed)
    answers = [g.text for g in generate(model, tokenizer, prompts, generation)]
    per_prompt = {i: answers[i * args.answers_per_prompt : (i + 1) * args.answers_per_prompt] for i in range(len(prompts))}
    features = {}
    for i in tqdm(per_prompt, desc="features", unit="prompt"):
        for j, vector in enumerate(readings(model, tokenizer, prompts[i], per_prompt[i], config.reward_model.max_length)):
            features[i, j] = vector
    scale = torch.stack(list(features.values())).std(dim=0) + 1e-6
    features = {key: vector / scale for key, vector in features.items()}
    width = next(iter(features.values())).shape[0] // 2

    order = list(per_prompt)
    random.Random(args.seed).shuffle(order)
    held_out, training = order[: args.held_out_prompts], order[args.held_out_prompts :]
    test_pairs = [(i, a, b) for i in held_out for a in range(args.answers_per_prompt) for b in range(a + 1, args.answers_per_prompt)]
    print(f"{len(answers)} answers to {len(prompts)} prompts; {len(training)} prompts train, {len(held_out)} test; noise {args.noise}")
    print("| judge | reading | " + " | ".join(f"{n} votes" for n in vote_counts) + " |")
    print("|---|---|" + "---|" * len(vote_counts))
    for name in args.judges.split(","):
        judge = BUILT_IN[name]
        scores = {(i, j): judge("", text) for i, texts in per_prompt.items() for j, text in enumerate(texts)}
        ordered = [(i, a, b) for i, a, b in test_pairs if scores[i, a] != scores[i, b]]
        agreement = {"end-of-turn token": [], "mean over the response": []}
        for votes in vote_counts:
            shares = {reading: 0.0 for reading in agreement}
            for draw in range(args.draws):
                rng = random.Random(f"{args.seed}-{name}-{votes}-{draw}")
                rows = []
                for _ in range(votes):
                    i = rng.choice(training)
                    a, b = rng.sample(range(args.answers_per_prompt), 2)
                    if not prefers_first(scores[i, a] - scores[i, b], args.noise, rng):
                        a, b = b, a
                    rows.append(features[i, a] - features[i, b])
                differences = torch.stack(rows)
                for reading, columns in zip(agreement, (slice(0, width), slice(width, 2 * width))):
                    weights = fit(differences[:, columns], args.l2)
                    reward = {key: float(vector[columns] @ weights) for key, vector in features.items()}
                    right = sum((reward[i, a] - reward[i, b]) * (scores[i, a] - scores[i, b]) > 0 for i, a, b in ordered)
                    shares[reading] += right / len(ordered) / args.draws
            for reading in agreement:
                agreement[reading].append(shares[reading])
        for reading, row in agreement.items():
            print(f"| {name} ({len(ordered)} test pairs) | {reading} | " + " | ".join(f"{share:.0%}" for share in row) + " |")


if __name__ == "__main__":
    main()
