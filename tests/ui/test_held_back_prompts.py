"""`tether generate` and `tether status` say how many prompts are held back from training, and why they get no pairs."""

import json

from tests.conftest import run_tether

# By its content's hash, "Name a planet." alone of these is held back at [round] held_back_share = 0.25, the default.
PROMPTS = ["Name a fruit.", "Name a colour.", "Name a planet."]
HELD_BACK = ("1 of 3 active prompts is held back from training to compare versions on ([round] held_back_share = 0.25): "
             "no pairs are generated for it outside a round, which pairs its new version against the old there")


def test_a_new_user_who_got_completions_for_2_of_3_prompts_reads_why(tiny_project, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in PROMPTS))
    run_tether("prompts", "import", str(prompts), "--project", str(tiny_project), check=True)
    generated = run_tether("generate", "--project", str(tiny_project), check=True).stdout
    assert generated.splitlines() == ["stored 4 completions from policy v0 for 2 prompts, and 2 new pairs", HELD_BACK]
    status = run_tether("status", "--project", str(tiny_project), check=True).stdout
    assert f"\nprompts       3 (3 active)\nheld back     {HELD_BACK}\n" in status
