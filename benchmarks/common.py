"""What the benchmarks share: the search's own trial code run outside Ray Tune, one trial at a time.

Every benchmark measures through `TrialRunner` with real vLLM engines in Ray actors, exactly as a
search does; only Tune's scheduling is left out.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainables.trial import TrialContext
from tuner.vocabulary import STATUS_REASON_TAG, STATUS_TAG, TrialStatus


def start_local_ray() -> None:
    from tuner.search import start_ray

    start_ray(None)


def stop_ray() -> None:
    import ray

    ray.shutdown()


def run_trial(
    context: TrialContext,
    params: dict[str, Any],
    trial_id: str,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One trial of `params` on a fresh pool (Ray must be running): every step's result, timings, outcome."""
    from trainables.trial import TrialRunner, driver_pool_factory, run_capacity_search

    runner = TrialRunner(context, params, driver_pool_factory(context), trial_id=trial_id)
    began = time.perf_counter()
    steps: list[dict[str, Any]] = []
    closed_at: list[float] = []

    def record(result: dict[str, Any]) -> None:
        result["t_end_s"] = round(time.perf_counter() - began, 3)
        steps.append({k: v for k, v in result.items() if k != "done"})
        if on_step is not None:
            on_step(result)
        if result["done"]:
            closed_at.append(time.perf_counter())

    run_capacity_search(runner, record)
    teardown_s = time.perf_counter() - (closed_at[-1] if closed_at else began)
    last = steps[-1]
    return {
        "params": params,
        "start_s": round(runner.start_s, 3),
        "steps": steps,
        "teardown_s": round(teardown_s, 3),
        "wall_s": round(time.perf_counter() - began, 3),
        "status": last[STATUS_TAG],
        "status_reason": last[STATUS_REASON_TAG],
        **{
            k: last[k]
            for k in (
                "capacity_rps_per_accel",
                "capacity_lo_rps_per_accel",
                "capacity_censored",
                "capacity_inconsistent",
            )
            if k in last
        },
        "capacity_hi_rps_per_accel": last.get("capacity_hi_rps_per_accel"),
    }


def step_line(result: dict[str, Any]) -> str:
    """One progress line per step, as the search prints them."""
    if result.get(STATUS_TAG) == TrialStatus.INFEASIBLE:
        return f"  infeasible: {result.get('status_reason', '')}"
    verdict = "pass" if result.get("slo_pass") else "FAIL"
    return (
        f"  step {int(result['load_step'])} {result.get('phase', '')} {result['load_factor']:.3g}x "
        f"{result['arrival_rps']:.2f} rps: {verdict} headroom {result['slo_headroom']:.2f} ttft p95 "
        f"{result.get('ttft_p95_s', float('nan')):.3f}s tpot p95 {result.get('tpot_p95_s', float('nan')):.4f}s "
        f"growth {result.get('ttft_growth', float('nan')):.3f} wall {result['step_wall_s']:.1f}s"
    )


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **cpu_kind(),
    }


def cpu_kind() -> dict[str, Any]:
    """What makes two machines' engine measurements incomparable: the CPU model, its cores and whether it
    computes bfloat16 natively (on 2026-12-02 an AVX2 EPYC ran the tiny model in bfloat16 about 8x slower
    per token than the machine before it)."""
    from tuner.tiny_model import cpu_has_native_bf16

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    model = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor()
    )
    return {"cpu_model": model, "cpus": os.cpu_count(), "bf16_native": cpu_has_native_bf16()}
