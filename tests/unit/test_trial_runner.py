"""One trial over the stand-in engine: the capacity search (climb, refine, censor), reporting, clean-up."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math

import numpy as np
import pytest
from stand_in import JumpEngine, StandInEngine

from trainables.pool import EnginePool, HealthPolicy
from trainables.trial import Fault, TrialContext, TrialRunner, engine_spec, kv_cache_bytes
from tuner.capacity import CapacityPlan
from tuner.errors import EngineError
from tuner.sampling import sample_step
from tuner.vocabulary import HEALTH_METRICS, REPORTED_METRICS, STATUS_REASON_TAG, STATUS_TAG, TRIAL_METRICS
from tuner.workload.records import Request, Workload

WORKLOAD = Workload(
    tuple(Request(arrival_s=i * 0.1, prompt_tokens=32, output_tokens=8) for i in range(20)), {"source": "test"}
)
SAMPLE = sample_step(WORKLOAD, measured=20, warmup=2, windows=2, seed=0)


# Two climb steps at 1x and 1.5x of 10 rps per replica (22 requests: 1.1 s, then 0.73 s with 2 replicas).
PLAN_1S = CapacityPlan(start_factor=1.0, growth=1.5, max_factor=1.5, min_factor=1.0, resolution=0.5)


def _context(**overrides) -> TrialContext:
    values = dict(
        model="/nonexistent",
        sample=SAMPLE,
        reference_rps=10.0,
        plan=CapacityPlan(start_factor=0.5, growth=4.0, max_factor=32.0, min_factor=0.5, resolution=0.5),
        slo="ttft:p95<200ms; tpot:p95<20ms",
        deadline_s=1.0,
        penalty_latency_s=30.0,
        sustain_horizon_s=None,
    )
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


def test_a_trial_climbs_until_a_step_fails_then_refines_and_carries_reference_latency():
    engines = [StandInEngine(tokens_per_s=600, max_batch=4)]
    runner = TrialRunner(_context(reference_rps=40.0), {"max_num_seqs": 4}, _factory(engines))
    results = _run_all(runner)
    assert [r["load_step"] for r in results] == list(range(1, len(results) + 1))
    phases = [r["phase"] for r in results]
    climb = phases.index("refine") if "refine" in phases else len(phases)
    assert [r["load_factor"] for r in results[:climb]] == [0.5, 2.0, 8.0, 32.0][:climb]
    assert results[-1]["trial_status"] == "completed"
    assert any(not r["slo_pass"] for r in results), "the stand-in must break below 32x"
    final = results[-1]
    passes = [r["arrival_rps"] for r in results if r["slo_pass"]]
    fails = [r["arrival_rps"] for r in results if not r["slo_pass"]]
    assert final["capacity_rps"] == max(p for p in passes if p < min(fails))
    assert final["capacity_hi_rps_per_accel"] == min(fails)
    assert final["capacity_hi_rps_per_accel"] <= final["capacity_rps"] * 1.5 * 1.01, "refined to the resolution"
    assert final["capacity_censored"] == 0.0
    assert final["status_reason"].startswith("capacity ") and "lowest failing step" in final["status_reason"]
    # Every step replays the same requests at its own rate, and says how many it counted.
    assert all(r["measured_requests"] == 20.0 for r in results)
    for r in results:  # the sends span the planned window, give or take a busy client's lag (20 ms)
        planned, actual = r["measured_requests"] / r["offered_rps"], r["measured_requests"] / r["arrival_rps"]
        assert abs(actual - planned) < 0.05 * planned + 0.02, (r["load_factor"], planned, actual)
    # Reference latency: penalty before the 1.0x step (not on this climb: 0.5x, 2x, ...), so penalty here.
    assert all(r["ref_ttft_p95_s"] == 30.0 for r in results)
    assert engines[0].prefix_resets == len(results), "each step starts from an empty prefix cache"
    assert engines[0].shut_down


def test_the_reference_step_gives_the_reference_latencies_carried_forward():
    engines = [StandInEngine(tokens_per_s=3000, max_batch=4)]
    plan = CapacityPlan(start_factor=0.5, growth=2.0, max_factor=4.0, min_factor=0.5, resolution=0.5)
    results = _run_all(TrialRunner(_context(plan=plan, reference_rps=40.0), {}, _factory(engines)))
    assert results[0]["ref_ttft_p95_s"] == 30.0 and results[1]["load_factor"] == 1.0
    assert results[1]["ref_ttft_p95_s"] < 1.0
    assert all(r["ref_ttft_p95_s"] == results[1]["ref_ttft_p95_s"] for r in results[1:])


def test_a_config_that_passes_the_maximum_is_censored_and_says_so():
    engines = [StandInEngine(tokens_per_s=1e6, max_batch=1000, prefill_tokens_per_s=1e9)]
    plan = CapacityPlan(start_factor=1.0, growth=2.0, max_factor=4.0, min_factor=1.0)
    results = _run_all(TrialRunner(_context(plan=plan, slo="ttft:p95<2s", reference_rps=40.0), {}, _factory(engines)))
    assert [r["load_factor"] for r in results] == [1.0, 2.0, 4.0]
    assert results[-1]["capacity_censored"] == 1.0 and "capacity_hi_rps_per_accel" not in results[-1]
    assert results[-1]["status_reason"].startswith("capacity >= ")
    assert "passed the capacity search's maximum load (4x)" in results[-1]["status_reason"]


@pytest.mark.parametrize("seed", range(6))
def test_the_bracket_contains_a_noisy_jump(seed):
    """End to end through replay and summaries: a stand-in whose latency jumps at a known rate, with
    step-to-step noise; the bracket, widened by that noise, contains the jump (the planner's own test
    shows >= 90% over 500 seeds; this shows the trial wires it up)."""
    # The stand-in's latency and the replay's timing are wall-clock: a garbage collection over the heap
    # earlier tests left (seconds late in a full run) would stall the event loop mid-step.
    gc.collect()
    gc.freeze()
    rng = np.random.default_rng(seed)
    jump = float(rng.uniform(130, 600))
    noise = 0.03
    engines = [JumpEngine(jump, noise_cv=noise, seed=seed, tokens_per_s=1e6, max_batch=1000, prefill_tokens_per_s=1e9)]
    workload = Workload(
        tuple(Request(arrival_s=i * 0.01, prompt_tokens=8, output_tokens=2) for i in range(50)), {"source": "even"}
    )
    context = _context(
        sample=sample_step(workload, measured=40, warmup=10, windows=1, seed=seed),
        reference_rps=100.0,
        slo="ttft:p95<300ms",
        deadline_s=2.0,
        plan=CapacityPlan(start_factor=1.0, growth=2.0, max_factor=16.0, resolution=0.1),
    )
    final = _run_all(TrialRunner(context, {}, _factory(engines)))[-1]
    low, high = final["capacity_rps_per_accel"], final.get("capacity_hi_rps_per_accel", np.inf)
    assert low * np.exp(-2 * noise) <= jump <= high * np.exp(2 * noise), (low, jump, high)


def test_under_the_majority_rule_the_trial_measures_its_ending_failure_again():
    gc.collect()
    gc.freeze()
    engines = [JumpEngine(300.0, tokens_per_s=1e6, max_batch=1000, prefill_tokens_per_s=1e9)]
    workload = Workload(
        tuple(Request(arrival_s=i * 0.01, prompt_tokens=8, output_tokens=2) for i in range(50)), {"source": "even"}
    )
    context = _context(
        sample=sample_step(workload, measured=40, warmup=10, windows=1, seed=0),
        reference_rps=100.0,
        slo="ttft:p95<300ms",
        deadline_s=2.0,
        plan=CapacityPlan(start_factor=1.0, growth=2.0, max_factor=16.0, resolution=0.1, failure_rule="majority"),
    )
    results = _run_all(TrialRunner(context, {}, _factory(engines)))
    *search, last = results
    fails = [r for r in search if not r["slo_pass"]]
    lowest = min(fails, key=lambda r: r["arrival_rps"])
    assert last["phase"] == "remeasure" and last["load_factor"] == lowest["load_factor"] and not last["slo_pass"]
    assert last["capacity_hi_rps_per_accel"] == pytest.approx((lowest["arrival_rps"] + last["arrival_rps"]) / 2)
    assert last["capacity_rps_per_accel"] <= 300.0 * 1.05 < last["capacity_hi_rps_per_accel"] * 1.05
    assert f"({lowest['load_factor']:.3g}x, " in last["status_reason"].split("lowest failing step")[1]


def test_load_is_per_accelerator():
    engines = [StandInEngine(), StandInEngine()]
    plan = CapacityPlan(start_factor=1.0, max_factor=1.0, min_factor=1.0)
    runner = TrialRunner(_context(plan=plan), {"num_replicas": 2}, _factory(engines))
    result = _run_all(runner)[0]
    assert result["offered_rps"] == 20.0 and result["num_accelerators"] == 2.0
    assert result["arrival_rps"] == pytest.approx(20.0, rel=0.05)
    assert result["capacity_rps_per_accel"] in (0.0, pytest.approx(result["arrival_rps"] / 2))
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


def test_a_kv_cache_below_one_request_is_infeasible_without_starting_an_engine(tmp_path):
    (tmp_path / "config.json").write_text(  # the tiny model's shape: 8 KiB of KV per token in float32
        '{"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 64}'
    )
    context = _context(
        model=str(tmp_path), kv_budget_bytes=64 << 20, engine_defaults={"max_model_len": 2048, "dtype": "float32"}
    )
    started = []

    async def recording(spec, replicas, health):
        started.append(spec.engine_args.get("kv_cache_memory_bytes"))
        raise EngineError("vLLM engine failed to start: ValueError: To serve at least one request ...")

    (result,) = _run_all(TrialRunner(context, {"gpu_memory_utilization": 0.2, "num_replicas": 2}, recording))
    assert started == [], "no engine is started for a config vLLM would refuse"
    assert result[STATUS_TAG] == "infeasible" and result["done"]
    reason = result[STATUS_REASON_TAG]
    assert "fewer than vLLM needs for one request of max_model_len 2048" in reason
    assert reason.endswith("(gpu_memory_utilization 0.2 x hardware.kv_budget_mib 64)")
    _run_all(TrialRunner(context, {"gpu_memory_utilization": 0.28}, recording))
    assert started == [int(0.28 * (64 << 20))], "a cache that holds one request is left to vLLM"
    _run_all(TrialRunner(dataclasses.replace(context, on_cpu=False), {"gpu_memory_utilization": 0.2}, recording))
    assert len(started) == 2, "on a GPU the fraction is vLLM's own, not a KV size the tool set"


# What a trial's result carries besides metrics: its status and why, whether it is done, the capacity
# search's phase, and where the replicas ran.
BOOKKEEPING = {STATUS_TAG, STATUS_REASON_TAG, "done", "phase", "replica_nodes"}


def test_a_trial_reports_only_vocabulary_metrics_and_ends_with_every_trial_and_health_metric():
    engines = [StandInEngine(tokens_per_s=600, max_batch=4)]
    results = _run_all(TrialRunner(_context(reference_rps=40.0), {"max_num_seqs": 4}, _factory(engines)))
    for result in results:
        assert set(result) - BOOKKEEPING - REPORTED_METRICS == set(), "not in tuner.vocabulary's tables"
    assert results[-1][STATUS_TAG] == "completed"
    assert set(TRIAL_METRICS) | set(HEALTH_METRICS) <= set(results[-1])


def test_an_infeasible_result_has_every_trial_metric_but_the_bracket_top_and_only_vocabulary_metrics():
    async def failing(spec, replicas, health):
        raise EngineError("vLLM engine failed to start: ValueError: KV cache too small")

    (result,) = _run_all(TrialRunner(_context(), {}, failing))
    assert set(result) - BOOKKEEPING - REPORTED_METRICS == set(), "not in tuner.vocabulary's tables"
    assert set(TRIAL_METRICS) - set(result) == {"capacity_hi_rps_per_accel"}
    assert set(HEALTH_METRICS) <= set(result)
    assert [result[k] for k in TRIAL_METRICS if k.startswith("ref_")] == [30.0] * 3, "the penalty"
    assert result["capacity_rps_per_accel"] == 0.0 and result[STATUS_TAG] == "infeasible"


def test_engine_spec_maps_memory_fraction_onto_kv_bytes_on_cpu():
    spec, replicas, tp = engine_spec(
        _context(kv_budget_bytes=64 << 20), {"gpu_memory_utilization": 0.5, "max_num_seqs": 8, "num_replicas": 2}
    )
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
    runner = TrialRunner(_context(trial_timeout_s=1.5), {}, _factory(engines))
    results = _run_all(runner)
    assert results[-1]["trial_status"] == "infeasible"
    assert "exceeded the trial time limit of 1.5s" in results[-1]["status_reason"]
    assert engines[0].shut_down


def _healing_factory(
    engines, *, kill_at_s: float | None = None, victim: int = 1, policy: HealthPolicy = HealthPolicy(0.05, 0.2, 2)
):
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
    make = _healing_factory(engines, kill_at_s=1.5)  # during step 2 (1.1 s, then 0.73 s of sends)
    runner = TrialRunner(_context(slo="e2e:p99<5s", plan=PLAN_1S), {"max_num_seqs": 8, "num_replicas": 2}, make)
    results = _run_all(runner)
    assert [r["trial_status"] for r in results] == ["running", "infeasible"]
    reason = results[-1]["status_reason"]
    assert reason.startswith("replica 1 crashed during step 2 (no fault was injected)"), reason
    assert "ActorDiedError" in reason and results[-1]["capacity_rps"] == 0.0
    assert engines[0].shut_down


def test_an_injected_kill_does_not_make_the_trial_infeasible():
    engines = [StandInEngine(tokens_per_s=5000, max_batch=32), StandInEngine(tokens_per_s=5000, max_batch=32)]
    context = _context(slo="e2e:p99<5s", plan=PLAN_1S, faults=(Fault("kill", at_load=1.5, at_fraction=0.3, replica=1),))
    results = _run_all(TrialRunner(context, {"max_num_seqs": 8, "num_replicas": 2}, _healing_factory(engines)))
    assert results[-1]["trial_status"] == "completed", results[-1]["status_reason"]
    assert results[1]["replica_failures"] == 1.0 and results[1]["false_alarms"] == 0.0


def test_a_crash_the_monitor_has_not_declared_yet_still_ends_the_trial():
    # Threshold far beyond the step: only the failed requests show the death when the step ends.
    engines = [StandInEngine(tokens_per_s=5000, max_batch=32), StandInEngine(tokens_per_s=5000, max_batch=32)]
    make = _healing_factory(engines, kill_at_s=1.5, policy=HealthPolicy(0.05, 0.2, 10_000))
    results = _run_all(
        TrialRunner(_context(slo="e2e:p99<5s", plan=PLAN_1S), {"max_num_seqs": 8, "num_replicas": 2}, make)
    )
    assert results[-1]["trial_status"] == "infeasible" and results[-1]["replica_failures"] == 0.0
    assert results[-1]["status_reason"].startswith("replica 1 crashed during step 2"), results[-1]["status_reason"]


def test_the_trials_server_runs_the_options_a_deployment_runs_on_loopback():
    from trainables.vllm_engine import server_command

    spec, _, _ = engine_spec(
        _context(serving="openai-server"),
        {"max_num_seqs": 8, "enable_prefix_caching": False, "gpu_memory_utilization": 0.5},
    )
    assert spec.serving == "openai-server"
    argv = server_command(spec.engine_args, 8123)
    joined = " ".join(argv)
    assert "--host 127.0.0.1 --port 8123" in joined
    assert "--max-num-seqs 8" in joined and "--no-enable-prefix-caching" in joined
    assert f"--kv-cache-memory-bytes {32 << 20}" in joined and "--enforce-eager" in joined
    # The server tokenizes and detokenizes as in production, and picks its own executor.
    assert "skip-tokenizer-init" not in joined and "distributed-executor-backend" not in joined
    assert "disable-log-stats" not in joined, "vLLM's server has no --no-disable-log-stats flag"


def test_the_client_runs_off_the_engines_cores_during_the_trial_only():
    import os

    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs two cores to move the client off the engine's")
    engine_core = min(before)

    async def make(spec, replicas, health):
        engine = StandInEngine()
        await engine.start()
        return EnginePool([engine], [{"cores": [engine_core]}])

    runner = TrialRunner(_context(plan=PLAN_1S), {}, make)
    runner.start()
    try:
        assert os.sched_getaffinity(0) == before - {engine_core}
    finally:
        runner.close()
    assert os.sched_getaffinity(0) == before, "a trial must leave the process where it found it"


def test_a_replica_whose_every_request_raises_makes_the_trial_infeasible():
    """Every request of the step fails because the replica raised (a broken engine that stays up): the pool
    marks those failures as the replica's (no string matching) and the trial ends infeasible."""

    class Broken(StandInEngine):
        async def generate(self, request):
            raise RuntimeError("engine step failed: bad kernel")
            yield  # an async generator that raises on first use

    runner = TrialRunner(_context(plan=PLAN_1S), {"max_num_seqs": 4}, _factory([Broken()]))
    result = _run_all(runner)[-1]
    assert result["trial_status"] == "infeasible"
    assert result["status_reason"].startswith("replicas crashed during step 1: replica 0: "), result["status_reason"]
    assert all(r.replica_error for r in runner.last_records)
