"""Which recorded trial to deploy: judging trials under an SLO, and picking one.

Re-judging under another SLO (`--slo` different from the one the search recorded) uses the search's own
rule, the same functions: a recorded step passes iff `tuner.metrics.judge` passes its recorded SLO
statistics (`slo_{metric}_{stat}_s`, failed requests counted as infinitely slow) and
`tuner.metrics.sustainable` finds no TTFT growth that breaks the new bound; the trial's capacity is then
`tuner.capacity.bracket` over its re-judged steps (the highest measured pass below the lowest failure;
censored when none fails), with the search's `capacity.failure_rule`. The loads measured were chosen for
the recorded SLO, so the bracket under another SLO can be wider. Latencies at the reference load
(`ref_*_p95_s`) do not depend on the SLO and are kept as they are. Steps recorded before the SLO
statistics existed fall back to the completed-only statistics when nothing failed, and fail when
something did.

A search with a confirmation phase recorded its verdict (`verdict.json`); `confirmed_winner` is the
trial it recommends, which `--pick max-capacity` exports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.capacity import CAPACITY_TIES, Observation, bracket, same_capacity
from tuner.errors import ExportError
from tuner.metrics import capacity_metrics, sustainable
from tuner.metrics import judge as judge_statistics
from tuner.pareto import Objective, knee_index, non_dominated
from tuner.recorded import DEFAULT_OBJECTIVES, SearchRecord, TrialRow
from tuner.slo import METRICS, STATS, Slo, parse_slo
from tuner.verdict import rounds_done
from tuner.vocabulary import (
    FEASIBLE_STATUSES,
    FINAL_STATUSES,
    TrialStatus,
    latency_name,
    slo_latency_name,
)

PICKS = ("max-capacity", "min-latency", "knee")


def recorded_statistics(step: Mapping[str, float]) -> dict[str, float]:
    """A recorded step's SLO statistics (`slo_*`), for steps recorded before them: the completed-only
    value when no request failed, +inf when one did (so such a step fails, never passes wrongly)."""
    failed = float(step.get("failed_requests", 0.0) or 0.0) > 0
    statistics = {}
    for metric in METRICS:
        for stat in STATS:
            name = slo_latency_name(metric, stat)
            value = step.get(name)
            if value is None:
                plain = step.get(latency_name(metric, stat))
                value = math.inf if failed or plain is None else plain
            statistics[name] = float(value)
    return statistics


def step_passes(step: Mapping[str, float], slo: Slo) -> bool:
    """Whether a recorded step meets `slo` by the search's own rule (see the module docstring)."""
    passed, _ = judge_statistics(recorded_statistics(step), slo)
    overloaded, _ = sustainable(step.get("ttft_projected_s"), slo)
    return passed and not overloaded


def rejudge(trial: TrialRow, slo: Slo, failure_rule: str = "once") -> TrialRow:
    """The trial with its capacity metrics recomputed under `slo` (see the module docstring), a load
    passing or failing by the search's `failure_rule`.

    Only completed / early-stopped trials with per-step metrics are re-judged; an infeasible trial keeps
    capacity 0.
    """
    metrics = dict(trial.metrics)
    accelerators = int(metrics.get("num_accelerators") or 1)
    if trial.status not in FEASIBLE_STATUSES or not trial.steps:
        return trial
    seen = [
        Observation(
            float(step.get("load_factor", 0.0)),
            float(step.get("arrival_rps", step.get("offered_rps", 0.0))) / accelerators,
            step_passes(step, slo),
        )
        for step in trial.steps
    ]
    for key in ("capacity_hi_rps_per_accel",):
        metrics.pop(key, None)
    metrics.update(capacity_metrics(bracket(seen, failure_rule), accelerators))
    return dataclasses.replace(trial, metrics=metrics)


def judge(record: SearchRecord, slo: str | None) -> tuple[str, tuple[TrialRow, ...], bool]:
    """(the SLO used, the trials judged under it, whether they were re-judged).

    `slo` None or the recorded SLO (in any order or units) keeps the search's own verdicts. Raises
    ConfigError (from
    `parse_slo`) for an unreadable SLO.
    """
    recorded = str(parse_slo(record.slo)) if record.slo else ""
    if slo is None or not slo.strip():
        return recorded, record.trials, False
    wanted = parse_slo(slo)
    if record.slo and set(wanted.terms) == set(parse_slo(record.slo).terms):
        return recorded, record.trials, False
    return str(wanted), tuple(rejudge(t, wanted, record.failure_rule) for t in record.trials), True


def feasible_trials(trials: Sequence[TrialRow]) -> list[TrialRow]:
    """Trials that finished measuring (completed or early-stopped) and passed at least one load step."""
    return [t for t in trials if t.status in FEASIBLE_STATUSES and t.capacity > 0]


def pareto_front(points: Sequence[Mapping[str, float]], objectives: Sequence[Objective]) -> list[int]:
    """The indices, in input order, of the trials' metrics no other dominates under `objectives`, with
    capacities that passed the same load (`same_capacity`) a tie there, decided by the other objectives."""
    return non_dominated(points, objectives, CAPACITY_TIES)


def highest_capacity(trials: Sequence[TrialRow]) -> TrialRow:
    """The trial with the highest capacity per accelerator; among those that passed the same load
    (`same_capacity`: their measured rates differ only in the arrival jitter), the lower reference TTFT
    p95, then the earlier trial."""
    top = max(t.capacity for t in trials)
    return min((t for t in trials if same_capacity(t.capacity, top)), key=lambda t: t.ref_ttft)


def pick_trial(
    trials: Sequence[TrialRow],
    pick: str = "max-capacity",
    objectives: Sequence[Objective] = DEFAULT_OBJECTIVES,
) -> TrialRow:
    """The trial `pick` chooses among the feasible ones.

    max-capacity: highest capacity per accelerator, ties (the same load passed: `same_capacity`) to the
    lower reference TTFT p95; min-latency: lowest reference TTFT p95, ties to the higher capacity; knee:
    the knee of the non-dominated front under `objectives`. Remaining ties go to the earlier trial. Raises
    ExportError when no trial is feasible and ValueError for an unknown pick.
    """
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {', '.join(PICKS)}, but got {pick!r}")
    candidates = feasible_trials(trials)
    if not candidates:
        raise ExportError("no trial passed a load step under the SLO")
    if pick == "max-capacity":
        return highest_capacity(candidates)
    if pick == "min-latency":
        return min(candidates, key=lambda t: (t.ref_ttft, -t.capacity))
    points = [dict(t.metrics) for t in candidates]
    chosen: list[Objective] = list(objectives) or list(DEFAULT_OBJECTIVES)
    front = pareto_front(points, chosen)
    return candidates[knee_index(points, front, chosen)]


def confirmed_winner(record: SearchRecord, trials: Sequence[TrialRow], *, pick: str, rejudged: bool) -> TrialRow | None:
    """The trial the confirmation phase recommends, for `--pick max-capacity` under the recorded SLO.

    The confirmation already applied its rules (tuner.verdict.decide): the baseline unless a finalist
    beats it distinguishably, and among finalists tied with the best one, the tie rule. None when there
    was no confirmation, another pick or SLO was asked for, or the recommended trial is not feasible.
    """
    if pick != "max-capacity" or rejudged or not record.verdict.get("winner"):
        return None
    winner = str(record.verdict["winner"])
    return next((t for t in feasible_trials(trials) if t.trial_id == winner), None)


def verdict_summary(record: SearchRecord, trial: TrialRow, *, rejudged: bool) -> dict[str, Any] | None:
    """best.json's `verdict`: the confirmation's verdict as it bears on the exported trial (None without one)."""
    verdict = record.verdict
    if not verdict:
        return None
    keys = (
        *("ratio", "ci_low", "ci_high", "confidence", "distinguishable", "rounds", "tied_with", "tie_rule"),
        *("power_at_gain", "gain_tested", "rounds_for_power"),  # could these rounds have seen a gain?
    )
    summary = {k: verdict.get(k) for k in keys}
    summary["rounds_done"] = rounds_done(verdict)  # what the interval rests on
    summary["winner"] = verdict.get("winner")
    summary["baseline"] = verdict.get("baseline")
    summary["text"] = verdict.get("text")
    summary["applies"] = not rejudged and trial.trial_id == verdict.get("winner")
    # the trial's latencies at the reference load over the baseline's, when the rounds measured them
    comparisons: list[dict[str, Any]] = list(verdict.get("comparisons") or ())
    comparison = next((c for c in comparisons if c.get("trial_id") == trial.trial_id), {})
    summary["reference_latency"] = list(comparison.get("reference_latency") or ())
    if rejudged:
        summary["note"] = "the confirmation judged the recorded SLO; this export re-judged under another one"
    elif trial.trial_id != verdict.get("winner"):
        summary["note"] = f"the confirmation recommends trial {verdict.get('winner')}; this export picked another"
    return summary


def no_feasible_message(record: SearchRecord, slo: str) -> str:
    """One line saying why nothing can be exported from `record` under `slo`."""
    counts = {s: sum(t.status == s for t in record.trials) for s in FINAL_STATUSES}
    summary = ", ".join(f"{v} {k.value.replace('_', '-')}" for k, v in counts.items())
    return (
        f"experiment {record.experiment!r}: no feasible trial to export: none of its "
        f"{len(record.trials)} trials ({summary}) passed a load step under SLO '{slo}'"
    )


def capacity_summary(trial: TrialRow) -> dict[str, Any]:
    """The trial's capacity for people and programs: value, bracket, censoring, and one line of text."""
    metrics = trial.metrics
    censored = bool(metrics.get("capacity_censored"))
    hi = metrics.get("capacity_hi_rps_per_accel")
    if censored:
        why = (
            "the trial was stopped before any step failed"
            if trial.status == TrialStatus.EARLY_STOPPED
            else "no step failed up to the capacity search's maximum load"
        )
        text = f">= {trial.capacity:.3g} requests/s per accelerator (a lower bound: {why})"
    elif trial.capacity <= 0:
        text = "no load passed: fails the SLO at every load tried"
    else:
        text = (
            f"{trial.capacity:.3g} requests/s per accelerator (it failed at {hi:.3g})"
            if hi is not None
            else f"{trial.capacity:.3g} requests/s per accelerator"
        )
        if metrics.get("capacity_inconsistent"):
            text += "; inconsistent: a load above a failure passed twice"
    return {
        "rps_per_accel": trial.capacity,
        "lo_rps_per_accel": metrics.get("capacity_lo_rps_per_accel"),
        "hi_rps_per_accel": hi,
        "censored": censored,
        "inconsistent": bool(metrics.get("capacity_inconsistent")),
        "text": text,
        "measurements": "the trial's own capacity search (the verdict, when present, rests on the confirmation rounds)",
    }
