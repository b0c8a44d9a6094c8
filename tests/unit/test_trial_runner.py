"""The ladder logic of one trial, over the stand-in engine: climb until a step fails, report, clean up."""

from __future__ import annotations

import asyncio
import math

from stand_in import StandInEngine

from trainables.pool import EnginePool, HealthPolicy
from trainables.trial import Fault, TrialContext, TrialRunner, engine_spec, kv_cache_bytes
from tuner.errors import EngineError
from tuner.workload.records import Request, Workload

WORKLOAD = Workload(tuple(Request(arrival_s=i * 0.1, prompt_tokens=32, output_tokens=8) for i in range(20)),
                    {"source": "test"})


def _context(**overrides) -> TrialContext:
    values = dict(model="/nonexistent", workload=WORKLOAD, reference_rps=10.0,
                  load_factors=(0.5, 1.0, 4.0, 40.0), slo="ttft:p95<200ms; tpot:p95<20ms",
                  step_duration_s=1.0, warmup_s=0.2, deadline_s=1.0, penalty_latency_s=30.0)
    values.update(overrides)
    return TrialContext(**values)


def _factory(engines):
    async def make(spec, replicas, health):
        for engine in engines[:replicas]:
            await engine.start()
        return EnginePool(engines[:replicas])

    return make


def _run_all(runner: TrialRunner) -> list[dict]:
    results = []
    runner.start()
    try:
        while True:
            results.append(runner.next_step())
            if results[-1]["done"]:
                return results
    finally:
        runner.close()


def test_a_trial_climbs_until_a_step_fails_and_carries_reference_latency():
    engines = [StandInEngine(tokens_per_s=3000, max_batch=4)]
    runner = TrialRunner(_context(), {"max_num_seqs": 4}, _factory(engines))
    results = _run_all(runner)
    assert [r["load_step"] for r in results] == list(range(1, len(results) + 1))
    assert results[-1]["trial_status"] == "completed"
    assert results[-1]["slo_pass"] == 0.0, "the 40x step must overload the stand-in"
    assert results[-1]["status_reason"].startswith(f"failed step {len(results)}")
    passed = [r for r in results if r["slo_pass"]]
    assert results[-1]["capacity_rps"] == passed[-1]["offered_rps"]
    assert results[-1]["capacity_censored"] == 0.0
    # Reference latency: penalty before the 1.0x step, measured from it on, then carried forward.
    assert results[0]["ref_ttft_p95_s"] == 30.0
    assert results[1]["ref_ttft_p95_s"] < 1.0
    assert all(r["ref_ttft_p95_s"] == results[1]["ref_ttft_p95_s"] for r in results[1:])
    assert engines[0].prefix_resets == len(results), "each step starts from an empty prefix cache"
    assert engines[0].shut_down


def test_load_is_per_accelerator():
    engines = [StandInEngine(), StandInEngine()]
    runner = TrialRunner(_context(load_factors=(1.0,)), {"num_replicas": 2}, _factory(engines))
    result = _run_all(runner)[0]
    assert result["offered_rps"] == 20.0 and result["num_accelerators"] == 2.0
    assert result["capacity_rps_per_accel"] in (0.0, 10.0)
    assert engines[0].requests and engines[1].requests


def test_an_engine_that_will_not_start_is_an_infeasible_trial_with_finite_penalties():
    async def failing(spec, replicas, health):
        raise EngineError("vLLM engine failed to start: ValueError: KV cache too small")

    runner = TrialRunner(_context(), {}, failing)
    results = _run_all(runner)
    assert len(results) == 1
    result = results[0]
    assert result["trial_status"] == "infeasible" and result["done"]
    assert "KV cache too small" in result["status_reason"]
    for key in ("capacity_rps_per_accel", "ref_ttft_p95_s", "slo_headroom", "load_step"):
        assert math.isfinite(result[key])


def test_engine_spec_maps_memory_fraction_onto_kv_bytes_on_cpu():
    spec, replicas, tp = engine_spec(_context(kv_budget_bytes=64 << 20),
                                     {"gpu_memory_utilization": 0.5, "max_num_seqs": 8, "num_replicas": 2})
    assert replicas == 2 and tp == 1
    assert "gpu_memory_utilization" not in spec.engine_args
    assert spec.engine_args["kv_cache_memory_bytes"] == 32 << 20 == kv_cache_bytes(0.5, 64 << 20)
    assert spec.engine_args["max_num_seqs"] == 8
    assert "num_replicas" not in spec.engine_args
    assert spec.engine_args["distributed_executor_backend"] == "uni"
    gpu_spec, _, _ = engine_spec(_context(on_cpu=False), {"gpu_memory_utilization": 0.9})
    assert gpu_spec.engine_args["gpu_memory_utilization"] == 0.9


def test_a_trial_over_its_time_limit_is_infeasible_and_still_cleaned_up():
    engines = [StandInEngine(tokens_per_s=3000)]
    runner = TrialRunner(_context(load_factors=(1.0, 4.0, 40.0), step_duration_s=1.0, trial_timeout_s=1.5),
                         {}, _factory(engines))
    results = _run_all(runner)
    assert results[-1]["trial_status"] == "infeasible"
    assert "exceeded the trial time limit of 1.5s" in results[-1]["status_reason"]
    assert engines[0].shut_down



def _healing_factory(engines, *, kill_at_s: float | None = None, victim: int = 1,
                     policy: HealthPolicy = HealthPolicy(0.05, 0.2, 2)):
    """Pools with heartbeats and replacement; with `kill_at_s`, replica `victim` dies on its own then."""

    async def make(spec, replicas, health):
        async def replace(index):
            return StandInEngine(tokens_per_s=5000, max_batch=32), {}

        pool = EnginePool(engines[:replicas], health=policy, replace=replace)
        pool.start_monitor()
        if kill_at_s is not None:
            async def die():
                await asyncio.sleep(kill_at_s)
                engines[victim].killed = True  # nothing the search did: no inject_fault

            asyncio.ensure_future(die())
        return pool

    return make


def test_a_replica_that_crashes_on_its_own_makes_the_trial_infeasible_with_the_reason():
    engines = [StandInEngine(tokens_per_s=5000, max_batch=32), StandInEngine(tokens_per_s=5000, max_batch=32)]
    make = _healing_factory(engines, kill_at_s=1.5)  # during step 2 (steps of 1 s)
    runner = TrialRunner(_context(slo="e2e:p99<5s"), {"max_num_seqs": 8, "num_replicas": 2}, make)
    results = _run_all(runner)
    assert [r["trial_status"] for r in results] == ["running", "infeasible"]
    reason = results[-1]["status_reason"]
    assert reason.startswith("replica 1 crashed during step 2 (no fault was injected)"), reason
    assert "ActorDiedError" in reason and results[-1]["capacity_rps"] == 0.0
    assert engines[0].shut_down


def test_an_injected_kill_does_not_make_the_trial_infeasible():
    engines = [StandInEngine(tokens_per_s=5000, max_batch=32), StandInEngine(tokens_per_s=5000, max_batch=32)]
    context = _context(slo="e2e:p99<5s", faults=(Fault("kill", step=2, at_fraction=0.3, replica=1),))
    results = _run_all(TrialRunner(context, {"max_num_seqs": 8, "num_replicas": 2}, _healing_factory(engines)))
    assert results[-1]["trial_status"] == "completed", results[-1]["status_reason"]
    assert results[1]["replica_failures"] == 1.0 and results[1]["false_alarms"] == 0.0


def test_a_crash_the_monitor_has_not_declared_yet_still_ends_the_trial():
    # Threshold far beyond the step: only the failed requests show the death when the step ends.
    engines = [StandInEngine(tokens_per_s=5000, max_batch=32), StandInEngine(tokens_per_s=5000, max_batch=32)]
    make = _healing_factory(engines, kill_at_s=1.5, policy=HealthPolicy(0.05, 0.2, 10_000))
    results = _run_all(TrialRunner(_context(slo="e2e:p99<5s"), {"max_num_seqs": 8, "num_replicas": 2}, make))
    assert results[-1]["trial_status"] == "infeasible" and results[-1]["replica_failures"] == 0.0
    assert results[-1]["status_reason"].startswith("replica 1 crashed during step 2"), results[-1]["status_reason"]
