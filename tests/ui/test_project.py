import os
import subprocess
import sys

import pytest

from tests.conftest import RunningServer, add_users, app_client, free_port, run_tether, set_settings
from train.common.config import GenerationConfig, Hardware
from ui.owner.config import ConfigError, TetherConfig, load_config, write_config
from ui.owner.project import ProjectError, init_project, load_project


def test_init_writes_a_config_that_reads_back_and_policy_zero(tmp_path):
    project = init_project(tmp_path / "p", model=None, hardware=Hardware("cpu", "CPU with 2 cores", 24))
    assert load_project(tmp_path / "p").config == TetherConfig()  # the CPU profile is the defaults the README measures
    status = run_tether("status", env={"TETHER_PROJECT": str(project.root)})
    assert status.returncode == 0, status.stderr
    assert "policies      v0" in status.stdout
    assert "model         HuggingFaceTB/SmolLM2-135M-Instruct" in status.stdout
    import torch
    from train.runtime.hardware import uses_bf16

    if not torch.cuda.is_available():
        assert f"device        cpu: CPU with {os.cpu_count()} cores" in status.stdout
    autocast = "on" if uses_bf16("auto") else "off"  # what this machine's CPU or GPU offers
    assert f"precision     float32 weights, quantization none; bf16 autocast {autocast} in reward-model training, {autocast} in PPO" in status.stdout
    assert "processes     1 per model job ([worker] gpus = 1)" in status.stdout


def test_init_refuses_an_existing_project_and_local_models_are_made_absolute(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tiny_model_dir.parent)
    project = init_project(tmp_path / "p", model=tiny_model_dir.name)
    assert project.config.model.name_or_path == str(tiny_model_dir)
    with pytest.raises(ProjectError, match="already holds a Tether project"):
        init_project(tmp_path / "p")


def test_init_killed_before_it_wrote_the_settings_is_finished_by_the_next_init_but_votes_are_never_overwritten(
        tmp_path, tiny_model_dir):
    from contextlib import closing

    from store import open_database
    from store.policies import add_policy

    root = tmp_path / "p"
    root.mkdir()
    with closing(open_database(root / "tether.duckdb")) as con:  # what init had done when it was killed
        add_policy(con, version=0, adapter_path=None)
    project = init_project(root, model=str(tiny_model_dir))
    assert (root / "tether.toml").exists() and run_tether("check", "--project", str(root)).returncode == 0
    with closing(project.connect()) as con:
        assert con.execute("SELECT version FROM policies").fetchall() == [(0,)]
        con.execute("INSERT INTO users (name, role, password_hash) VALUES ('ann', 'annotator', 'x')")
    (root / "tether.toml").unlink()
    with pytest.raises(ProjectError, match="holds a Tether database .* but no tether.toml"):
        init_project(root, model=str(tiny_model_dir))


def test_commands_outside_a_project_say_how_to_make_one(tmp_path):
    result = run_tether("status", "--project", str(tmp_path))
    assert result.returncode == 1
    assert "no Tether project" in result.stderr and "tether init" in result.stderr


def test_config_round_trips_every_setting(tmp_path):
    config = TetherConfig(generation=GenerationConfig(temperature=0.3, seed=7, per_prompt=4))
    write_config(tmp_path / "tether.toml", config)
    assert load_config(tmp_path / "tether.toml") == config


@pytest.mark.parametrize("text, message", [
    ("[generation]\ntemprature = 0.5\n", "[generation] has no setting 'temprature'"),
    ("[generation]\nbatch_size = '8'\n", "[generation] batch_size must be a whole number, got '8'"),
    ("[generation]\nseed = 1.5\n", "[generation] seed must be a whole number, got 1.5"),
    ("[generation]\ntop_p = 1.5\n", "[generation] top_p must be in (0, 1]"),
    ("[model]\ndtype = 'int3'\n", "[model] dtype must be one of"),
    ("[grpo]\ngroup_size = 1\n", "group_size must be at least 2"),
    ("[grpo]\nprompts_per_step = 3\nminibatches = 2\ngroup_size = 3\n", "must be a multiple of minibatches (2)"),
    ("[grpo]\nscale_rewards = 'group_mean'\n", "scale_rewards must be 'batch', 'group' or 'none'"),
    ("[dpo]\nvotes = 'newest'\n", "votes must be one of new, latest, all"),
    ("[round]\noptimizer = 'sgd'\n", "optimizer must be one of"),
    ("[modle]\n", "unknown section [modle]"),
    ("[model\n", "cannot read it"),
])
def test_bad_config_is_named_by_file_and_key(tmp_path, text, message):
    path = tmp_path / "tether.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)


def test_a_locked_database_is_named_with_its_process_and_no_traceback(tiny_project):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from store import open_database; con = open_database(sys.argv[1]); "
         "print('ready', flush=True); time.sleep(60)",
         str(tiny_project / "tether.duckdb")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        for args in (["status"], ["prompts", "import", "x.jsonl"], ["generate"]):
            result = run_tether(*args, "--project", str(tiny_project))
            assert result.returncode == 1
            assert f"tether.duckdb is in use by process {holder.pid} (" in result.stderr
            assert "open_database" in result.stderr  # the holder's command line
            assert "Traceback" not in result.stderr
    finally:
        holder.kill()
        holder.wait()
    assert run_tether("status", "--project", str(tiny_project)).returncode == 0


def test_init_says_which_settings_it_chose_for_the_hardware(tmp_path):
    cpu = init_project(tmp_path / "cpu", hardware=Hardware("cpu", "CPU with 2 cores", 24))
    small = init_project(tmp_path / "small", hardware=Hardware("cuda", "NVIDIA L4", 22))
    large = init_project(tmp_path / "large", hardware=Hardware("cuda", "NVIDIA H100", 80))
    assert cpu.profile.startswith("CPU profile for CPU with 2 cores (24 GB)")
    assert small.profile.startswith("GPU profile for NVIDIA L4 (22 GB)") and large.profile.startswith("GPU profile for NVIDIA H100 (80 GB)")
    for project in (small, large):
        written = load_project(project.root).config
        assert written.generation.max_new_tokens > cpu.config.generation.max_new_tokens
        assert written.ppo.steps > cpu.config.ppo.steps and written.ppo_response_tokens() == written.generation.max_new_tokens
    assert load_project(small.root).config.reward_model.gradient_checkpointing is True  # 22 GB: memory before speed
    assert load_project(large.root).config.reward_model.gradient_checkpointing == "auto"  # on for a quantised base alone
    assert load_project(large.root).config.ppo.batch_size > load_project(small.root).config.ppo.batch_size
    large_grpo, small_grpo = load_project(large.root).config.grpo, load_project(small.root).config.grpo
    assert large_grpo.prompts_per_step > small_grpo.prompts_per_step > cpu.config.grpo.prompts_per_step
    shown = run_tether("init", str(tmp_path / "cli"))
    assert shown.returncode == 0 and "profile for" in shown.stdout, shown.stderr


def test_ppo_optimises_the_length_annotators_see_unless_told_otherwise(tmp_path):
    defaults = TetherConfig()
    assert defaults.ppo.max_new_tokens is None and defaults.ppo_response_tokens() == defaults.generation.max_new_tokens
    assert defaults.length_warning() is None
    path = tmp_path / "tether.toml"
    path.write_text("[generation]\nmax_new_tokens = 64\n[ppo]\nmax_new_tokens = 32\n")
    shorter = load_config(path)
    assert shorter.ppo_response_tokens() == 32
    assert "PPO samples at most 32 tokens" in shorter.length_warning() and "up to 64" in shorter.length_warning()
    path.write_text("[generation]\nmax_new_tokens = 64\n[ppo]\nmax_new_tokens = 96\n")
    with pytest.raises(ConfigError, match=r"tether.toml: \[ppo\] max_new_tokens \(96\) is longer than \[generation\] max_new_tokens \(64\)"):
        load_config(path)
    path.write_text("[generation]\nmax_new_tokens = 64\n[grpo]\nmax_new_tokens = 96\n")
    with pytest.raises(ConfigError, match=r"tether.toml: \[grpo\] max_new_tokens \(96\) is longer than \[generation\] max_new_tokens \(64\)"):
        load_config(path)


def test_saving_the_schedule_changes_its_one_line_and_refuses_a_file_edited_since_the_app_read_it(tiny_project):
    config = tiny_project / "tether.toml"
    config.write_text("# Our team's note: keep the answers short.\n" + config.read_text())
    add_users(tiny_project, {"olga": "operator"})
    server = RunningServer(tiny_project)
    try:
        operator = app_client(server.url, "olga", "password-123")
        before = config.read_text().splitlines()
        assert operator.predict(3, api_name="/set_schedule") == "A round starts every 3 new comparisons."
        after = config.read_text().splitlines()
        assert len(after) == len(before)
        assert [(old, new) for old, new in zip(before, after) if old != new] == [("every_comparisons = 0", "every_comparisons = 3")]

        set_settings(tiny_project, "generation", temperature=0.5)  # someone edits the file while the app runs
        edited = config.read_bytes()
        with pytest.raises(Exception, match="changed since the settings in use were read from it"):
            operator.predict(5, api_name="/set_schedule")
        assert config.read_bytes() == edited
        assert operator.predict(api_name="/round_status") == "No round running; the scheduler starts a round every 3 new comparisons."
    finally:
        server.stop()


@pytest.mark.parametrize("broken", ["unparsable", pytest.param("empty", marks=pytest.mark.deep)])
def test_a_broken_tether_toml_stops_serve_and_every_command_naming_the_file_and_line(tiny_project, broken):
    config = tiny_project / "tether.toml"
    lines = config.read_text().splitlines()
    if broken == "unparsable":
        line = lines.index("every_comparisons = 0")
        lines[line] = "every_comparisons = = 0"  # as an editor might leave it
        config.write_text("\n".join(lines) + "\n")
        where = f"(at line {line + 1}, column 21)"
    else:
        config.write_text("")  # what a write cut short by a crash leaves
        where = "the file is empty"
    for args in (["status"], ["serve", "--port", str(free_port())]):
        result = run_tether(*args, "--project", str(tiny_project), timeout=60)
        assert result.returncode == 1, (args, result.stdout)
        assert f"Error: {config}: " in result.stderr and where in result.stderr and "Traceback" not in result.stderr
