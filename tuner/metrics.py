"""Turn request records into step summaries and a trial's ladder metrics (SLO, goodput, capacity)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainables.protocol import RequestRecord
from tuner.slo import METRICS, STATS, Slo, SloTerm

_INF = math.inf
_MAX_HEADROOM = 100.0
# A failed request has no latency; for these metrics it counts as infinitely slow, so failures can
# only push a step towards failing (tpot only where the request asked for >= 2 output tokens).
_FAILURE_COUNTS_IN = ("ttft", "e2e", "tpot")
_REF_METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class StepSummary:
    """What one load step measured: where on the ladder it ran, whether it met the SLO, its metrics."""

    load_step: int
    load_factor: float
    offered_rps: float
    passed: bool
    metrics: dict[str, float]


def request_values(record: RequestRecord, metric: str) -> list[float]:
    """Return the latencies in seconds that one completed request contributes to `metric`.

    One value for ttft, tpot, e2e and queue, the inter-token gaps for itl; none for a failed request,
    for tpot of a 1-token output, or for queue when the engine reported no queueing time.
    Raises ValueError for a metric not in `tuner.slo.METRICS`.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (use one of {', '.join(METRICS)})")
    if not record.ok:
        return []
    if metric == "itl":
        return list(record.token_gaps_s)
    value = {"ttft": record.ttft_s, "tpot": record.tpot_s, "e2e": record.e2e_s, "queue": record.queue_s}[
        metric
    ]
    return [] if value is None else [value]


def stat(values: Sequence[float], stat: str) -> float:
    """Return the mean or the percentile (numpy's linear interpolation) of `values`; +inf entries are allowed.

    Raises ValueError for empty `values` or a statistic not in `tuner.slo.STATS`.
    """
    if stat not in STATS:
        raise ValueError(f"unknown statistic {stat!r} (use one of {', '.join(STATS)})")
    if not values:
        raise ValueError(f"the {stat} of no values is undefined")
    if stat == "mean":
        return float(np.mean(values))
    # Written out rather than np.percentile, which yields NaN (and warns) next to +inf failures.
    ordered = sorted(values)
    position = float(stat[1:]) / 100 * (len(ordered) - 1)
    below = math.floor(position)
    fraction = position - below
    low = float(ordered[below])
    if fraction == 0:
        return low
    high = float(ordered[below + 1])
    if math.isinf(high):
        return high
    step = high - low
    return low + step * fraction if fraction < 0.5 else high - step * (1 - fraction)


def summarize_step(
    records: Sequence[RequestRecord],
    slo: Slo,
    *,
    load_step: int,
    load_factor: float,
    offered_rps: float,
    window_s: float,
) -> StepSummary:
    """Return the summary of one load step over its records (those in the warm-up are not counted).

    Rates divide by `window_s`, the measured window's length. Latency keys are left out for a
    metric no completed counted request has a value for. Raises ValueError if `window_s` <= 0.
    """
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, but got {window_s}")
    counted = [r for r in records if not r.in_warmup]
    completed = [r for r in counted if r.ok]
    metrics = {
        "load_step": float(load_step),
        "load_factor": float(load_factor),
        "offered_rps": float(offered_rps),
        "achieved_rps": len(completed) / window_s,
        "output_tok_s": sum(r.output_tokens for r in completed) / window_s,
        "failed_requests": float(len(counted) - len(completed)),
        # Warm-up included: a client that cannot keep to the schedule spoils the whole step.
        "send_lag_p99_s": stat([r.send_lag_s for r in records], "p99") if records else 0.0,
    }
    for metric in METRICS:
        values = [v for r in completed for v in request_values(r, metric)]
        if values:
            metrics.update({f"{metric}_{s}_s": stat(values, s) for s in STATS})

    observed = [(term, _observed(counted, term)) for term in slo.terms]
    passed = bool(counted) and all(value <= term.bound_s for term, value in observed)
    headroom = min((_headroom(term, value) for term, value in observed), default=_MAX_HEADROOM)
    good = sum(1 for r in completed if all(_request_meets(r, term) for term in slo.terms))
    metrics.update(
        slo_pass=1.0 if passed else 0.0,
        slo_headroom=headroom if counted else 0.0,
        slo_attainment=good / len(counted) if counted else 0.0,
        goodput_rps=good / window_s,
    )
    return StepSummary(load_step, float(load_factor), float(offered_rps), passed, metrics)


def ladder_metrics(
    steps: Sequence[StepSummary],
    *,
    ref_load_step: int,
    ladder_len: int,
    num_accelerators: int,
    penalty_latency_s: float,
    ref_records: Sequence[RequestRecord] | None,
) -> dict[str, float]:
    """Return the trial metrics carried forward after each step: capacity, censoring, reference latencies.

    `ref_records` are the records of the reference step (`ref_load_step`), or None until it has run;
    reference latencies are then `penalty_latency_s`, and a failed request counts as that penalty.
    Raises ValueError for `num_accelerators` or `ladder_len` < 1, a non-positive or infinite
    penalty, or `ref_records` given while no step has `ref_load_step`.
    """
    if num_accelerators < 1 or ladder_len < 1:
        raise ValueError(
            f"num_accelerators and ladder_len must be >= 1, but got {num_accelerators}, {ladder_len}"
        )
    if not (math.isfinite(penalty_latency_s) and penalty_latency_s > 0):
        raise ValueError(f"penalty_latency_s must be positive and finite, but got {penalty_latency_s}")
    if ref_records is not None and all(s.load_step != ref_load_step for s in steps):
        raise ValueError(f"ref_records given, but no step has the reference load_step {ref_load_step}")
    passed = [s for s in steps if s.passed]
    capacity_rps = max(passed, key=lambda s: s.load_step).offered_rps if passed else 0.0
    metrics = {
        "capacity_rps": capacity_rps,
        "capacity_rps_per_accel": capacity_rps / num_accelerators,
        "capacity_censored": 1.0 if len(passed) == len(steps) and len(steps) < ladder_len else 0.0,
    }
    counted = [r for r in ref_records or () if not r.in_warmup]
    for metric in _REF_METRICS:
        values = [v for r in counted for v in request_values(r, metric)]
        values += [penalty_latency_s for r in counted if _failure_counts(r, metric)]
        p95 = stat(values, "p95") if values else penalty_latency_s
        metrics[f"ref_{metric}_p95_s"] = min(p95, penalty_latency_s)
    return metrics


def _failure_counts(record: RequestRecord, metric: str) -> bool:
    return not record.ok and metric in _FAILURE_COUNTS_IN and (metric != "tpot" or record.output_tokens >= 2)


def _observed(counted: Sequence[RequestRecord], term: SloTerm) -> float:
    """The term's statistic over the counted requests; +inf if there is nothing to measure."""
    values = [v for r in counted for v in request_values(r, term.metric)]
    values += [_INF for r in counted if _failure_counts(r, term.metric)]
    return stat(values, term.stat) if values else _INF


def _headroom(term: SloTerm, observed: float) -> float:
    if observed <= 0:
        return _MAX_HEADROOM
    return min(max(term.bound_s / observed, 0.0), _MAX_HEADROOM)


def _request_meets(record: RequestRecord, term: SloTerm) -> bool:
    """Whether one completed request meets the term on its own (undefined values are ignored)."""
    values = request_values(record, term.metric)
    return not values or stat(values, term.stat) <= term.bound_s
