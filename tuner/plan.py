"""The replica plan: how many replicas the traffic needs, from the confirmed capacity of one replica.

- **Capacity of one replica**: the exported trial's capacity per accelerator, as a lower bound (the
  lowest of its confirmation measurements; its trial's own when there was no confirmation) times the
  accelerators of one replica (`tensor_parallel_size`).
- **Operating point**: that capacity less a stated headroom (default 20%): the rate per replica the plan
  runs at, and the one `tuner validate` checks.
- **Rates to serve**: the workload's rate profile (requests per minute in whole minutes, as requests/s:
  trough, mean, p99, peak), recorded by the search, or one `--target-rps`.
- **Replicas** for a rate R: ceil(R / operating point), at least 1. With a profile, Ray Serve autoscales
  between the trough's and the peak's replica counts, aiming at `target_ongoing_requests` per replica:
  by Little's law, the operating rate times the mean end-to-end latency the trial measured at its
  highest passing load step not above the operating point.

Pure functions on recorded values: nothing here is measured anew.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.recorded import SearchRecord, TrialRow

DEFAULT_HEADROOM = 0.2
MINUTE_S = 60.0
PROFILE_KEYS = ("trough", "mean", "p99", "peak")


def rate_profile(arrivals_s: Sequence[float], bin_s: float = MINUTE_S) -> dict[str, float] | None:
    """Requests/s per whole `bin_s` of the trace (a trailing partial bin is left out): trough, mean, p99,
    peak. A trace shorter than one bin is one bin as long as the trace. None for fewer than 2 arrivals."""
    times = np.sort(np.asarray(arrivals_s, dtype=float))
    if times.size < 2:
        return None
    start, end = float(times[0]), float(times[-1])
    span = end - start
    if span <= 0:
        return None
    whole = int(span // bin_s)
    if whole == 0:
        rate = times.size / span
        return {"bin_s": span, "bins": 1, "trough": rate, "mean": rate, "p99": rate, "peak": rate}
    index = ((times - start) // bin_s).astype(int)  # minute k holds [start + k bin_s, start + (k + 1) bin_s)
    rates = np.bincount(index[index < whole], minlength=whole) / bin_s
    return {
        "bin_s": bin_s,
        "bins": whole,
        "trough": float(rates.min()),
        "mean": float(rates.mean()),
        "p99": float(np.percentile(rates, 99)),
        "peak": float(rates.max()),
    }


def confirmed_lower_bound(record: SearchRecord, trial: TrialRow) -> tuple[float, str]:
    """The exported trial's capacity per accelerator to plan with, and where it comes from: the lowest
    of its confirmation measurements (0 if one passed no load), else its trial's own capacity."""
    rounds = (record.verdict.get("measurements") or {}).get(trial.trial_id) or []
    if rounds:
        values = [float(m.get("capacity_rps_per_accel") or 0) for m in rounds]
        return min(values), f"the lowest of its {len(values)} confirmation measurements"
    return trial.capacity, "its trial's capacity search (no confirmation measured it)"


@dataclass(frozen=True)
class ReplicaPlan:
    capacity_rps: float  # one replica, lower bound
    capacity_source: str
    headroom: float
    operating_rps: float  # one replica, the plan's operating point
    rates: Mapping[str, float]  # PROFILE_KEYS from the workload, or {"target": R}
    replicas: Mapping[str, int]  # replicas each rate needs
    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float | None
    in_flight_source: str

    @property
    def autoscales(self) -> bool:
        return self.max_replicas > self.min_replicas

    def autoscaling_config(self) -> dict[str, Any] | None:
        """Ray Serve's `autoscaling_config` (it replaces `num_replicas`), or None for a fixed count."""
        if not self.autoscales:
            return None
        config: dict[str, Any] = {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas}
        if self.target_ongoing_requests is not None:
            config["target_ongoing_requests"] = self.target_ongoing_requests
        return config

    def lines(self) -> list[str]:
        """The plan in words, for the exported files' comments."""
        rates = ", ".join(f"{k} {v:.3g}" for k, v in self.rates.items())
        counts = ", ".join(f"{k} {v}" for k, v in self.replicas.items())
        lines = [
            f"Replica plan: one replica sustains >= {self.capacity_rps:.3g} requests/s ({self.capacity_source});",
            f"planned at {self.operating_rps:.3g} requests/s per replica ({self.headroom:.0%} headroom).",
            f"Rates to serve (requests/s): {rates}; replicas needed: {counts}.",
        ]
        if self.autoscales:
            ongoing = (
                f", target_ongoing_requests {self.target_ongoing_requests:g} ({self.in_flight_source})"
                if self.target_ongoing_requests is not None
                else ""
            )
            lines.append(f"Ray Serve autoscales {self.min_replicas}-{self.max_replicas} replicas{ongoing}.")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "capacity_rps_per_replica": self.capacity_rps,
            "capacity_source": self.capacity_source,
            "headroom": self.headroom,
            "operating_rps_per_replica": self.operating_rps,
            "rates_rps": dict(self.rates),
            "replicas": dict(self.replicas),
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "autoscaling_config": self.autoscaling_config(),
            "target_ongoing_requests": self.target_ongoing_requests,
            "in_flight_source": self.in_flight_source,
            "text": " ".join(self.lines()),
        }


def replicas_for(rate_rps: float, operating_rps: float) -> int:
    return max(1, math.ceil(rate_rps / operating_rps - 1e-9))


def replica_plan(
    record: SearchRecord, trial: TrialRow, *, headroom: float = DEFAULT_HEADROOM, target_rps: float | None = None
) -> ReplicaPlan | None:
    """The plan for `trial` (see the module docstring); None when its capacity is 0 or there is no rate to
    plan for (no `target_rps` and no rate profile recorded with the search)."""
    capacity, source = confirmed_lower_bound(record, trial)
    if capacity <= 0:
        return None
    per_replica = capacity * int(trial.params.get("tensor_parallel_size", 1) or 1)
    operating = per_replica * (1 - headroom)
    if target_rps is not None:
        rates: dict[str, float] = {"target": float(target_rps)}
    else:
        profile = record.workload.get("rate_profile") or {}
        if not all(isinstance(profile.get(k), int | float) for k in PROFILE_KEYS):
            return None
        rates = {k: float(profile[k]) for k in PROFILE_KEYS}
    replicas = {k: replicas_for(v, operating) for k, v in rates.items()}
    low, high = min(replicas.values()), max(replicas.values())
    ongoing, in_flight = little(trial, operating)
    return ReplicaPlan(per_replica, source, headroom, operating, rates, replicas, low, high, ongoing, in_flight)


def no_plan_reason(record: SearchRecord, trial: TrialRow) -> str:
    """Why `replica_plan` gave None for `trial`, in one sentence for the exported files."""
    capacity, source = confirmed_lower_bound(record, trial)
    if capacity <= 0:
        return (
            f"No replica plan: {source} is 0 requests/s (it passed no load there), so no rate can be planned "
            "at it; the replica count is the trial's."
        )
    return (
        "No replica plan: the search recorded no rate profile of its workload; give --target-rps to plan one "
        "(the replica count is the trial's)."
    )


def little(trial: TrialRow, operating_rps: float) -> tuple[float | None, str]:
    """Requests in flight per replica at `operating_rps` by Little's law, L = rate x mean E2E latency, the
    latency from the trial's highest passing load step at or below that rate per replica."""
    accelerators = float(trial.metrics.get("num_accelerators", 1.0) or 1.0)
    per_replica_accelerators = int(trial.params.get("tensor_parallel_size", 1) or 1)
    replicas = max(1.0, accelerators / per_replica_accelerators)
    steps = [
        s
        for s in trial.steps
        if s.get("slo_pass") and s.get("e2e_mean_s") is not None and math.isfinite(s["e2e_mean_s"])
    ]
    below = [s for s in steps if float(s.get("offered_rps", 0)) / replicas <= operating_rps * (1 + 1e-9)]
    if not below:
        return None, "no passing load step at or below the operating point measured an E2E latency"
    step = max(below, key=lambda s: float(s.get("offered_rps", 0)))
    latency = float(step["e2e_mean_s"])
    rate = float(step.get("offered_rps", 0)) / replicas
    ongoing = max(1.0, round(operating_rps * latency, 1))
    return ongoing, f"Little's law: {operating_rps:.3g}/s x mean E2E {latency:.3g} s measured at {rate:.3g}/s"
