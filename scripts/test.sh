#!/usr/bin/env bash
# The tests, as CI runs them: the unit and contract tests on every core (pytest-xdist), then the
# integration tests one at a time (each owns the machine's cores: real vLLM engines, Ray, servers).
# Arguments go to both pytest runs (-x, --durations=20, a test file: the run it selects nothing in passes).
set -euo pipefail
cd "$(dirname "$0")/.."
# -X faulthandler: a crash prints every thread's stack, in the exit handlers too (tests/clean_exit.py).
run() { .venv/bin/python -X faulthandler -m pytest "$@" || { rc=$?; [ "$rc" = 5 ] || exit "$rc"; }; }
run -n auto -m "not integration" "$@"
run -m integration "$@"
