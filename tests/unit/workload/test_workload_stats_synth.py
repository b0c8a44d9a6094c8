"""Workload summaries and synthetic workloads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.workload import load_workload, summarize, synthesize
from tuner.workload.records import Request, Workload
from tuner.workload.stats import burstiness_cv, prefix_sharing_ratio


def make(arrivals: list[float], prefixes: list[tuple[int, ...]] | None = None) -> Workload:
    prefixes = prefixes or [()] * len(arrivals)
    return Workload(
        requests=tuple(
            Request(arrival_s=a, prompt_tokens=10 * (i + 1), output_tokens=i + 1, prefix_ids=p)
            for i, (a, p) in enumerate(zip(arrivals, prefixes, strict=True))
        ),
        provenance={"source": "t", "format": "canonical", "dropped": {"x": 2}, "transforms": []},
    )


def test_burstiness() -> None:
    assert burstiness_cv(make([0.0, 1.0, 2.0, 3.0])) == 0.0
    # gaps 1 and 3: mean 2, population std 1
    assert burstiness_cv(make([0.0, 1.0, 4.0])) == pytest.approx(0.5)
    assert burstiness_cv(make([0.0, 1.0])) is None
    assert burstiness_cv(make([0.0, 0.0, 0.0])) is None


def test_prefix_sharing_ratio() -> None:
    requests = make(
        [0.0, 1.0, 2.0, 3.0],
        [(1, 2, 3), (1, 2, 4), (1, 5), (9, 2, 3)],
    ).requests
    # Shared: request 2 repeats (1, 2); request 3 repeats (1,); request 4 nothing (9 never led).
    assert prefix_sharing_ratio(requests) == pytest.approx(3 / 11)
    assert prefix_sharing_ratio(make([0.0]).requests) is None


def test_prefix_sharing_on_mooncake_matches_a_naive_count(traces: Path) -> None:
    workload = load_workload(traces / "mooncake_conversation_first3000.jsonl")
    requests = workload.requests[:400]
    seen: set[tuple[int, ...]] = set()
    shared = total = 0
    for request in requests:
        ids = request.prefix_ids
        run = 0
        while run < len(ids) and ids[: run + 1] in seen:
            run += 1
        shared += run
        total += len(ids)
        seen.update(ids[:k] for k in range(1, len(ids) + 1))
    assert prefix_sharing_ratio(requests) == pytest.approx(shared / total)


def test_summarize() -> None:
    summary = summarize(make([0.0, 1.0, 4.0]))
    json.dumps(summary)  # serialisable as is
    assert summary["requests"] == 3
    assert summary["duration_s"] == 4.0
    assert summary["mean_rate_rps"] == 0.5
    assert summary["burstiness_cv"] == pytest.approx(0.5)
    assert summary["prompt_tokens"] == {
        "mean": 20.0,
        "p50": 20.0,
        "p90": 28.0,
        "p99": 29.8,
        "max": 30.0,
    }
    assert summary["output_tokens"]["max"] == 3.0
    assert summary["prefix_sharing_ratio"] is None
    assert summary["dropped"] == {"x": 2}


def test_summarize_real_trace(traces: Path) -> None:
    summary = summarize(load_workload(traces / "AzureLLMInferenceTrace_conv.csv"))
    assert summary["requests"] == 19_366
    assert summary["mean_rate_rps"] == pytest.approx(19_365 / 3501.721937)
    assert summary["prompt_tokens"]["p50"] == 1020.0  # as the traces README says
    assert summary["output_tokens"]["p50"] == 129.0


def test_synth_reproducible_and_sized(traces: Path) -> None:
    reference = load_workload(traces / "AzureLLMInferenceTrace_conv.csv")
    once = synthesize(reference, rate_rps=5.0, count=500, seed=11)
    assert synthesize(reference, rate_rps=5.0, count=500, seed=11).requests == once.requests
    assert synthesize(reference, rate_rps=5.0, count=500, seed=12).requests != once.requests
    assert len(once.requests) == 500
    assert once.requests[0].arrival_s == 0.0
    prompts = [r.prompt_tokens for r in reference.requests]
    assert all(min(prompts) <= r.prompt_tokens <= max(prompts) for r in once.requests)
    assert once.provenance["synth"]["seed"] == 11
    assert once.provenance["fitted_from"]["sha256"] == reference.provenance["sha256"]


def test_synth_duration_and_rate(traces: Path) -> None:
    reference = load_workload(traces / "BurstGPT_1.first400.csv")
    generated = synthesize(reference, rate_rps=20.0, duration_s=600.0, seed=1)
    assert all(r.arrival_s < 600.0 for r in generated.requests)
    assert len(generated.requests) == pytest.approx(12_000, rel=0.05)
    assert burstiness_cv(generated) == pytest.approx(1.0, abs=0.05)


def test_synth_gamma_cv(traces: Path) -> None:
    reference = load_workload(traces / "BurstGPT_1.first400.csv")
    generated = synthesize(reference, rate_rps=8.0, count=40_000, arrivals="gamma", cv=3.0, seed=2)
    assert generated.mean_rate_rps == pytest.approx(8.0, rel=0.05)
    assert burstiness_cv(generated) == pytest.approx(3.0, rel=0.1)


def test_synth_fits_log_moments(traces: Path) -> None:
    reference = load_workload(traces / "AzureLLMInferenceTrace_conv.csv")
    generated = synthesize(reference, rate_rps=1.0, count=20_000, seed=3)
    logs = np.log([r.output_tokens for r in generated.requests])
    fit = generated.provenance["synth"]["output_fit"]
    assert logs.mean() == pytest.approx(fit["mu"], abs=0.05)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_rps": 1.0},
        {"rate_rps": 1.0, "count": 3, "duration_s": 3.0},
        {"rate_rps": 0.0, "count": 3},
        {"rate_rps": 1.0, "count": 0},
        {"rate_rps": 1.0, "count": 3, "arrivals": "gamma", "cv": 0.0},
        {"rate_rps": 1.0, "count": 3, "arrivals": "uniform"},
    ],
)
def test_synth_bad_parameters(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        synthesize(make([0.0, 1.0]), **kwargs)  # type: ignore[arg-type]
