"""A real capacity search on one vLLM CPU engine: climb until a step fails, bisect, measure the ending
failure again (the majority rule), a measured bracket."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ENGINE_PATTERN, leftover_processes

from trainables.pool import HealthPolicy, start_ray_pool
from trainables.trial import TrialRunner
from trainables.vllm_engine import EngineSpec
from tuner.capacity import CapacityPlan
from tuner.config import load_config
from tuner.search import prepare, trial_context

pytestmark = pytest.mark.integration


def test_a_real_capacity_search_brackets_the_breaking_point(ray_local):
    # The embedded default's workload and SLO, short steps; a small batch breaks near the bundled trace's
    # rate on one core (about 0.75x on a 2-core AVX2 EPYC, about 2x on the faster machine before it), so
    # from 1x the search either climbs to a failure within a few doublings or descends to a pass. Steps of
    # 40 measured requests (2 above the p95) and a 50% resolution keep it within the 5 minutes the test may
    # take: with 60 requests and 30% it took 430 s on a slow 2-core AVX2 EPYC hour (2026-12-04). It runs
    # the majority failure rule (one or two steps more): the default rule's bracket is the same code with
    # every failure believed at once (tests/unit/test_capacity.py drives both), and the searches of
    # test_search_e2e.py and test_cluster.py run the default.
    prepared = prepare(
        load_config(None, {"capacity.tail_requests": 2, "capacity.min_window_s": 6, "capacity.warmup_requests": 5}),
        device_has_gpu=False,
    )
    context = dataclasses.replace(
        trial_context(prepared),
        plan=CapacityPlan(
            start_factor=1.0, growth=2.0, max_factor=32.0, min_factor=0.125, resolution=0.5, failure_rule="majority"
        ),
    )

    async def factory(spec: EngineSpec, replicas: int, health: HealthPolicy):
        return await start_ray_pool(spec, replicas, placement_group=None, health=health, replace=True)

    runner = TrialRunner(
        context, {"max_num_seqs": 4, "max_num_batched_tokens": 256, "gpu_memory_utilization": 0.5}, factory
    )
    runner.start()
    results = []
    try:
        assert runner.failure is None, runner.failure
        while not results or not results[-1]["done"]:
            results.append(runner.next_step())
    finally:
        runner.close()
    final = results[-1]
    assert final["trial_status"] == "completed", final["status_reason"]
    phases = [r["phase"] for r in results]
    assert phases[0] == "climb" and "refine" in phases, phases
    assert any(not r["slo_pass"] for r in results), "the search found a load that fails"
    assert any(r["slo_pass"] for r in results), "and one that passes"
    # Each load's verdict by the majority of its measurements (a failure outvoted by two passes is a
    # pass); the load that ended the search failed in 2 of 3 or in both of 2 measurements.
    loads: dict[float, list[dict]] = {}
    for r in results:
        loads.setdefault(round(r["load_factor"], 6), []).append(r)
    verdicts = {f: sum(r["slo_pass"] for r in rs) > sum(not r["slo_pass"] for r in rs) for f, rs in loads.items()}
    rates = {f: sum(r["arrival_rps"] for r in rs) / len(rs) for f, rs in loads.items()}
    lowest_fail = min((f for f, ok in verdicts.items() if not ok), key=lambda f: rates[f])
    ending = [r["slo_pass"] for r in loads[lowest_fail]]
    assert ending.count(False) >= 2 and "remeasure" in phases, (lowest_fail, ending, phases)
    # Capacity = the measured arrival rate of the highest passing load below the lowest failing one, and
    # the bracket was refined to the resolution.
    passes = [rates[f] for f, ok in verdicts.items() if ok and rates[f] < rates[lowest_fail]]
    assert final["capacity_rps_per_accel"] == pytest.approx(max(passes))
    assert final["capacity_hi_rps_per_accel"] == pytest.approx(rates[lowest_fail])
    assert final["capacity_censored"] == 0.0
    assert final["capacity_hi_rps_per_accel"] <= final["capacity_rps_per_accel"] * 1.5 * 1.05
    # Every step offered the load it was asked for, counted enough requests, and lasted its window.
    for r in results:
        assert abs(r["arrival_rps"] / r["offered_rps"] - 1) <= 0.05, r
        assert r["measured_requests"] >= 40
    assert final["status_reason"].startswith("capacity ")
    assert leftover_processes(wait_s=30, pattern=ENGINE_PATTERN) == []


def test_a_confirmation_is_stopped_at_the_budget_s_end_through_a_real_engine(ray_local):
    """The budget's end is a hard one for the confirmation (tuner.confirm.run_confirmation): a re-measurement
    on a real vLLM server still running then is stopped, its engine shut down, and its round not counted.
    The trials' brackets are put at a quarter of the reference load, so the measurement climbs from there:
    its engine start and first steps (about 30 s each at 40 requests) outlast a 60 s budget. From the
    reference load, as before 2026-12-07, a fast hour finished the first measurement inside the budget
    (CI: at 59 s), and the budget then ended between the round's two measurements."""
    import time

    from trainables.trial import measure_on_ray
    from tuner.confirm import run_confirmation
    from tuner.recorded import TrialRow

    prepared = prepare(
        load_config(None, {"capacity.tail_requests": 2, "capacity.min_window_s": 6, "capacity.warmup_requests": 5}),
        device_has_gpu=False,
    )
    context = trial_context(prepared)
    ref = context.reference_rps

    def row(trial_id: str, params: dict) -> TrialRow:
        metrics = {
            "capacity_rps_per_accel": 0.25 * ref,
            "capacity_hi_rps_per_accel": 0.3 * ref,
            "num_accelerators": 1.0,
        }
        return TrialRow(trial_id, f"run-{trial_id}", "completed", params=params, metrics=metrics)

    base, small = row("base", {}), row("small", {"max_num_seqs": 4, "max_num_batched_tokens": 256})
    lines: list[str] = []
    began = time.monotonic()
    outcome = run_confirmation(
        context=context,
        trials=[base, small],
        baseline=base,
        count=1,
        rounds=2,
        resolution=0.5,
        measure=measure_on_ray,
        deadline=began + 60,
        measurement_s=1.0,  # so that round 1 starts
        progress=lines.append,
    )
    ended = time.monotonic() - began
    assert ended < 60 + 30, f"ended {ended:.0f}s after it began: the budget's end stops the measurement"
    assert outcome.rounds_done == 0 and all(v == [] for v in outcome.measurements.values()), outcome.measurements
    assert any("the time budget ended during the measurement of" in note for note in outcome.notes), outcome.notes
    assert any("stopped at the time budget's end" in line for line in lines), lines
    assert leftover_processes(wait_s=30, pattern=ENGINE_PATTERN) == []
