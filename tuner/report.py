"""Report: recorded searches as one self-contained HTML page (interactive, offline) and a Markdown twin.

Per search it shows the Pareto front of capacity per accelerator against latency at the reference load
(baseline and winner marked), each trial's latency at the loads its capacity search measured, how much the
winner beats the baseline, parameter importance, and every trial with its status and reason; with two
or more searches, a side-by-side comparison. `build_report` is pure (records in, text out);
`generate_report` reads MLflow, writes the files and logs them to each search's parent run.
"""

from __future__ import annotations

import html
import math
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.capacity import rule_text
from tuner.errors import TrackingError
from tuner.recorded import SearchRecord, TrialRow, load_search, scrub_uri
from tuner.selection import confirmed_winner, feasible_trials, pareto_front, pick_trial
from tuner.slo import parse_slo
from tuner.verdict import REFERENCE_LATENCIES, confirmation_lead, rounds_done
from tuner.vocabulary import FEASIBLE_STATUSES, FINAL_STATUSES, TrialStatus

# fANOVA over fewer trials ranks noise: 8 trials with 6 tied capacities gave confident-looking bars.
MIN_IMPORTANCE_TRIALS = 10
_STATUS_STYLE = {TrialStatus.COMPLETED: ("circle", "#1f77b4"), TrialStatus.EARLY_STOPPED: ("triangle-up", "#ff7f0e")}
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


# --- what the report says, computed from records --------------------------------------------------


@dataclass(frozen=True)
class Importance:
    """Parameter importances for capacity per accelerator, or why there are none."""

    values: Mapping[str, float] = field(default_factory=dict)
    note: str = ""
    evaluator: str = ""


@dataclass(frozen=True)
class Summary:
    """The findings of one search."""

    record: SearchRecord
    axes: tuple[str, str]  # (capacity metric, latency metric)
    front: tuple[TrialRow, ...]
    winner: TrialRow | None
    baseline: TrialRow | None
    counts: Mapping[str, int]
    importance: Importance

    @property
    def gain(self) -> float | None:
        """Winner capacity / baseline capacity (None when either is missing or the baseline is 0)."""
        if self.winner is None or self.baseline is None or self.baseline.capacity <= 0:
            return None
        return self.winner.capacity / self.baseline.capacity


def summarize(record: SearchRecord) -> Summary:
    """The front, winner (max capacity under the recorded SLO), baseline, counts and importance."""
    objectives = list(record.objectives)
    capacity_metric = next((m for m, d in objectives if d == "max"), "capacity_rps_per_accel")
    latency_metric = next((m for m, d in objectives if d == "min"), "ref_ttft_p95_s")
    feasible = feasible_trials(record.trials)
    front_idx = pareto_front([dict(t.metrics) for t in feasible], objectives) if feasible else []
    front = tuple(sorted((feasible[i] for i in front_idx), key=lambda t: _metric(t, latency_metric)))
    winner = pick_trial(record.trials, "max-capacity", objectives) if feasible else None
    confirmed = confirmed_winner(record, record.trials, pick="max-capacity", rejudged=False)
    if confirmed is not None:  # the confirmation rounds decide, not the search's one measurement each
        winner = confirmed
    statuses = [s.value for s in FINAL_STATUSES]
    statuses += sorted({t.status for t in record.trials} - set(statuses))  # e.g. running, mid-search
    counts = {s: sum(t.status == s for t in record.trials) for s in statuses}
    return Summary(
        record=record,
        axes=(capacity_metric, latency_metric),
        front=front,
        winner=winner,
        baseline=record.baseline_trial(),
        counts=counts,
        importance=param_importance(record),
    )


def param_importance(
    record: SearchRecord, target: str = "capacity_rps_per_accel", *, minimum: int = MIN_IMPORTANCE_TRIALS
) -> Importance:
    """fANOVA importances (Optuna; PED-ANOVA when scikit-learn is absent) of the searched parameters.

    The study is rebuilt from the completed and early-stopped trials, with distributions from the search
    space widened to cover every value tried (the baseline may lie outside the searched ranges).
    """
    usable = [t for t in record.trials if t.status in FEASIBLE_STATUSES and _finite(t.metrics.get(target))]
    if len(usable) < minimum:
        return Importance(
            note=f"not computed: {len(usable)} completed or early-stopped trial(s), at least {minimum} are needed "
            "(over fewer, the ranking is mostly measurement noise)"
        )
    space = dict(record.space.get("parameters") or {}) if isinstance(record.space, Mapping) else {}
    tunable = [n for n, spec in space.items() if isinstance(spec, Mapping) and "type" in spec]
    if not tunable:
        fixed = set(space)
        tunable = sorted({k for t in usable for k in t.params if k not in fixed})
    names = [n for n in tunable if all(n in t.params and t.params[n] is not None for t in usable)]
    varied = [n for n in names if len({repr(t.params[n]) for t in usable}) > 1]
    if not varied:
        return Importance(note="not computed: no searched parameter took two different values")
    import optuna
    from optuna.trial import create_trial

    distributions = {n: _distribution(space.get(n), [t.params[n] for t in usable]) for n in varied}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for trial in usable:
        study.add_trial(
            create_trial(
                params={n: trial.params[n] for n in varied},
                distributions=distributions,
                value=float(trial.metrics[target]),
            )
        )
    evaluator: Any
    try:
        import sklearn  # noqa: F401  (fANOVA needs it)

        evaluator, label = optuna.importance.FanovaImportanceEvaluator(seed=0), "fANOVA"
    except ImportError:
        evaluator, label = optuna.importance.PedAnovaImportanceEvaluator(), "PED-ANOVA"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = optuna.importance.get_param_importances(study, evaluator=evaluator, target=None)
    except Exception as error:  # too little variation for the evaluator: say so, never fail the report
        return Importance(note=f"not computed: {type(error).__name__}: {error}")
    cleaned = {k: float(v) if _finite(v) else 0.0 for k, v in values.items()}
    return Importance(values=cleaned, evaluator=label, note=f"{label} over {len(usable)} trials, target {target}")


def _distribution(spec: Any, values: list[Any]):
    """An Optuna distribution for `spec` (int/float/categorical) that contains every value in `values`."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    kind = spec.get("type") if isinstance(spec, Mapping) else None
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if kind == "categorical" or not numeric:
        choices = list(spec.get("choices", [])) if isinstance(spec, Mapping) else []
        for value in values:
            if value not in choices:
                choices.append(value)
        return CategoricalDistribution(choices)
    low = min([*values, *([spec["low"]] if isinstance(spec, Mapping) and "low" in spec else [])])
    high = max([*values, *([spec["high"]] if isinstance(spec, Mapping) and "high" in spec else [])])
    log = bool(spec.get("log")) if isinstance(spec, Mapping) else False
    if kind == "int" or (kind is None and all(isinstance(v, int) for v in values)):
        step = int(spec.get("step", 1) or 1) if isinstance(spec, Mapping) else 1
        if any((int(v) - int(low)) % step for v in values) or (int(high) - int(low)) % step:
            step = 1
        return IntDistribution(int(low), int(high), log=log and low >= 1 and step == 1, step=step)
    return FloatDistribution(float(low), float(high), log=log and low > 0)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _metric(trial: TrialRow, name: str) -> float:
    value = trial.metrics.get(name)
    return float(value) if value is not None and math.isfinite(value) else math.inf


# --- figures --------------------------------------------------------------------------------------


def pareto_figure(summary: Summary):
    """Capacity per accelerator against latency at the reference load; front, baseline, winner marked.

    Only trials that passed a load step are drawn: the others have no capacity and a penalty latency.
    """
    import plotly.graph_objects as go

    cap, lat = summary.axes
    figure = go.Figure()
    feasible = feasible_trials(summary.record.trials)
    for status, (symbol, color) in _STATUS_STYLE.items():
        trials = [t for t in feasible if t.status == status and _finite(t.metrics.get(lat))]
        if trials:
            figure.add_trace(
                go.Scatter(
                    x=[t.metrics[lat] for t in trials],
                    y=[t.metrics.get(cap, 0.0) for t in trials],
                    mode="markers",
                    name=status.value.replace("_", " ")
                    + (" (capacity is a lower bound)" if status == TrialStatus.EARLY_STOPPED else ""),
                    marker={"symbol": symbol, "size": 10, "color": color, "opacity": 0.75},
                    text=[_hover(t) for t in trials],
                    hovertemplate="%{text}<extra></extra>",
                )
            )
    if summary.front:
        figure.add_trace(
            go.Scatter(
                x=[t.metrics[lat] for t in summary.front],
                y=[t.metrics.get(cap, 0.0) for t in summary.front],
                mode="lines+markers",
                name="Pareto front",
                line={"color": "#d62728", "width": 2},
                marker={"size": 6, "color": "#d62728"},
                hoverinfo="skip",
            )
        )
    _confirmation_trace(figure, summary, feasible, lat)
    winner_label = "winner (confirmed)" if summary.record.verdict else "winner (max capacity)"
    for trial, label, symbol, color in (
        (summary.baseline, "baseline", "star", "#2ca02c"),
        (summary.winner, winner_label, "diamond", "#9467bd"),
    ):
        if trial is not None and trial in feasible and _finite(trial.metrics.get(lat)):
            figure.add_trace(
                go.Scatter(
                    x=[trial.metrics[lat]],
                    y=[trial.metrics.get(cap, 0.0)],
                    mode="markers",
                    name=label,
                    marker={
                        "symbol": symbol,
                        "size": 18,
                        "color": "rgba(0,0,0,0)",
                        "line": {"width": 2.5, "color": color},
                    },
                    text=[f"{label}<br>{_hover(trial)}"],
                    hovertemplate="%{text}<extra></extra>",
                )
            )
    left_out = len(summary.record.trials) - len(feasible)
    note = f"; {left_out} trial(s) that passed no load step not drawn" if left_out else ""
    figure.update_layout(
        title=f"{summary.record.experiment}: Pareto front (SLO {summary.record.slo}{note})",
        xaxis_title=_axis_label(lat),
        yaxis_title=_axis_label(cap),
        height=460,
        template="plotly_white",
        legend={"orientation": "h", "y": -0.2},
    )
    return figure


def _confirmation_trace(figure, summary: Summary, feasible: Sequence[TrialRow], lat: str) -> None:
    """Each confirmation round's bracket of the re-measured configs, drawn at the trial's latency."""
    import plotly.graph_objects as go

    measured = summary.record.verdict.get("measurements") or {}
    by_id = {t.trial_id: t for t in feasible}
    xs, ys, plus, minus, texts = [], [], [], [], []
    for trial_id, rounds in measured.items():
        trial = by_id.get(trial_id)
        if trial is None or not _finite(trial.metrics.get(lat)):
            continue
        for m in rounds:
            lo, hi = float(m.get("capacity_rps_per_accel") or 0.0), m.get("hi_rps_per_accel")
            mid = math.sqrt(lo * hi) if lo > 0 and hi else lo
            xs.append(trial.metrics[lat])
            ys.append(mid)
            plus.append((hi - mid) if hi else 0.0)
            minus.append(mid - lo)
            bracket = f"{lo:.3g}-{hi:.3g}" if hi else f">= {lo:.3g}"
            texts.append(f"trial {trial_id}, confirmation round {m.get('round')}: {bracket} rps/accel")
    if xs:
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name="confirmation rounds (bracket each)",
                marker={"symbol": "line-ew", "size": 14, "line": {"width": 2, "color": "#17becf"}},
                error_y={"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "color": "#17becf"},
                text=texts,
                hovertemplate="%{text}<extra></extra>",
            )
        )


def curves_figure(record: SearchRecord):
    """Each trial's latency against the measured load of each step (TTFT and TPOT at the SLO's statistic),
    SLO bounds as lines."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = _curve_metrics(record.slo)
    figure = make_subplots(rows=1, cols=len(panels), subplot_titles=[_axis_label(m) for m, _ in panels])
    for index, trial in enumerate(t for t in record.trials if t.steps):
        color = _PALETTE[index % len(_PALETTE)]
        for column, (metric, _) in enumerate(panels, start=1):
            steps = sorted(
                (s for s in trial.steps if _finite(s.get(metric)) and _finite(_step_rate(s))), key=_step_rate
            )
            if not steps:
                continue
            figure.add_trace(
                go.Scatter(
                    x=[_step_rate(s) for s in steps],
                    y=[s[metric] for s in steps],
                    mode="lines+markers",
                    name=f"{trial.trial_id} ({trial.status})",
                    legendgroup=trial.trial_id,
                    showlegend=column == 1,
                    line={"color": color},
                    marker={
                        "size": 9,
                        "color": color,
                        "symbol": ["circle" if s.get("slo_pass") else "x" for s in steps],
                    },
                    text=[
                        f"trial {trial.trial_id}<br>step {int(s.get('load_step', 0))} "
                        f"({s.get('load_factor', 0):.3g}x)"
                        f"<br>{'pass' if s.get('slo_pass') else 'FAIL'}"
                        for s in steps
                    ],
                    hovertemplate="%{text}<br>%{x:.3g} rps/accel<br>%{y:.3g} s<extra></extra>",
                ),
                row=1,
                col=column,
            )
    for column, (_, bound) in enumerate(panels, start=1):
        if bound is not None:
            figure.add_hline(
                y=bound,
                line={"dash": "dash", "color": "#888"},
                row=1,
                col=column,
                annotation_text="SLO bound",
                annotation_position="top left",
            )
        figure.update_xaxes(title_text="measured load (requests/s per accelerator)", row=1, col=column)
        figure.update_yaxes(title_text="seconds", row=1, col=column)
    figure.update_layout(
        title=f"{record.experiment}: latency at each load the capacity search measured "
        "(circle = step passed the SLO, x = failed)",
        height=480,
        template="plotly_white",
        legend={"orientation": "h", "y": -0.25},
    )
    return figure


def _step_rate(step: Mapping[str, float]) -> float:
    """A step's measured arrival rate per accelerator (its offered rate for older records)."""
    rate = step.get("arrival_rps", step.get("offered_rps"))
    return float("nan") if rate is None else float(rate) / max(float(step.get("num_accelerators") or 1.0), 1.0)


def capacity_cell(trial: TrialRow) -> str:
    """A capacity for a table: '13.2 (fails at 14.1)', '≥ 85' when censored, '-' for no capacity (an
    infeasible trial, or one ended before its first load step reported)."""
    if trial.status == TrialStatus.INFEASIBLE or "capacity_rps_per_accel" not in trial.metrics:
        return "-"
    if trial.metrics.get("capacity_censored"):
        return f"≥ {_fmt(trial.capacity)}"
    hi = trial.metrics.get("capacity_hi_rps_per_accel")
    flag = " (inconsistent)" if trial.metrics.get("capacity_inconsistent") else ""
    return (f"{_fmt(trial.capacity)} (fails at {_fmt(hi)})" if hi is not None else _fmt(trial.capacity)) + flag


def capacity_phrase(trial: TrialRow) -> str:
    """A capacity for a sentence: '13.2 requests/s per accelerator (it failed at 14.1)'."""
    if trial.metrics.get("capacity_censored"):
        return f"at least {_fmt(trial.capacity)} requests/s per accelerator (no load it ran failed)"
    hi = trial.metrics.get("capacity_hi_rps_per_accel")
    failed = f" (it failed at {_fmt(hi)})" if hi is not None else ""
    return f"{_fmt(trial.capacity)} requests/s per accelerator{failed}"


def _curve_metrics(slo: str) -> list[tuple[str, float | None]]:
    """(step metric, bound) for each SLO term, TTFT and TPOT p95 when the SLO names neither."""
    try:
        terms = parse_slo(slo).terms if slo else ()
    except Exception:
        terms = ()
    panels: list[tuple[str, float | None]] = [(f"{t.metric}_{t.stat}_s", float(t.bound_s)) for t in terms[:3]]
    return panels or [("ttft_p95_s", None), ("tpot_p95_s", None)]


def importance_figure(summary: Summary):
    """Horizontal bars of parameter importance (None when there are no values)."""
    import plotly.graph_objects as go

    values = summary.importance.values
    if not values:
        return None
    names = list(values)[::-1]
    figure = go.Figure(go.Bar(x=[values[n] for n in names], y=names, orientation="h", marker={"color": "#1f77b4"}))
    figure.update_layout(
        title=f"{summary.record.experiment}: parameter importance for capacity per accelerator "
        f"({summary.importance.evaluator})",
        xaxis_title="importance (sums to 1)",
        height=120 + 40 * len(names),
        template="plotly_white",
    )
    return figure


def comparison_figure(summaries: Sequence[Summary]):
    """Every search's Pareto front on one chart (one colour per search, baseline as a star)."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for index, summary in enumerate(summaries):
        cap, lat = summary.axes
        color = _PALETTE[index % len(_PALETTE)]
        name = summary.record.experiment
        feasible = [t for t in feasible_trials(summary.record.trials) if _finite(t.metrics.get(lat))]
        figure.add_trace(
            go.Scatter(
                x=[t.metrics[lat] for t in feasible],
                y=[t.capacity for t in feasible],
                mode="markers",
                name=f"{name}: trials",
                legendgroup=name,
                marker={"color": color, "opacity": 0.4, "size": 8},
                text=[_hover(t) for t in feasible],
                hovertemplate="%{text}<extra></extra>",
            )
        )
        if summary.front:
            figure.add_trace(
                go.Scatter(
                    x=[t.metrics[lat] for t in summary.front],
                    y=[t.capacity for t in summary.front],
                    mode="lines+markers",
                    name=f"{name}: front",
                    legendgroup=name,
                    line={"color": color, "width": 2.5},
                    hoverinfo="skip",
                )
            )
        base = summary.baseline
        if base is not None and base in feasible:
            figure.add_trace(
                go.Scatter(
                    x=[base.metrics[lat]],
                    y=[base.capacity],
                    mode="markers",
                    name=f"{name}: baseline",
                    legendgroup=name,
                    marker={"symbol": "star", "size": 16, "color": color},
                )
            )
    figure.update_layout(
        title="Pareto fronts side by side",
        xaxis_title=_axis_label(summaries[0].axes[1]),
        yaxis_title=_axis_label(summaries[0].axes[0]),
        height=480,
        template="plotly_white",
        legend={"orientation": "h", "y": -0.2},
    )
    return figure


def _hover(trial: TrialRow) -> str:
    params = "<br>".join(f"{html.escape(str(k))}={html.escape(_fmt(v))}" for k, v in trial.params.items())
    return (
        f"trial {html.escape(trial.trial_id)} [{trial.status}]<br>"
        f"capacity {html.escape(capacity_cell(trial))} rps/accel"
        f"<br>ref TTFT p95 {_fmt(trial.metrics.get('ref_ttft_p95_s'))} s<br>{params}"
    )


_LABELS = {
    "capacity_rps_per_accel": "capacity (requests/s per accelerator within the SLO)",
    "ref_ttft_p95_s": "TTFT p95 at the reference load (s)",
    "ref_tpot_p95_s": "TPOT p95 at the reference load (s)",
    "ref_e2e_p95_s": "end-to-end p95 at the reference load (s)",
}


def _axis_label(metric: str) -> str:
    if metric in _LABELS:
        return _LABELS[metric]
    match = re.fullmatch(r"(ttft|tpot|itl|e2e|queue)_(\w+)_s", metric)
    return f"{match.group(1).upper()} {match.group(2)} (s)" if match else metric


# --- tables ---------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.3g}"
    return str(value)


def trial_table(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of every trial: role, status, params, capacity, latency at reference, steps, reason."""
    record = summary.record
    params = _shown_params(record)
    front = {t.trial_id for t in summary.front}
    header = [
        "trial",
        "role",
        "status",
        *params,
        "capacity rps/accel",
        "ref TTFT p95 s",
        "ref TPOT p95 s",
        "steps passed",
        "reason",
    ]
    rows = []
    for trial in record.trials:
        roles = [
            r
            for r, hit in (
                ("winner", summary.winner is not None and trial.trial_id == summary.winner.trial_id),
                ("baseline", summary.baseline is not None and trial.trial_id == summary.baseline.trial_id),
                ("pareto", trial.trial_id in front),
            )
            if hit
        ]
        capacity = capacity_cell(trial)
        latency = [
            _fmt(trial.metrics.get(m)) if trial.status != TrialStatus.INFEASIBLE else "-"
            for m in ("ref_ttft_p95_s", "ref_tpot_p95_s")
        ]
        passed = sum(1 for s in trial.steps if s.get("slo_pass"))
        rows.append(
            [
                trial.trial_id,
                ", ".join(roles),
                trial.status,
                *[_fmt(trial.params.get(p)) for p in params],
                capacity,
                *latency,
                f"{passed}/{len(trial.steps)}" if trial.steps else "-",
                trial.status_reason or "-",
            ]
        )
    return header, rows


def _shown_params(record: SearchRecord) -> list[str]:
    """Params that differ between trials (the searched ones), in the order first seen."""
    names: list[str] = []
    for trial in record.trials:
        for name in trial.params:
            if name not in names:
                names.append(name)
    varied = [n for n in names if len({repr(t.params.get(n)) for t in record.trials}) > 1]
    return varied or names


def gain_lines(summary: Summary) -> list[str]:
    """Plain sentences on how the winner compares with the baseline."""
    winner, baseline = summary.winner, summary.baseline
    if winner is None:
        return ["No trial passed a load step under the SLO: there is no winner to compare."]
    lines = []
    verdict = summary.record.verdict
    if verdict:
        recommended = (
            "the baseline" if verdict.get("winner") == verdict.get("baseline") else f"trial {verdict.get('winner')}"
        )
        rounds = " (each a fresh pool, order rotated)" if rounds_done(verdict) else ""
        lines.append(f"{confirmation_lead(verdict)}{rounds}: {verdict.get('text')}. Recommended: {recommended}.")
    else:
        lines.append(
            "No confirmation phase ran: every figure below is one measurement, and the winner is the highest of "
            "noisy values (see the README on repeatability)."
        )
    if baseline is None:
        lines.append("The baseline trial is not in the record.")
    elif baseline.trial_id == winner.trial_id:
        lines.append(f"The baseline (trial {baseline.trial_id}) is itself the best: no candidate beat it.")
        for comparison in verdict.get("comparisons") or ():
            for text in _confirmed_latency(verdict, str(comparison.get("trial_id"))).values():
                lines.append(f"Trial {comparison.get('trial_id')} against the baseline: {text}.")
    elif baseline.status == TrialStatus.INFEASIBLE or baseline.capacity <= 0:
        lines.append(
            f"The baseline (trial {baseline.trial_id}, {baseline.status}) fails the SLO at every load tried; "
            f"the winner (trial {winner.trial_id}) sustains {capacity_phrase(winner)}."
        )
    else:
        gain = summary.gain or 0.0
        at_least = "at least " if winner.metrics.get("capacity_censored") else ""
        if baseline.metrics.get("capacity_censored"):
            lines.append(
                f"The winner (trial {winner.trial_id}) sustains {capacity_phrase(winner)}; the baseline "
                f"passed every load it was measured at ({capacity_phrase(baseline)}), so no ratio can be given."
            )
        else:
            lines.append(
                f"The winner (trial {winner.trial_id}) sustains {capacity_phrase(winner)}, the baseline "
                f"{capacity_phrase(baseline)}: {at_least}x{gain:.2f} ({(gain - 1) * 100:+.0f}%) in the search, "
                "one capacity search each (selection-biased: the winner was picked for being high)."
            )
        confirmed = _confirmed_latency(verdict, winner.trial_id)
        for metric, label in REFERENCE_LATENCIES.items():
            if metric in confirmed:
                lines.append(confirmed[metric] + ".")
                continue
            a, b = winner.metrics.get(metric), baseline.metrics.get(metric)
            if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and b:
                lines.append(
                    f"{label} at the reference load: {a:.3g} s against {b:.3g} s ({(a / b - 1) * 100:+.0f}%; "
                    "one step each in the search, no interval: `confirm.reference_step` measures it in every "
                    "confirmation round)."
                )
    if winner.metrics.get("capacity_censored"):
        lines.append("The winner's capacity is a lower bound: no step it ran failed.")
    return lines


def _confirmed_latency(verdict: Mapping[str, Any], trial_id: str) -> dict[str, str]:
    """metric -> the confirmation rounds' interval on it (finalist over baseline), where there is one."""
    comparisons: list[dict[str, Any]] = list(verdict.get("comparisons") or ())
    comparison = next((c for c in comparisons if c.get("trial_id") == trial_id), {})
    return {c["metric"]: c["text"] for c in comparison.get("reference_latency") or () if c.get("ratio") is not None}


def comparison_table(summaries: Sequence[Summary]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) comparing searches side by side."""
    header = [
        "experiment",
        "model",
        "workload",
        "SLO",
        "device",
        "trials (completed/early-stopped/infeasible)",
        "winner",
        "winner capacity rps/accel",
        "winner ref TTFT p95 s",
        "baseline capacity rps/accel",
        "gain",
    ]
    rows = []
    for s in summaries:
        record, winner, baseline = s.record, s.winner, s.baseline
        workload = record.workload.get("source") or record.params.get("workload") or "-"
        sha = str(record.workload.get("sha256") or "")[:12]
        rows.append(
            [
                record.experiment,
                Path(record.model).name or record.model,
                f"{Path(str(workload)).name} {sha}".strip(),
                record.slo,
                record.device,
                "/".join(str(s.counts[status]) for status in FINAL_STATUSES),
                winner.trial_id if winner else "-",
                _fmt(winner.capacity) if winner else "-",
                _fmt(winner.metrics.get("ref_ttft_p95_s")) if winner else "-",
                _fmt(baseline.capacity) if baseline else "-",
                f"x{s.gain:.2f}" if s.gain else "-",
            ]
        )
    return header, rows


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- documents ------------------------------------------------------------------------------------


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1300px;
color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:1.8em}h3{margin-top:1.4em}
.meta{color:#555;font-size:.92em}.meta code{background:#f4f4f4;padding:1px 4px}
.table{overflow-x:auto}table{border-collapse:collapse;font-size:.85em;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f4f6f8}
tbody tr:nth-child(even){background:#fafafa}.note{color:#666;font-style:italic}.plot{margin:12px 0}
.gain{font-size:1.05em;background:#f3f8f3;border-left:4px solid #2ca02c;padding:8px 12px}
"""


def build_report(records: Sequence[SearchRecord], *, generated: str | None = None) -> tuple[str, str]:
    """(HTML, Markdown) for the searches in `records`; the HTML embeds plotly.js once and works offline."""
    if not records:
        raise ValueError("records is empty; give at least one search")
    from plotly.offline import get_plotlyjs

    generated = generated or time.strftime("%Y-%m-%d %H:%M:%S")
    summaries = [summarize(r) for r in records]
    names = ", ".join(r.experiment for r in records)
    parts = [
        f"<h1>vllm-tuner report: {html.escape(names)}</h1>",
        f'<p class="meta">Generated {html.escape(generated)} from MLflow '
        f"<code>{html.escape(scrub_uri(records[0].tracking_uri))}</code>.</p>",
    ]
    md = [
        f"# vllm-tuner report: {names}",
        "",
        f"Generated {generated} from MLflow `{scrub_uri(records[0].tracking_uri)}`.",
        "",
    ]
    if len(summaries) > 1:
        header, rows = comparison_table(summaries)
        parts += [
            "<h2>Comparison</h2>",
            _html_table(header, rows),
            _plot(comparison_figure(summaries), "plot-comparison"),
        ]
        md += ["## Comparison", "", _md_table(header, rows), ""]
    for index, summary in enumerate(summaries):
        section_html, section_md = _section(summary, index)
        parts.append(section_html)
        md += section_md
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>vllm-tuner report: {html.escape(names)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>' + "\n".join(parts) + "</body></html>\n"
    )
    return page, "\n".join(md).rstrip() + "\n"


def _section(summary: Summary, index: int) -> tuple[str, list[str]]:
    record = summary.record
    workload = record.workload
    source = workload.get("source") or record.params.get("workload") or "-"
    meta = [
        ("model", record.model or "-"),
        ("workload", f"{source} (sha256 {str(workload.get('sha256', '-'))[:16]})"),
        ("SLO", record.slo or "-"),
        ("device", record.device),
        ("reference load", f"{record.params.get('reference_rps', '-')} requests/s per accelerator"),
        ("capacity search", _plan_text(record.capacity_plan)),
        ("objectives", ", ".join(f"{d} {m}" for m, d in record.objectives)),
        (
            "trials",
            f"{len(record.trials)}: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in summary.counts.items()),
        ),
        (
            "parent run",
            record.parent_run_id
            + ("" if record.status == "FINISHED" else f" ({record.status.lower()}: the search may not be over)"),
        ),
    ]
    transforms = workload.get("transforms") or []
    if transforms:
        meta.append(
            (
                "workload transforms",
                "; ".join(str(t.get("op", t)) if isinstance(t, Mapping) else str(t) for t in transforms),
            )
        )
    out = [f'<h2 id="exp-{index}">Search {html.escape(record.experiment)}</h2>', '<ul class="meta">']
    out += [f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>" for k, v in meta]
    out.append("</ul>")
    md = [f"## Search {record.experiment}", ""] + [f"- **{k}**: {v}" for k, v in meta] + [""]

    gains = gain_lines(summary)
    out += [
        "<h3>Winner against the baseline</h3>",
        '<div class="gain">' + "<br>".join(html.escape(g) for g in gains) + "</div>",
    ]
    md += ["### Winner against the baseline", ""] + [f"- {g}" for g in gains] + [""]
    if summary.winner is not None:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in summary.winner.params.items())
        out.append(f'<p class="meta">Winner params: <code>{html.escape(params)}</code></p>')
        md += [f"Winner params: `{params}`", ""]

    if record.validation:
        header, rows, text = validation_table(record.validation)
        out += [
            "<h3>Validation through the serving stack</h3>",
            f"<p>{html.escape(text)}</p>",
            _html_table(header, rows),
        ]
        md += ["### Validation through the serving stack", "", text, "", _md_table(header, rows), ""]

    out += ["<h3>Pareto front</h3>", _plot(pareto_figure(summary), f"plot-pareto-{index}")]
    md += ["### Pareto front", ""]
    cap, lat = summary.axes
    if summary.front:
        header = ["trial", "status", cap, lat, "params"]
        rows = [
            [
                t.trial_id,
                t.status,
                capacity_cell(t),
                _fmt(t.metrics.get(lat)),
                ", ".join(f"{k}={_fmt(v)}" for k, v in t.params.items()),
            ]
            for t in summary.front
        ]
        out.append(_html_table(header, rows))
        md += [_md_table(header, rows), ""]
    else:
        out.append('<p class="note">No trial passed a load step: nothing is Pareto-optimal.</p>')
        md += ["No trial passed a load step: nothing is Pareto-optimal.", ""]

    out += ["<h3>Throughput-latency curves</h3>", _plot(curves_figure(record), f"plot-curves-{index}")]
    md += ["### Throughput-latency curves", "", _md_table(*_curve_rows(record)), ""]

    out.append("<h3>Parameter importance</h3>")
    md += ["### Parameter importance", ""]
    figure = importance_figure(summary)
    if figure is not None:
        out.append(_plot(figure, f"plot-importance-{index}"))
        rows = [[k, f"{v:.3f}"] for k, v in summary.importance.values.items()]
        out.append(f'<p class="note">{html.escape(summary.importance.note)}</p>')
        md += [_md_table(["parameter", "importance"], rows), "", summary.importance.note, ""]
    else:
        out.append(f'<p class="note">Parameter importance {html.escape(summary.importance.note)}.</p>')
        md += [f"Parameter importance {summary.importance.note}.", ""]

    header, rows = trial_table(summary)
    out += ["<h3>All trials</h3>", _html_table(header, rows)]
    md += ["### All trials", "", _md_table(header, rows), ""]
    return "\n".join(out), md


def validation_table(document: Mapping[str, Any]) -> tuple[list[str], list[list[str]], str]:
    """The latest `tuner validate` of this search: one row per stack, config and rate, and its sentence."""
    header = ["stack", "config", "rate", "requests/s per replica", "SLO", "achieved", "goodput"]
    header += ["TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "E2E p95", "failed"]
    rows = [
        [
            str(m.get("stack")),
            str(m.get("config")),
            str(m.get("rate")),
            _fmt(m.get("rate_rps")),
            "pass" if m.get("slo_pass") else "FAIL",
            _fmt(m.get("achieved_rps")),
            _fmt(m.get("goodput_rps")),
            *(_fmt(m.get(k)) for k in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "e2e_p95_s")),
            _fmt(m.get("failed_requests")),
        ]
        for m in document.get("measurements") or []
    ]
    ratios = "; ".join(
        f"{r['stack']} at the {r['rate']} rate: goodput x{r['goodput_ratio']:.2f} the comparison's"
        for r in document.get("ratios") or []
        if r.get("goodput_ratio") is not None
    )
    text = f"{document.get('text', '')} (client: {document.get('client', 'vllm bench serve')})."
    return header, rows, text + (f" {ratios}." if ratios else "")


def _plan_text(plan: Mapping[str, Any]) -> str:
    if not plan:
        return "-"
    width = max(float(plan.get("resolution", 0.1)), float(plan.get("noise", 0.0)))
    return (
        f"climb from {plan.get('start_factor', 1):g}x x{plan.get('growth', 2):g} per step up to "
        f"{plan.get('max_factor', 0):g}x, then bisect to {width:.0%}" + rule_text(str(plan.get("failure_rule", "once")))
    )


def _curve_rows(record: SearchRecord) -> tuple[list[str], list[list[str]]]:
    metrics = [m for m, _ in _curve_metrics(record.slo)]
    header = ["trial", "step", "load", "measured rps/accel", "achieved rps", *metrics, "SLO"]
    rows = []
    for trial in record.trials:
        for step in (s for s in trial.steps if "offered_rps" in s):
            rows.append(
                [
                    trial.trial_id,
                    _fmt(int(step.get("load_step", 0))),
                    f"{step.get('load_factor', 0):.3g}x",
                    _fmt(_step_rate(step)),
                    _fmt(step.get("achieved_rps")),
                    *[_fmt(step.get(m)) for m in metrics],
                    "pass" if step.get("slo_pass") else "fail",
                ]
            )
    return header, rows


def _plot(figure, div_id: str) -> str:
    body = figure.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=div_id,
        config={"displaylogo": False, "responsive": True},
    )
    return f'<div class="plot">{body}</div>'


# --- MLflow I/O -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportResult:
    """Where the report went."""

    html_path: Path
    markdown_path: Path
    logged_to: tuple[str, ...]
    records: tuple[SearchRecord, ...]


def default_out_dir(root: Path, experiments: Sequence[str]) -> Path:
    """`<root>/reports/<exp1>+<exp2>...` (names made file-safe)."""
    name = "+".join(re.sub(r"[^A-Za-z0-9_.-]+", "-", e) for e in experiments)[:120] or "report"
    return root / "reports" / name


def generate_report(
    tracking_uri: str, experiments: Sequence[str], out_dir: str | Path, *, log_to_mlflow: bool = True
) -> ReportResult:
    """Read each experiment's latest search, write report.html and report.md, log both to each parent run.

    Raises TrackingError when an experiment has no recorded search.
    """
    from tuner.tracking import attach_files, client_for

    if not experiments:
        raise TrackingError("give at least one --experiment")
    client = client_for(tracking_uri)
    records = tuple(load_search(client, name) for name in dict.fromkeys(experiments))
    page, markdown = build_report(records)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(page)
    md_path.write_text(markdown)
    logged = []
    if log_to_mlflow:
        for record in records:
            attach_files(client, record.parent_run_id, [html_path, md_path])
            logged.append(record.parent_run_id)
    return ReportResult(html_path=html_path, markdown_path=md_path, logged_to=tuple(logged), records=records)
