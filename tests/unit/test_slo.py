"""Unit tests of SLO parsing and printing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import ConfigError
from tuner.slo import METRICS, STATS, Slo, SloTerm, parse_slo


def test_parses_the_documented_example() -> None:
    assert parse_slo("ttft:p95<5s; tpot:p95<100ms; e2e:p99<=10s") == Slo(
        (SloTerm("ttft", "p95", 5.0), SloTerm("tpot", "p95", 0.1), SloTerm("e2e", "p99", 10.0))
    )


@pytest.mark.parametrize(
    ("text", "term"),
    [
        ("  ttft : p95 <  5 s  ", SloTerm("ttft", "p95", 5.0)),
        ("itl:mean<=0.5s", SloTerm("itl", "mean", 0.5)),
        ("queue:p50<1e3ms", SloTerm("queue", "p50", 1.0)),
        ("e2e:p90<.25s", SloTerm("e2e", "p90", 0.25)),
        ("tpot:p99<+7ms", SloTerm("tpot", "p99", 0.007)),
    ],
)
def test_tolerates_whitespace_and_number_forms(text: str, term: SloTerm) -> None:
    assert parse_slo(text) == Slo((term,))


def test_empty_pieces_between_semicolons_are_skipped() -> None:
    assert parse_slo(";ttft:p95<5s;; ;") == Slo((SloTerm("ttft", "p95", 5.0),))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "ttft:p97<5s",
            "SLO term 'ttft:p97<5s': unknown percentile 'p97' (use one of mean, p50, p90, p95, p99)",
        ),
        (
            "tfft:p95<5s",
            "SLO term 'tfft:p95<5s': unknown metric 'tfft' (use one of ttft, tpot, itl, e2e, queue)",
        ),
        ("ttft:p95<5", "SLO term 'ttft:p95<5': missing unit in bound '5' (use ms or s)"),
        ("ttft:p95<5min", "SLO term 'ttft:p95<5min': unknown unit 'min' in bound '5min' (use ms or s)"),
        ("ttft:p95<fast", "SLO term 'ttft:p95<fast': bound 'fast' is not a number with a unit"),
        ("ttft:p95<infs", "SLO term 'ttft:p95<infs': bound 'infs' is not a number with a unit"),
        ("ttft:p95<0s", "SLO term 'ttft:p95<0s': bound '0s' must be a positive finite number"),
        ("ttft:p95<-1ms", "SLO term 'ttft:p95<-1ms': bound '-1ms' must be a positive finite number"),
        ("ttft:p95<1e999s", "SLO term 'ttft:p95<1e999s': bound '1e999s' must be a positive finite number"),
        (
            "ttft:p95<5s; ttft:p95<=6s",
            "SLO term 'ttft:p95<=6s': ttft:p95 is already bounded by 'ttft:p95<5s'",
        ),
        ("ttft<5s", "SLO term 'ttft<5s': expected METRIC:STAT<BOUND"),
        ("ttft:p95", "SLO term 'ttft:p95': expected METRIC:STAT<BOUND"),
        ("ttft:p95>5s", "SLO term 'ttft:p95>5s': expected METRIC:STAT<BOUND"),
        ("", "SLO '' has no terms"),
        (" ; ", "SLO ' ; ' has no terms"),
    ],
)
def test_rejects_bad_terms_with_one_line_naming_the_term(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_slo(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_same_metric_with_other_stat_is_not_a_duplicate() -> None:
    assert len(parse_slo("ttft:p50<1s; ttft:p99<5s").terms) == 2


@pytest.mark.parametrize(
    ("term", "text"),
    [
        (SloTerm("ttft", "p95", 5.0), "ttft:p95<5s"),
        (SloTerm("tpot", "p95", 0.1), "tpot:p95<100ms"),
        (SloTerm("e2e", "p99", 1.0), "e2e:p99<1s"),
        (SloTerm("itl", "mean", 0.0125), "itl:mean<12.5ms"),
        (SloTerm("queue", "p50", 2.5), "queue:p50<2.5s"),
        (SloTerm("ttft", "p90", 1e20), "ttft:p90<1e+20s"),
    ],
)
def test_str_is_compact_and_uses_ms_below_a_second(term: SloTerm, text: str) -> None:
    assert str(term) == text


def test_slo_str_joins_terms() -> None:
    slo = Slo((SloTerm("ttft", "p95", 5.0), SloTerm("tpot", "p95", 0.1)))
    assert str(slo) == "ttft:p95<5s; tpot:p95<100ms"


_terms = st.builds(
    SloTerm,
    st.sampled_from(METRICS),
    st.sampled_from(STATS),
    st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False),
)


@given(_terms)
def test_term_round_trips_through_the_parser(term: SloTerm) -> None:
    assert parse_slo(str(term)) == Slo((term,))


@given(st.lists(_terms, min_size=1, max_size=len(METRICS) * len(STATS), unique_by=lambda t: (t.metric, t.stat)))
def test_slo_round_trips_through_the_parser(terms: list[SloTerm]) -> None:
    slo = Slo(tuple(terms))
    assert parse_slo(str(slo)) == slo
