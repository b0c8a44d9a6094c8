"""Shared test setup: the repo root on sys.path, and a run's exit code that is its tests' verdict (clean_exit)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clean_exit import pytest_sessionfinish, pytest_unconfigure  # noqa: E402, F401 - hooks, found by name
