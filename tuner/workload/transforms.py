"""Pure transformations of a Workload, each recorded as a step in `provenance["transforms"]`.

Every function returns a new Workload and leaves its argument untouched. Selections (window,
first N, sampling) re-base arrivals so the first kept request arrives at 0 s. Requests dropped for
not fitting the model's context are counted in the step and in `provenance["dropped"]`; clipped
ones are counted in the step. Anything random takes a seed.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.errors import ConfigError, WorkloadError
from tuner.workload.records import PREFIX_BLOCK_TOKENS, Request, Workload

Overflow = Literal["clip", "drop"]


def _derive(
    workload: Workload,
    requests: Sequence[Request],
    step: dict[str, Any],
    dropped: dict[str, int] | None = None,
) -> Workload:
    """Build the transformed Workload with `step` appended; raise WorkloadError if it is empty."""
    provenance = copy.deepcopy(workload.provenance)
    step = {**step, "requests_before": len(workload.requests), "requests_after": len(requests)}
    provenance.setdefault("transforms", []).append(step)
    if dropped:
        totals = provenance.setdefault("dropped", {})
        for reason, count in dropped.items():
            totals[reason] = totals.get(reason, 0) + count
    if not requests:
        source = provenance.get("source", "workload")
        details = ", ".join(f"{key}={value}" for key, value in step.items() if key != "op")
        raise WorkloadError(f"{source}: workload is empty after filtering ({step['op']}: {details})")
    return Workload(requests=tuple(requests), provenance=provenance)


def _rebased(requests: Sequence[Request]) -> list[Request]:
    """Shift arrivals so the first request arrives at 0 s."""
    if not requests:
        return []
    origin = requests[0].arrival_s
    return [replace(r, arrival_s=r.arrival_s - origin) for r in requests]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def first_n(workload: Workload, n: int) -> Workload:
    """Keep the first `n` requests. Raises ConfigError unless n >= 1."""
    _require(n >= 1, f"`n >= 1` must hold, but got n={n}")
    return _derive(workload, workload.requests[:n], {"op": "first_n", "n": n})


def time_window(workload: Workload, start_s: float = 0.0, end_s: float | None = None) -> Workload:
    """Keep requests arriving in [start_s, end_s) and re-base them so the first arrives at 0 s.

    `end_s=None` keeps everything from `start_s` on. Raises ConfigError unless 0 <= start < end.
    """
    _require(start_s >= 0, f"`start_s >= 0` must hold, but got start_s={start_s}")
    _require(
        end_s is None or end_s > start_s,
        f"`start_s < end_s` must hold, but got start_s={start_s}, end_s={end_s}",
    )
    kept = [r for r in workload.requests if r.arrival_s >= start_s and (end_s is None or r.arrival_s < end_s)]
    return _derive(workload, _rebased(kept), {"op": "time_window", "start_s": start_s, "end_s": end_s})


def sample_fraction(workload: Workload, fraction: float, seed: int = 0) -> Workload:
    """Keep each request independently with probability `fraction` (seeded), then re-base.

    Thinning lowers the rate while keeping the trace's burst shape. Raises ConfigError unless
    0 < fraction <= 1.
    """
    _require(0 < fraction <= 1, f"`0 < fraction <= 1` must hold, but got fraction={fraction}")
    keep = np.random.default_rng(seed).random(len(workload.requests)) < fraction
    kept = [r for r, chosen in zip(workload.requests, keep, strict=True) if chosen]
    return _derive(workload, _rebased(kept), {"op": "sample_fraction", "fraction": fraction, "seed": seed})


def scale_time(workload: Workload, factor: float) -> Workload:
    """Multiply every arrival time by `factor`: 0.5 halves the gaps, doubling the rate.

    Raises ConfigError unless factor is finite and > 0.
    """
    _require(
        math.isfinite(factor) and factor > 0,
        f"`time scale factor > 0` must hold, but got {factor}",
    )
    scaled = [replace(r, arrival_s=r.arrival_s * factor) for r in workload.requests]
    return _derive(workload, scaled, {"op": "scale_time", "factor": factor})


def scale_to_rate(workload: Workload, target_rps: float) -> Workload:
    """Scale arrival times so the mean rate ((n - 1) / span) becomes `target_rps`.

    Raises ConfigError unless target_rps > 0; WorkloadError if the workload spans no time (fewer
    than two requests, or all at once), since no time scaling changes its rate.
    """
    _require(
        math.isfinite(target_rps) and target_rps > 0,
        f"`target rate > 0` must hold, but got {target_rps}",
    )
    if workload.duration_s <= 0:
        raise WorkloadError(
            f"{workload.provenance.get('source', 'workload')}: cannot scale to {target_rps} req/s: "
            f"its {len(workload.requests)} request(s) span 0 s"
        )
    factor = workload.mean_rate_rps / target_rps
    if not math.isfinite(factor):
        raise WorkloadError(
            f"{workload.provenance.get('source', 'workload')}: cannot scale to {target_rps} req/s: "
            f"its span of {workload.duration_s:g} s is too short to scale"
        )
    scaled = [replace(r, arrival_s=r.arrival_s * factor) for r in workload.requests]
    return _derive(
        workload,
        scaled,
        {"op": "scale_to_rate", "target_rps": target_rps, "factor": factor},
    )


def _scaled_count(count: int, factor: float) -> int:
    """`count * factor` rounded half up, at least 1."""
    return max(1, math.floor(count * factor + 0.5))


def _with_prompt(request: Request, prompt_tokens: int) -> Request:
    """The request with a new prompt length: prefix blocks past it cut, text (now wrong) removed."""
    blocks = math.ceil(prompt_tokens / PREFIX_BLOCK_TOKENS)
    return replace(
        request,
        prompt_tokens=prompt_tokens,
        prefix_ids=request.prefix_ids[:blocks],
        prompt_text=None,
    )


def scale_lengths(workload: Workload, prompt_factor: float = 1.0, output_factor: float = 1.0) -> Workload:
    """Multiply prompt and output lengths by their factors (rounded half up, at least 1 token).

    A changed prompt loses prefix blocks beyond its new length and its text, which no longer
    matches. Raises ConfigError unless both factors are finite and > 0.
    """
    for name, factor in (("prompt_factor", prompt_factor), ("output_factor", output_factor)):
        _require(math.isfinite(factor) and factor > 0, f"`{name} > 0` must hold, but got {factor}")
    scaled = []
    for request in workload.requests:
        prompt = _scaled_count(request.prompt_tokens, prompt_factor)
        new = request if prompt == request.prompt_tokens else _with_prompt(request, prompt)
        scaled.append(replace(new, output_tokens=_scaled_count(request.output_tokens, output_factor)))
    return _derive(
        workload,
        scaled,
        {"op": "scale_lengths", "prompt_factor": prompt_factor, "output_factor": output_factor},
    )


def fit_to_context(workload: Workload, max_model_len: int, overflow: Overflow = "clip") -> Workload:
    """Make every request fit `max_model_len` (prompt + output tokens), counting what changed.

    "clip" shortens the prompt first, then the output, keeping at least 1 token of each; "drop"
    removes the request (counted under provenance["dropped"]). Raises ConfigError unless
    max_model_len >= 2 and overflow is "clip" or "drop".
    """
    _require(max_model_len >= 2, f"`max_model_len >= 2` must hold, but got {max_model_len}")
    _require(overflow in ("clip", "drop"), f"overflow must be 'clip' or 'drop', but got {overflow!r}")
    kept: list[Request] = []
    changed = 0
    for request in workload.requests:
        if request.prompt_tokens + request.output_tokens <= max_model_len:
            kept.append(request)
            continue
        changed += 1
        if overflow == "clip":
            prompt = max(1, max_model_len - request.output_tokens)
            clipped = _with_prompt(request, prompt) if prompt != request.prompt_tokens else request
            kept.append(replace(clipped, output_tokens=min(request.output_tokens, max_model_len - prompt)))
    step = {"op": "fit_to_context", "max_model_len": max_model_len, "overflow": overflow}
    if overflow == "clip":
        return _derive(workload, kept, {**step, "clipped": changed})
    reason = f"longer than max_model_len {max_model_len}"
    return _derive(
        workload,
        _rebased(kept),
        {**step, "dropped": changed},
        {reason: changed} if changed else None,
    )


class TransformSpec(BaseModel):
    """The `workload.transforms` section of a search config; every option is optional.

    Applied in this order: time window, first N, sampling, length scaling, fit to context, then
    time scaling or target rate (at most one of the two), so the rate asked for is the rate
    replayed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    window_start_s: float | None = Field(None, ge=0, description="keep arrivals >= this (s)")
    window_end_s: float | None = Field(None, gt=0, description="keep arrivals < this (s)")
    first_n: int | None = Field(None, ge=1, description="keep the first N requests")
    sample_fraction: float | None = Field(
        None, gt=0, le=1, description="keep each request with this probability (seeded)"
    )
    prompt_scale: float = Field(1.0, gt=0, description="multiply prompt lengths")
    output_scale: float = Field(1.0, gt=0, description="multiply output lengths")
    max_model_len: int | None = Field(None, ge=2, description="fit prompt + output to this")
    overflow: Overflow = Field("clip", description="what to do with requests over max_model_len")
    time_scale: float | None = Field(None, gt=0, description="multiply arrival times")
    target_rate_rps: float | None = Field(None, gt=0, description="scale times to this mean rate")
    seed: int = Field(0, description="seed for anything random (sampling)")

    @model_validator(mode="after")
    def _consistent(self) -> TransformSpec:
        start = self.window_start_s or 0.0
        if self.window_end_s is not None and self.window_end_s <= start:
            raise ValueError(f"`window_start_s < window_end_s` must hold, but got {start} and {self.window_end_s}")
        if self.time_scale is not None and self.target_rate_rps is not None:
            raise ValueError("give time_scale or target_rate_rps, not both")
        return self


def apply_transforms(workload: Workload, spec: TransformSpec) -> Workload:
    """Apply the spec's transformations in their fixed order; options left unset are skipped.

    Raises WorkloadError when a step leaves no request ("... is empty after filtering").
    """
    if spec.window_start_s is not None or spec.window_end_s is not None:
        workload = time_window(workload, spec.window_start_s or 0.0, spec.window_end_s)
    if spec.first_n is not None:
        workload = first_n(workload, spec.first_n)
    if spec.sample_fraction is not None:
        workload = sample_fraction(workload, spec.sample_fraction, spec.seed)
    if spec.prompt_scale != 1.0 or spec.output_scale != 1.0:
        workload = scale_lengths(workload, spec.prompt_scale, spec.output_scale)
    if spec.max_model_len is not None:
        workload = fit_to_context(workload, spec.max_model_len, spec.overflow)
    if spec.time_scale is not None:
        workload = scale_time(workload, spec.time_scale)
    if spec.target_rate_rps is not None:
        workload = scale_to_rate(workload, spec.target_rate_rps)
    return workload
