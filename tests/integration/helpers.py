"""Helpers for integration tests: run the CLI as a user would, and find leftover engine/Ray processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tuner.processes import is_zombie

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PATTERN = "VLLM::EngineCore|VLLM::Worker|EngineCore|vllm.entrypoints.openai.api_server|server_guard.py"
LEAK_PATTERN = ENGINE_PATTERN + "|ray::|raylet|gcs_server"


def run_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m tuner ARGS` in the repo root, with output captured."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env, text=True, capture_output=True, timeout=timeout
    )


def leftover_processes(wait_s: float = 20.0, pattern: str = LEAK_PATTERN) -> list[str]:
    """vLLM engine or Ray processes still alive after `wait_s` seconds of grace (empty list: none)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
        lines = [line for line in found.splitlines() if "pgrep" not in line]
        if not lines or time.monotonic() > deadline:
            return lines
        time.sleep(1)


def still_running(found: list[str]) -> list[str]:
    """Those of `found` (lines of `leftover_processes`: "pid command line") that still run: same pid, same
    command line (not a reused pid), not a zombie waiting to be reaped."""
    alive = []
    for line in found:
        pid, _, args = line.partition(" ")
        try:
            zombie = is_zombie(int(pid))
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if not zombie and cmdline.strip() == args.strip():
            alive.append(line)
    return alive
