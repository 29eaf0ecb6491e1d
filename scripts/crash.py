"""Crash-safety of every write: each writing operation is killed (kill -9) at random moments, the project restarted as
the server restarts it, then `tether check` and the operation's own count say whether it happened whole or not at all.

Each operation is a `tether` command (or, for the settings file, the server's own change of one setting) run in a child
process that has imported Tether already and waits for a word to start, so that the kill lands in the operation's
work, not in Python's start. Its run time is measured unkilled; each kill comes at a uniform random moment in 1.2
times its latest run that ended on its own (the first, or a trial the kill missed). After a kill the worker processes
a job left exit (they watch their owner), the project is restarted (ui.owner.recovery.recover, what `tether serve`
does as it starts), checked (ui.owner.check, `tether check`), and the operation's effect counted: all of it, none of
it, or half (a defect). The exit status is 1 if any was half done or any check failed.

    .venv/bin/python scripts/crash.py --kills 25              # the long run; figures in BENCHMARKS.md
    .venv/bin/python scripts/crash.py --kills 2 --ops prompts,users   # a quick look
    sudo .venv/bin/python scripts/crash.py --full-disk        # each operation once on a full disk

With --full-disk the work happens on a tmpfs mounted for the run (root only), filled to its last byte before each
operation runs unkilled: it must end whole, or refuse with one short line naming the problem (no traceback) and leave
nothing half done; space then returns, and the project is restarted and checked as after a kill.

The project is on the tests' tiny random Llama, so a reward model or PPO job takes seconds.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from soak import tiny_model
from store import open_database
from ui.owner.check import check_project
from ui.owner.config import read_config, set_setting
from ui.owner.project import load_project
from ui.owner.recovery import recover, stray_processes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ is no installed package
from tests.conftest import fill  # noqa: E402
TETHER = str(Path(sys.executable).parent / "tether")
PASSWORD = "a-long-enough-password"
OPERATIONS = ["prompts", "import-prefs", "gold", "export", "backup", "restore", "reward-model", "ppo", "rollback", "users",
              "init", "settings"]  # each one's run and outcome: operations()
LONGEST_REFUSAL = 400  # a longer line dumps something (a list of errors, a repr) instead of saying what went wrong
# The child: imports Tether, says so, waits for the word, then runs one operation as the user would.
CHILD = """
import json, sys
from pathlib import Path
from ui.cli import cli
from ui.owner.config import ConfigError, read_config, set_setting
spec = json.loads(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
if "cli" in spec:
    cli.main(spec["cli"], prog_name="tether")
else:
    path = Path(spec["settings"])
    try:
        set_setting(path, read_config(path)[1], "round", "every_comparisons", spec["value"])
    except ConfigError as e:  # the server refuses the Loop view's change with its words
        sys.exit(f"Error: {e}")
"""


@dataclass
class Operation:
    name: str
    spec: Callable[[int], dict]  # trial -> what the child runs
    state: Callable[[Path, int], object]  # (project, trial) -> what the operation changes, before and after
    outcome: Callable[[object, object, int], str]  # (before, after, trial) -> "whole", "none", or what is half done
    stdin: str = ""


def rows(project: Path, sql: str, params: list | None = None) -> list[tuple]:
    with closing(open_database(project / "tether.duckdb")) as con:
        return con.execute(sql, params or []).fetchall()


def all_or_none(expected: int) -> Callable[[object, object, int], str]:
    """An operation that adds `expected` of something: whole if all came, none if none did."""
    def outcome(before, after, trial) -> str:
        added = after - before
        return "whole" if added == expected else "none" if added == 0 else f"{added} of {expected} added"
    return outcome


def jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def operations(project: Path, work: Path, size: int) -> dict[str, Operation]:
    p = str(project)
    prompts = lambda t: jsonl(work / f"prompts-{t}.jsonl", [{"prompt": f"Trial {t}, question {i}: why?"} for i in range(size)])
    prefs = lambda t, kind: jsonl(work / f"{kind}-{t}.jsonl", [
        {"prompt": f"{kind} {t}, question {i}?", "chosen": f"A fine answer {i}.", "rejected": "No."} for i in range(size)])
    from_file = lambda name: lambda project, t: rows(project, "SELECT count(*) FROM prompts WHERE source LIKE ?", [f"%{name}-{t}.jsonl"])[0][0]
    votes = lambda project, t: rows(project, "SELECT count(*) FROM comparisons")[0][0]
    in_the_backup = votes(project, 0)

    def export_outcome(before, after, t) -> str:
        """Absent, or as many rows as the export run unkilled (trial 0) wrote: no vote changes between them."""
        out, whole = work / f"export-{t}.jsonl", len((work / "export-0.jsonl").read_text().splitlines())
        if not out.exists():
            return "none"
        lines = len(out.read_text().splitlines())
        return "whole" if lines == whole else f"{lines} of {whole} rows written"

    def copy_outcome(before, after, t, kind: str) -> str:
        """A backup or a restored project: absent, or whole (restored and checked) with every vote."""
        expected = before if kind == "backup" else in_the_backup
        target = work / f"{kind}-{t}"
        if not target.exists() or not any(target.iterdir()):
            return "none"
        if kind == "backup":
            restored = work / f"restored-from-{t}"
            done = subprocess.run([TETHER, "restore", str(target), "--project", str(restored)], capture_output=True, text=True)
            if done.returncode:
                return f"a backup that does not restore: {done.stderr.strip()}"
            target = restored
        problems = check_project_at(target)
        got = rows(target, "SELECT count(*) FROM comparisons")[0][0]
        return f"not whole: {problems}" if problems else "whole" if got == expected else f"{got} of {expected} votes"

    def init_outcome(before, after, t) -> str:
        target = work / f"init-{t}"
        made = [name for name in ("tether.toml", "tether.duckdb") if (target / name).exists()]
        if not made:
            return "none"
        if made == ["tether.duckdb"]:  # killed before it wrote the settings: the next init must finish it
            again = subprocess.run([TETHER, "init", str(target), "--model", str(work / "tiny-llama")], capture_output=True, text=True)
            if again.returncode:
                return f"only tether.duckdb made, and init again refused: {again.stderr.strip()}"
        elif len(made) < 2:
            return f"only {made[0]} made"
        problems = check_project_at(target)
        return f"not whole: {problems}" if problems else "whole"

    def settings_outcome(before, after, t) -> str:
        return "whole" if after == t + 1000 else "none" if after == before else f"every_comparisons = {after}"

    return {op.name: op for op in [
        Operation("prompts", lambda t: {"cli": ["prompts", "import", str(prompts(t)), "--project", p]},
                  from_file("prompts"), all_or_none(size)),
        Operation("import-prefs", lambda t: {"cli": ["import-prefs", str(prefs(t, "prefs")), "--project", p]},
                  lambda project, t: rows(project, "SELECT count(*) FROM comparisons")[0][0], all_or_none(size)),
        Operation("gold", lambda t: {"cli": ["gold", "import", str(prefs(t, "gold")), "--project", p]},
                  lambda project, t: rows(project, "SELECT count(*) FROM gold")[0][0], all_or_none(size)),
        Operation("export", lambda t: {"cli": ["export", "--format", "jsonl", "--include-ties", "--include-ai",
                                               "--out", str(work / f"export-{t}.jsonl"), "--project", p]},
                  lambda project, t: rows(project, "SELECT count(*) FROM comparisons WHERE source <> 'import'")[0][0],
                  export_outcome),
        Operation("backup", lambda t: {"cli": ["backup", str(work / f"backup-{t}"), "--project", p]},
                  votes, lambda b, a, t: copy_outcome(b, a, t, "backup")),
        Operation("restore", lambda t: {"cli": ["restore", str(work / "source-backup"), "--project", str(work / f"restore-{t}")]},
                  lambda project, t: None, lambda b, a, t: copy_outcome(b, a, t, "restore")),
        Operation("reward-model", lambda t: {"cli": ["rm", "train", "--project", p]},
                  lambda project, t: rows(project, "SELECT count(*) FROM reward_models")[0][0], all_or_none(1)),
        Operation("ppo", lambda t: {"cli": ["ppo", "--project", p]},
                  lambda project, t: rows(project, "SELECT count(*) FROM policies")[0][0], all_or_none(1)),
        Operation("rollback", lambda t: {"cli": ["rollback", "1", "--project", p]},
                  lambda project, t: rows(project, "SELECT count(*) FROM policies")[0][0], all_or_none(1)),
        Operation("users", lambda t: {"cli": ["users", "add", f"user{t}", "--role", "annotator", "--project", p]},
                  lambda project, t: rows(project, "SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM account_events)")[0],
                  lambda b, a, t: "whole" if (a[0] - b[0], a[1] - b[1]) == (1, 1) else "none" if a == b else f"users, log: {b} to {a}",
                  stdin=PASSWORD + "\n"),
        Operation("init", lambda t: {"cli": ["init", str(work / f"init-{t}"), "--model", str(work / "tiny-llama")]},
                  lambda project, t: None, init_outcome),
        Operation("settings", lambda t: {"settings": str(project / "tether.toml"), "value": t + 1000},
                  lambda project, t: load_project(project).config.round.every_comparisons, settings_outcome),
    ]}


def check_project_at(root: Path) -> list[str]:
    project = load_project(root)
    with closing(project.connect()) as con:
        return check_project(con, project).problems


def restart(project: Path) -> list[str]:
    """Wait for the processes a killed job left to exit, then set right what the server sets right as it starts."""
    deadline = time.monotonic() + 120
    while any(stray_processes(job) for job in (project / "jobs").glob("*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    loaded = load_project(project)
    with closing(loaded.connect()) as con:
        return recover(con, loaded)


def run_child(op: Operation, spec: dict, kill_after: float | None) -> tuple[float, bool, int, str]:
    """Run the operation, as `spec` says (its input files written), in a child; kill it `kill_after` seconds after its
    start unless None. Returns its seconds, whether it was killed before it ended, its exit status and its output."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec)], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert child.stdout.readline() == "ready\n"
    start = time.monotonic()
    child.stdin.write("go\n" + op.stdin)
    child.stdin.flush()
    killed = False
    if kill_after is not None:
        try:
            child.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            killed = True
    output = child.communicate()[0]
    return time.monotonic() - start, killed, child.returncode, output


def setup(work: Path, chosen: list[str]) -> Path:
    """A project on the tiny model with imported votes, prompts and a backup; with reward model v1 where a chosen
    operation uses one or copies its adapter (a backup's tree), and policies v1 and v2 where one rolls back."""
    project = work / "project"
    model = tiny_model(work / "tiny-llama")
    steps = [["init", str(project), "--model", model],
             ["import-prefs", str(jsonl(work / "setup-prefs.jsonl", [
                 {"prompt": f"Setup question {i}?", "chosen": f"A fine answer {i}.", "rejected": "No."} for i in range(40)]))],
             ["prompts", "import", str(ROOT / "scripts" / "demo_prompts.jsonl")]]
    if {"backup", "restore", "ppo", "rollback"} & set(chosen):
        steps.append(["rm", "train"])
    if "rollback" in chosen:
        steps += [["ppo"], ["rollback", "0"]]  # v1 trained, v2 a copy of v0: rolling back to v1 copies it
    for step in steps:
        done = subprocess.run([TETHER, *step, *([] if step[0] == "init" else ["--project", str(project)])],
                              capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"setting up: tether {' '.join(step)} failed:\n{done.stdout}{done.stderr}")
        if step[0] == "init":
            settings(project)
    subprocess.run([TETHER, "backup", str(work / "source-backup"), "--project", str(project)], check=True, capture_output=True)
    return project


def settings(project: Path) -> None:
    """Jobs of a few seconds: one epoch, one PPO step, the imported votes in the reward model."""
    path = project / "tether.toml"
    for section, key, value in [("reward_model", "epochs", 1), ("reward_model", "include_imported", True),
                                ("ppo", "steps", 1), ("ppo", "batch_size", 4), ("ppo", "minibatch_size", 2)]:
        set_setting(path, read_config(path)[1], section, key, value)


def refusal(status: int, output: str) -> str:
    """How an operation that met a full disk ended: 'ok' (it fitted), its one line of refusal, or what is wrong."""
    if status == 0:
        return "ok"
    last = output.strip().splitlines()[-1] if output.strip() else ""
    if "Traceback" in output or not last:
        return f"a traceback, not one line: {last}"
    if len(last) > LONGEST_REFUSAL:
        return f"unclear, {len(last)} characters: {last[:LONGEST_REFUSAL]}"
    return last


def full_disk(ops: dict[str, Operation], chosen: list[str], project: Path, work: Path) -> int:
    """Each operation once with the disk full; returns how many were half done, failed their check, or refused unclearly."""
    failures = 0
    print(f"\n{'operation':<14}{'outcome':>9}{'check':>8}  refusal")
    for name in chosen:
        op, filler, trial = ops[name], work / "filler", 1
        _, _, status, output = run_child(op, op.spec(0), None)  # first with room, as a reference (the export's rows)
        if status:
            sys.exit(f"{name} failed with room on the disk:\n{output}")
        before, spec = op.state(project, trial), op.spec(trial)  # its input files written while there is room
        fill(filler)
        _, _, status, output = run_child(op, spec, None)
        filler.unlink()
        restart(project)
        outcome, problems, said = op.outcome(before, op.state(project, trial), trial), check_project_at(project), refusal(status, output)
        bad = outcome not in ("whole", "none") or problems or said.startswith(("a traceback", "unclear")) or status and outcome != "none"
        failures += bool(bad)
        print(f"{name:<14}{outcome:>9}{'failed' if problems else 'whole':>8}  {said}", flush=True)
        if problems:
            print(f"  {problems}", flush=True)
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10, help="kills of each operation (default 10)")
    parser.add_argument("--ops", help="the operations to kill, comma-separated (default: all)")
    parser.add_argument("--size", type=int, default=3000, help="rows in each imported file (default 3000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, help="where to build the project (default: a new temporary directory)")
    parser.add_argument("--full-disk", action="store_true", help="run each operation once on a full disk instead (root only)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tether-crash-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.full_disk:
        work = work / "disk"
        work.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=768m", "tmpfs", str(work)], check=True)
    try:
        failures = run(args, work, rng)
    finally:
        if args.full_disk:
            subprocess.run(["umount", "--lazy", str(work)], check=True)
    print(f"\nhalf-done operations, failed checks and unclear refusals (must be 0): {failures}")
    sys.exit(1 if failures else 0)


def run(args: argparse.Namespace, work: Path, rng: random.Random) -> int:
    chosen = args.ops.split(",") if args.ops else list(OPERATIONS)
    if unknown := set(chosen) - set(OPERATIONS):
        sys.exit(f"no operation {', '.join(sorted(unknown))}: choose from {', '.join(OPERATIONS)}")
    project = setup(work, chosen)
    ops = operations(project, work, args.size)
    assert list(ops) == OPERATIONS, "OPERATIONS names operations()'s, in its order"
    if args.full_disk:
        print(f"project {project} on a {shutil.disk_usage(work).total // 2**20} MiB tmpfs; {', '.join(chosen)} on a full disk", flush=True)
        return full_disk(ops, chosen, project, work)
    print(f"project {project}; {args.kills} kills of each of {', '.join(chosen)}", flush=True)
    failures = 0
    print(f"\n{'operation':<14}{'seconds':>8}{'kills':>7}{'mid-run':>9}{'whole':>7}{'none':>6}{'half':>6}{'check failed':>14}")
    for name in chosen:
        op = ops[name]
        trial = 0
        seconds, _, status, output = run_child(op, op.spec(trial), None)  # its run time, unkilled: the kills fall within it
        restart(project)
        if status:
            sys.exit(f"{name} failed unkilled:\n{output}")
        tally = Counter()
        for _ in range(args.kills):
            trial += 1
            before = op.state(project, trial)
            took, killed, _, _ = run_child(op, op.spec(trial), rng.uniform(0, 1.2 * seconds))
            if not killed:  # it ended before the kill: its latest run time bounds the next moment (a first run is slower)
                seconds = took
            restart(project)
            after = op.state(project, trial)
            outcome = op.outcome(before, after, trial)
            problems = check_project_at(project)
            tally["mid-run"] += killed
            tally[outcome if outcome in ("whole", "none") else "half"] += 1
            tally["check failed"] += bool(problems)
            if outcome not in ("whole", "none") or problems:
                failures += 1
                print(f"  {name} trial {trial}: {outcome}; check: {problems or 'whole'}", flush=True)
        print(f"{name:<14}{seconds:>8.1f}{args.kills:>7}{tally['mid-run']:>9}{tally['whole']:>7}{tally['none']:>6}"
              f"{tally['half']:>6}{tally['check failed']:>14}", flush=True)
    return failures


if __name__ == "__main__":
    main()
