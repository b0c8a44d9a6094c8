"""A recorded search as plain records, read from MLflow in one place.

`load_search` reads the newest search of an experiment (its parent run, documents and trial runs;
confirmation runs are left out: they repeat finalists and never enter the search's records) into a
frozen `SearchRecord` of `TrialRow`s. Everything downstream (selection, export, report) is pure
functions over these records.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from tuner.errors import TrackingError
from tuner.pareto import Objective
from tuner.space import matches_baseline
from tuner.vocabulary import PARENT_TAG, RUN_KIND_TAG, STATUS_REASON_TAG, STATUS_TAG, STEP_METRICS, RunKind

DEFAULT_OBJECTIVES: tuple[Objective, ...] = (
    ("capacity_rps_per_accel", "max"),
    ("ref_ttft_p95_s", "min"),
)


@dataclass(frozen=True)
class TrialRow:
    """One trial as recorded: its params, final metrics, and the metrics of each load step in order."""

    trial_id: str
    run_id: str
    status: str
    status_reason: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    steps: tuple[Mapping[str, float], ...] = ()

    @property
    def capacity(self) -> float:
        return float(self.metrics.get("capacity_rps_per_accel", 0.0) or 0.0)

    @property
    def ref_ttft(self) -> float:
        value = self.metrics.get("ref_ttft_p95_s")
        return float(value) if value is not None and math.isfinite(value) else math.inf


@dataclass(frozen=True)
class SearchRecord:
    """A recorded search: the parent run's params and documents, and every trial."""

    experiment: str
    parent_run_id: str
    tracking_uri: str
    slo: str
    trials: tuple[TrialRow, ...]
    objectives: tuple[Objective, ...] = DEFAULT_OBJECTIVES
    params: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    space: Mapping[str, Any] = field(default_factory=dict)
    workload: Mapping[str, Any] = field(default_factory=dict)
    baseline: Mapping[str, Any] = field(default_factory=dict)
    status: str = "FINISHED"  # the parent run's: RUNNING while the search goes on
    verdict: Mapping[str, Any] = field(default_factory=dict)  # verdict.json of the confirmation phase, if any
    validation: Mapping[str, Any] = field(default_factory=dict)  # validation.json of the latest `tuner validate`

    @property
    def model(self) -> str:
        return str(self.params.get("model") or _get(self.config, "model.path") or "")

    @property
    def failure_rule(self) -> str:
        """The capacity search's `capacity.failure_rule` ("once" for searches recorded before it existed)."""
        return str(self.capacity_plan.get("failure_rule") or "once")

    @property
    def device(self) -> str:
        device = str(self.params.get("device") or _get(self.config, "hardware.device") or "cpu")
        return "gpu" if device == "gpu" else "cpu"

    @property
    def max_model_len(self) -> int | None:
        value = _get(self.config, "model.max_model_len")
        return int(value) if value is not None else None

    @property
    def engine_args(self) -> dict[str, Any]:
        return dict(_get(self.config, "model.engine_args") or {})

    @property
    def kv_budget_mib(self) -> float:
        return float(_get(self.config, "hardware.kv_budget_mib") or 64.0)

    @property
    def cpu_cores_per_replica(self) -> int:
        return int(_get(self.config, "hardware.cpu_cores_per_replica") or 1)

    @property
    def capacity_plan(self) -> dict[str, Any]:
        """The capacity search's settings (start, growth, maximum, resolution, ...), as recorded."""
        text = self.params.get("capacity_plan")
        if text:
            try:
                return dict(json.loads(str(text)))
            except ValueError:
                pass
        return dict(_get(self.config, "capacity") or {})

    def baseline_trial(self) -> TrialRow | None:
        """The trial that ran the baseline params (the search evaluates it first), if any."""
        if not self.baseline:
            return self.trials[0] if self.trials else None
        for trial in self.trials:
            if matches_baseline(trial.params, self.baseline):
                return trial
        return None


def _get(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for key in dotted.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def coerce_param(text: Any) -> Any:
    """An MLflow param string back to the bool / int / float / None it was logged from."""
    if not isinstance(text, str):
        return text
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if text == "None":
        return None
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def scrub_uri(uri: str) -> str:
    """A tracking URI without any user:password part (up to the last @ before the query: a password may
    hold an unescaped / or @) and with the value of a `password` query key masked."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme.split("+", 1)[0].lower() in ("file", "sqlite"):
        return uri  # no credentials there; a path may hold an @
    head, mark, query = rest.partition("?")
    head = head.rsplit("@", 1)[-1]
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", query)
    return f"{scheme}://{head}{mark}{query}"


def load_search(client: Any, experiment: str, *, with_steps: bool = True) -> SearchRecord:
    """Read the latest search of `experiment` (the newest parent run that has trials) from MLflow.

    Raises TrackingError when the experiment, a parent run, or its trials are missing.
    """
    from tuner.tracking import experiment_id

    found = client.get_experiment_by_name(experiment)
    if found is None or found.lifecycle_stage == "deleted":
        raise TrackingError(f"no MLflow experiment named {experiment!r} in {scrub_uri(client.tracking_uri)}")
    exp_id = experiment_id(client, experiment, create=False)
    parents = client.search_runs(
        [exp_id],
        filter_string=f"tags.{RUN_KIND_TAG} = '{RunKind.SEARCH}'",
        order_by=["attributes.start_time DESC"],
        max_results=200,
    )
    if not parents:
        raise TrackingError(f"experiment {experiment!r} has no search run (tag {RUN_KIND_TAG}={RunKind.SEARCH})")
    for parent in parents:
        runs = client.search_runs(
            [exp_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'",
            order_by=["attributes.start_time ASC"],
            max_results=5000,
        )
        validations = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) == RunKind.VALIDATE.value]
        # Trials only: confirmation measurements repeat finalists and never enter the search's records.
        runs = [r for r in runs if r.data.tags.get(RUN_KIND_TAG, RunKind.TRIAL.value) == RunKind.TRIAL.value]
        if runs:
            break
    else:
        raise TrackingError(f"experiment {experiment!r}: its search run {parents[0].info.run_id} has no trials")
    documents = _documents(client, parent.info.run_id)
    trials = tuple(_trial_row(client, run, with_steps) for run in runs)
    objectives = _objectives(parent.data.params.get("objectives"), documents.get("search_config.yaml") or {})
    return SearchRecord(
        experiment=experiment,
        parent_run_id=parent.info.run_id,
        tracking_uri=client.tracking_uri,
        slo=parent.data.tags.get("slo") or parent.data.params.get("slo") or "",
        trials=trials,
        objectives=objectives,
        params=dict(parent.data.params),
        config=documents.get("search_config.yaml") or {},
        space=documents.get("search_space.yaml") or {},
        workload=documents.get("workload.json") or {},
        baseline=documents.get("baseline.json") or {},
        status=parent.info.status,
        verdict=documents.get("verdict.json") or {},
        validation=(
            _documents(client, validations[-1].info.run_id, ("validation.json",)).get("validation.json") or {}
            if validations
            else {}
        ),
    )


_PARENT_DOCUMENTS = ("search_config.yaml", "search_space.yaml", "workload.json", "baseline.json", "verdict.json")


def _documents(client: Any, run_id: str, names: tuple[str, ...] = _PARENT_DOCUMENTS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    present = {a.path for a in client.list_artifacts(run_id)}
    with tempfile.TemporaryDirectory() as tmp, _quiet_downloads():
        for name in names:
            if name not in present:
                continue
            try:
                local = Path(client.download_artifacts(run_id, name, tmp))
                text = local.read_text()
                out[name] = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
            except Exception:  # a missing or unreadable document only loses provenance
                continue
    return out


@contextlib.contextmanager
def _quiet_downloads():
    """MLflow draws a progress bar per artifact download unless told not to; restore the setting after."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _objectives(text: str | None, config: Mapping[str, Any]) -> tuple[Objective, ...]:
    if text:
        pairs = [part.split(":", 1) for part in text.split(",") if ":" in part]
        if pairs and all(mode in ("max", "min") for mode, _ in pairs):
            return tuple(cast(Objective, (metric, mode)) for mode, metric in pairs)
    listed = config.get("objectives") if isinstance(config, Mapping) else None
    if listed:
        return tuple(cast(Objective, (o["metric"], o["mode"])) for o in listed)
    return DEFAULT_OBJECTIVES


def _trial_row(client: Any, run: Any, with_steps: bool) -> TrialRow:
    metrics = dict(run.data.metrics)
    steps: tuple[dict[str, float], ...] = ()
    if with_steps:
        by_step: dict[int, dict[str, float]] = {}
        for key in (*STEP_METRICS, "capacity_rps_per_accel"):
            if key not in metrics:
                continue
            for point in client.get_metric_history(run.info.run_id, key):
                by_step.setdefault(int(point.step), {})[key] = float(point.value)
        steps = tuple(by_step[s] for s in sorted(by_step))
    tags = run.data.tags
    return TrialRow(
        trial_id=tags.get("trial_id") or run.info.run_name or run.info.run_id,
        run_id=run.info.run_id,
        status=tags.get(STATUS_TAG, "unknown"),
        status_reason=tags.get(STATUS_REASON_TAG, ""),
        params={k: coerce_param(v) for k, v in run.data.params.items()},
        metrics=metrics,
        steps=steps,
    )
