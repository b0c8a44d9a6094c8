"""The default tiny model: what cannot build it (a missing library, an unwritable cache) is one ConfigError line."""

from __future__ import annotations

import sys

import pytest

from tuner.errors import ConfigError
from tuner.tiny_model import cpu_has_native_bf16, engine_defaults, ensure_tiny_model


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


def test_the_tiny_model_runs_in_float32_on_cpu_only():
    from trainables.vllm_engine import EngineSpec

    tiny = "/cache/models/tiny-llama-v1"
    assert engine_defaults(tiny, on_cpu=True) == {"dtype": "float32"}
    assert engine_defaults(tiny, on_cpu=False) == {} and engine_defaults("/models/llama", on_cpu=True) == {}
    assert EngineSpec(engine_args={"model": tiny}).args == {"model": tiny, "dtype": "float32"}
    assert EngineSpec(engine_args={"model": tiny, "dtype": "bfloat16"}).args["dtype"] == "bfloat16"
    assert "dtype" not in EngineSpec(engine_args={"model": tiny}, on_cpu=False).args


@pytest.mark.parametrize(
    "cpuinfo, native",
    [
        ("flags\t\t: fpu sse avx2 fma\n", False),  # an AVX2 EPYC (Zen 3)
        ("flags\t\t: avx2 avx512f avx512_bf16\n", True),
        ("flags\t\t: avx2 avx512f amx_bf16 amx_tile\n", True),
        ("Features\t: fp asimd bf16\n", True),
        ("Features\t: fp asimd\n", False),
        ("processor\t: 0\n", True),  # no flags line: unknown, nothing is said
    ],
)
def test_native_bfloat16_is_read_from_the_cpu_flags(cpuinfo, native):
    assert cpu_has_native_bf16(cpuinfo) is native
