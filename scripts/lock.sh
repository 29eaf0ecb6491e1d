#!/usr/bin/env bash
# Refresh scripts/requirements.lock: the newest releases that pyproject.toml's ranges allow today, resolved with
# pip-tools beside the torch of scripts/torch.txt (which the lock leaves to that file). Then run scripts/test.sh, and
# commit the lock only with a suite that passed on it.
set -euo pipefail
if [ $# -gt 0 ]; then
    [ "$1" = --help ] || echo "lock.sh takes no arguments" >&2
    sed -n '2,4s/^# //p' "$0"
    [ "$1" = --help ]; exit
fi
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/pip" install --quiet pip-tools
"$tools/bin/pip-compile" --quiet --extra test --strip-extras --unsafe-package torch --no-emit-index-url --no-emit-find-links \
    --constraint scripts/torch.txt --output-file scripts/requirements.lock pyproject.toml
