"""A real pool of two vLLM CPU replicas in Ray actors: parallel start, routing, a killed replica, teardown."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import pytest
from helpers import ENGINE_PATTERN, leftover_processes

from trainables.pool import start_ray_pool
from trainables.replay import replay_step
from trainables.vllm_engine import EngineSpec
from tuner.errors import EngineError
from tuner.sampling import plan_step, sample_step
from tuner.tiny_model import ensure_tiny_model
from tuner.workload.records import Request, Workload

pytestmark = pytest.mark.integration


def _spec(**overrides) -> EngineSpec:
    args = {
        "model": str(ensure_tiny_model()),
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "max_model_len": 1024,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 512,
        "kv_cache_memory_bytes": 16 << 20,
        "distributed_executor_backend": "uni",
        **overrides,
    }
    return EngineSpec(engine_args=args)


WORKLOAD = Workload(
    tuple(Request(arrival_s=i * 0.1, prompt_tokens=64, output_tokens=16) for i in range(40)), {"source": "test"}
)


def _frontend_cores(info: list[dict]) -> list[set[int]]:
    """Where each replica's frontend belongs: the cores no engine holds, else its own engine's."""
    free = os.sched_getaffinity(0) - {core for replica in info for core in replica["cores"]}
    return [free or set(replica["cores"]) for replica in info]


def test_two_replicas_start_in_parallel_share_load_survive_a_killed_replica_and_leave_nothing(ray_local):
    """One pool (an engine start costs about a minute here): a step shared by both replicas, then a step
    during which one replica's actor is killed."""
    loop = asyncio.new_event_loop()
    began = time.perf_counter()
    pool = loop.run_until_complete(start_ray_pool(_spec(), 2, placement_group=None))
    start_s = time.perf_counter() - began
    try:
        assert len(pool.info) == 2
        assert {tuple(i["cores"]) for i in pool.info} == {(0,), (1,)}, "each replica on its own core"
        # Each frontend (the actor) on the cores no engine holds, else beside its own engine, never on the other's.
        assert [os.sched_getaffinity(i["pid"]) for i in pool.info] == _frontend_cores(pool.info)
        # In parallel: the pool's start is about one engine's, well under the sum a sequential start needs.
        starts = [i["start_s"] for i in pool.info]
        assert start_s < 0.8 * sum(starts), (start_s, starts)
        plan = plan_step(
            sample_step(WORKLOAD, measured=25, warmup=5, windows=1, seed=0), rate_rps=10, step_seed=1, vocab_size=4096
        )
        records = loop.run_until_complete(replay_step(pool, plan, deadline_s=20, id_prefix="pool"))
        assert all(r.ok for r in records), [r.error for r in records if not r.ok]
        assert {r.replica for r in records} == {0, 1}
        assert all(r.ttft_s > 0 and len(r.token_gaps_s) == 15 for r in records)

        plan = plan_step(
            sample_step(WORKLOAD, measured=30, warmup=0, windows=1, seed=0), rate_rps=10, step_seed=2, vocab_size=4096
        )

        async def kill_soon():
            await asyncio.sleep(1.0)
            ray_local.kill(pool.replicas[0].handle, no_restart=True)

        async def run():
            killer = asyncio.create_task(kill_soon())
            records = await replay_step(pool, plan, deadline_s=20, id_prefix="kill")
            await killer
            return records

        records = loop.run_until_complete(run())
        # Without a health monitor the router still stops using a replica whose actor died, and the
        # requests it held are retried on the other one: nothing fails, nothing is lost.
        assert all(r.ok for r in records), [r.error for r in records if not r.ok]
        retried = [r for r in records if r.retries]
        assert retried and all(r.replica == 1 for r in retried)
        assert records[-1].replica == 1
    finally:
        loop.run_until_complete(pool.shutdown())
        loop.close()
    # Nothing left, the killed actor's EngineCore included (reaped by the raylet, not orphaned).
    assert leftover_processes(wait_s=30, pattern=ENGINE_PATTERN) == []


def test_two_served_replicas_on_two_cores_both_answer_promptly(ray_local):
    """Each replica's vLLM API server works beside its own engine when no core is free. (Moved onto the
    other replica's engine core, one replica answered its first tokens ~10 s late and took ~12% of the
    requests, at 10 requests/s over both.)"""
    loop = asyncio.new_event_loop()
    spec = dataclasses.replace(_spec(), serving="openai-server")
    pool = loop.run_until_complete(start_ray_pool(spec, 2, placement_group=None))
    try:
        assert [os.sched_getaffinity(i["server_pid"]) for i in pool.info] == _frontend_cores(pool.info)
        requests = tuple(Request(arrival_s=i * 0.1, prompt_tokens=64, output_tokens=48) for i in range(120))
        workload = Workload(requests, {"source": "test"})
        plan = plan_step(
            sample_step(workload, measured=100, warmup=10, windows=1, seed=0), rate_rps=10, step_seed=3, vocab_size=4096
        )
        records = loop.run_until_complete(replay_step(pool, plan, deadline_s=30, id_prefix="served"))
        assert all(r.ok for r in records), [r.error for r in records if not r.ok]
        for replica in (0, 1):
            ttfts = sorted(r.ttft_s for r in records if r.replica == replica)
            assert len(ttfts) >= 0.3 * len(records), (replica, len(ttfts), len(records))
            assert ttfts[int(0.95 * (len(ttfts) - 1))] < 1.0, (replica, ttfts[-5:])
    finally:
        loop.run_until_complete(pool.shutdown())
        loop.close()
    assert leftover_processes(wait_s=30, pattern=ENGINE_PATTERN) == []


def test_a_replica_that_cannot_start_stops_the_others_and_names_the_reason(ray_local):
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(EngineError) as error:
            loop.run_until_complete(
                start_ray_pool(_spec(max_model_len=2048, kv_cache_memory_bytes=1 << 20), 2, placement_group=None)
            )
    finally:
        loop.close()
    assert "cache" in str(error.value).lower()
    assert leftover_processes(wait_s=30, pattern=ENGINE_PATTERN) == []
