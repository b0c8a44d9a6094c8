"""The failure contract, one for every engine the pool talks to: the stand-in of the unit tests, the real
vLLM engine in-process, a replica served by vLLM's OpenAI server (over HTTP), and the Ray replica that
hosts one (what a search's pool really holds).

- A start that fails raises EngineError, one line.
- Once its engine is killed, a replica proves its death: `ping` raises an error `proves_death` accepts
  (within a minute), and a request either raises such an error or ends with a `Finished` that carries
  an error: it never hangs and never reports success.

The happy path is tests/contract/test_engine_contract.py; each real engine here is started for its test
alone, since the test kills it.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from stand_in import StandInEngine
from test_engine_contract import _spec

from trainables.pool import proves_death
from trainables.protocol import Finished, GenerateRequest
from tuner.errors import EngineError

KINDS = [
    "stand-in",
    pytest.param("vllm", marks=pytest.mark.integration),
    pytest.param("vllm-server", marks=pytest.mark.integration),
    pytest.param("ray-replica", marks=pytest.mark.integration),
]


@pytest.fixture(scope="module")
def ray_running():
    import ray

    from tuner.search import start_ray

    start_ray(None)
    yield
    ray.shutdown()


async def _start(kind: str, **overrides):
    """(replica, a coroutine function that kills its engine the hard way, one that shuts everything down)."""
    if kind == "stand-in":
        engine = StandInEngine(fail_start="max_num_batched_tokens must be >= 1" if overrides else None)
        await engine.start()

        async def kill_stand_in() -> None:
            engine.killed = True

        return engine, kill_stand_in, engine.shutdown
    if kind == "vllm":
        from trainables.vllm_engine import VllmEngine

        engine = VllmEngine(_spec("in-process", **overrides))
        await engine.start()

        async def kill_core() -> None:  # the engine core is a child process of this one
            import psutil

            for child in psutil.Process().children(recursive=True):
                if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                    os.kill(child.pid, signal.SIGKILL)

        return engine, kill_core, engine.shutdown
    if kind == "vllm-server":
        from trainables.http_replica import HttpReplica
        from trainables.vllm_engine import SERVED_MODEL_NAME, VllmServer

        server = VllmServer(_spec("openai-server", **overrides))
        try:
            info = await server.start()
        except BaseException:
            await server.shutdown()
            raise
        replica = HttpReplica(info["url"], server, SERVED_MODEL_NAME)
        return replica, server.kill, replica.shutdown
    from trainables.pool import HealthPolicy, RayReplica, start_ray_pool

    # One replica as a search's pool holds it: the server in a Ray actor, reached over HTTP; no heartbeats
    # during the test (the monitor would declare the death itself).
    pool = await start_ray_pool(
        _spec("openai-server", **overrides),
        1,
        placement_group=None,
        first_bundle=0,
        health=HealthPolicy(period_s=3600, timeout_s=3600),
    )
    replica = pool.replicas[0]
    host = getattr(replica, "host", replica)
    assert isinstance(host, RayReplica)
    return replica, host.kill, pool.shutdown


@pytest.mark.parametrize("kind", KINDS)
def test_a_start_that_fails_is_one_engine_error(kind, request):
    if kind == "ray-replica":
        request.getfixturevalue("ray_running")
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(EngineError) as error:
            loop.run_until_complete(_start(kind, max_num_batched_tokens=0))
        assert "max_num_batched_tokens" in str(error.value) and "\n" not in str(error.value)
    finally:
        loop.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_replica_proves_its_death_and_never_reports_success(kind, request):
    if kind == "ray-replica":
        request.getfixturevalue("ray_running")
    loop = asyncio.new_event_loop()
    replica, kill, close = loop.run_until_complete(_start(kind))
    try:
        assert isinstance(loop.run_until_complete(replica.ping()), float)
        loop.run_until_complete(kill())

        async def ping_until_it_fails() -> BaseException:
            for _ in range(60):
                try:
                    await asyncio.wait_for(replica.ping(), 5)
                except asyncio.TimeoutError:
                    pass
                except Exception as error:  # noqa: BLE001 - the error is the subject
                    return error
                await asyncio.sleep(1)
            raise AssertionError("ping still answered a minute after the engine was killed")

        death = loop.run_until_complete(ping_until_it_fails())
        assert proves_death(death), f"{type(death).__name__}: {death}"

        async def one_request():
            items = []
            try:
                async for item in replica.generate(GenerateRequest("dead-1", tuple(range(20, 52)), 8)):
                    items.append(item)
            except Exception as error:  # noqa: BLE001
                return error
            return items

        outcome = loop.run_until_complete(asyncio.wait_for(one_request(), 60))
        if isinstance(outcome, BaseException):
            assert proves_death(outcome), f"{type(outcome).__name__}: {outcome}"
        else:
            assert outcome and isinstance(outcome[-1], Finished) and outcome[-1].error, outcome
    finally:
        loop.run_until_complete(close())
        loop.close()
