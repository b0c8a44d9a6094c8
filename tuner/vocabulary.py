"""The names every part of the tool shares: trial statuses, MLflow run kinds, and the metrics a step reports.

Every module that writes or reads a status, a run kind or a metric name takes it from here, so a name
means one thing everywhere (search, trial, tracking, export, report, benchmarks).
"""

from __future__ import annotations

from enum import Enum

from tuner.slo import METRICS, STATS


class TrialStatus(str, Enum):
    """How a trial ended (or that it still runs); recorded as the `trial_status` tag of its run."""

    RUNNING = "running"
    COMPLETED = "completed"  # capacity found, or censored at the capacity search's maximum load
    EARLY_STOPPED = "early_stopped"  # stopped by ASHA or the budget: its capacity is a lower bound
    INFEASIBLE = "infeasible"  # engine would not start, crashed, or ran out of time

    def __str__(self) -> str:
        return self.value


FINAL_STATUSES = (TrialStatus.COMPLETED, TrialStatus.EARLY_STOPPED, TrialStatus.INFEASIBLE)
# Trials whose measurements compare with each other (the others have penalty values only).
FEASIBLE_STATUSES = (TrialStatus.COMPLETED, TrialStatus.EARLY_STOPPED)


class RunKind(str, Enum):
    """What an MLflow run records; the `run_kind` tag every run of the tool carries."""

    SEARCH = "search"  # the parent run of one search
    TRIAL = "trial"  # one trial of the search (nested under the search)
    CONFIRM = "confirm"  # a re-measurement of a finalist or the baseline after the search
    VALIDATE = "validate"  # the exported files served and replayed

    def __str__(self) -> str:
        return self.value


RUN_KIND_TAG = "run_kind"
PARENT_TAG = "mlflow.parentRunId"
# A trial's status and the reason for it: keys of every result the trial reports, and tags of its run.
STATUS_TAG = "trial_status"
STATUS_REASON_TAG = "status_reason"


def latency_name(metric: str, stat: str) -> str:
    """`ttft_p95_s`: the statistic over the step's completed requests."""
    return f"{metric}_{stat}_s"


def slo_latency_name(metric: str, stat: str) -> str:
    """`slo_ttft_p95_s`: the statistic the SLO judges, failed requests counted as infinitely slow."""
    return f"slo_{metric}_{stat}_s"


# What each load step reports (every `tune.report`), with its meaning; the README's table says the same.
STEP_METRICS: dict[str, str] = {
    "load_step": "1-based index of the step within the trial",
    "load_factor": "the step's target load as a multiple of the reference load, per accelerator",
    "offered_rps": "the step's target rate for the whole pool (requests/s)",
    "arrival_rps": "measured arrival rate of the counted requests (requests/s, whole pool)",
    "measured_requests": "requests the step counted (warm-up excluded)",
    "achieved_rps": "completed counted requests per second of the measured window",
    "output_tok_s": "output tokens of completed counted requests per second of the measured window",
    "slo_pass": "1 if the step met every SLO term and was sustainable",
    "slo_headroom": "min over SLO terms of bound / observed (> 1 passes), and the sustainability term",
    "slo_attainment": "fraction of counted requests that individually meet every bound",
    "goodput_rps": "counted requests per second that individually meet every bound",
    "ttft_growth": "slope of TTFT over send time within the step (seconds per second)",
    "ttft_projected_s": "TTFT the growth reaches sustain_horizon_s after the step (only when significant)",
    "overloaded": "1 if TTFT grew within the step enough to break the TTFT bound if the load lasted",
    "failed_requests": "counted requests that errored or missed the step deadline",
    "send_lag_p99_s": "p99 of the replay client's send time minus the scheduled time",
    "num_accelerators": "replicas x tensor-parallel size",
    "engine_start_s": "seconds the pool took to start",
    "step_wall_s": "wall time of the step",
}
for _metric in METRICS:
    for _stat in STATS:
        STEP_METRICS[latency_name(_metric, _stat)] = f"{_stat} of {_metric} over completed counted requests"
        STEP_METRICS[slo_latency_name(_metric, _stat)] = (
            f"{_stat} of {_metric} as the SLO judges it: failed requests count as infinitely slow"
        )

# What a trial carries forward after each step: the capacity found so far and the reference latencies.
TRIAL_METRICS: dict[str, str] = {
    "capacity_rps": "highest passing measured arrival rate below the lowest failing one (whole pool)",
    "capacity_rps_per_accel": "capacity_rps per accelerator: the search's main objective",
    "capacity_lo_rps_per_accel": "lower end of the bracket around the breaking point (= capacity)",
    "capacity_hi_rps_per_accel": "upper end of that bracket: the lowest failing rate (absent while censored)",
    "capacity_censored": "1 while no step failed: the capacity is a lower bound",
    "capacity_inconsistent": "1 if a pass above a failure held when re-measured: the bracket was widened",
    "ref_ttft_p95_s": "TTFT p95 at the reference load (penalty until measured)",
    "ref_tpot_p95_s": "TPOT p95 at the reference load (penalty until measured)",
    "ref_e2e_p95_s": "end-to-end latency p95 at the reference load (penalty until measured)",
}

HEALTH_METRICS: dict[str, str] = {
    "replica_failures": "replicas declared dead during the step",
    "detection_s": "slowest time from an injected fault to its declaration",
    "false_alarms": "replicas declared dead only for not answering in time, with no fault injected",
    "retried_requests": "requests retried on another replica",
    "lost_requests": "planned requests neither completed nor failed with a reason (always 0)",
}

# Every metric a trial reports; objectives and the ASHA metric must be among them.
REPORTED_METRICS: frozenset[str] = frozenset(STEP_METRICS) | frozenset(TRIAL_METRICS) | frozenset(HEALTH_METRICS)
