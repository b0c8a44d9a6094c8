"""Shared paths and a stand-in tokenizer for the workload tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def traces() -> Path:
    """The real traces, in the `shared` folder beside the repository root (as in CI)."""
    path = (REPO / ".." / "shared" / "traces").resolve()
    assert path.is_dir(), f"real traces not found at {path}"
    return path


@pytest.fixture
def fixtures() -> Path:
    """Small trace files written from each format's documentation."""
    return REPO / "tests" / "fixtures" / "workload"


@pytest.fixture
def tokenizer() -> Callable[[str], list[int]]:
    """One token per whitespace-separated word."""
    return lambda text: list(range(len(text.split())))
