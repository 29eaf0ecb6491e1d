"""Every model path in half precision, on the tiny model, through the `tether` command as a user runs it."""

import math
import re
from contextlib import closing

import pytest

from store import open_database
from tests.conftest import DEMO_PROMPTS, run_tether, set_settings
from tests.test_reward_jobs import toy_preferences


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_generate_reward_model_and_ppo_complete_in_half_precision(tiny_project, tmp_path, dtype):
    set_settings(tiny_project, "model", dtype=dtype)
    set_settings(tiny_project, "ppo", steps=2, batch_size=4)
    project = ("--project", str(tiny_project))
    run_tether("prompts", "import", str(DEMO_PROMPTS), *project, check=True)
    prefs = toy_preferences(tmp_path / "prefs.jsonl")
    run_tether("import-prefs", str(prefs), *project, check=True)
    outputs = {}
    for command in ("generate", "--limit", "2"), ("rm", "train", "--include-imported"), ("rm", "score"), ("rm", "eval", "--data", str(prefs)), ("ppo",):
        done = run_tether(*command, *project)
        assert done.returncode == 0, (command, done.stderr)
        outputs[command[-1] if command[0] == "ppo" else command[1]] = done.stdout

    last_score = re.match(r"policy v1 from v0 against reward model v1: last step score (\S+),", outputs["ppo"])
    assert last_score and math.isfinite(float(last_score.group(1))), outputs["ppo"]
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rewards = [r for (r,) in con.execute("SELECT reward FROM completions WHERE reward IS NOT NULL").fetchall()]
    assert len(rewards) >= 2 and all(math.isfinite(r) for r in rewards)
    assert (tiny_project / "policies" / "v1" / "adapter_config.json").exists()
