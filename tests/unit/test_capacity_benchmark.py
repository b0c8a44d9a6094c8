"""benchmarks/capacity.py: single trials prepared without the search's confirmation phase, and the analysis
of a repeatability series' spread (no engine is started here)."""

from __future__ import annotations

import math
import statistics

import pytest
from benchmark_modules import load

capacity = load("capacity")


def test_the_full_settings_prepare_without_the_searchs_time_budget_check():
    """With the full settings a trial costs more than the embedded time budget leaves after the
    confirmation's reserve; `repeatability` and `fidelity` run single trials, so that check must not
    refuse them (it did: `repeatability --settings full` stopped with budget.time_budget_s's error)."""
    for name in ("full", "demo"):
        prepared = capacity._prepared(capacity._settings(name))
        assert prepared.config.confirm_rounds() == 0
    assert capacity._prepared(capacity._settings("full")).config.capacity.resolution == 0.1


def test_the_crossing_interpolates_inside_the_bracket_and_only_there():
    """The diagnostic that separates the bracket's quantisation from the runs' own spread: where headroom
    crosses 1 between the highest pass below the lowest fail and that fail."""
    # (load factor, arrival rps, passed, headroom, TTFT growth), in the order a capacity search runs them.
    loads = [
        (1.0, 5.0, True, 3.0, 0.0),
        (2.0, 10.0, True, 2.0, 0.0),
        (4.0, 20.0, False, 0.1, 0.3),
        (2.83, 14.0, True, 1.5, 0.0),
        (3.36, 16.8, False, 0.5, 0.05),
    ]
    # headroom 1.5 -> 0.5: the crossing is half-way, geometrically: 14 * (16.8 / 14) ** 0.5.
    assert capacity.crossing(14.0, loads) == pytest.approx(14.0 * 1.2**0.5)
    # Between the capacity and the lowest fail, whatever the headroom values.
    steep = [*loads[:3], (2.83, 14.0, True, 9.0, 0.0), (3.36, 16.8, False, 0.0, 0.4)]
    assert 14.0 < capacity.crossing(14.0, steep) < 16.8
    # A fail on sustainability alone (headroom still >= 1) says nothing about where: mid-bracket.
    sustained = [*loads[:4], (3.36, 16.8, False, 1.2, 0.2)]
    assert capacity.crossing(14.0, sustained) == pytest.approx(14.0 * 1.2**0.5)
    # Censored (no fail) and no pass below the lowest fail: no crossing.
    assert capacity.crossing(20.0, [row for row in loads if row[2]]) is None
    assert capacity.crossing(None, loads) is None
    assert capacity.crossing(2.0, [(1.0, 5.0, False, 0.5, 0.0), (2.0, 10.0, True, 2.0, 0.0)]) is None
    assert capacity.crossing(2.0, [(1.0, 5.0, False, 0.5, 0.0), (0.5, 2.5, True, 2.0, 0.0)]) == pytest.approx(
        2.0 * 2 ** (1 / 1.5)
    )


def test_a_series_spread_reports_the_crossings_cv_and_rank_correlations():
    def run(cap, probe, tpot):
        rows = [(2.83, cap, True, 1.5, 0.0), (3.36, cap * 1.1, False, 0.5, 0.05)]
        return {"capacity": cap, "loads": rows, "host_probe_s": probe, "ref_tpot_p50_ms": tpot, "start_s": 30}

    spread = capacity._spread([run(15.0, 0.9, 30.0), run(16.0, 0.8, 28.0), run(18.0, 0.7, 25.0)])
    assert spread["cv"] == pytest.approx(statistics.stdev([15, 16, 18]) / statistics.fmean([15, 16, 18]))
    assert spread["crossing_cv"] == pytest.approx(spread["cv"])  # every crossing the same fraction up
    # Faster host (shorter probe), faster engine (lower TPOT): higher capacity; constant start: no figure.
    assert spread["spearman_capacity_vs"] == {"host_probe_s": -1.0, "ref_tpot_p50_ms": -1.0, "start_s": None}
    # A series recorded before the probe existed gets no figure for it, not a wrong one.
    old = [{k: v for k, v in run(c, 0, 0).items() if k != "host_probe_s"} for c in (15.0, 16.0, 18.0)]
    assert capacity._spread(old)["spearman_capacity_vs"]["host_probe_s"] is None


def test_back_to_back_pairs_remove_a_drift_they_share():
    """Two slow runs then two fast ones: the capacities spread widely, each pair only by its own noise."""
    runs = [{"capacity": c, "loads": []} for c in (10.0, 10.5, 20.0, 21.0)]
    spread = capacity._spread(runs)
    assert spread["pairs"] == 2
    assert spread["sd_log"] > 0.3
    # Both pairs' ratio is 1.05; one config measured twice has expected ratio 1, so that is noise.
    assert spread["paired_sd_log"] == pytest.approx(math.log(1.05) / math.sqrt(2))
    shuffled = capacity._spread([{"capacity": c, "loads": []} for c in (10.0, 20.0, 21.0, 10.5)])
    assert shuffled["paired_sd_log"] > 0.3  # the drift falls between a pair's runs: nothing removed
    assert capacity._spread(runs[:1])["paired_sd_log"] is None  # one run is no pair
