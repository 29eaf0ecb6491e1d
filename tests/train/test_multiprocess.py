"""Jobs in two processes under `accelerate launch`, through the worker, on the CPU, as [worker] gpus = 2 runs them on GPUs.

accelerate's `--cpu` starts several processes only through mpirun, which is not installed here;
its torchrun launcher, the one [worker] gpus uses, starts them on a CPU as well.
"""

import json
import re
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from store import open_database
from tests.conftest import DEMO_PROMPTS, run_tether, score_with_plain_peft, set_settings, toy_preferences
from train.runtime.jobdir import read_events
from ui.owner.jobs import run_job, worker_command
from ui.owner.project import load_project
from ui.owner.round_jobs import submit_generation, submit_ppo, submit_reward_training

pytestmark = pytest.mark.worker_process  # about the worker process itself: its jobs start real workers

# The held-out Bradley-Terry loss of the two-process reward model against the one-process one,
# same global batch and seed. The two see each step's pairs in another grouping (the length
# sampler groups per process) and draw other dropout masks, so they are not equal; on this task
# their losses differed by 0.004 to 0.03 nats (see the test), while the untrained loss is log 2.
HELD_OUT_LOSS_TOLERANCE = 0.1


def run_two_processes(project_dir: Path, submit) -> tuple[str, str]:
    """Queue a job with submit(project, run), run it in two CPU processes; (its status, worker.log)."""
    project = load_project(project_dir)
    job = submit(project, project.run)
    directory = project_dir / "jobs" / str(job.id)
    # [worker] gpus = 2's own command: accelerate launch starts two processes, which meet through gloo on the CPU.
    done = run_job(project, project.run, job, command=worker_command(directory, 2))
    return done.status, (directory / "worker.log").read_text()


def shares(log: str, what: str) -> dict[int, int]:
    """{rank: count} from the lines each process writes, 'process R of 2: N <what>'."""
    return {int(rank): int(count) for rank, count in re.findall(rf"process (\d) of 2: (\d+) {what}", log)}


def reward_metrics(project: Path) -> dict[int, dict]:
    with closing(open_database(project / "tether.duckdb")) as con:
        return {v: json.loads(m) for v, m in con.execute("SELECT version, metrics FROM reward_models").fetchall()}


def test_worker_command_launches_one_process_per_gpu():
    assert worker_command(Path("jobs/1"), 1) == [sys.executable, "-m", "train.worker", "jobs/1"]
    launched = worker_command(Path("jobs/1"), 4)
    assert launched[:3] == [sys.executable, "-m", "accelerate.commands.launch"] and "--multi_gpu" in launched
    assert launched[launched.index("--num_processes") + 1] == "4" and launched[-3:] == ["-m", "train.worker", "jobs/1"]


@pytest.mark.deep
def test_two_processes_train_one_reward_model_as_one_process_does_and_run_ppo(tiny_project, tiny_model_dir, tmp_path):
    set_settings(tiny_project, "reward_model", kind="lora", warm_start=False, batch_size=4, epochs=3, trust="always")
    set_settings(tiny_project, "ppo", steps=2, batch_size=4, minibatch_size=2, max_new_tokens=6)
    project = ("--project", str(tiny_project))
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl", n=60)), *project, check=True)

    status, log = run_two_processes(tiny_project, lambda p, run: submit_reward_training(p, run, include_imported=True))
    assert status == "done", log
    two = reward_metrics(tiny_project)[1]
    fitted = shares(log, "rows fitted")
    # Each process fits its half of every global batch of 4.
    assert set(fitted) == {0, 1} and fitted[0] == fitted[1] == two["pairs_train"] * 3 // 2, log

    one_process = run_tether("rm", "train", "--include-imported", *project)  # the same pairs, batch and seed
    assert one_process.returncode == 0, one_process.stderr
    one = reward_metrics(tiny_project)[2]
    assert two["steps"] == one["steps"] and two["pairs_eval"] == one["pairs_eval"] > 0
    assert one["eval_loss"] < 0.5 and two["eval_loss"] < 0.5  # both learnt the task; log 2 = 0.69
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], abs=HELD_OUT_LOSS_TOLERANCE)
    print(f"held-out loss: two processes {two['eval_loss']:.4f}, one {one['eval_loss']:.4f}")

    # The two-process version loads with plain transformers + peft and scores as Tether stored it.
    cases = [([{"role": "user", "content": "Question 3: what do you like?"}], answer) for answer in ("No. 3", "I like cats and 3 dogs. Thank you!")]
    plain = score_with_plain_peft(tiny_model_dir, tiny_project / "reward_models" / "v1", cases, tmp_path)
    assert plain[1]["normalised"] > plain[0]["normalised"]

    # A head: each process reads half the answers' features, and the fit on them is the one a single process makes.
    set_settings(tiny_project, "reward_model", kind="head")
    status, log = run_two_processes(tiny_project, lambda p, run: submit_reward_training(p, run, include_imported=True))
    assert status == "done", log
    assert shares(log, "answers' features read") == {0: 60, 1: 60}, log  # 60 pairs, two answers each
    assert run_tether("rm", "train", "--include-imported", *project).returncode == 0  # reads them from the cache
    three, four = reward_metrics(tiny_project)[3], reward_metrics(tiny_project)[4]
    assert (three["features_read"], four["features_read"], four["features_cached"]) == (120, 0, 120)
    heads = [load_file(str(tiny_project / "reward_models" / f"v{v}" / "head.safetensors")) for v in (3, 4)]
    assert torch.equal(heads[0]["weight"], heads[1]["weight"])

    run_tether("prompts", "import", str(DEMO_PROMPTS), *project, check=True)
    status, log = run_two_processes(tiny_project, lambda p, run: submit_ppo(p, run))
    assert status == "done", log
    assert shares(log, "responses sampled over 2 steps") == {0: 4, 1: 4}, log  # two of each step's four, each
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT version, parent FROM policies ORDER BY version").fetchall() == [(0, None), (1, 0)]
        steps = con.execute("SELECT count(DISTINCT step) FROM metrics WHERE job_id = 5 AND name = 'kl'").fetchone()
    assert steps == (2,)
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from peft import PeftModel; from transformers import AutoModelForCausalLM; "
         "PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(sys.argv[1]), sys.argv[2]); print('loaded')",
         str(tiny_model_dir), str(tiny_project / "policies" / "v1")],
        capture_output=True, text=True,
    )
    assert loaded.stdout.strip() == "loaded", loaded.stderr

    # Generation splits the prompts: every completion once, in prompt order, from both processes.
    status, log = run_two_processes(tiny_project, lambda p, run: submit_generation(p, run, limit=3, per_prompt=2))
    assert status == "done", log
    # A reward model trusted from its first version exists, so each prompt's one pair is chosen from 4 answers
    # (the 'active' queue), each process scoring its own.
    assert shares(log, "completions") in ({0: 8, 1: 4}, {0: 4, 1: 8}), log
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        made = con.execute("SELECT prompt_id, count(*), count(reward_heads) FROM completions WHERE policy_version = 1 GROUP BY prompt_id").fetchall()
    assert len(made) == 3 and all(n == scored == 4 for _, n, scored in made)
    # Only the first process writes events, and its progress speaks for the whole job, not its share.
    job_dir = max((tiny_project / "jobs").iterdir(), key=lambda d: int(d.name))
    progress = [e for e in read_events(job_dir, 0)[0] if e["event"] == "progress"]
    assert progress[-1]["done"] == progress[-1]["total"] == 12 and progress[-1]["progress"] == 1.0


def test_more_gpus_than_the_machine_has_is_refused_before_a_job_is_queued(tiny_project, tmp_path):
    import torch

    project = ("--project", str(tiny_project))
    run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), *project, check=True)
    gpus = max(2, torch.cuda.device_count() + 1)  # 1 is one process, on a CPU as well
    set_settings(tiny_project, "worker", gpus=gpus)
    refused = run_tether("rm", "train", "--include-imported", *project)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"[worker] gpus = {gpus} asks for {gpus} GPUs and this machine has {torch.cuda.device_count()}" in refused.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    set_settings(tiny_project, "worker", gpus="some")
    bad = run_tether("status", *project)
    assert bad.returncode == 1 and 'tether.toml: [worker] gpus must be a whole number of at least 1, or "all", got \'some\'' in bad.stderr
