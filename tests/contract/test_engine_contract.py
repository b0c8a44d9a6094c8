"""One contract, three engines: the stand-in used by unit tests, the real vLLM engine in-process, and a
replica served by vLLM's OpenAI server (streamed over HTTP) must behave alike.

Each real engine is started once for the whole module, since it takes ~20 s to start.
"""

from __future__ import annotations

import asyncio

import pytest
from stand_in import StandInEngine

from trainables.protocol import Finished, FirstToken, GenerateRequest


def _spec(serving: str, **overrides):
    from trainables.vllm_engine import EngineSpec
    from tuner.tiny_model import ensure_tiny_model

    return EngineSpec(
        engine_args={
            "model": str(ensure_tiny_model()),
            "skip_tokenizer_init": True,
            "enforce_eager": True,
            "max_model_len": 1024,
            "max_num_seqs": 8,
            "max_num_batched_tokens": 512,
            "kv_cache_memory_bytes": 16 << 20,
            "distributed_executor_backend": "uni",
            "disable_log_stats": False,
            **overrides,
        },
        serving=serving,
    )


async def _start(kind: str):
    if kind == "stand-in":
        engine = StandInEngine()
        await engine.start()
        return engine
    if kind == "vllm":
        from trainables.vllm_engine import VllmEngine

        engine = VllmEngine(_spec("in-process"))
        await engine.start()
        return engine
    from trainables.http_replica import HttpReplica
    from trainables.vllm_engine import SERVED_MODEL_NAME, VllmServer

    server = VllmServer(_spec("openai-server"))
    info = await server.start()
    return HttpReplica(info["url"], server, SERVED_MODEL_NAME)


@pytest.fixture(
    scope="module",
    params=[
        "stand-in",
        pytest.param("vllm", marks=pytest.mark.integration),
        pytest.param("vllm-server", marks=pytest.mark.integration),
    ],
)
def engine(request):
    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(_start(request.param))
    yield engine, loop
    loop.run_until_complete(engine.shutdown())
    loop.close()


def _collect(engine, loop, request: GenerateRequest):
    async def run():
        return [item async for item in engine.generate(request)]

    return loop.run_until_complete(run())


def test_generate_streams_first_token_then_exact_finish(engine):
    engine, loop = engine
    items = _collect(engine, loop, GenerateRequest("c-1", tuple(range(20, 84)), 12))
    assert isinstance(items[0], FirstToken) and items[0].request_id == "c-1"
    assert isinstance(items[-1], Finished) and len(items) == 2
    finished = items[-1]
    assert finished.error is None
    assert finished.output_tokens == 12, "ignore_eos with min_tokens: exactly the asked length"
    assert len(finished.token_gaps_s) == 11 and all(g >= 0 for g in finished.token_gaps_s)


def test_one_token_output_has_no_gaps(engine):
    engine, loop = engine
    items = _collect(engine, loop, GenerateRequest("c-2", tuple(range(20, 40)), 1))
    assert items[-1].output_tokens == 1 and items[-1].token_gaps_s == ()


def test_concurrent_requests_all_complete(engine):
    engine, loop = engine

    async def run():
        async def one(i):
            return [x async for x in engine.generate(GenerateRequest(f"c-3-{i}", tuple(range(30, 62)), 6))]

        return await asyncio.gather(*(one(i) for i in range(10)))

    for items in loop.run_until_complete(run()):
        assert items[-1].output_tokens == 6 and items[-1].error is None


def test_abort_stops_a_long_request(engine):
    engine, loop = engine

    async def run():
        items = []
        started = asyncio.Event()

        async def consume():
            async for item in engine.generate(GenerateRequest("c-4", tuple(range(20, 52)), 1000)):
                items.append(item)
                if isinstance(item, FirstToken):
                    started.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(started.wait(), 60)  # abort a request that is really generating
        await engine.abort(["c-4"])
        await asyncio.wait_for(task, 10)  # and its stream ends soon after, long before 1000 tokens
        return items

    items = loop.run_until_complete(run())
    assert any(isinstance(item, FirstToken) for item in items)
    produced = items[-1].output_tokens if isinstance(items[-1], Finished) else None
    assert produced is None or produced < 1000, produced


def test_ping_and_prefix_reset_answer(engine):
    engine, loop = engine
    assert isinstance(loop.run_until_complete(engine.ping()), float)
    loop.run_until_complete(engine.reset_prefix_cache())
