"""Turn request records into step summaries (SLO verdict, goodput, sustainability) and a trial's metrics.

The SLO rule lives here once: a step passes iff every term's statistic, with failed requests counted
as infinitely slow, is within its bound, and the load was sustainable (`overload`). `slo_statistics`
computes those statistics and `judge` applies an SLO to them; the search judges its steps with them
and the export re-judges recorded steps under another SLO with the same two functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from tuner.capacity import Bracket, Observation, Phase, bracket
from tuner.records import RequestRecord
from tuner.slo import METRICS, STATS, Slo, SloTerm
from tuner.vocabulary import latency_name, slo_latency_name

_INF = math.inf
_MAX_HEADROOM = 100.0
# A failed request has no latency; for these metrics it counts as infinitely slow, so failures can
# only push a step towards failing (tpot only where the request asked for >= 2 output tokens).
_FAILURE_COUNTS_IN = ("ttft", "e2e", "tpot")
_REF_METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class StepSummary:
    """What one load step measured: its load, whether it met the SLO sustainably, its metrics."""

    load_step: int
    load_factor: float
    offered_rps: float
    passed: bool
    metrics: dict[str, float]
    phase: Phase = Phase.CLIMB

    @property
    def arrival_rps(self) -> float:
        """The measured arrival rate of the counted requests (the offered rate if none was measured)."""
        return float(self.metrics.get("arrival_rps", self.offered_rps))


@dataclass(frozen=True)
class Overload:
    """Growth of TTFT within a step: an overloaded server's queue, and so its TTFT, grows all along.

    `growth` is the least-squares slope of TTFT over send time (seconds per second: for a queue, about
    the load's excess over what the server sustains), `significant` whether its one-sided lower 95%
    bound is above 0 (with one independent observation per second of window, as requests within a
    second are not independent), and `projected_s` the TTFT the trend reaches `horizon_s` after the
    step's window.
    """

    growth: float
    significant: bool
    projected_s: float


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
    value = {"ttft": record.ttft_s, "tpot": record.tpot_s, "e2e": record.e2e_s, "queue": record.queue_s}[metric]
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


def slo_statistics(counted: Sequence[RequestRecord]) -> dict[str, float]:
    """Every metric x statistic as the SLO judges it, keyed `slo_{metric}_{stat}_s`.

    Failed requests count as infinitely slow for ttft, e2e and tpot (tpot only where the request asked
    for >= 2 output tokens); a statistic with no value at all is +inf, so it can never pass.
    """
    statistics = {}
    for metric in METRICS:
        values = [v for r in counted for v in request_values(r, metric)]
        values += [_INF for r in counted if _failure_counts(r, metric)]
        for name in STATS:
            statistics[slo_latency_name(metric, name)] = stat(values, name) if values else _INF
    return statistics


def judge(statistics: Mapping[str, float], slo: Slo) -> tuple[bool, float]:
    """(passed, headroom) of `slo` over statistics keyed as `slo_statistics` keys them.

    Passed iff every term's statistic is within its bound; headroom is the smallest bound / observed,
    capped at 100. A statistic missing from `statistics` counts as +inf.
    """
    observed = [(term, float(statistics.get(slo_latency_name(term.metric, term.stat), _INF))) for term in slo.terms]
    passed = all(value <= term.bound_s for term, value in observed)
    headroom = min((_headroom(term, value) for term, value in observed), default=_MAX_HEADROOM)
    return passed, headroom


def overload(counted: Sequence[RequestRecord], *, window_s: float, horizon_s: float) -> Overload | None:
    """How TTFT grew over the step's counted requests (see `Overload`); None with fewer than 3 seconds
    of window or 3 completed requests to fit a trend to."""
    done = sorted((r for r in counted if r.ok and r.ttft_s is not None), key=lambda r: r.sent_s)
    independent = min(len(done), math.floor(window_s))
    if independent < 3 or len(done) < 3:
        return None
    sent = np.array([r.sent_s for r in done])
    ttft = np.array([r.ttft_s for r in done], dtype=float)
    if np.ptp(sent) <= 0:
        return None
    fit = scipy_stats.linregress(sent, ttft)
    # Requests sent within the same second share the same queue: count one observation per second.
    stderr = float(fit.stderr) * math.sqrt(max(len(done) - 2, 1) / max(independent - 2, 1))
    lower = fit.slope - float(scipy_stats.t.ppf(0.95, max(independent - 2, 1))) * stderr
    end = float(sent[0]) + window_s
    projected = float(fit.intercept + fit.slope * (end + horizon_s))
    return Overload(float(fit.slope), bool(lower > 0), projected)


def summarize_step(
    records: Sequence[RequestRecord],
    slo: Slo,
    *,
    load_step: int,
    load_factor: float,
    offered_rps: float,
    window_s: float,
    horizon_s: float | None = None,
    phase: Phase = Phase.CLIMB,
) -> StepSummary:
    """Return the summary of one load step over its records (those in the warm-up are not counted).

    `window_s` is the planned length of the measured window (the counted requests' sends span it at
    the offered rate); rates divide by it, and `arrival_rps` is measured from the actual send times.
    With `horizon_s`, a step whose TTFT grows significantly enough to break the SLO's TTFT bound
    (else its e2e bound) within `horizon_s` after the window is not sustainable and fails (see
    `Overload`). Latency keys are left out for a metric no completed counted request has a value for.
    Raises ValueError if `window_s` <= 0.
    """
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, but got {window_s}")
    counted = [r for r in records if not r.in_warmup]
    completed = [r for r in counted if r.ok]
    metrics = {
        "load_step": float(load_step),
        "load_factor": float(load_factor),
        "offered_rps": float(offered_rps),
        "arrival_rps": _arrival_rps(counted, window_s),
        "measured_requests": float(len(counted)),
        "achieved_rps": len(completed) / window_s,
        "output_tok_s": sum(r.output_tokens for r in completed) / window_s,
        "failed_requests": float(len(counted) - len(completed)),
        # Warm-up included: a client that cannot keep to the schedule spoils the whole step.
        "send_lag_p99_s": stat([r.send_lag_s for r in records], "p99") if records else 0.0,
    }
    for metric in METRICS:
        values = [v for r in completed for v in request_values(r, metric)]
        if values:
            metrics.update({latency_name(metric, s): stat(values, s) for s in STATS})
    statistics = slo_statistics(counted)
    metrics.update(statistics)
    passed, headroom = judge(statistics, slo)
    growth = overload(counted, window_s=window_s, horizon_s=horizon_s) if horizon_s is not None else None
    if growth is not None:
        metrics["ttft_growth"] = growth.growth
        if growth.significant:
            metrics["ttft_projected_s"] = growth.projected_s
    overloaded, sustain_headroom = sustainable(metrics.get("ttft_projected_s"), slo)
    headroom = min(headroom, sustain_headroom)
    metrics["overloaded"] = float(overloaded)
    passed = passed and bool(counted) and not overloaded
    good = sum(1 for r in completed if all(_request_meets(r, term) for term in slo.terms))
    metrics.update(
        slo_pass=1.0 if passed else 0.0,
        slo_headroom=headroom if counted else 0.0,
        slo_attainment=good / len(counted) if counted else 0.0,
        goodput_rps=good / window_s,
    )
    return StepSummary(load_step, float(load_factor), float(offered_rps), passed, metrics, phase)


def _arrival_rps(counted: Sequence[RequestRecord], window_s: float) -> float:
    """Counted requests over the window their sends actually spanned (the planned window, stretched or
    shrunk by how late the last send was compared with the first)."""
    if not counted:
        return 0.0
    ordered = sorted(counted, key=lambda r: r.scheduled_s)
    span = window_s + ordered[-1].send_lag_s - ordered[0].send_lag_s
    return len(counted) / span if span > 0 else 0.0


def sustainable(projected_s: float | None, slo: Slo) -> tuple[bool, float]:
    """(overloaded, headroom) of a step whose TTFT trend projects to `projected_s` (None: no
    significant growth): overloaded when that breaks the SLO's TTFT bound, else its e2e bound."""
    bound = None
    for metric in ("ttft", "e2e"):
        bounds = [term.bound_s for term in slo.terms if term.metric == metric]
        if bounds:
            bound = min(bounds)
            break
    if projected_s is None or bound is None:
        return False, _MAX_HEADROOM
    return projected_s > bound, _headroom(SloTerm("ttft", "mean", bound), projected_s)


def observations(steps: Sequence[StepSummary], num_accelerators: int) -> list[Observation]:
    """The capacity search's view of the steps: nominal load, measured rate per accelerator, verdict."""
    return [Observation(s.load_factor, s.arrival_rps / num_accelerators, s.passed, s.phase) for s in steps]


def trial_metrics(
    steps: Sequence[StepSummary],
    *,
    num_accelerators: int,
    penalty_latency_s: float,
    ref_records: Sequence[RequestRecord] | None,
    failure_rule: str = "once",
) -> dict[str, float]:
    """Return the metrics a trial carries forward after each step: the capacity bracket so far and the
    latencies at the reference load.

    `ref_records` are the records of the step at the reference load, or None until it has run; the
    reference latencies are then `penalty_latency_s`, and a failed request counts as that penalty.
    `failure_rule` is the capacity search's (`tuner.capacity.bracket`).
    Raises ValueError for `num_accelerators` < 1 or a non-positive or infinite penalty.
    """
    if num_accelerators < 1:
        raise ValueError(f"num_accelerators must be >= 1, but got {num_accelerators}")
    if not (math.isfinite(penalty_latency_s) and penalty_latency_s > 0):
        raise ValueError(f"penalty_latency_s must be positive and finite, but got {penalty_latency_s}")
    found = bracket(observations(steps, num_accelerators), failure_rule)
    metrics = capacity_metrics(found, num_accelerators)
    counted = [r for r in ref_records or () if not r.in_warmup]
    for metric in _REF_METRICS:
        values = [v for r in counted for v in request_values(r, metric)]
        values += [penalty_latency_s for r in counted if _failure_counts(r, metric)]
        p95 = stat(values, "p95") if values else penalty_latency_s
        metrics[f"ref_{metric}_p95_s"] = min(p95, penalty_latency_s)
    return metrics


def capacity_metrics(found: Bracket, num_accelerators: int) -> dict[str, float]:
    """The capacity metrics of a bracket (per accelerator, and for the whole pool)."""
    metrics = {
        "capacity_rps": found.capacity * num_accelerators,
        "capacity_rps_per_accel": found.capacity,
        "capacity_lo_rps_per_accel": found.capacity,
        "capacity_censored": 1.0 if found.censored else 0.0,
        "capacity_inconsistent": 1.0 if found.inconsistent else 0.0,
    }
    if found.hi is not None:
        metrics["capacity_hi_rps_per_accel"] = found.hi
    return metrics


def _failure_counts(record: RequestRecord, metric: str) -> bool:
    return not record.ok and metric in _FAILURE_COUNTS_IN and (metric != "tpot" or record.output_tokens >= 2)


def _headroom(term: SloTerm, observed: float) -> float:
    if observed <= 0:
        return _MAX_HEADROOM
    return min(max(term.bound_s / observed, 0.0), _MAX_HEADROOM)


def _request_meets(record: RequestRecord, term: SloTerm) -> bool:
    """Whether one completed request meets the term on its own (undefined values are ignored)."""
    values = request_values(record, term.metric)
    return not values or stat(values, term.stat) <= term.bound_s
