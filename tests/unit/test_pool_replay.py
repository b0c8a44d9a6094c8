"""Router, open-loop replay and the step deadline, driven by the in-process stand-in engine."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from stand_in import StandInEngine

from trainables.pool import EnginePool
from trainables.replay import replay_step
from tuner.records import PlannedRequest


def _plan(n: int, gap_s: float, prompt: int = 8, output: int = 4, warmup: int = 0) -> list[PlannedRequest]:
    return [
        PlannedRequest(
            index=i,
            scheduled_s=i * gap_s,
            prompt_token_ids=tuple(range(16, 16 + prompt)),
            output_tokens=output,
            in_warmup=i < warmup,
        )
        for i in range(n)
    ]


def test_router_picks_fewest_outstanding_then_least_used():
    pool = EnginePool([StandInEngine(), StandInEngine(), StandInEngine()])
    pool.outstanding = [2, 0, 1]
    assert pool.pick() == 1
    pool.outstanding = [0, 0, 0]
    pool._assigned = [3, 1, 1]
    assert pool.pick() == 1


def test_router_spreads_concurrent_requests_over_replicas():
    engines = [StandInEngine(tokens_per_s=500), StandInEngine(tokens_per_s=500)]
    pool = EnginePool(engines)
    records = asyncio.run(replay_step(pool, _plan(10, 0.0, output=20), deadline_s=10, id_prefix="t"))
    assert all(r.ok for r in records)
    assert {r.replica for r in records} == {0, 1}
    assert abs(len(engines[0].requests) - len(engines[1].requests)) <= 1
    assert pool.outstanding == [0, 0]


def test_replay_is_open_loop_and_on_schedule():
    # A slow engine must not delay later sends: each is sent at its scheduled time.
    pool = EnginePool([StandInEngine(tokens_per_s=50, max_batch=1)])
    records = asyncio.run(replay_step(pool, _plan(5, 0.05, output=10), deadline_s=10, id_prefix="t"))
    for record in records:
        assert record.send_lag_s < 0.03
        assert record.sent_s == pytest.approx(record.scheduled_s, abs=0.03)
    # With one slot, later requests queue: their TTFT grows, which an open loop must show.
    assert records[-1].ttft_s > records[0].ttft_s + 0.3


def test_records_carry_exact_lengths_and_timings():
    pool = EnginePool([StandInEngine()])
    records = asyncio.run(replay_step(pool, _plan(3, 0.01, prompt=12, output=6, warmup=1), deadline_s=5, id_prefix="t"))
    assert [r.in_warmup for r in records] == [True, False, False]
    for record in records:
        assert record.ok and record.error is None
        assert record.prompt_tokens == 12 and record.output_tokens == 6
        assert len(record.token_gaps_s) == 5
        assert 0 < record.ttft_s <= record.e2e_s
        assert record.tpot_s is not None and record.tpot_s > 0


def test_deadline_fails_and_aborts_unfinished_requests():
    engine = StandInEngine(tokens_per_s=20, max_batch=1)
    pool = EnginePool([engine])
    records = asyncio.run(replay_step(pool, _plan(4, 0.0, output=50), deadline_s=0.5, id_prefix="t"))
    failed = [r for r in records if not r.ok]
    assert failed, "a request that cannot finish before the deadline must fail"
    assert all(r.error == "missed the step deadline" and r.finished_s is None for r in failed)
    assert {f"t-{r.index}" for r in failed} <= engine.aborted


def test_a_replica_error_fails_only_its_request():
    class Broken(StandInEngine):
        async def generate(self, request):
            raise RuntimeError("actor died")
            yield  # pragma: no cover

    pool = EnginePool([Broken()])
    records = asyncio.run(replay_step(pool, _plan(2, 0.0), deadline_s=2, id_prefix="t"))
    assert [r.ok for r in records] == [False, False]
    assert "actor died" in records[0].error


def test_an_empty_pool_is_refused():
    with pytest.raises(ValueError):
        EnginePool([])


def test_a_pool_start_cut_by_the_trial_time_limit_leaves_nothing_for_asyncio_to_print(monkeypatch):
    """A trial stopped at its time limit while its engines start (the confirmation at the budget's end) cancels
    the start; asyncio then printed "_GatheringFuture exception was never retrieved" and a traceback on the
    README's demo (2026-12-07), because `wait_for` never reads the gather it was waiting on."""
    import gc

    from trainables import pool as pool_module

    class Method:
        def __init__(self, make):
            self.make = make

        def remote(self, *args):
            return self.make()

    class Handle:  # a Ray actor handle whose engine start never ends
        start = Method(lambda: asyncio.sleep(60))
        shutdown = Method(lambda: asyncio.sleep(0))

    async def no_kill(self):
        return None

    monkeypatch.setattr(pool_module, "_create_actor", lambda *args: Handle())
    monkeypatch.setattr(pool_module.RayReplica, "kill", no_kill)
    loop = asyncio.new_event_loop()
    unread: list[str] = []
    loop.set_exception_handler(lambda _, context: unread.append(context["message"]))
    with pytest.raises(asyncio.TimeoutError):
        starting = pool_module.start_ray_pool(None, 2, placement_group=None)  # type: ignore[arg-type]
        loop.run_until_complete(asyncio.wait_for(starting, 0.2))
    gc.collect()
    loop.close()
    assert unread == []


def test_the_trial_process_loads_the_http_client_before_its_first_request():
    """A trial's process imports aiohttp with the trainable, not on the first request of its first step:
    the import takes 0.15-0.2 s of CPU, and a replay client sharing two cores with two saturated replicas
    spent up to 1.2 s in it, sending a 20 requests/s step at a measured 16.1 (CI, 2026-12-07)."""
    code = "import sys, trainables.tune_trainable; print('aiohttp' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
