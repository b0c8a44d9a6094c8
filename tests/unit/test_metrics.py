"""Unit tests of records -> step summaries (the one SLO rule, sustainability) -> trial metrics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.metrics import (
    StepSummary,
    judge,
    overload,
    request_values,
    slo_statistics,
    stat,
    summarize_step,
    trial_metrics,
)
from tuner.records import RequestRecord
from tuner.slo import METRICS, STATS, Slo, SloTerm, parse_slo

INF = math.inf


def record(
    ttft: float = 0.1,
    e2e: float = 1.0,
    out: int = 10,
    *,
    ok: bool = True,
    warmup: bool = False,
    sent: float = 0.0,
    lag: float = 0.0,
    gaps: tuple[float, ...] | None = None,
    queue: float | None = None,
) -> RequestRecord:
    """A request sent at `sent` (scheduled `lag` earlier); a failed one has no token times."""
    if gaps is None:
        gaps = ((e2e - ttft) / (out - 1),) * (out - 1) if ok and out > 1 else ()
    return RequestRecord(
        index=0,
        scheduled_s=sent - lag,
        sent_s=sent,
        prompt_tokens=100,
        output_tokens=out,
        first_token_s=sent + ttft if ok else None,
        finished_s=sent + e2e if ok else None,
        token_gaps_s=gaps,
        queue_s=queue,
        ok=ok,
        error=None if ok else "deadline",
        in_warmup=warmup,
    )


def summarize(records: list[RequestRecord], slo: str = "ttft:p95<1s", window_s: float = 10.0) -> StepSummary:
    return summarize_step(records, parse_slo(slo), load_step=2, load_factor=1.5, offered_rps=3.0, window_s=window_s)


def step(load_step: int, passed: bool, offered_rps: float) -> StepSummary:
    """A step at load factor = offered rate, whose measured arrival rate is the offered one."""
    return StepSummary(load_step, offered_rps, offered_rps, passed, {"arrival_rps": offered_rps})


def trial(
    steps: list[StepSummary],
    ref: list[RequestRecord] | None = None,
    *,
    num_accelerators: int = 2,
    penalty_latency_s: float = 60.0,
) -> dict[str, float]:
    """Trial metrics with the given (or default) settings."""
    return trial_metrics(steps, num_accelerators=num_accelerators, penalty_latency_s=penalty_latency_s, ref_records=ref)


# --- request_values ---------------------------------------------------------------------------


def test_request_values_of_a_completed_request() -> None:
    r = record(ttft=0.5, e2e=2.5, out=5, sent=3.0, queue=0.2)
    assert request_values(r, "ttft") == pytest.approx([0.5])
    assert request_values(r, "e2e") == pytest.approx([2.5])
    assert request_values(r, "tpot") == pytest.approx([0.5])
    assert request_values(r, "itl") == pytest.approx([0.5] * 4)
    assert request_values(r, "queue") == pytest.approx([0.2])


def test_request_values_leave_out_what_is_undefined() -> None:
    one_token = record(ttft=0.5, e2e=0.5, out=1)
    assert request_values(one_token, "tpot") == []
    assert request_values(one_token, "itl") == []
    assert request_values(one_token, "ttft") == [0.5]
    assert request_values(record(queue=None), "queue") == []


@pytest.mark.parametrize("metric", METRICS)
def test_request_values_of_a_failed_request_are_empty(metric: str) -> None:
    failed = record(ok=False, queue=0.3, gaps=(0.1, 0.1))
    assert request_values(failed, metric) == []


def test_request_values_rejects_unknown_metric() -> None:
    with pytest.raises(ValueError, match="unknown metric 'ttlt'"):
        request_values(record(), "ttlt")


# --- stat -------------------------------------------------------------------------------------


def test_stat_mean_and_percentiles() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert stat(values, "mean") == 2.5
    assert stat(values, "p50") == 2.5
    assert stat(values, "p90") == pytest.approx(3.7)
    assert stat([7.0], "p99") == 7.0


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=50), st.sampled_from(STATS))
def test_stat_matches_numpy_on_finite_values(values: list[float], name: str) -> None:
    expected = np.mean(values) if name == "mean" else np.percentile(values, float(name[1:]))
    assert stat(values, name) == pytest.approx(float(expected), rel=1e-12, abs=1e-9)


@pytest.mark.parametrize(
    ("values", "name", "expected"),
    [
        ([1.0, INF], "p50", INF),
        ([INF, INF], "p95", INF),
        ([1.0, 2.0, 3.0, INF], "p50", 2.5),
        ([1.0] * 19 + [INF], "p95", INF),
        ([1.0] * 99 + [INF], "p95", 1.0),
        ([1.0, INF], "mean", INF),
    ],
)
def test_stat_with_failures_as_infinity_never_gives_nan(values: list[float], name: str, expected: float) -> None:
    assert stat(values, name) == expected


@given(
    st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=30),
    st.integers(min_value=1, max_value=10),
    st.sampled_from(STATS),
)
def test_stat_with_infinities_is_at_least_the_stat_with_a_large_stand_in(
    values: list[float], failures: int, name: str
) -> None:
    with_inf = stat(values + [INF] * failures, name)
    assert not math.isnan(with_inf)
    assert with_inf >= stat(values + [2e6] * failures, name)


def test_stat_rejects_empty_values_and_unknown_stats() -> None:
    with pytest.raises(ValueError, match="no values"):
        stat([], "p95")
    with pytest.raises(ValueError, match="unknown statistic 'p97'"):
        stat([1.0], "p97")


# --- summarize_step: measurement --------------------------------------------------------------


def test_summary_rates_counts_and_latency_keys() -> None:
    records = [record(ttft=0.1 * i, e2e=1.0 + i, out=10, lag=0.01 * i) for i in range(1, 5)]
    records.append(record(ok=False, out=10))
    summary = summarize(records, window_s=2.0)
    m = summary.metrics
    assert (summary.load_step, summary.load_factor, summary.offered_rps) == (2, 1.5, 3.0)
    assert (m["load_step"], m["load_factor"], m["offered_rps"]) == (2.0, 1.5, 3.0)
    assert m["achieved_rps"] == 2.0
    assert m["output_tok_s"] == 20.0
    assert m["failed_requests"] == 1.0
    assert m["ttft_mean_s"] == pytest.approx(0.25)
    assert m["ttft_p50_s"] == pytest.approx(0.25)
    assert m["e2e_p99_s"] == pytest.approx(float(np.percentile([2, 3, 4, 5], 99)))
    assert m["send_lag_p99_s"] == pytest.approx(float(np.percentile([0.01, 0.02, 0.03, 0.04, 0.0], 99)))
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert all(f"{metric}_{s}_s" in m for s in STATS)
    assert not any(key.startswith("queue_") for key in m)
    assert all(isinstance(v, float) and math.isfinite(v) for k, v in m.items() if not k.startswith("slo_"))
    assert m["measured_requests"] == 5.0


def test_queue_keys_appear_when_the_engine_reports_queueing() -> None:
    m = summarize([record(queue=0.2), record(queue=None), record(queue=0.4)]).metrics
    assert m["queue_mean_s"] == pytest.approx(0.3)
    assert {k for k in m if k.startswith("queue_")} == {f"queue_{s}_s" for s in STATS}


def test_itl_pools_every_gap_of_every_completed_request() -> None:
    m = summarize([record(gaps=(0.1, 0.2)), record(gaps=(0.3,))]).metrics
    assert m["itl_mean_s"] == pytest.approx(0.2)
    assert m["itl_p50_s"] == pytest.approx(0.2)


def test_warmup_is_left_out_except_for_send_lag() -> None:
    counted = [record(ttft=0.2, out=4)]
    warm = [record(ttft=9.0, out=50, warmup=True, lag=5.0), record(ok=False, warmup=True)]
    m = summarize(counted + warm, window_s=1.0).metrics
    assert m["achieved_rps"] == 1.0
    assert m["output_tok_s"] == 4.0
    assert m["failed_requests"] == 0.0
    assert m["ttft_p99_s"] == pytest.approx(0.2)
    assert m["send_lag_p99_s"] == pytest.approx(float(np.percentile([0.0, 5.0, 0.0], 99)))
    assert m["slo_pass"] == 1.0
    assert m["slo_attainment"] == 1.0


def test_one_token_outputs_have_no_tpot_or_itl() -> None:
    m = summarize([record(ttft=0.3, e2e=0.3, out=1)] * 3).metrics
    assert m["ttft_p50_s"] == pytest.approx(0.3)
    assert not any(key.startswith(("tpot_", "itl_")) for key in m)


def test_rejects_non_positive_window() -> None:
    with pytest.raises(ValueError, match="window_s must be > 0"):
        summarize([record()], window_s=0.0)


@pytest.mark.parametrize("records", [[], [record(warmup=True), record(warmup=True, ok=False)]])
def test_a_step_without_counted_requests_fails_with_zero_scores(records: list[RequestRecord]) -> None:
    summary = summarize(records)
    m = summary.metrics
    assert not summary.passed
    assert (m["slo_pass"], m["slo_headroom"], m["slo_attainment"], m["goodput_rps"]) == (0.0, 0.0, 0.0, 0.0)
    assert (m["achieved_rps"], m["output_tok_s"], m["failed_requests"]) == (0.0, 0.0, 0.0)
    assert not any(key.startswith(METRICS) for key in m)
    if not records:
        assert m["send_lag_p99_s"] == 0.0


@pytest.mark.parametrize("slo", ["ttft:p50<1s", "e2e:mean<100s", "tpot:p99<1s", "itl:p50<1s", "queue:p50<1s"])
def test_all_failed_never_passes(slo: str) -> None:
    summary = summarize([record(ok=False, out=5, queue=0.1)] * 4, slo)
    m = summary.metrics
    assert not summary.passed
    assert m["failed_requests"] == 4.0
    assert (m["slo_headroom"], m["slo_attainment"], m["goodput_rps"], m["achieved_rps"]) == (
        0.0,
        0.0,
        0.0,
        0.0,
    )
    assert not any(key.startswith(METRICS) for key in m)


# --- summarize_step: SLO ----------------------------------------------------------------------


def test_one_failure_in_twenty_makes_p95_fail() -> None:
    fast = [record(ttft=0.1)] * 19
    assert summarize([*fast, record(ttft=0.1)]).passed
    summary = summarize([*fast, record(ok=False)])
    assert not summary.passed
    assert summary.metrics["slo_headroom"] == 0.0
    assert summary.metrics["ttft_p95_s"] == pytest.approx(0.1)  # the latency figures cover completed requests
    assert summary.metrics["slo_attainment"] == pytest.approx(19 / 20)


def test_one_failure_in_a_hundred_still_passes_p95() -> None:
    summary = summarize([record(ttft=0.1)] * 99 + [record(ok=False)])
    assert summary.passed
    assert summary.metrics["slo_headroom"] == pytest.approx(10.0)


def test_failed_one_token_request_is_left_out_of_tpot() -> None:
    completed = [record(e2e=1.0, out=10)] * 9
    assert summarize([*completed, record(ok=False, out=1)], "tpot:p99<1s").passed
    assert not summarize([*completed, record(ok=False, out=2)], "tpot:p99<1s").passed


@pytest.mark.parametrize("slo", ["itl:p99<1s", "queue:p99<1s"])
def test_failures_add_nothing_to_itl_and_queue(slo: str) -> None:
    summary = summarize([record(queue=0.1)] * 9 + [record(ok=False)], slo)
    assert summary.passed
    assert summary.metrics["slo_attainment"] == pytest.approx(0.9)


@pytest.mark.parametrize("slo", ["queue:p50<1s", "tpot:p50<1s", "itl:p50<1s"])
def test_a_term_with_nothing_to_measure_does_not_hold(slo: str) -> None:
    summary = summarize([record(ttft=0.1, e2e=0.1, out=1, queue=None)] * 3, slo)
    assert not summary.passed
    assert summary.metrics["slo_headroom"] == 0.0
    assert summary.metrics["slo_attainment"] == 1.0  # each request on its own has nothing to violate


def test_headroom_is_the_tightest_term() -> None:
    m = summarize([record(ttft=0.5, e2e=2.0)] * 4, "ttft:p95<1s; e2e:p95<3s").metrics
    assert m["slo_headroom"] == pytest.approx(1.5)
    assert m["slo_pass"] == 1.0


def test_failing_headroom_is_below_one() -> None:
    m = summarize([record(ttft=4.0, e2e=5.0)] * 4, "ttft:p95<1s").metrics
    assert m["slo_headroom"] == pytest.approx(0.25)
    assert m["slo_pass"] == 0.0


def test_observed_equal_to_bound_passes() -> None:
    summary = summarize([record(ttft=0.5)] * 3, "ttft:p95<=500ms")
    assert summary.passed
    assert summary.metrics["slo_headroom"] == pytest.approx(1.0)
    assert summary.metrics["slo_attainment"] == 1.0


@pytest.mark.parametrize("ttft", [0.0, 1e-9])
def test_headroom_is_capped_at_100(ttft: float) -> None:
    assert summarize([record(ttft=ttft)] * 3, "ttft:p95<1s").metrics["slo_headroom"] == 100.0


def test_goodput_counts_requests_meeting_every_term_on_their_own() -> None:
    records = [
        record(ttft=0.1, e2e=1.0),  # good
        record(ttft=0.1, e2e=9.0),  # e2e too slow
        record(ttft=2.0, e2e=3.0),  # ttft too slow
        record(ttft=0.2, e2e=0.2, out=1),  # good: tpot undefined for one token
        record(ok=False),  # failed: never good
        record(ttft=0.1, e2e=1.0, warmup=True),  # warm-up: not counted
    ]
    m = summarize(records, "ttft:p99<1s; e2e:p99<5s; tpot:p99<200ms", window_s=4.0).metrics
    assert m["goodput_rps"] == 0.5
    assert m["slo_attainment"] == pytest.approx(2 / 5)


def test_goodput_itl_uses_each_requests_own_gaps() -> None:
    bursty = record(gaps=(0.01,) * 9 + (1.0,))
    assert summarize([bursty], "itl:p50<50ms").metrics["slo_attainment"] == 1.0
    assert summarize([bursty], "itl:p99<50ms").metrics["slo_attainment"] == 0.0
    assert summarize([bursty], "itl:mean<50ms").metrics["slo_attainment"] == 0.0


def test_goodput_ignores_queue_when_not_reported() -> None:
    records = [record(queue=None), record(queue=0.5), record(queue=2.0)]
    assert summarize(records, "queue:p50<1s").metrics["slo_attainment"] == pytest.approx(2 / 3)


def test_summary_without_terms_passes_with_capped_headroom() -> None:
    summary = summarize_step([record()], Slo(()), load_step=0, load_factor=1.0, offered_rps=1.0, window_s=1.0)
    assert summary.passed
    assert summary.metrics["slo_headroom"] == 100.0
    assert summary.metrics["goodput_rps"] == 1.0


_records = st.builds(
    record,
    ttft=st.floats(min_value=0, max_value=20),
    e2e=st.floats(min_value=20, max_value=60),
    out=st.integers(min_value=1, max_value=50),
    ok=st.booleans(),
    warmup=st.booleans(),
    lag=st.floats(min_value=0, max_value=5),
    queue=st.none() | st.floats(min_value=0, max_value=10),
)
_slos = st.lists(
    st.builds(SloTerm, st.sampled_from(METRICS), st.sampled_from(STATS), st.floats(min_value=1e-3, max_value=100)),
    min_size=1,
    max_size=4,
    unique_by=lambda t: (t.metric, t.stat),
).map(lambda terms: Slo(tuple(terms)))


@given(st.lists(_records, max_size=30), _slos)
def test_summary_invariants(records: list[RequestRecord], slo: Slo) -> None:
    summary = summarize_step(records, slo, load_step=1, load_factor=1.0, offered_rps=2.0, window_s=5.0)
    m = summary.metrics
    assert all(isinstance(v, float) and math.isfinite(v) for k, v in m.items() if not k.startswith("slo_"))
    assert 0.0 <= m["slo_headroom"] <= 100.0
    assert 0.0 <= m["slo_attainment"] <= 1.0
    assert m["goodput_rps"] <= m["achieved_rps"]
    assert m["slo_pass"] == float(summary.passed)
    if summary.passed:
        assert m["slo_headroom"] >= 1.0
        assert m["failed_requests"] < sum(not r.in_warmup for r in records)
    elif m["slo_headroom"] > 1.0:
        pytest.fail("a failing step reports headroom above 1")


# --- the one SLO rule: slo_statistics + judge ----------------------------------------------------


def test_slo_statistics_count_failures_as_infinitely_slow_and_judge_applies_any_slo() -> None:
    records = [record(ttft=0.1, e2e=1.0)] * 19 + [record(ok=False)]
    statistics = slo_statistics(records)
    assert statistics["slo_ttft_p50_s"] == pytest.approx(0.1)
    assert statistics["slo_ttft_p95_s"] == INF  # 1 failure in 20 reaches the p95
    assert statistics["slo_itl_p99_s"] == pytest.approx(0.1)  # failures add nothing to itl
    assert judge(statistics, parse_slo("ttft:p90<1s")) == (True, pytest.approx(10.0))
    assert judge(statistics, parse_slo("ttft:p95<1s")) == (False, 0.0)
    assert judge({}, parse_slo("ttft:p50<1s")) == (False, 0.0), "a statistic never measured never passes"


@given(st.lists(_records, max_size=30), _slos)
def test_a_step_passes_exactly_when_judge_passes_its_recorded_statistics(
    records: list[RequestRecord], slo: Slo
) -> None:
    summary = summarize_step(records, slo, load_step=1, load_factor=1.0, offered_rps=2.0, window_s=5.0)
    recorded = {k: v for k, v in summary.metrics.items() if k.startswith("slo_") and k.endswith("_s")}
    assert summary.passed == judge(recorded, slo)[0]


# --- sustainability --------------------------------------------------------------------------------


def _queueing(excess: float, n: int = 200, rate: float = 10.0, seed: int = 0) -> list[RequestRecord]:
    """Requests at `rate` whose TTFT grows by `excess` seconds per second sent, with noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sent = i / rate
        ttft = max(0.01, 0.2 + excess * sent + rng.normal(0, 0.05))
        out.append(record(ttft=ttft, e2e=ttft + 1.0, out=20, sent=sent))
    return out


def test_a_growing_queue_is_not_sustainable_even_when_the_step_passes_its_bounds() -> None:
    records = _queueing(0.08)  # TTFT 0.2 s -> 1.8 s over a 20 s step
    passing = summarize_step(
        records, parse_slo("ttft:p95<3s"), load_step=1, load_factor=1.0, offered_rps=10.0, window_s=20.0
    )
    assert passing.passed, "without the sustainability check the step passes"
    growing = summarize_step(
        records, parse_slo("ttft:p95<3s"), load_step=1, load_factor=1.0, offered_rps=10.0, window_s=20.0, horizon_s=60.0
    )
    assert not growing.passed and growing.metrics["overloaded"] == 1.0
    assert growing.metrics["ttft_growth"] == pytest.approx(0.08, rel=0.15)
    assert growing.metrics["slo_headroom"] < 1.0


def test_a_steady_server_is_sustainable() -> None:
    steady = summarize_step(
        _queueing(0.0),
        parse_slo("ttft:p95<3s"),
        load_step=1,
        load_factor=1.0,
        offered_rps=10.0,
        window_s=20.0,
        horizon_s=60.0,
    )
    assert steady.passed and steady.metrics["overloaded"] == 0.0


def test_slight_growth_that_stays_within_the_bound_over_the_horizon_is_sustainable() -> None:
    growth = overload(_queueing(0.005), window_s=20.0, horizon_s=60.0)
    assert growth is not None and growth.projected_s < 3.0
    assert summarize_step(
        _queueing(0.005),
        parse_slo("ttft:p95<3s"),
        load_step=1,
        load_factor=1.0,
        offered_rps=10.0,
        window_s=20.0,
        horizon_s=60.0,
    ).passed


def test_overload_needs_a_few_seconds_of_window() -> None:
    assert overload(_queueing(0.5, n=10), window_s=1.0, horizon_s=60.0) is None


def test_arrival_rate_is_measured_from_the_actual_sends() -> None:
    on_time = [record(sent=i / 10) for i in range(50)]
    late = [record(sent=i / 10 + (0.002 * i), lag=0.002 * i) for i in range(50)]  # the client falls behind
    assert summarize(on_time, window_s=5.0).metrics["arrival_rps"] == pytest.approx(10.0)
    assert summarize(late, window_s=5.0).metrics["arrival_rps"] == pytest.approx(50 / (5.0 + 0.098))


# --- trial_metrics ---------------------------------------------------------------------------------


def test_before_any_step_everything_is_penalty_and_censored() -> None:
    assert trial([]) == {
        "capacity_rps": 0.0,
        "capacity_rps_per_accel": 0.0,
        "capacity_lo_rps_per_accel": 0.0,
        "capacity_censored": 1.0,
        "capacity_inconsistent": 0.0,
        "ref_ttft_p95_s": 60.0,
        "ref_tpot_p95_s": 60.0,
        "ref_e2e_p95_s": 60.0,
    }


def test_capacity_is_the_highest_measured_pass_per_accelerator_while_censored() -> None:
    m = trial([step(3, True, 8.0), step(1, True, 2.0), step(2, True, 4.0)], ref=[record()])
    assert m["capacity_rps"] == 8.0
    assert m["capacity_rps_per_accel"] == 4.0
    assert m["capacity_censored"] == 1.0 and "capacity_hi_rps_per_accel" not in m


def test_a_failed_step_ends_censoring_and_closes_the_bracket() -> None:
    m = trial([step(1, True, 2.0), step(2, True, 4.0), step(3, False, 8.0)], ref=[record()])
    assert m["capacity_rps"] == 4.0
    assert (m["capacity_lo_rps_per_accel"], m["capacity_hi_rps_per_accel"]) == (2.0, 4.0)
    assert m["capacity_censored"] == 0.0


def test_capacity_is_the_measured_arrival_rate_not_the_nominal_load() -> None:
    measured = StepSummary(1, 1.0, 10.0, True, {"arrival_rps": 9.5})
    assert trial([measured], num_accelerators=1)["capacity_rps_per_accel"] == 9.5


def test_no_passed_step_means_zero_capacity_and_penalty_refs() -> None:
    m = trial([step(1, False, 2.0)])
    assert (m["capacity_rps"], m["capacity_rps_per_accel"], m["capacity_censored"]) == (0.0, 0.0, 0.0)
    assert m["ref_ttft_p95_s"] == m["ref_tpot_p95_s"] == m["ref_e2e_p95_s"] == 60.0


def test_ref_values_are_p95_of_counted_reference_requests() -> None:
    ref = [record(ttft=0.1 * i, e2e=1.0 * i, out=11) for i in range(1, 21)]
    ref.append(record(ttft=50.0, e2e=55.0, warmup=True))
    m = trial([step(1, True, 1.0), step(2, True, 2.0)], ref=ref)
    ttfts = [0.1 * i for i in range(1, 21)]
    e2es = [1.0 * i for i in range(1, 21)]
    assert m["ref_ttft_p95_s"] == pytest.approx(float(np.percentile(ttfts, 95)))
    assert m["ref_e2e_p95_s"] == pytest.approx(float(np.percentile(e2es, 95)))
    assert m["ref_tpot_p95_s"] == pytest.approx(
        float(np.percentile([(e - t) / 10 for t, e in zip(ttfts, e2es, strict=True)], 95))
    )


def test_failed_reference_requests_count_as_the_penalty() -> None:
    ref = [record(ttft=1.0, e2e=2.0, out=2)] * 19 + [record(ok=False, out=2)]
    m = trial([step(1, True, 2.0)], ref=ref, penalty_latency_s=30.0)
    assert m["ref_ttft_p95_s"] == pytest.approx(float(np.percentile([1.0] * 19 + [30.0], 95)))
    assert m["ref_tpot_p95_s"] == pytest.approx(float(np.percentile([1.0] * 19 + [30.0], 95)))
    assert m["ref_e2e_p95_s"] == pytest.approx(float(np.percentile([2.0] * 19 + [30.0], 95)))


def test_ref_tpot_without_multi_token_requests_is_the_penalty() -> None:
    ref = [record(ttft=0.2, e2e=0.2, out=1)] * 5 + [record(ok=False, out=1)]
    m = trial([step(1, False, 2.0)], ref=ref, penalty_latency_s=30.0)
    assert m["ref_tpot_p95_s"] == 30.0
    assert m["ref_ttft_p95_s"] == pytest.approx(float(np.percentile([0.2] * 5 + [30.0], 95)))


def test_ref_values_never_exceed_the_penalty() -> None:
    m = trial([step(1, False, 2.0)], ref=[record(ttft=100.0, e2e=200.0, out=2)], penalty_latency_s=30.0)
    assert m["ref_ttft_p95_s"] == m["ref_tpot_p95_s"] == m["ref_e2e_p95_s"] == 30.0


def test_all_warmup_reference_gives_penalty() -> None:
    m = trial([step(1, True, 2.0)], ref=[record(warmup=True)], penalty_latency_s=30.0)
    assert m["ref_ttft_p95_s"] == 30.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_accelerators": 0}, "num_accelerators must be >= 1"),
        ({"penalty_latency_s": 0.0}, "penalty_latency_s must be positive and finite"),
        ({"penalty_latency_s": INF}, "penalty_latency_s must be positive and finite"),
    ],
)
def test_trial_metrics_reject_bad_arguments(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trial([step(1, True, 1.0)], **overrides)


@given(
    st.lists(st.booleans(), max_size=6),
    st.one_of(st.none(), st.lists(_records, max_size=20)),
    st.floats(min_value=1e-3, max_value=100),
)
def test_trial_values_are_finite_and_within_penalty(
    passes: list[bool], ref: list[RequestRecord] | None, penalty: float
) -> None:
    steps = [step(i + 1, p, 2.0 * (i + 1)) for i, p in enumerate(passes)]
    m = trial(steps, ref=ref, penalty_latency_s=penalty)
    assert all(math.isfinite(v) for v in m.values())
    assert all(0 <= m[f"ref_{x}_p95_s"] <= penalty for x in ("ttft", "tpot", "e2e"))
    assert m["capacity_censored"] == float(all(passes))


def test_a_step_whose_client_sent_late_says_so_in_its_progress_line() -> None:
    from tuner.tracking import step_text

    step = {"load_step": 1, "load_factor": 1.0, "arrival_rps": 16.06, "slo_pass": 0.0, "slo_headroom": 0.5}
    on_time = step_text({**step, "send_lag_p99_s": 0.004})
    late = step_text({**step, "send_lag_p99_s": 1.2256})
    assert "late" not in on_time and on_time.startswith("step 1 ")
    assert late.startswith(on_time) and "the client sent late (send lag p99 1.23s)" in late
