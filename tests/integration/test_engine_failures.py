"""Configs that crash the engine become clear reasons, never crashed searches (real vLLM CPU engine)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ENGINE_PATTERN, leftover_processes

from trainables.vllm_engine import EngineSpec, VllmEngine, VllmServer, vllm_defaults
from tuner.errors import EngineError
from tuner.kv_memory import kv_shortfall, min_memory_fraction
from tuner.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["openai-server", "in-process"])
def serving(request) -> str:
    return request.param


def _start(serving: str, **engine_args) -> str:
    args = {
        "model": str(ensure_tiny_model()),
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "distributed_executor_backend": "uni",
        **engine_args,
    }
    spec = EngineSpec(engine_args=args, serving=serving)
    engine = VllmServer(spec) if serving == "openai-server" else VllmEngine(spec)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(EngineError) as error:
            loop.run_until_complete(engine.start())
        return str(error.value)
    finally:
        loop.run_until_complete(engine.shutdown())
        loop.close()


def test_kv_cache_too_small_for_max_model_len_names_vllm_reason(serving):
    # 1 MiB of KV holds ~256 tokens of the tiny model: less than one 2048-token sequence.
    message = _start(serving, max_model_len=2048, kv_cache_memory_bytes=1 << 20)
    assert message.startswith("vLLM engine failed to start: ")
    assert "KV cache" in message or "cache" in message.lower(), message
    assert "see root cause above" not in message.lower()
    assert "\n" not in message
    assert leftover_processes(pattern=ENGINE_PATTERN) == []


def test_the_kv_pre_check_draws_vllms_own_line():
    """tuner.kv_memory turns away a candidate only where vLLM would: one byte under its line vLLM refuses
    the tiny model (2048 tokens in 17 blocks of 128, one held back, at 8 KiB per token in float32) for want
    of KV cache; at the line it starts."""
    model = str(ensure_tiny_model())
    as_run = EngineSpec(engine_args={"model": model, "max_model_len": 2048}).args  # float32, as the tool runs it
    line = int(min_memory_fraction(model, as_run, 1 << 20) or 0) << 20
    assert line == 17 << 20
    below = {"max_model_len": 2048, "kv_cache_memory_bytes": line - 1}
    assert kv_shortfall(model, {**as_run, **below}) is not None
    assert "max seq len" in _start("openai-server", **below)
    at_line = EngineSpec(
        engine_args={
            "model": model,
            "skip_tokenizer_init": True,
            "enforce_eager": True,
            "distributed_executor_backend": "uni",
            "max_model_len": 2048,
            "kv_cache_memory_bytes": line,
        }
    )
    assert kv_shortfall(model, at_line.args) is None
    engine = VllmServer(at_line)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.start())  # raises EngineError if vLLM refused it
    finally:
        loop.run_until_complete(engine.shutdown())
        loop.close()
    assert leftover_processes(pattern=ENGINE_PATTERN) == []


def test_invalid_engine_argument_names_it(serving):
    message = _start(serving, max_model_len=1024, max_num_batched_tokens=0)
    assert "max_num_batched_tokens" in message and ("(got 0)" in message or "0" in message), message
    assert message.startswith("vLLM engine failed to start: ") and "\n" not in message
    assert leftover_processes(pattern=ENGINE_PATTERN) == []


def test_vllm_defaults_are_the_baseline():
    defaults = vllm_defaults(
        {"model": str(ensure_tiny_model()), "skip_tokenizer_init": True, "max_model_len": 2048},
        ["max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching"],
    )
    assert defaults["max_num_seqs"] >= 1 and defaults["max_num_batched_tokens"] >= 1
    assert isinstance(defaults["enable_prefix_caching"], bool)


def test_a_failed_start_leaves_this_process_on_the_cores_it_had():
    import os

    before = os.sched_getaffinity(0)
    _start("in-process", max_model_len=1024, max_num_batched_tokens=0)
    assert os.sched_getaffinity(0) == before


_STARTER = """
import asyncio, sys
from trainables.vllm_engine import EngineSpec, VllmServer
from tuner.tiny_model import ensure_tiny_model
args = {"model": str(ensure_tiny_model()), "skip_tokenizer_init": True, "enforce_eager": True}
asyncio.run(VllmServer(EngineSpec(engine_args=args, serving="openai-server")).start())
"""


def test_a_server_whose_starter_is_killed_mid_start_leaves_no_engine_behind():
    # A search killed while a trial starts its engines: the server is still starting (vLLM's server then
    # exits on SIGTERM without stopping its engine core); nothing of it may outlive its starter.
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    engine = ""
    while not engine and time.monotonic() < deadline and starter.poll() is None:
        time.sleep(0.2)
        engine = subprocess.run(["pgrep", "-f", "EngineCore"], capture_output=True, text=True).stdout
    assert engine, "the engine core started"
    starter.kill()
    starter.wait(10)
    assert leftover_processes(wait_s=40, pattern=ENGINE_PATTERN) == []
