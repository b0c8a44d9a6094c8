"""benchmarks/capacity.py prepares its single trials without the search's confirmation phase (no engine
is started here)."""

from __future__ import annotations

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
