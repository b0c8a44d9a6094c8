"""The default tiny model: what cannot build it (a missing library, an unwritable cache) is one ConfigError line."""

from __future__ import annotations

import sys

import pytest

from tuner.errors import ConfigError
from tuner.tiny_model import ensure_tiny_model


def test_a_missing_library_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `from transformers import ...` raises ImportError
    with pytest.raises(ConfigError) as raised:
        ensure_tiny_model(tmp_path)
    assert str(raised.value) == (
        "model.path: not set, and the default tiny model cannot be built: import of transformers halted; "
        "None in sys.modules (install transformers, or set model.path)"
    )
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".tiny-llama-v1.lock"], "no half-built model"


def test_a_cache_that_cannot_be_written_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("VLLM_TUNER_CACHE", str(tmp_path / "a-file"))
    with pytest.raises(ConfigError) as raised:
        ensure_tiny_model()
    assert str(raised.value) == (
        f"model.path: not set, and the default tiny model cannot be written: {tmp_path / 'a-file' / 'models'}: "
        "Not a directory (set $VLLM_TUNER_CACHE to a writable folder, or set model.path)"
    )
