"""One vocabulary: statuses and run kinds read and write as plain strings, and the documented metric
table is exactly the set of metrics a trial reports."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from tuner import report
from tuner.export import BEST_JSON_STEP_METRICS
from tuner.verdict import REFERENCE_LATENCIES
from tuner.vocabulary import REPORTED_METRICS, STEP_METRICS, TRIAL_METRICS, RunKind, TrialStatus

DOC = Path(__file__).resolve().parents[2] / "docs" / "measurement.md"


def _expand(name: str) -> set[str]:
    """`{a,b}_{x,y}_s` -> {a_x_s, a_y_s, b_x_s, b_y_s}."""
    parts = re.split(r"(\{[^}]*\})", name)
    options = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return {"".join(choice) for choice in itertools.product(*options)}


def _documented() -> set[str]:
    names: set[str] = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            for name in re.findall(r"`([^`]+)`", first_cell):
                names |= _expand(name)
    return names


def test_every_reported_metric_is_documented_and_every_documented_one_is_reported():
    documented = _documented()
    assert REPORTED_METRICS - documented == set(), "reported but not in docs/measurement.md"
    assert documented - REPORTED_METRICS == set(), "documented but never reported"


def test_statuses_and_run_kinds_are_plain_strings_where_they_are_stored():
    assert str(TrialStatus.EARLY_STOPPED) == "early_stopped" and TrialStatus.COMPLETED == "completed"
    assert json.dumps({"status": TrialStatus.INFEASIBLE}) == '{"status": "infeasible"}'
    assert f"tags.run_kind = '{RunKind.SEARCH}'" == "tags.run_kind = 'search'"
    assert TrialStatus("completed") is TrialStatus.COMPLETED


def test_metric_names_listed_outside_the_tables_are_names_from_them():
    assert set(BEST_JSON_STEP_METRICS) - set(STEP_METRICS) == set(), "best.json step keys"
    assert set(report._LABELS) - REPORTED_METRICS == set(), "report axis labels"
    assert set(REFERENCE_LATENCIES) - set(TRIAL_METRICS) == set(), "the verdict's reference latencies"
