"""Workload transformations: pure, composable, recorded in provenance, never silent about drops."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tuner.errors import ConfigError, WorkloadError
from tuner.workload.records import Request, Workload
from tuner.workload.transforms import (
    TransformSpec,
    apply_transforms,
    first_n,
    fit_to_context,
    sample_fraction,
    scale_lengths,
    scale_time,
    scale_to_rate,
    time_window,
)


def make(arrivals: list[float], prompts: list[int] | None = None, outputs: list[int] | None = None) -> Workload:
    prompts = prompts or [100] * len(arrivals)
    outputs = outputs or [10] * len(arrivals)
    return Workload(
        requests=tuple(
            Request(
                arrival_s=a,
                prompt_tokens=p,
                output_tokens=o,
                prefix_ids=tuple(range(math.ceil(p / 512))),
            )
            for a, p, o in zip(arrivals, prompts, outputs, strict=True)
        ),
        provenance={"source": "test.jsonl", "format": "canonical", "dropped": {}, "transforms": []},
    )


@st.composite
def workloads(draw: st.DrawFn, min_size: int = 1) -> Workload:
    gaps = draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=min_size, max_size=40))
    arrivals = [0.0]
    for gap in gaps[1:]:
        arrivals.append(arrivals[-1] + gap)
    size = len(arrivals)
    prompts = draw(st.lists(st.integers(1, 20_000), min_size=size, max_size=size))
    outputs = draw(st.lists(st.integers(1, 4_000), min_size=size, max_size=size))
    return make(arrivals, prompts, outputs)


@given(workloads(), st.floats(1e-3, 1e3))
def test_scale_time_preserves_order_and_count(workload: Workload, factor: float) -> None:
    scaled = scale_time(workload, factor)
    arrivals = [r.arrival_s for r in scaled.requests]
    assert len(arrivals) == len(workload.requests)
    assert arrivals == sorted(arrivals)
    assert arrivals == [r.arrival_s * factor for r in workload.requests]
    assert [r.prompt_tokens for r in scaled.requests] == [r.prompt_tokens for r in workload.requests]


@given(workloads(min_size=2), st.floats(1e-3, 1e4))
def test_target_rate_hits_the_rate(workload: Workload, target: float) -> None:
    if workload.duration_s <= 0:
        with pytest.raises(WorkloadError, match="span 0 s"):
            scale_to_rate(workload, target)
        return
    if not math.isfinite(workload.mean_rate_rps / target):
        with pytest.raises(WorkloadError, match="too short to scale"):
            scale_to_rate(workload, target)
        return
    scaled = scale_to_rate(workload, target)
    assert scaled.mean_rate_rps == pytest.approx(target, rel=1e-9)
    assert len(scaled.requests) == len(workload.requests)


@given(workloads(), st.integers(2, 30_000), st.sampled_from(["clip", "drop"]))
def test_fit_to_context(workload: Workload, max_model_len: int, overflow: str) -> None:
    over = sum(r.prompt_tokens + r.output_tokens > max_model_len for r in workload.requests)
    try:
        fitted = fit_to_context(workload, max_model_len, overflow)  # type: ignore[arg-type]
    except WorkloadError as exc:
        assert overflow == "drop" and over == len(workload.requests)
        assert "is empty after filtering" in str(exc)
        return
    assert all(r.prompt_tokens + r.output_tokens <= max_model_len for r in fitted.requests)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in fitted.requests)
    assert all(len(r.prefix_ids) <= math.ceil(r.prompt_tokens / 512) for r in fitted.requests)
    step = fitted.provenance["transforms"][-1]
    if overflow == "clip":
        assert len(fitted.requests) == len(workload.requests)
        assert step["clipped"] == over
        # Only the prompt is shortened while it can be: outputs shrink only down at prompt 1.
        for before, after in zip(workload.requests, fitted.requests, strict=True):
            assert after.output_tokens == before.output_tokens or after.prompt_tokens == 1
    else:
        assert len(fitted.requests) == len(workload.requests) - over
        assert step["dropped"] == over
        reason = f"longer than max_model_len {max_model_len}"
        assert fitted.provenance["dropped"].get(reason, 0) == over


def test_clip_example() -> None:
    workload = make([0.0, 1.0, 2.0], prompts=[3000, 100, 5000], outputs=[500, 100, 5000])
    fitted = fit_to_context(workload, 2048)
    assert [(r.prompt_tokens, r.output_tokens) for r in fitted.requests] == [
        (1548, 500),
        (100, 100),
        (1, 2047),
    ]
    assert fitted.requests[0].prefix_ids == (0, 1, 2, 3)


@given(workloads(), st.floats(0.01, 10), st.floats(0.01, 10))
def test_scale_lengths_rounds_and_keeps_one_token(workload: Workload, pf: float, of: float) -> None:
    scaled = scale_lengths(workload, pf, of)
    for before, after in zip(workload.requests, scaled.requests, strict=True):
        assert after.prompt_tokens == max(1, math.floor(before.prompt_tokens * pf + 0.5))
        assert after.output_tokens == max(1, math.floor(before.output_tokens * of + 0.5))
        assert len(after.prefix_ids) <= math.ceil(after.prompt_tokens / 512)


@given(workloads(), st.integers(1, 50))
def test_first_n(workload: Workload, n: int) -> None:
    assert first_n(workload, n).requests == workload.requests[:n]


@given(workloads(), st.floats(0, 500), st.floats(0.1, 500))
def test_time_window_rebases(workload: Workload, start: float, length: float) -> None:
    end = start + length
    inside = [r for r in workload.requests if start <= r.arrival_s < end]
    if not inside:
        with pytest.raises(WorkloadError, match="is empty after filtering"):
            time_window(workload, start, end)
        return
    window = time_window(workload, start, end)
    assert len(window.requests) == len(inside)
    assert window.requests[0].arrival_s == 0.0
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(inside)]
    assert [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(window.requests)] == pytest.approx(gaps)


@settings(max_examples=30)
@given(workloads(), st.floats(0.05, 1.0), st.integers(0, 1000))
def test_sample_fraction_is_seeded(workload: Workload, fraction: float, seed: int) -> None:
    try:
        once = sample_fraction(workload, fraction, seed)
    except WorkloadError:
        return
    assert sample_fraction(workload, fraction, seed).requests == once.requests
    assert once.requests[0].arrival_s == 0.0
    assert len(once.requests) <= len(workload.requests)


def test_sample_fraction_rate() -> None:
    workload = make([float(i) for i in range(20_000)])
    sampled = sample_fraction(workload, 0.25, seed=7)
    assert len(sampled.requests) == pytest.approx(5_000, rel=0.05)
    assert sampled.provenance["transforms"][-1]["seed"] == 7


def test_transforms_are_pure_and_recorded() -> None:
    workload = make([0.0, 1.0, 2.0, 3.0])
    before = copy.deepcopy(workload.provenance)
    result = scale_time(first_n(workload, 3), 2.0)
    assert workload.provenance == before
    assert result.provenance["transforms"] == [
        {"op": "first_n", "n": 3, "requests_before": 4, "requests_after": 3},
        {"op": "scale_time", "factor": 2.0, "requests_before": 3, "requests_after": 3},
    ]


@pytest.mark.parametrize(
    "call",
    [
        lambda w: first_n(w, 0),
        lambda w: time_window(w, 5.0, 5.0),
        lambda w: time_window(w, -1.0),
        lambda w: sample_fraction(w, 0.0),
        lambda w: scale_time(w, 0.0),
        lambda w: scale_time(w, float("nan")),
        lambda w: scale_to_rate(w, -1.0),
        lambda w: scale_lengths(w, 0.0),
        lambda w: fit_to_context(w, 1),
        lambda w: fit_to_context(w, 100, "truncate"),
    ],
)
def test_bad_arguments(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="must"):
        call(make([0.0, 1.0]))


def test_apply_transforms_in_order() -> None:
    workload = make([float(i) for i in range(100)], prompts=[3000, 1000] * 50, outputs=[100] * 100)
    spec = TransformSpec(
        window_start_s=10,
        window_end_s=60,
        first_n=20,
        prompt_scale=0.5,
        output_scale=2,
        max_model_len=1000,
        overflow="drop",
        target_rate_rps=4.0,
    )
    result = apply_transforms(workload, spec)
    assert [step["op"] for step in result.provenance["transforms"]] == [
        "time_window",
        "first_n",
        "scale_lengths",
        "fit_to_context",
        "scale_to_rate",
    ]
    # 50 in the window, the first 20 of them, half of those too long once lengths are scaled.
    assert [(r.prompt_tokens, r.output_tokens) for r in result.requests] == [(500, 200)] * 10
    assert result.provenance["dropped"] == {"longer than max_model_len 1000": 10}
    assert result.mean_rate_rps == pytest.approx(4.0)


def test_apply_transforms_empty_result() -> None:
    workload = make([0.0, 1.0], prompts=[3000, 3000])
    with pytest.raises(WorkloadError, match=r"^test.jsonl: workload is empty after filtering \(fit_to_context"):
        apply_transforms(workload, TransformSpec(max_model_len=100, overflow="drop"))


def test_apply_empty_spec_is_identity() -> None:
    workload = make([0.0, 1.0])
    assert apply_transforms(workload, TransformSpec()) == workload


@pytest.mark.parametrize(
    "data",
    [
        {"first": 3},
        {"first_n": 0},
        {"time_scale": -1},
        {"time_scale": 2, "target_rate_rps": 3},
        {"window_start_s": 5, "window_end_s": 5},
        {"overflow": "truncate"},
        {"sample_fraction": 1.5},
        {"target_rate_rps": float("inf")},
    ],
)
def test_spec_validation(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        TransformSpec.model_validate(data)
