#!/usr/bin/env bash
# Set up, then run the quick tier of the test suite: every test but those marked `deep`.
# `scripts/test.sh --deep` runs the deep tier instead: the long fuzz, every kill point, the soak,
# the loads and the statistical checks, whose quick forms run in the quick tier. .ci/run runs both.
# Other arguments go to pytest; `scripts/test.sh -n 0` runs the tests one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --help ]; then
    sed -n '2,5s/^# \{0,1\}//p' "$0"
    exit
fi
tier=(-m "not deep")
if [ "${1:-}" = --deep ]; then
    tier=(-m deep)
    shift
fi
scripts/setup.sh
# The browser tests drive Debian's Chromium (Playwright's own browser download is not used).
if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    else
        echo "the browser tests need Chromium: sudo apt-get install chromium" >&2
        exit 1
    fi
fi
# Three test processes, a file each at a time, on two cores: a test that waits on a server or a
# worker leaves its core to another. `tether` commands and their jobs run in the test's own process
# (tests/conftest.py), where torch is imported once. One OpenMP thread per process, so that they
# do not spin against each other's threads.
# Files with deep tests go first (tests/conftest.py), in that order, not xdist's most-tests-first.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -n "${TEST_PROCESSES:-3}" --dist loadfile --no-loadscope-reorder "${tier[@]}" "$@"
