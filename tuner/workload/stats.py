"""Summary statistics of a Workload: size, rate, burstiness, length percentiles, prefix sharing."""

from __future__ import annotations

from typing import Any

import numpy as np

from tuner.workload.records import Request, Workload


def burstiness_cv(workload: Workload) -> float | None:
    """Coefficient of variation (std / mean) of inter-arrival gaps: 1 for Poisson, more is burstier.

    None when undefined: fewer than two gaps, or all requests at the same instant.
    """
    arrivals = np.array([r.arrival_s for r in workload.requests], dtype=float)
    gaps = np.diff(arrivals)
    if len(gaps) < 2 or gaps.mean() <= 0:
        return None
    return float(gaps.std() / gaps.mean())


def length_percentiles(values: list[int]) -> dict[str, float] | None:
    """Mean, p50, p90, p99 (linear interpolation) and max of token lengths; None if no values."""
    if not values:
        return None
    array = np.array(values, dtype=float)
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return {
        "mean": float(array.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(array.max()),
    }


def prefix_sharing_ratio(requests: tuple[Request, ...]) -> float | None:
    """Fraction of prefix blocks that repeat an earlier request's leading blocks.

    For each request, the longest leading run of its `prefix_ids` that also led some earlier
    request counts as shared (a prefix cache with unbounded room would hit those blocks).
    None when no request has prefix ids.
    """
    trie: dict[int, Any] = {}
    total = 0
    shared = 0
    for request in requests:
        node = trie
        matching = True
        for block in request.prefix_ids:
            total += 1
            child = node.get(block)
            if matching and child is not None:
                shared += 1
            else:
                matching = False
                if child is None:
                    child = node[block] = {}
            node = child
    return shared / total if total else None


def summarize(workload: Workload) -> dict[str, Any]:
    """A JSON-serialisable summary of the workload, with where it came from and what was dropped.

    Keys: requests, duration_s, mean_rate_rps, burstiness_cv, prompt_tokens and output_tokens
    ({mean, p50, p90, p99, max}), prefix_sharing_ratio, dropped, and from provenance: source,
    format, detected, time_unit, sha256, rows_read, transforms.
    """
    requests = workload.requests
    provenance = workload.provenance
    return {
        "source": provenance.get("source"),
        "format": provenance.get("format"),
        "detected": provenance.get("detected"),
        "time_unit": provenance.get("time_unit"),
        "sha256": provenance.get("sha256"),
        "rows_read": provenance.get("rows_read"),
        "requests": len(requests),
        "duration_s": workload.duration_s,
        "mean_rate_rps": workload.mean_rate_rps,
        "burstiness_cv": burstiness_cv(workload),
        "prompt_tokens": length_percentiles([r.prompt_tokens for r in requests]),
        "output_tokens": length_percentiles([r.output_tokens for r in requests]),
        "prefix_sharing_ratio": prefix_sharing_ratio(requests),
        "dropped": dict(provenance.get("dropped", {})),
        "transforms": list(provenance.get("transforms", [])),
    }
