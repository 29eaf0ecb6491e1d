"""Every model path in half precision, on the tiny model, through the `tether` command as a user runs it."""

import math
import re
from contextlib import closing
from pathlib import Path

import pytest
import torch

from store import open_database
from tests.conftest import DEMO_PROMPTS, run_tether, save_tiny_llama, score_with_plain_peft, set_settings, toy_preferences, train_tokenizer
from train.common.config import ModelConfig
from train.reward.versions import load_reward_model
from ui.owner.project import init_project


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.deep)])
def test_generate_reward_model_and_ppo_complete_in_half_precision(tiny_project, tiny_model_dir, tmp_path, dtype):
    set_settings(tiny_project, "model", dtype=dtype)
    set_settings(tiny_project, "reward_model", kind="auto")  # both kinds: the head, and a LoRA model to check against peft
    set_settings(tiny_project, "ppo", steps=2, batch_size=4)
    project = ("--project", str(tiny_project))
    run_tether("prompts", "import", str(DEMO_PROMPTS), *project, check=True)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), *project, check=True)
    for command in ("generate", "--limit", "2"), ("rm", "train", "--include-imported"), ("rm", "score"), ("ppo",):
        done = run_tether(*command, *project)
        assert done.returncode == 0, (command, done.stderr)

    last_score = re.match(r"policy v1 from v0 against reward model v1: last step score (\S+),", done.stdout)
    assert last_score and math.isfinite(float(last_score.group(1))), done.stdout
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rewards = [r for (r,) in con.execute("SELECT reward FROM completions WHERE reward IS NOT NULL").fetchall()]
    assert len(rewards) >= 2 and all(math.isfinite(r) for r in rewards)
    assert (tiny_project / "policies" / "v1" / "adapter_config.json").exists()

    # The LoRA reward model, trained on the base in this dtype, scores as transformers + peft alone score it in the same dtype.
    cases = [([{"role": "user", "content": f"Question {i}: what do you like?"}], answer) for i in (1, 2) for answer in ("No.", "I like cats. Thank you!")]
    lora = tiny_project / "reward_models" / "v1" / "lora"
    plain = score_with_plain_peft(tiny_model_dir, lora, cases, tmp_path, dtype)
    ours = load_reward_model(str(tiny_model_dir), lora, ModelConfig(dtype=dtype)).score(*zip(*cases))
    # Tether's head reads float32 states where plain peft's runs in the base's dtype: bf16's 8-bit mantissa
    # rounds each score by about 0.4%, and the normalised scores here are within 1.5 of 0.
    assert [p["normalised"] for p in plain] == pytest.approx(ours, abs=0.02)


LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def no_pad_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama whose tokenizer is Llama-3 style: EOS is <|eot_id|>, and it has no pad token."""
    path = tmp_path_factory.mktemp("tiny-llama3")
    tokenizer = train_tokenizer(["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                                eos_token="<|eot_id|>", pad_token=None, chat_template=LLAMA3_TEMPLATE)
    assert tokenizer.pad_token is None
    save_tiny_llama(path, tokenizer)
    return path


def test_a_model_without_a_pad_token_trains_a_reward_model_runs_ppo_and_generates(no_pad_model_dir, tmp_path):
    root = tmp_path / "project"
    init_project(root, str(no_pad_model_dir))
    set_settings(root, "generation", max_new_tokens=12)
    set_settings(root, "ppo", steps=2, batch_size=4)
    project = ("--project", str(root))
    run_tether("prompts", "import", str(DEMO_PROMPTS), *project, check=True)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), *project, check=True)
    for command in ("rm", "train", "--include-imported"), ("ppo",), ("generate", "--limit", "2"):
        done = run_tether(*command, *project)
        assert done.returncode == 0, (command, done.stderr)
    assert "from policy v1" in done.stdout
    with closing(open_database(root / "tether.duckdb")) as con:
        texts = [t for (t,) in con.execute("SELECT text FROM completions WHERE policy_version = 1").fetchall()]
    # 2 prompts, a pair each (v1 has not yet shown it predicts new votes, so the 'active' queue pairs at random);
    # special tokens, the added pad too, are not text.
    assert len(texts) == 4 and not any("<|" in t for t in texts)


def test_a_cuda_device_on_a_machine_without_cuda_is_one_message_and_nothing_is_registered(tiny_project, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    project = ("--project", str(tiny_project))
    run_tether("prompts", "import", str(DEMO_PROMPTS), *project, check=True)
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), *project, check=True)
    set_settings(tiny_project, "model", device="cuda:0")
    for command in ("generate",), ("rm", "train", "--include-imported"), ("simulate", "--judge", "concise", "--rounds", "1", "--eval-prompts", str(DEMO_PROMPTS)):
        refused = run_tether(*command, *project)
        assert refused.returncode == 1, (command, refused.stderr)
        assert refused.stderr.strip().splitlines()[-1].startswith('Error: [model] device = "cuda:0" needs a CUDA GPU'), refused.stderr
        assert "Traceback" not in refused.stderr
    set_settings(tiny_project, "model", device="auto")
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM completions WHERE policy_version IS NOT NULL").fetchone() == (0,)
    assert not (tiny_project / "jobs").exists() or not any((tiny_project / "jobs").iterdir())
