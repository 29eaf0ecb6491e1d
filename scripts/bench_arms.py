"""What the benchmarks share: running one arm in a child process and taking its own peak memory."""

import json
import os
import subprocess
import sys


def run_arm(name: str, command: list[str]) -> dict:
    """Run an arm that prints its result as a JSON last line; that result and the child's peak resident memory."""
    print(f"running {name} ...", file=sys.stderr, flush=True)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    stdout = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"the {name} arm failed (wait status {status})")
    return {**json.loads(stdout.strip().splitlines()[-1]), "peak_gb": usage.ru_maxrss / 2**20}
