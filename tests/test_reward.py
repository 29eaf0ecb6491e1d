import json
import random

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import score_with_plain_peft
from train.config import RewardModelConfig
from train.errors import ModelError
from train.reward import (
    METRICS_FILE,
    NORMALIZATION_FILE,
    Normalization,
    RewardModel,
    build_model,
    encode,
    encode_pairs,
    load_reward_model,
    split_by_prompt,
    train_reward_model,
)

WORDS = ["apple", "river", "stone", "cloud", "music", "light", "table", "green"]


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def toy_rows(prompts: int, pairs_per_prompt: int = 1, seed: int = 0) -> list[dict]:
    """A learnable preference: the chosen reply ends with "thanks", the rejected one with "sorry"."""
    rng = random.Random(seed)
    rows = []
    for i in range(prompts):
        prompt = [{"role": "user", "content": f"Tell me about {rng.choice(WORDS)} number {i}."}]
        for _ in range(pairs_per_prompt):
            body = " ".join(rng.choice(WORDS) for _ in range(4))
            rows.append({"prompt": prompt, "chosen": assistant(f"{body} thanks"), "rejected": assistant(f"{body} sorry")})
    return rows


def prompt_key(row: dict) -> str:
    return json.dumps(row["prompt"])


def test_the_split_keeps_each_prompt_on_one_side_and_is_deterministic():
    rows = toy_rows(prompts=20, pairs_per_prompt=3)
    train, held = split_by_prompt(rows, eval_share=0.25, seed=7)
    assert len(train) + len(held) == len(rows)
    assert not {prompt_key(r) for r in train} & {prompt_key(r) for r in held}
    assert len({prompt_key(r) for r in held}) == 5  # a quarter of the 20 prompts, with all their pairs
    assert len(held) == 15

    again = split_by_prompt(list(reversed(rows)), eval_share=0.25, seed=7)
    assert sorted(map(prompt_key, again[1])) == sorted(map(prompt_key, held))  # the row order does not matter
    assert [r["chosen"] for r in train] == [r["chosen"] for r in rows if r in train]  # each part keeps the order
    other = split_by_prompt(rows, eval_share=0.25, seed=8)[1]
    assert {prompt_key(r) for r in other} != {prompt_key(r) for r in held}

    assert split_by_prompt(rows[:6], eval_share=0.01, seed=0)[1] != []  # a share > 0 holds out at least one prompt
    assert split_by_prompt(rows, eval_share=0.0, seed=0) == (rows, [])


def test_long_prompts_lose_their_start_and_no_pair_is_dropped(tiny_model_dir):
    model, tokenizer = build_model(str(tiny_model_dir), RewardModelConfig())
    long_prompt = [{"role": "user", "content": " ".join(WORDS * 6)}]
    rows = [
        {"prompt": [{"role": "user", "content": "Hi?"}], "chosen": assistant("apple"), "rejected": assistant("river")},
        {"prompt": long_prompt, "chosen": assistant("stone cloud"), "rejected": assistant("music")},
        {"prompt": long_prompt, "chosen": assistant("light"), "rejected": assistant(" ".join(WORDS * 8))},
    ]
    max_length = 40
    encoded = encode_pairs(tokenizer, rows, max_length)
    assert len(encoded.chosen_ids) == len(encoded.rejected_ids) == 3
    assert (encoded.truncated, encoded.responses_cut) == (2, 1)

    prompt_ids = tokenizer.apply_chat_template(long_prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    response_ids = tokenizer("stone cloud", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert len(prompt_ids) + len(response_ids) > max_length
    chosen = encoded.chosen_ids[1]
    assert len(chosen) == max_length
    assert chosen == (prompt_ids + response_ids)[-max_length:]  # the prompt is cut from the left, the response whole
    assert chosen[-1] == tokenizer.eos_token_id

    short = encode(tokenizer, rows[0]["prompt"], "apple", max_length)
    assert not short.prompt_cut and encoded.chosen_ids[0] == short.input_ids
    too_long = encode(tokenizer, long_prompt, " ".join(WORDS * 8), max_length)
    assert too_long.response_cut and too_long.input_ids == encoded.rejected_ids[2]
    long_response = tokenizer(" ".join(WORDS * 8), add_special_tokens=False)["input_ids"]
    assert too_long.input_ids == long_response[:max_length]  # a response alone over max_length keeps its start


def test_the_score_is_read_at_the_last_non_pad_token(tiny_model_dir):
    model, tokenizer = build_model(str(tiny_model_dir), RewardModelConfig())
    model.eval()
    prompts = ["Hi?", [{"role": "user", "content": "Name a colour."}], "Why?"]
    responses = ["apple", "green, like a river in the light", "because"]
    batched = RewardModel(model, tokenizer, Normalization(0.0, 1.0), 512).raw_scores(prompts, responses, batch_size=3)  # right-padded

    classifier = model.get_base_model()
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        for prompt, response, got in zip(prompts, responses, batched):
            ids = torch.tensor([encode(tokenizer, prompt, response, 512).input_ids])  # (1, T)
            hidden = classifier.model(input_ids=ids).last_hidden_state  # (1, T, C)
            manual = classifier.score(hidden[:, -1]).item()  # the head on the last token, the closing EOS
            assert got == pytest.approx(manual, abs=1e-5)

            padded = torch.cat([ids, torch.full((1, 5), pad)], dim=1)  # (1, T + 5)
            mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 5, dtype=torch.long)], dim=1)
            assert model(input_ids=padded, attention_mask=mask).logits.item() == pytest.approx(manual, abs=1e-5)
            # Right padding leaves the real tokens where they are, so even without a mask nothing changes.
            assert model(input_ids=padded).logits.item() == pytest.approx(manual, abs=1e-5)
            # Left padding needs the mask: unmasked, the pads in front are attended to.
            left = torch.cat([torch.full((1, 5), pad), ids], dim=1)
            assert model(input_ids=left).logits.item() != pytest.approx(manual, abs=1e-5)

        # Why the pad token must differ from EOS: with pad == EOS the closing EOS counts as padding
        # and the score is read one token early.
        ids = encode(tokenizer, prompts[0], responses[0], 512).input_ids
        classifier.config.pad_token_id = tokenizer.eos_token_id
        early = model(input_ids=torch.tensor([ids])).logits.item()
        assert early == pytest.approx(model(input_ids=torch.tensor([ids[:-1]])).logits.item(), abs=1e-6)
        assert early != pytest.approx(batched[0], abs=1e-5)
        classifier.config.pad_token_id = pad


TRAIN_CONFIG = RewardModelConfig(learning_rate=1e-3, epochs=4, batch_size=8, lora_dropout=0.0, max_length=64, seed=3)


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """One short run on the toy preference, shared by the tests below: (rows, train, eval, metrics, out_dir, progress)."""
    rows = toy_rows(prompts=40)
    # A few long prompts, so that truncation runs during training too.
    for row in rows[:6]:
        row["prompt"] = [{"role": "user", "content": " ".join(WORDS * 3)}] + row["prompt"]
    train, held = split_by_prompt(rows, eval_share=0.25, seed=0)
    out_dir = tmp_path_factory.mktemp("rm") / "v1"
    progress = []
    metrics = train_reward_model(str(tiny_model_dir), train, held, TRAIN_CONFIG, out_dir, on_progress=progress.append)
    return rows, train, held, metrics, out_dir, progress


def test_a_short_run_learns_a_toy_preference(trained, tiny_model_dir):
    rows, train, held, metrics, out_dir, progress = trained
    assert (metrics["pairs_train"], metrics["pairs_eval"]) == (30, 10)
    assert metrics["truncated"] > 0  # long prompts were cut, and still every pair trained:
    assert metrics["steps"] == len(progress) == 4 * 4  # 30 pairs in batches of 8, four epochs
    assert [p["step"] for p in progress] == list(range(1, 17)) and {p["total_steps"] for p in progress} == {16}
    assert all(0 <= p["accuracy"] <= 1 for p in progress) and progress[-1]["accuracy"] > progress[0]["accuracy"]
    assert metrics["eval_accuracy"] >= 0.9
    assert metrics["eval_mean_margin"] > 0
    assert metrics["train_loss_end"] < metrics["train_loss_start"]
    assert metrics["pairs_per_second"] > 0 and metrics["seconds"] >= metrics["train_seconds"]

    saved = json.loads((out_dir / METRICS_FILE).read_text())
    assert saved["eval_accuracy"] == metrics["eval_accuracy"] and saved["config"]["seed"] == TRAIN_CONFIG.seed

    # The LoRA matrices and the head moved from where the same seed starts them.
    weights = load_file(out_dir / "adapter_model.safetensors")
    initial, _ = build_model(str(tiny_model_dir), TRAIN_CONFIG)
    start = {name: p.detach() for name, p in initial.named_parameters()}
    head = next(k for k in weights if k.endswith("score.weight"))
    assert not torch.allclose(weights[head], start["base_model.model.score.modules_to_save.default.weight"])
    lora_b = [k for k in weights if "lora_B" in k]
    assert lora_b and all(weights[k].abs().sum() > 0 for k in lora_b)  # LoRA B starts at zero


def test_normalised_training_scores_have_mean_0_and_std_1(trained, tiny_model_dir):
    rows, train, held, metrics, out_dir, progress = trained
    reward_model = load_reward_model(str(tiny_model_dir), out_dir)
    assert reward_model.max_length == TRAIN_CONFIG.max_length
    assert json.loads((out_dir / NORMALIZATION_FILE).read_text()) == {"mean": metrics["reward_mean"], "std": metrics["reward_std"]}
    prompts = [r["prompt"] for r in train] * 2
    responses = [r["chosen"][0]["content"] for r in train] + [r["rejected"][0]["content"] for r in train]
    scores = torch.tensor(reward_model.score(prompts, responses))
    assert scores.mean().item() == pytest.approx(0, abs=1e-4)
    assert scores.std(correction=0).item() == pytest.approx(1, abs=1e-4)

    scored = []
    again = reward_model.pairwise_accuracy(held, batch_size=4, on_scored=scored.append)
    assert again.accuracy == metrics["eval_accuracy"] and again.pairs == len(held)
    assert sum(scored) == 2 * len(held) and max(scored) == 4
    assert again.mean_margin == pytest.approx(metrics["eval_mean_margin"], abs=1e-4)


def test_a_saved_reward_model_scores_the_same_in_a_fresh_process_with_plain_transformers_and_peft(trained, tiny_model_dir, tmp_path):
    rows, train, held, metrics, out_dir, progress = trained
    reward_model = load_reward_model(str(tiny_model_dir), out_dir)
    cases = [(r["prompt"], r[side][0]["content"]) for r in held[:4] + train[:4] for side in ("chosen", "rejected")]
    full_lengths = [len(encode(reward_model.tokenizer, p, r, 10**6).input_ids) for p, r in cases]
    assert sum(n > TRAIN_CONFIG.max_length for n in full_lengths) >= 2  # truncation is part of what must match
    plain = score_with_plain_peft(tiny_model_dir, out_dir, cases, tmp_path)

    prompts, responses = [c[0] for c in cases], [c[1] for c in cases]
    ours_raw = reward_model.raw_scores(prompts, responses, batch_size=8)
    ours = reward_model.score(prompts, responses, batch_size=8)
    assert [p["raw"] for p in plain] == pytest.approx(ours_raw, abs=1e-4)
    assert [p["normalised"] for p in plain] == pytest.approx(ours, abs=1e-4)


def test_a_run_never_overwrites_a_reward_model(tiny_model_dir, tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "keep").write_text("x")
    with pytest.raises(ModelError, match="not empty"):
        train_reward_model(str(tiny_model_dir), toy_rows(4), [], RewardModelConfig(), tmp_path / "v1")
    with pytest.raises(ModelError, match="no preference pairs"):
        train_reward_model(str(tiny_model_dir), [], [], RewardModelConfig(), tmp_path / "v2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


def test_the_config_checks_its_values():
    assert RewardModelConfig().lora_target_modules() == "all-linear"
    assert RewardModelConfig(target_modules="q_proj, v_proj").lora_target_modules() == ["q_proj", "v_proj"]
    for bad in ({"eval_share": 1.0}, {"lora_r": 0}, {"batch_size": 0}, {"target_modules": "q_proj,,v_proj"}, {"learning_rate": 0.0},
                {"precision": "fp16"}):
        with pytest.raises(ValueError):
            RewardModelConfig(**bad)
