"""Heartbeats, declaration, replacement and retries, over stand-in replicas (no Ray, no vLLM)."""

from __future__ import annotations

import asyncio

import pytest
from stand_in import StandInEngine

from trainables.pool import EnginePool, HealthPolicy
from trainables.replay import replay_step
from tuner.records import PlannedRequest


def _plan(n: int, gap_s: float, output: int = 30) -> list[PlannedRequest]:
    return [
        PlannedRequest(index=i, scheduled_s=i * gap_s, prompt_token_ids=tuple(range(16, 48)), output_tokens=output)
        for i in range(n)
    ]


async def _replay_with_fault(pool: EnginePool, kind: str, *, at_s: float, n=30, gap=0.05):
    pool.start_monitor()

    async def fault():
        await asyncio.sleep(at_s)
        await pool.inject_fault(0, kind)

    task = asyncio.ensure_future(fault())
    records = await replay_step(pool, _plan(n, gap), deadline_s=10, id_prefix="h")
    await task
    await asyncio.sleep(0.3)
    await pool.shutdown()
    return records


def _replacer(made: list):
    async def replace(index):
        engine = StandInEngine(tokens_per_s=600)
        made.append(engine)
        return engine, {"replacement": True}

    return replace


@pytest.mark.parametrize("kind", ["kill", "freeze"])
def test_a_faulty_replica_is_declared_within_the_bound_replaced_and_nothing_is_lost(kind):
    policy = HealthPolicy(period_s=0.1, timeout_s=0.2, failure_threshold=3)
    made: list = []
    pool = EnginePool(
        [StandInEngine(tokens_per_s=600), StandInEngine(tokens_per_s=600)], health=policy, replace=_replacer(made)
    )
    records = asyncio.run(_replay_with_fault(pool, kind, at_s=0.3))

    assert len(pool.declarations) == 1
    declaration = pool.declarations[0]
    assert declaration.replica == 0 and declaration.fault_at is not None
    bound = policy.period_s * policy.failure_threshold + policy.timeout_s
    assert 0 < declaration.detection_s <= bound + 0.15
    assert made, "a replacement was started"
    assert pool.alive == [True, True], "the replacement took the dead replica's place"
    # Every request completed; those caught on the faulty replica were retried elsewhere.
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert any(r.retries for r in records)
    assert len(records) == 30


def test_a_replica_too_slow_to_answer_is_a_false_alarm():
    policy = HealthPolicy(period_s=0.05, timeout_s=0.05, failure_threshold=2)
    slow = StandInEngine(ping_delay_s=0.2)
    pool = EnginePool([slow, StandInEngine()], health=policy)

    async def run():
        pool.start_monitor()
        await asyncio.sleep(0.5)
        await pool.shutdown()

    asyncio.run(run())
    assert [d.replica for d in pool.declarations] == [0]
    assert pool.declarations[0].fault_at is None and pool.declarations[0].detection_s is None
    assert pool.declarations[0].false_alarm and not pool.declarations[0].crashed
    assert slow.killed


def test_a_replica_that_dies_on_its_own_is_a_crash_with_its_reason_not_a_false_alarm():
    policy = HealthPolicy(period_s=0.05, timeout_s=0.2, failure_threshold=2)
    made: list = []
    dying = StandInEngine(tokens_per_s=600)
    pool = EnginePool([dying, StandInEngine(tokens_per_s=600)], health=policy, replace=_replacer(made))

    async def run():
        pool.start_monitor()

        async def die():
            await asyncio.sleep(0.3)
            dying.killed = True  # no inject_fault: nothing the search did

        task = asyncio.ensure_future(die())
        records = await replay_step(pool, _plan(30, 0.05), deadline_s=10, id_prefix="c")
        await task
        await pool.shutdown()
        return records

    records = asyncio.run(run())
    declaration = pool.declarations[0]
    assert declaration.crashed and not declaration.false_alarm and declaration.detection_s is None
    assert "ActorDiedError: the actor died unexpectedly" in declaration.cause
    assert all(r.ok for r in records) and made  # still replaced and retried, as for an injected fault


def test_an_injected_kill_is_not_a_crash():
    policy = HealthPolicy(period_s=0.05, timeout_s=0.2, failure_threshold=2)
    pool = EnginePool([StandInEngine(), StandInEngine()], health=policy, replace=_replacer([]))
    asyncio.run(_replay_with_fault(pool, "kill", at_s=0.2, n=10))
    assert [(d.crashed, d.false_alarm) for d in pool.declarations] == [(False, False)]


def test_a_generous_policy_never_declares_a_healthy_pool():
    pool = EnginePool([StandInEngine(), StandInEngine()], health=HealthPolicy(0.05, 1.0, 3))

    async def run():
        pool.start_monitor()
        records = await replay_step(pool, _plan(20, 0.02), deadline_s=5, id_prefix="g")
        await pool.shutdown()
        return records

    records = asyncio.run(run())
    assert pool.declarations == [] and all(r.ok and r.retries == 0 for r in records)


def test_without_a_live_replica_requests_fail_with_a_reason_never_silently():
    pool = EnginePool([StandInEngine()], health=HealthPolicy(0.05, 0.05, 1))

    async def run():
        pool.start_monitor()
        await pool.inject_fault(0, "kill")
        await asyncio.sleep(0.2)
        records = await replay_step(pool, _plan(3, 0.0), deadline_s=2, id_prefix="n")
        await pool.shutdown()
        return records

    records = asyncio.run(run())
    assert [r.ok for r in records] == [False] * 3
    assert all(r.error.startswith("no live replica to serve it") for r in records)


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match="failure_threshold"):
        HealthPolicy(period_s=1, timeout_s=1, failure_threshold=0)


def test_one_bad_request_is_not_a_dead_replica():
    from trainables.pool import proves_death
    from tuner.errors import EngineDied, EngineError

    assert not proves_death(ValueError("max_tokens must be at least 1"))
    assert not proves_death(EngineError("vLLM engine failed to start: bad argument"))
    assert proves_death(EngineDied("vLLM engine died: the engine-core process ended (killed by signal 9)"))
    # The type decides, never the text.
    assert not proves_death(RuntimeError("ActorDiedError: the actor died unexpectedly"))
    assert not proves_death(EngineError("vLLM engine died: said by a message only"))

    class ActorDiedError(Exception):  # Ray's actor errors are recognised by their class names
        pass

    assert proves_death(ActorDiedError("The actor died unexpectedly before finishing this task."))

    class Wrapper(Exception):  # Ray's task errors carry the original as `cause`
        cause = EngineDied("vLLM engine died: killed by signal 9")

    assert proves_death(Wrapper("ray.exceptions.RayTaskError"))
