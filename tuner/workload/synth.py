"""Synthetic workloads: Poisson or Gamma arrivals at a rate, lengths fitted from a reference trace.

Lengths are lognormal, fitted by the moments of log(length) of the reference workload, rounded and
clipped to the reference's min and max. Prompt and output lengths are drawn independently and
synthetic requests share no prefix blocks. Everything is reproducible from the seed.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal

import numpy as np

from tuner.errors import ConfigError
from tuner.workload.records import Request, Workload

Arrivals = Literal["poisson", "gamma"]


def fit_lognormal(values: list[int]) -> dict[str, float]:
    """Fit a lognormal by log-moments: mu and sigma of log(values), and min and max to clip to."""
    logs = np.log(np.array(values, dtype=float))
    return {
        "mu": float(logs.mean()),
        "sigma": float(logs.std()),
        "min": float(min(values)),
        "max": float(max(values)),
    }


def _lengths(rng: np.random.Generator, fit: dict[str, float], count: int) -> list[int]:
    drawn = np.rint(rng.lognormal(fit["mu"], fit["sigma"], size=count))
    return [int(v) for v in np.clip(drawn, fit["min"], fit["max"])]


def _gaps(rng: np.random.Generator, arrivals: Arrivals, rate_rps: float, cv: float, count: int) -> np.ndarray:
    """Inter-arrival gaps with mean 1 / rate: exponential, or Gamma with shape 1 / cv^2."""
    if arrivals == "poisson":
        return rng.exponential(1.0 / rate_rps, size=count)
    shape = 1.0 / cv**2
    return rng.gamma(shape, 1.0 / (rate_rps * shape), size=count)


def arrival_times(
    rng: np.random.Generator,
    *,
    rate_rps: float,
    arrivals: Arrivals,
    cv: float,
    count: int | None,
    duration_s: float | None,
) -> list[float]:
    """Arrival times from 0 s: `count` of them, or all those before `duration_s`."""
    if count is not None:
        return [0.0, *np.cumsum(_gaps(rng, arrivals, rate_rps, cv, count - 1)).tolist()]
    assert duration_s is not None
    times = [0.0]
    batch = max(16, int(rate_rps * duration_s * 1.2))
    while times[-1] < duration_s:
        times.extend((times[-1] + np.cumsum(_gaps(rng, arrivals, rate_rps, cv, batch))).tolist())
    return [t for t in times if t < duration_s]


def synthesize(
    reference: Workload,
    *,
    rate_rps: float,
    duration_s: float | None = None,
    count: int | None = None,
    arrivals: Arrivals = "poisson",
    cv: float = 1.0,
    seed: int = 0,
) -> Workload:
    """Generate a workload at `rate_rps` with lengths fitted from `reference`.

    Give exactly one of `duration_s` (arrivals in [0, duration_s)) or `count`. `cv` is the
    coefficient of variation of Gamma inter-arrival gaps (1 is as bursty as Poisson; ignored for
    "poisson"). The provenance records the parameters, the fit and the reference's provenance.
    Raises ConfigError for bad parameters.
    """
    if (duration_s is None) == (count is None):
        raise ConfigError("give exactly one of duration_s or count")
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ConfigError(f"`rate_rps > 0` must hold, but got {rate_rps}")
    if count is not None and count < 1:
        raise ConfigError(f"`count >= 1` must hold, but got {count}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"`duration_s > 0` must hold, but got {duration_s}")
    if arrivals not in ("poisson", "gamma"):
        raise ConfigError(f"arrivals must be 'poisson' or 'gamma', but got {arrivals!r}")
    if not (math.isfinite(cv) and cv > 0):
        raise ConfigError(f"`cv > 0` must hold, but got {cv}")
    if not reference.requests:
        raise ConfigError("the reference workload has no requests to fit lengths from")
    rng = np.random.default_rng(seed)
    times = arrival_times(rng, rate_rps=rate_rps, arrivals=arrivals, cv=cv, count=count, duration_s=duration_s)
    prompt_fit = fit_lognormal([r.prompt_tokens for r in reference.requests])
    output_fit = fit_lognormal([r.output_tokens for r in reference.requests])
    prompts = _lengths(rng, prompt_fit, len(times))
    outputs = _lengths(rng, output_fit, len(times))
    requests = tuple(
        Request(arrival_s=t, prompt_tokens=p, output_tokens=o) for t, p, o in zip(times, prompts, outputs, strict=True)
    )
    parameters: dict[str, Any] = {
        "arrivals": arrivals,
        "rate_rps": rate_rps,
        "cv": cv if arrivals == "gamma" else 1.0,
        "count": count,
        "duration_s": duration_s,
        "seed": seed,
        "lengths": "lognormal by log-moments, clipped to the reference's min/max",
        "prompt_fit": prompt_fit,
        "output_fit": output_fit,
    }
    provenance: dict[str, Any] = {
        "source": f"synth from {reference.provenance.get('source', 'workload')}",
        "format": "synth",
        "detected": None,
        "time_unit": None,
        "sha256": None,
        "rows_read": None,
        "dropped": {},
        "synth": parameters,
        "fitted_from": copy.deepcopy(reference.provenance),
        "transforms": [],
    }
    return Workload(requests=requests, provenance=provenance)
