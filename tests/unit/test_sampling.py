"""Step samples: representative windows at the target rate, the same requests every step, exact prompts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.records import RequestRecord
from tuner.sampling import FIRST_ORDINARY_TOKEN, plan_step, required_requests, sample_step
from tuner.workload.records import PREFIX_BLOCK_TOKENS, Request, Workload


def _workload(gaps: list[float], prefix: bool = False) -> Workload:
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    requests = tuple(
        Request(
            arrival_s=float(t),
            prompt_tokens=600 if prefix else 20 + i % 7,
            output_tokens=5 + i,
            prefix_ids=(7, 100 + i) if prefix else (),
        )
        for i, t in enumerate(times)
    )
    return Workload(requests, {"source": "test"})


def _measured_rate(plan, sample, rate: float) -> float:
    """Counted requests over their window, as the step summary measures it with a perfect client."""
    counted = [
        RequestRecord(p.index, p.scheduled_s, p.scheduled_s, 1, 1, None, None, in_warmup=p.in_warmup)
        for p in plan
        if not p.in_warmup
    ]
    from tuner.metrics import _arrival_rps

    return _arrival_rps(counted, sample.window_s(rate))


def test_the_measured_requests_arrive_at_exactly_the_target_rate_on_a_bursty_trace():
    rng = np.random.default_rng(1)
    gaps = rng.gamma(1 / 16, 16.0, size=999).tolist()  # burstiness CV 4
    workload = _workload(gaps)
    sample = sample_step(workload, measured=200, warmup=20, windows=4, seed=3, min_window_s=10.0, max_rate_rps=300.0)
    for rate in (0.5, 7.0, 30.0, 300.0):
        plan = plan_step(sample, rate_rps=rate, step_seed=1, vocab_size=4096)
        measured = [p for p in plan if not p.in_warmup]
        expected = max(200, math.ceil(rate * 10.0))  # enough requests, and at least 10 s of them
        assert len(measured) == expected and sum(p.in_warmup for p in plan) == 20
        assert measured[-1].scheduled_s - measured[0].scheduled_s < expected / rate
        assert sample.window_s(rate) == pytest.approx(max(200 / rate, 10.0))
        assert _measured_rate(plan, sample, rate) == pytest.approx(rate, rel=1e-9)


def test_a_faster_step_replays_a_superset_of_a_slower_steps_requests():
    workload = _workload(np.random.default_rng(2).exponential(1.0, 999).tolist())
    sample = sample_step(workload, measured=40, warmup=0, windows=4, seed=1, min_window_s=5.0, max_rate_rps=40.0)
    slow, _ = sample.layout(4.0)
    fast, _ = sample.layout(40.0)
    assert len(slow) == 40 and len(fast) == 200
    for window in sample.windows:  # each window contributes its first requests, in equal shares
        assert window[:10] == tuple(r for r in slow if r in window[:10])
        assert set(window[:50]) <= set(fast)


def test_windows_keep_the_recorded_burst_structure_and_spread_over_the_trace():
    gaps = ([0.01] * 9 + [5.0]) * 100  # bursts of 10 requests, 5 s apart
    sample = sample_step(_workload(gaps), measured=40, warmup=0, windows=4, seed=0)
    assert [s * 4 // 1001 for s in sample.starts] == [0, 1, 2, 3], "one window in each quarter of the trace"
    offsets = np.diff(np.array(sample.layout(1.0)[1]))
    ratios = []
    for window, start in enumerate(sample.starts):
        for k in range(9):  # the 9 gaps inside each window of 10 consecutive requests
            ratios.append(offsets[window * 10 + k] / gaps[start + k])
    # Every recorded gap, 0.01 s or 5 s, scaled by one common factor: bursts stay bursts.
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-9)
    assert any(gaps[s + k] == 5.0 for s in sample.starts for k in range(9)), "a burst boundary inside a window"


def test_the_same_seed_gives_the_same_requests_and_another_seed_other_windows():
    workload = _workload(np.random.default_rng(0).exponential(1.0, 500).tolist())
    first = sample_step(workload, measured=50, warmup=5, windows=5, seed=7)
    assert first == sample_step(workload, measured=50, warmup=5, windows=5, seed=7)
    assert first.starts != sample_step(workload, measured=50, warmup=5, windows=5, seed=8).starts


def test_warmup_is_sent_evenly_before_the_measured_window():
    sample = sample_step(_workload([1.0] * 99), measured=30, warmup=6, windows=2, seed=0)
    plan = plan_step(sample, rate_rps=3.0, step_seed=1, vocab_size=4096)
    warm = [p.scheduled_s for p in plan if p.in_warmup]
    assert warm == pytest.approx([k / 3.0 for k in range(6)])
    assert all(p.scheduled_s > warm[-1] for p in plan if not p.in_warmup)
    assert [p.in_warmup for p in plan] == [True] * 6 + [False] * 30


def test_a_short_trace_is_replayed_in_whole_passes():
    sample = sample_step(_workload([1.0] * 9), measured=45, warmup=0, windows=1, seed=0)
    lengths = [r.prompt_tokens for r in sample.layout(1.0)[0]]
    assert len(lengths) == 45 and len(set(lengths)) > 1
    assert sorted(set(lengths)) == sorted({r.prompt_tokens for r in _workload([1.0] * 9).requests})


def test_prompts_have_exact_lengths_and_no_special_tokens():
    sample = sample_step(_workload([1.0] * 20), measured=10, warmup=2, windows=2, seed=0)
    for planned, request in zip(
        plan_step(sample, rate_rps=1.0, step_seed=3, vocab_size=512), sample.layout(1.0)[0], strict=True
    ):
        assert len(planned.prompt_token_ids) == request.prompt_tokens
        assert planned.output_tokens == request.output_tokens
        assert all(FIRST_ORDINARY_TOKEN <= t < 512 for t in planned.prompt_token_ids)


def test_shared_prefix_ids_become_shared_token_prefixes_within_a_step_only():
    sample = sample_step(_workload([1.0] * 9, prefix=True), measured=4, warmup=0, windows=1, seed=0)
    plan = plan_step(sample, rate_rps=1.0, step_seed=1, vocab_size=4096)
    a, b = plan[0].prompt_token_ids, plan[1].prompt_token_ids
    assert a[:PREFIX_BLOCK_TOKENS] == b[:PREFIX_BLOCK_TOKENS]
    assert a[PREFIX_BLOCK_TOKENS:] != b[PREFIX_BLOCK_TOKENS:]
    other = plan_step(sample, rate_rps=1.0, step_seed=2, vocab_size=4096)
    assert other[0].prompt_token_ids[:PREFIX_BLOCK_TOKENS] != a[:PREFIX_BLOCK_TOKENS]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e4)), min_size=0, max_size=60),
    st.integers(min_value=1, max_value=120),
    st.integers(min_value=0, max_value=10),
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=0, max_value=10**6),
)
def test_any_trace_gives_ordered_arrivals_and_the_exact_rate(gaps, measured, warmup, windows, seed):
    sample = sample_step(_workload(gaps), measured=measured, warmup=warmup, windows=windows, seed=seed)
    requests, offsets = sample.layout(2.5)
    assert len(requests) == measured + warmup and sample.measured_at(2.5) == measured
    assert all(b >= a for a, b in zip(offsets, offsets[1:], strict=False))
    plan = plan_step(sample, rate_rps=2.5, step_seed=0, vocab_size=64)
    assert _measured_rate(plan, sample, 2.5) == pytest.approx(2.5, rel=1e-9)


@pytest.mark.parametrize(
    ("percentiles", "tail", "expected"),
    [([95.0], 10, 200), ([99.0], 10, 1000), ([90.0, 95.0], 5, 100), ([50.0], 10, 20), ([], 10, 20)],
)
def test_required_requests_leave_enough_above_the_percentile(percentiles, tail, expected):
    assert required_requests(percentiles, tail) == expected


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rate_rps"):
        plan_step(
            sample_step(_workload([1.0]), measured=1, warmup=0, windows=1, seed=0),
            rate_rps=0,
            step_seed=0,
            vocab_size=64,
        )
    with pytest.raises(ValueError, match="measured >= 1"):
        sample_step(_workload([1.0]), measured=0, warmup=0, windows=1, seed=0)
    with pytest.raises(ValueError, match="percentiles"):
        required_requests([100.0], 10)
