"""MLflow records of a search, written here and nowhere else: one parent run per search, one nested run
per trial (`TrialTracker`, a Ray Tune callback) and per confirmation measurement, fronts, the verdict
and reports as the parent's artifacts. (`tuner.recorded` is where they are read back.)

Only the search driver writes, so a SQLite store sees no concurrent writers. Prompt text never reaches
MLflow: only params, metrics, tags and provenance.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import TrackingError
from tuner.recorded import TrialRow, scrub_uri
from tuner.vocabulary import (
    FINAL_STATUSES,
    PARENT_TAG,
    RUN_KIND_TAG,
    STATUS_REASON_TAG,
    STATUS_TAG,
    RunKind,
    TrialStatus,
)

# How MLflow's SQL stores write an infinite value (they cannot hold inf); the SLO's statistics are +inf
# when failed requests decide them, and must read back as larger than any bound.
MLFLOW_INFINITY = 1.7976931348623157e308
# Keys Tune adds to every result; they are bookkeeping, not measurements.
_TUNE_KEYS = {
    "done",
    "training_iteration",
    "timestamp",
    "time_this_iter_s",
    "time_total_s",
    "pid",
    "time_since_restore",
    "iterations_since_restore",
    "timesteps_total",
    "episodes_total",
    "timesteps_since_restore",
    "should_checkpoint",
}


def default_tracking_uri(root: Path) -> str:
    """`sqlite:///<root>/reports/mlflow.db`: MLflow 3 refuses a plain ./mlruns file store."""
    return f"sqlite:///{(root / 'reports' / 'mlflow.db').resolve()}"


# The stores MLflow can track to (a scheme may carry a driver: postgresql+psycopg2://).
_TRACKING_SCHEMES = {"", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks"}


def check_tracking_uri(uri: str) -> None:
    """Raise TrackingError (one line, naming --tracking-uri) for a URI MLflow cannot track to: an unknown
    scheme, an http(s) server that does not answer as MLflow's does, a SQLite file that is not a
    database, or a database URI whose driver is not installed or whose server does not accept a
    connection. A SQLite database's folder is created (nothing else is written), failing the same way
    when it cannot be."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    shown = scrub_uri(uri)
    if scheme not in _TRACKING_SCHEMES:
        raise TrackingError(
            f"--tracking-uri {shown}: MLflow cannot track to a {scheme!r} URI (use sqlite:///FILE, "
            "http(s)://HOST:PORT, file:///DIR, postgresql://, mysql:// or mssql://)"
        )
    if scheme == "sqlite":
        database = Path(uri.removeprefix("sqlite:///"))
        folder = database.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TrackingError(f"--tracking-uri {shown}: cannot create {folder}: {error.strerror}") from None
        if not os.access(folder, os.W_OK):
            raise TrackingError(f"--tracking-uri {shown}: {folder} is not writable")
        if database.exists():
            _check_sqlite(shown, database)
    elif scheme in ("http", "https"):
        _check_server(shown)
    elif scheme in ("postgresql", "mysql", "mssql"):
        _check_database(uri, shown)


# How long the tracking server may take to answer the check (MLflow's own client retries for minutes).
SERVER_PROBE_TIMEOUT_S = 5.0


def _check_server(uri: str) -> None:
    """TrackingError unless an MLflow tracking server answers at `uri` (its /health route; an answer that
    asks for credentials counts: the MLflow client sends those)."""
    import urllib.error
    import urllib.request

    url = f"{uri.rstrip('/')}/health"
    try:
        urllib.request.urlopen(url, timeout=SERVER_PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError as error:
        error.close()
        if error.code not in (401, 403):
            raise TrackingError(
                f"--tracking-uri {uri}: the server there does not answer as MLflow's does (HTTP {error.code} for {url})"
            ) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        why = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        raise TrackingError(f"--tracking-uri {uri}: no MLflow tracking server answers there ({why})") from None


def _check_database(uri: str, shown: str) -> None:
    """TrackingError unless SQLAlchemy (MLflow's database layer) reads `uri` and its driver is installed,
    and, where the URI names a TCP host, the host accepts a connection. No login is tried: MLflow does
    that, and says why it fails."""
    import socket

    from sqlalchemy.engine.url import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(uri)
        dialect = url.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):  # their messages may quote the password
        raise TrackingError(f"--tracking-uri {shown}: not a database URI SQLAlchemy can read") from None
    try:
        dialect.import_dbapi()
    except ImportError as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise TrackingError(
            f"--tracking-uri {shown}: its database driver {dialect.driver!r} cannot be imported ({reason}); "
            "install it into this environment"
        ) from None
    if not _tcp_host(url):
        return
    port = url.port or _DATABASE_PORTS.get(url.get_backend_name())
    try:
        socket.create_connection((url.host, port), timeout=SERVER_PROBE_TIMEOUT_S).close()
    except OSError as error:
        why = error.strerror or ("no answer" if isinstance(error, TimeoutError) else type(error).__name__)
        where = f"{url.host}:{port}"
        raise TrackingError(
            f"--tracking-uri {shown}: no database server accepts a connection at {where} ({why})"
        ) from None


def _tcp_host(url: Any) -> bool:
    """Whether the database URI reaches its server over TCP at its host: not a local socket (no host, a
    `unix_socket` or `host` query key, MySQL's `localhost`) and not an ODBC data source name (mssql
    without a port)."""
    if not url.host or {"unix_socket", "host", "odbc_connect"} & set(url.query):
        return False
    backend = url.get_backend_name()
    if backend == "mysql" and url.host == "localhost":
        return False
    return not (backend == "mssql" and url.port is None)


# Where a database server listens when its URI names no port.
_DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def _check_sqlite(uri: str, database: Path) -> None:
    """TrackingError unless `database` is a file SQLite can read (it writes nothing)."""
    import sqlite3
    from contextlib import closing

    if not database.is_file():
        raise TrackingError(f"--tracking-uri {uri}: {database} is not a database file")
    try:
        with closing(sqlite3.connect(database)) as connection:
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as error:
        raise TrackingError(f"--tracking-uri {uri}: {database} is not an SQLite database ({error})") from None


def client_for(uri: str):
    """An MlflowClient for `uri` (checked by `check_tracking_uri`, which creates a SQLite file's folder)."""
    from mlflow.tracking import MlflowClient

    check_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str, *, create: bool) -> str:
    """The id of experiment `name`; created when `create`, else TrackingError if it does not exist."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        return found.experiment_id
    if not create:
        raise TrackingError(f"no MLflow experiment named {name!r} in {scrub_uri(client.tracking_uri)}")
    artifacts = None
    if str(client.tracking_uri).startswith("sqlite:///"):
        # Beside the database, not in ./mlruns of whatever folder the command ran in.
        root = Path(str(client.tracking_uri).removeprefix("sqlite:///")).parent / "mlartifacts"
        artifacts = (root / name).resolve().as_uri()
    return client.create_experiment(name, artifact_location=artifacts)


def measurable(result: dict[str, Any]) -> dict[str, float]:
    """The numeric measurements of a Tune result (Tune's own bookkeeping and NaN left out; an infinite
    value as MLflow's SQL stores write it, `MLFLOW_INFINITY`)."""
    out = {}
    for key, value in result.items():
        if key in _TUNE_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
        elif math.isinf(value):
            out[key] = math.copysign(MLFLOW_INFINITY, value)
    return out


# A replay client whose sends ran this late (p99) bunched the step's requests: the step measured burstier
# arrivals than the trace's. The client kept to 1.4-11 ms on 2026-12-07 (docs/benchmarks.md, "Overhead").
LATE_SEND_S = 0.1


def step_text(result: dict[str, Any]) -> str:
    """One load step, as the progress lines show it: "step N PHASE Fx (R rps): pass|FAIL ..." with its
    headroom, latencies, token rate and, when a replica failed or the client sent late, what happened."""
    metrics = measurable(result)
    step = int(metrics.get("load_step", result.get("training_iteration", 0)))
    verdict = "pass" if metrics.get("slo_pass") else "FAIL"
    if metrics.get("overloaded"):
        verdict += f" (TTFT grew {metrics.get('ttft_growth', 0):.2f} s/s: not sustainable)"
    notes = ""
    if metrics.get("replica_failures") or metrics.get("false_alarms"):
        notes = (
            f"  | {metrics.get('replica_failures', 0):.0f} replica(s) declared dead, detected in "
            f"{metrics.get('detection_s', 0):.1f}s, {metrics.get('false_alarms', 0):.0f} false "
            f"alarm(s), {metrics.get('retried_requests', 0):.0f} retried, "
            f"{metrics.get('lost_requests', 0):.0f} lost"
        )
    lag = metrics.get("send_lag_p99_s", 0.0)
    if lag > LATE_SEND_S:
        notes += f"  | the client sent late (send lag p99 {lag:.2f}s): burstier arrivals than the trace's"
    return (
        f"step {step} {result.get('phase', '')} {metrics.get('load_factor', 0):.3g}x "
        f"({metrics.get('arrival_rps', 0):.2f} rps): {verdict}  headroom "
        f"{metrics.get('slo_headroom', 0):.2f}  ttft p95 {_fmt(metrics.get('ttft_p95_s'))}s  "
        f"tpot p95 {_fmt(metrics.get('tpot_p95_s'))}s  {metrics.get('output_tok_s', 0):.0f} tok/s" + notes
    )


@dataclass
class LiveTrial:
    """What the tracker knows of a trial while results stream in (mutable, the tracker's own); `row()` is
    the one record of a trial everything else uses (`tuner.recorded.TrialRow`, as read back from MLflow)."""

    trial_id: str
    run_id: str
    params: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    status: str = TrialStatus.RUNNING
    reason: str = ""
    steps: int = 0
    closed: bool = False

    def row(self) -> TrialRow:
        return TrialRow(
            trial_id=self.trial_id,
            run_id=self.run_id,
            status=str(TrialStatus(self.status)),
            status_reason=self.reason,
            params=dict(self.params),
            metrics=dict(self.metrics),
        )


# The tracker of the search running in this process. Tune pickles its callbacks and scheduler with the
# experiment; on resume they are unpickled as references to this one rather than as stale copies.
_ACTIVE: dict[str, TrialTracker] = {}


def active_tracker() -> TrialTracker | None:
    return _ACTIVE.get("tracker")


def _active_callback():
    tracker = active_tracker()
    assert tracker is not None, "a restored search needs a TrialTracker in this process"
    return tracker.callback


class TrialTracker:
    """Ray Tune callback: a nested MLflow run per trial, metrics per load step, status tags at the end.

    `stopped_by_scheduler` is filled by the scheduler wrapper in `tuner.search`, so a stopped trial can
    be told apart from one the time budget cut short. `progress` receives one line per event.
    """

    def __init__(
        self,
        client,
        experiment: str,
        parent_run_id: str,
        *,
        progress: Callable[[str], None] = print,
        total_trials: int | None = None,
    ) -> None:
        from ray.tune import Callback

        self.client = client
        self.experiment_id = experiment_id(client, experiment, create=True)
        self.parent_run_id = parent_run_id
        self.progress = progress
        self.total_trials = total_trials
        self.outcomes: dict[str, LiveTrial] = {}
        self.stopped_by_scheduler: dict[str, str] = {}
        self._started = time.monotonic()
        tracker = self

        class _Callback(Callback):
            def on_trial_start(self, iteration, trials, trial, **info):
                tracker.trial_started(trial.trial_id, dict(trial.config))

            def on_trial_result(self, iteration, trials, trial, result, **info):
                tracker.trial_result(trial.trial_id, result)

            def on_trial_complete(self, iteration, trials, trial, **info):
                tracker.trial_ended(trial.trial_id, error=None)

            def on_trial_error(self, iteration, trials, trial, **info):
                error = getattr(trial, "error_message", None) or "the trial raised an error"
                tracker.trial_ended(trial.trial_id, error=str(error).strip().splitlines()[-1])

            def __reduce__(self):
                return (_active_callback, ())

        self.callback = _Callback()
        _ACTIVE["tracker"] = self

    def rows(self) -> list[TrialRow]:
        """Every trial so far, as the one record of a trial."""
        return [outcome.row() for outcome in self.outcomes.values()]

    def adopt_runs(self, reason: str) -> tuple[int, int]:
        """On resume: take over the trial runs already under the parent run. Runs of trials that were
        interrupted are closed as early_stopped with `reason` (their trials are not rerun).
        Returns (runs adopted, of which interrupted)."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_run_id}'", max_results=10_000
        )
        interrupted = 0
        for run in runs:
            if run.data.tags.get(RUN_KIND_TAG) == RunKind.CONFIRM.value:
                if run.info.status == "RUNNING":  # a confirmation the stopped driver left open
                    self.client.set_tag(run.info.run_id, STATUS_TAG, TrialStatus.EARLY_STOPPED.value)
                    self.client.set_tag(run.info.run_id, STATUS_REASON_TAG, reason)
                    self.client.set_terminated(run.info.run_id, "KILLED")
                continue
            trial_id = run.data.tags.get("trial_id")
            if not trial_id:
                continue
            status = run.data.tags.get(STATUS_TAG, TrialStatus.RUNNING.value)
            outcome = LiveTrial(
                trial_id,
                run.info.run_id,
                dict(run.data.params),
                metrics=dict(run.data.metrics),
                status=status,
                reason=run.data.tags.get(STATUS_REASON_TAG, ""),
                steps=int(run.data.metrics.get("load_step", 0)),
                closed=True,
            )
            if status not in FINAL_STATUSES or run.info.status == "RUNNING":
                interrupted += 1
                outcome.status, outcome.reason = TrialStatus.EARLY_STOPPED, reason
                self.client.set_tag(run.info.run_id, STATUS_TAG, outcome.status)
                self.client.set_tag(run.info.run_id, STATUS_REASON_TAG, reason)
                self.client.set_terminated(run.info.run_id, "KILLED")
            self.outcomes[trial_id] = outcome
        return len(self.outcomes), interrupted

    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None:
        if trial_id in self.outcomes:
            return
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{trial_id}",
            tags={
                PARENT_TAG: self.parent_run_id,
                "trial_id": trial_id,
                RUN_KIND_TAG: RunKind.TRIAL.value,
                STATUS_TAG: TrialStatus.RUNNING.value,
            },
        )
        for key, value in params.items():
            self.client.log_param(run.info.run_id, key, value)
        self.outcomes[trial_id] = LiveTrial(trial_id, run.info.run_id, params)
        number = len(self.outcomes)
        total = f"/{self.total_trials}" if self.total_trials else ""
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in params.items() if not isinstance(v, bool))
        self.say(f"trial {number}{total} {trial_id} starting: {shown}")

    def trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        outcome = self.outcomes.get(trial_id)
        if outcome is None:
            return
        metrics = measurable(result)
        step = int(metrics.get("load_step", result.get("training_iteration", 0)))
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(outcome.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])
        outcome.metrics, outcome.steps = metrics, step
        outcome.status = TrialStatus(str(result.get(STATUS_TAG, TrialStatus.RUNNING)))
        outcome.reason = str(result.get(STATUS_REASON_TAG, ""))
        if outcome.status == TrialStatus.INFEASIBLE:
            self.say(f"  {trial_id} infeasible: {outcome.reason}")
            return
        self.say(f"  {trial_id} {step_text(result)}")
        for key in ("replica_nodes",):
            if isinstance(result.get(key), str) and result[key]:
                self.client.set_tag(outcome.run_id, key, result[key])

    def trial_ended(self, trial_id: str, error: str | None) -> None:
        outcome = self.outcomes.get(trial_id)
        if outcome is None or outcome.closed:
            return
        if error is not None:
            outcome.status, outcome.reason = TrialStatus.INFEASIBLE, f"trial crashed: {error}"
        elif outcome.status not in (TrialStatus.COMPLETED, TrialStatus.INFEASIBLE):
            outcome.status = TrialStatus.EARLY_STOPPED
            outcome.reason = self.stopped_by_scheduler.get(
                trial_id, f"stopped after step {outcome.steps} by the search's budget"
            )
        self._close(outcome)

    def close_open_runs(self, reason: str) -> None:
        """End every run still open (search interrupted or budget spent) as early_stopped."""
        for outcome in self.outcomes.values():
            if not outcome.closed:
                if outcome.status not in (TrialStatus.COMPLETED, TrialStatus.INFEASIBLE):
                    outcome.status, outcome.reason = TrialStatus.EARLY_STOPPED, reason
                self._close(outcome)

    def _close(self, outcome: LiveTrial) -> None:
        run_id = outcome.run_id
        status = TrialStatus(outcome.status)
        self.client.set_tag(run_id, STATUS_TAG, status.value)
        self.client.set_tag(run_id, STATUS_REASON_TAG, outcome.reason[:5000])
        self.client.set_terminated(run_id, "FINISHED" if status != TrialStatus.INFEASIBLE else "FAILED")
        outcome.closed = True
        self.say(
            f"trial {outcome.trial_id} {status.value}: {capacity_text(outcome.metrics, status)}, "
            f"ref ttft p95 {_fmt(outcome.metrics.get('ref_ttft_p95_s'))}s; {outcome.reason}"
        )

    def say(self, line: str) -> None:
        """One progress line, stamped with the time since the search started."""
        elapsed = int(time.monotonic() - self._started)
        self.progress(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {line}")


def capacity_text(metrics: dict[str, float], status: TrialStatus | str) -> str:
    """A trial's capacity as people should read it: 'capacity 13.2 rps/accel (bracket 12.6-14.1)',
    'capacity >= 15.9 rps/accel (censored)', or 'no capacity' for an infeasible trial or one ended before
    its first load step reported (an engine still starting when the budget ran out)."""
    if TrialStatus(status) == TrialStatus.INFEASIBLE:
        return "no capacity (infeasible)"
    if "capacity_rps_per_accel" not in metrics:
        return "no capacity (no load step finished)"
    capacity = metrics["capacity_rps_per_accel"]
    if metrics.get("capacity_censored"):
        return f"capacity >= {capacity:.3g} rps/accel (censored: no step failed)"
    hi = metrics.get("capacity_hi_rps_per_accel")
    if capacity <= 0:
        return f"capacity 0: failed the SLO at every load tried (lowest failing {_fmt(hi)} rps/accel)"
    bracket = f" (bracket {capacity:.3g}-{hi:.3g})" if hi is not None else ""
    flag = ", inconsistent" if metrics.get("capacity_inconsistent") else ""
    return f"capacity {capacity:.3g} rps/accel{bracket}{flag}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


def start_parent_run(
    client, experiment: str, *, run_name: str, params: dict[str, Any], tags: dict[str, str], documents: dict[str, Any]
) -> str:
    """Open the search's parent run with its params, tags and JSON/YAML documents; returns its id."""
    exp_id = experiment_id(client, experiment, create=True)
    run = client.create_run(exp_id, run_name=run_name, tags={RUN_KIND_TAG: RunKind.SEARCH.value, **tags})
    for key, value in params.items():
        client.log_param(run.info.run_id, key, str(value)[:6000])
    for name, document in documents.items():
        if name.endswith(".json"):
            client.log_dict(run.info.run_id, document, name)
        else:
            client.log_text(run.info.run_id, document, name)
    return run.info.run_id


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))


def mark_resumed(client, parent: str, stamp: str) -> None:
    client.set_tag(parent, "resumed_at", stamp)


def latest_search_run(client, experiment: str):
    """The newest parent run (`run_kind=search`) of `experiment`, or None; TrackingError if the experiment
    does not exist."""
    exp_id = experiment_id(client, experiment, create=False)
    runs = client.search_runs(
        [exp_id],
        filter_string=f"tags.{RUN_KIND_TAG} = '{RunKind.SEARCH}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def finish_search_run(
    client,
    parent: str,
    *,
    documents: dict[str, Any],
    figures: dict[str, Callable[[], Any]],
    tags: dict[str, str],
    metrics: dict[str, float],
    status: str,
) -> None:
    """Close the parent run: its JSON documents, figures (a figure that fails to draw is a tag, never a
    lost record), tags and metrics, then its status."""
    for name, document in documents.items():
        client.log_dict(parent, document, name)
    for name, draw in figures.items():
        try:
            client.log_figure(parent, draw(), name)
        except Exception as error:  # a plot must never cost the search its records
            client.set_tag(parent, f"{name.rsplit('.', 1)[0]}_plot_error", str(error)[:500])
    for key, value in tags.items():
        client.set_tag(parent, key, value[:5000])
    for key, number in metrics.items():
        client.log_metric(parent, key, float(number))
    client.set_terminated(parent, status)


def open_confirm_run(client, experiment: str, parent: str, trial_id: str, round_: int, params: dict[str, Any]) -> str:
    """A nested run for one confirmation measurement of trial `trial_id` (`run_kind=confirm`); its id."""
    run = client.create_run(
        experiment_id(client, experiment, create=True),
        run_name=f"confirm-{trial_id}-r{round_}",
        tags={
            PARENT_TAG: parent,
            RUN_KIND_TAG: RunKind.CONFIRM.value,
            "confirms_trial": trial_id,
            "confirm_round": str(round_),
            STATUS_TAG: TrialStatus.RUNNING.value,
        },
    )
    for key, value in params.items():
        client.log_param(run.info.run_id, key, value)
    return str(run.info.run_id)


def log_confirm_step(client, run_id: str, result: dict[str, Any]) -> None:
    """One load step of a confirmation measurement: its metrics at its step number (`load_step`), as a
    trial's run has them, so each step of a re-measurement can be read back."""
    from mlflow.entities import Metric

    metrics = measurable(result)
    step = int(metrics.get("load_step", 0))
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])


def close_confirm_run(client, run_id: str, result: dict[str, Any] | None, status: TrialStatus, reason: str) -> None:
    """A confirmation measurement's status and reason, and its outcome's metrics (at its step) when it
    ended with a result."""
    if result is not None:
        log_confirm_step(client, run_id, result)
    client.set_tag(run_id, STATUS_TAG, status.value)
    client.set_tag(run_id, STATUS_REASON_TAG, reason[:5000])
    client.set_terminated(run_id, "FAILED" if status == TrialStatus.INFEASIBLE else "FINISHED")


def attach_files(client, run_id: str, paths: list[Path]) -> None:
    """Files (a report) as artifacts of a run."""
    for path in paths:
        client.log_artifact(run_id, str(path))


def record_validation(client, experiment: str, parent: str, document: dict[str, Any], files: list[Path]) -> str:
    """A nested run (`run_kind=validate`) under the search's parent: each measurement's figures as metrics
    named `{stack}.{config}.{rate}.{figure}`, `validation.json`, the served config files; its id."""
    from mlflow.entities import Metric

    run = client.create_run(
        experiment_id(client, experiment, create=False),
        run_name="validate",
        tags={
            PARENT_TAG: parent,
            RUN_KIND_TAG: RunKind.VALIDATE.value,
            "validated_trial": str(document["trial_id"]),
            "validation": str(document["text"])[:5000],
        },
    )
    run_id = str(run.info.run_id)
    now = int(time.time() * 1000)
    metrics = [
        Metric(f"{m['stack']}.{m['config']}.{m['rate']}.{key}", float(value), now, 0)
        for m in document["measurements"]
        for key, value in m.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ]
    metrics += [Metric("held", float(document["held"]), now, 0)]
    for start in range(0, len(metrics), 500):
        client.log_batch(run_id, metrics=metrics[start : start + 500])
    client.log_dict(run_id, document, "validation.json")
    attach_files(client, run_id, files)
    client.set_terminated(run_id, "FINISHED")
    return run_id
