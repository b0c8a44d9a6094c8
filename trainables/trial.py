"""One trial: start a pool for a candidate config, search its capacity one load step at a time, report.

`TrialRunner` is plain Python over an injected pool factory, so the capacity search is tested with the
stand-in engine; `trainables.tune_trainable` adapts it to Ray Tune. Which load comes next is decided
by `tuner.capacity`; what each step replays by `tuner.sampling`; its verdict by `tuner.metrics`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from trainables.pool import EnginePool, HealthPolicy, error_line
from trainables.replay import replay_step
from trainables.vllm_engine import EngineSpec, set_process_affinity
from tuner import capacity
from tuner.capacity import CapacityPlan, Phase
from tuner.errors import EngineError
from tuner.kv_memory import kv_shortfall
from tuner.metrics import StepSummary, observations, summarize_step, trial_metrics
from tuner.records import PlannedRequest, RequestRecord
from tuner.sampling import StepSample, plan_step
from tuner.slo import parse_slo
from tuner.space import POOL_PARAMS
from tuner.vocabulary import HEALTH_METRICS, STATUS_REASON_TAG, STATUS_TAG, TRIAL_METRICS, TrialStatus

log = logging.getLogger(__name__)

# vLLM's default gpu_memory_utilization, used for the KV size on CPU when a candidate does not set it.
DEFAULT_MEMORY_FRACTION = 0.9


@dataclass(frozen=True)
class Fault:
    """Fault injection: at `at_fraction` of the first step at or above load `at_load`, kill or freeze
    replica `replica`."""

    kind: str
    at_load: float = 1.0
    at_fraction: float = 0.5
    replica: int = 0


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a search shares: model, step sample, capacity plan, SLO (never a searched value)."""

    model: str
    sample: StepSample
    reference_rps: float
    slo: str
    plan: CapacityPlan = CapacityPlan()
    engine_defaults: dict[str, Any] = field(default_factory=dict)
    on_cpu: bool = True
    cpu_cores_per_replica: int = 1
    kv_budget_bytes: int = 64 << 20
    deadline_s: float = 20.0
    sustain_horizon_s: float | None = 60.0
    serving: str = "in-process"
    penalty_latency_s: float = 60.0
    vocab_size: int = 4096
    start_timeout_s: float = 600.0
    seed: int = 0
    faults: tuple[Fault, ...] = ()
    health: HealthPolicy = HealthPolicy()
    trial_timeout_s: float | None = None


def engine_spec(context: TrialContext, params: dict[str, Any]) -> tuple[EngineSpec, int, int]:
    """Split a candidate's params into (engine spec, replicas, accelerators per replica).

    On CPU, `gpu_memory_utilization` becomes `kv_cache_memory_bytes` = fraction x KV budget.
    """
    args = {
        "model": context.model,
        "enforce_eager": True,
        "skip_tokenizer_init": True,
        "disable_log_stats": False,
        "seed": context.seed,
        **context.engine_defaults,
    }
    args.update({k: v for k, v in params.items() if k not in POOL_PARAMS})
    tp = int(args.get("tensor_parallel_size", 1))
    args.setdefault("distributed_executor_backend", "uni" if tp == 1 else "mp")
    if context.on_cpu and "kv_cache_memory_bytes" not in args:
        # Always bounded on CPU: vLLM's own default takes half the host's memory per engine.
        args["kv_cache_memory_bytes"] = kv_cache_bytes(
            args.pop("gpu_memory_utilization", DEFAULT_MEMORY_FRACTION), context.kv_budget_bytes
        )
    spec = EngineSpec(
        engine_args=args, cpu_cores=context.cpu_cores_per_replica * tp, on_cpu=context.on_cpu, serving=context.serving
    )
    return spec, int(params.get("num_replicas", 1)), tp


def health_policy(context: TrialContext, params: dict[str, Any]) -> HealthPolicy:
    """The candidate's heartbeat settings, falling back to the search's defaults."""
    default = context.health
    return HealthPolicy(
        period_s=float(params.get("heartbeat_period_s", default.period_s)),
        timeout_s=float(params.get("heartbeat_timeout_s", default.timeout_s)),
        failure_threshold=int(params.get("failure_threshold", default.failure_threshold)),
    )


def kv_cache_bytes(fraction: float, budget_bytes: int) -> int:
    """The CPU stand-in for `gpu_memory_utilization`: that fraction of the KV budget, in bytes."""
    return int(float(fraction) * budget_bytes)


# (engine spec, replicas, health policy) -> a started pool whose monitor is running
PoolFactory = Callable[[EngineSpec, int, HealthPolicy], Awaitable[EnginePool]]


class TrialRunner:
    """Runs one candidate's capacity search; `next_step()` returns the metrics dict of each step."""

    def __init__(
        self, context: TrialContext, params: dict[str, Any], pool_factory: PoolFactory, trial_id: str = "trial"
    ) -> None:
        self.context = context
        self.params = dict(params)
        self.trial_id = trial_id
        self.spec, self.num_replicas, self.tp = engine_spec(context, params)
        self.health = health_policy(context, params)
        self._declarations_seen = 0
        self._crash: tuple[int, str] | None = None  # (replica, cause) of a crash in the last step
        self._faults_left = list(context.faults)
        self.num_accelerators = self.num_replicas * self.tp
        self.slo = parse_slo(context.slo)
        self.steps: list[StepSummary] = []
        self.ref_records: list[RequestRecord] | None = None
        self.last_records: list[RequestRecord] = []  # the latest step's, for benchmarks and tests
        self.last_plan: list[PlannedRequest] = []  # the plan the latest step replayed
        self.failure: str | None = None
        self.pool: EnginePool | None = None
        self.start_s = 0.0
        self._began = time.perf_counter()
        self._loop = asyncio.new_event_loop()
        self._pool_factory = pool_factory
        self._affinity: set[int] | None = None  # this process's cores before the trial moved it

    def _remaining_s(self) -> float | None:
        limit = self.context.trial_timeout_s
        return None if limit is None else limit - (time.perf_counter() - self._began)

    def start(self) -> None:
        """Start the pool; a failure is kept as the trial's infeasibility reason, never raised. A candidate
        whose KV cache cannot hold one request of max_model_len is not started (tuner.kv_memory)."""
        began = self._began = time.perf_counter()
        if self.spec.on_cpu:
            args = self.spec.args
            self.failure = kv_shortfall(args.get("model"), args)
            if self.failure is not None:
                self.failure += self._kv_size_origin()
                return
        try:
            starting = self._pool_factory(self.spec, self.num_replicas, self.health)
            self.pool = self._loop.run_until_complete(asyncio.wait_for(starting, self._remaining_s()))
        except asyncio.TimeoutError:
            self.failure = (
                f"exceeded the trial time limit of {self.context.trial_timeout_s:g}s while the engines were starting"
            )
        except EngineError as error:
            self.failure = str(error)
        except Exception as error:  # anything else that stops the engine is still an infeasible config
            self.failure = f"engine failed to start: {error_line(error)}"
        self.start_s = time.perf_counter() - began
        if self.pool is not None:
            self._affinity = keep_client_off_engine_cores(self.pool.info)

    def _kv_size_origin(self) -> str:
        """Where the KV cache's size came from, when the candidate's gpu_memory_utilization set it."""
        fraction = self.params.get("gpu_memory_utilization")
        if fraction is None or "kv_cache_memory_bytes" in {**self.context.engine_defaults, **self.params}:
            return ""
        budget_mib = self.context.kv_budget_bytes / (1 << 20)
        return f" (gpu_memory_utilization {float(fraction):g} x hardware.kv_budget_mib {budget_mib:g})"

    def next_step(self) -> dict[str, Any]:
        """Run the next load step; the result carries `done` when the trial has nothing left to do."""
        if self.failure is not None:
            return self._infeasible_result(self.failure)
        context = self.context
        step = len(self.steps) + 1
        chosen = capacity.next_step(context.plan, observations(self.steps, self.num_accelerators))
        assert chosen is not None, "next_step() called after the trial was done"
        factor, phase = chosen
        rate = factor * context.reference_rps * self.num_accelerators
        plan = plan_step(
            context.sample, rate_rps=rate, step_seed=context.seed * 1000 + step, vocab_size=context.vocab_size
        )
        assert self.pool is not None
        began = time.perf_counter()
        remaining = self._remaining_s()
        if remaining is not None and remaining <= 0:
            self.failure = f"exceeded the trial time limit of {context.trial_timeout_s:g}s after step {step - 1}"
            return self._infeasible_result(self.failure)
        faults = [f for f in self._faults_left if factor >= f.at_load * (1 - 1e-9)]
        self._faults_left = [f for f in self._faults_left if f not in faults]
        window_s = context.sample.window_s(rate)
        try:
            records = self._loop.run_until_complete(
                asyncio.wait_for(self._run(plan, step, faults, window_s), remaining)
            )
        except asyncio.TimeoutError:
            self.failure = f"exceeded the trial time limit of {context.trial_timeout_s:g}s during step {step}"
            return self._infeasible_result(self.failure)
        summary = summarize_step(
            records,
            self.slo,
            load_step=step,
            load_factor=factor,
            offered_rps=rate,
            window_s=window_s,
            horizon_s=context.sustain_horizon_s,
            phase=phase,
        )
        self.steps.append(summary)
        self.last_records, self.last_plan = records, plan
        if self.ref_records is None and capacity.same_load(factor, 1.0):
            self.ref_records = records
        crashed = [r.error for r in records if r.replica_error and r.error]
        if crashed and len(crashed) == len(records):
            self.failure = f"replicas crashed during step {step}: {crashed[0]}"
            return self._infeasible_result(self.failure)
        health = self._health_metrics(records, len(plan))
        if self._crash is not None:
            # A replica that dies without an injected fault is a config that crashes the engine.
            replica, cause = self._crash
            self.failure = f"replica {replica} crashed during step {step} (no fault was injected): {cause}"
            return self._infeasible_result(self.failure)
        carried = trial_metrics(
            self.steps,
            num_accelerators=self.num_accelerators,
            penalty_latency_s=context.penalty_latency_s,
            ref_records=self.ref_records,
            failure_rule=context.plan.failure_rule,
        )
        seen = observations(self.steps, self.num_accelerators)
        done = capacity.next_step(context.plan, seen) is None
        reason = ""
        if done:
            found = capacity.bracket(seen, context.plan.failure_rule)
            stop = capacity.limit(context.plan, seen)
            reason = f"capacity {capacity.describe(found, stop, context.plan, reference_rps=context.reference_rps)}"
            reason += f" after {step} steps"
            failed = capacity.failed_factors(seen, context.plan.failure_rule)
            failing = [
                s for s in self.steps if not s.passed and any(capacity.same_load(s.load_factor, f) for f in failed)
            ]
            if failing:
                lowest = min(failing, key=lambda s: s.arrival_rps)
                reason += (
                    f"; lowest failing step {lowest.load_step} ({lowest.load_factor:.3g}x, "
                    f"{lowest.arrival_rps:.2f} rps): {_why(lowest)}"
                )
        nodes = sorted({str(i.get("node")) for i in self.pool.info if i.get("node")})
        return {
            **summary.metrics,
            **carried,
            **health,
            "num_accelerators": float(self.num_accelerators),
            "replica_nodes": ",".join(nodes),
            "phase": str(phase),
            "engine_start_s": round(self.start_s, 2),
            "step_wall_s": round(time.perf_counter() - began, 2),
            STATUS_TAG: str(TrialStatus.COMPLETED if done else TrialStatus.RUNNING),
            STATUS_REASON_TAG: reason,
            "done": done,
        }

    async def _run(
        self, plan: list[PlannedRequest], step: int, faults: list[Fault], window_s: float
    ) -> list[RequestRecord]:
        pool = self.pool
        assert pool is not None
        await pool.reset_prefix_cache()
        start = min(p.scheduled_s for p in plan if not p.in_warmup)
        tasks = [asyncio.ensure_future(self._inject(f, start + f.at_fraction * window_s)) for f in faults]
        try:
            return await replay_step(
                pool, plan, deadline_s=self.context.deadline_s, id_prefix=f"{self.trial_id}-s{step}"
            )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _inject(self, fault: Fault, delay_s: float) -> None:
        assert self.pool is not None
        await asyncio.sleep(delay_s)
        index = fault.replica % self.num_replicas
        if self.pool.alive[index]:
            log.info("injecting %s into replica %d", fault.kind, index)
            await self.pool.inject_fault(index, fault.kind)

    def _health_metrics(self, records: list[RequestRecord], planned: int) -> dict[str, float]:
        """Health events since the previous report, and the guarantee that no request is lost."""
        assert self.pool is not None
        new = self.pool.declarations[self._declarations_seen :]
        self._declarations_seen = len(self.pool.declarations)
        crash = next(((d.replica, d.cause or "") for d in new if d.crashed), None)
        # A replica whose requests died at the end of the step may not be declared yet: it crashed too.
        self._crash = crash or next(iter(self.pool.unexplained_deaths()), None)
        detections = [d.detection_s for d in new if d.detection_s is not None]
        accounted = sum(1 for r in records if r.ok or r.error)
        return {
            "replica_failures": float(len(new)),
            "detection_s": max(detections) if detections else 0.0,
            "false_alarms": float(sum(1 for d in new if d.false_alarm)),
            "retried_requests": float(sum(1 for r in records if r.retries)),
            "lost_requests": float(planned - accounted),
        }

    def _infeasible_result(self, reason: str) -> dict[str, Any]:
        """Every trial metric (capacity 0, the reference latencies at the penalty) but the bracket's top
        (nothing failed: nothing was measured), the health counters at 0 and a failed step verdict."""
        penalty = self.context.penalty_latency_s
        trial = {name: penalty if name.startswith("ref_") else 0.0 for name in TRIAL_METRICS}
        del trial["capacity_hi_rps_per_accel"]
        return {
            **trial,
            **dict.fromkeys(HEALTH_METRICS, 0.0),
            "load_step": float(max(1, len(self.steps))),
            "slo_pass": 0.0,
            "slo_headroom": 0.0,
            "slo_attainment": 0.0,
            "goodput_rps": 0.0,
            "num_accelerators": float(self.num_accelerators),
            "phase": str(Phase.CLIMB),
            STATUS_TAG: str(TrialStatus.INFEASIBLE),
            STATUS_REASON_TAG: reason,
            "done": True,
        }

    def close(self) -> None:
        """Shut the pool down (always safe to call, also twice or after a failed start)."""
        if self._affinity is not None:
            set_process_affinity(os.getpid(), self._affinity)
            self._affinity = None
        pool, self.pool = self.pool, None
        if self._loop.is_closed():
            return
        try:
            if pool is not None:
                self._loop.run_until_complete(pool.shutdown())
            # Requests still in flight after a timed-out step: cancel them, do not leave them pending.
            self._loop.run_until_complete(_cancel_other_tasks())
        finally:
            self._loop.close()


def keep_client_off_engine_cores(info: list[dict[str, Any]]) -> set[int] | None:
    """Run this process (the replay client) on cores no replica of this machine claimed, if any are left
    (two engines, or an engine and its client, on one core measure each other); returns the cores it ran
    on before, to restore when the trial ends, or None if nothing changed."""
    claimed = {core for facts in info if facts.get("node") in (None, _node_id()) for core in facts.get("cores", ())}
    before = os.sched_getaffinity(0)
    free = before - claimed
    if not (claimed and free):
        return None
    set_process_affinity(os.getpid(), free)
    return before


def _node_id() -> str | None:
    import sys

    ray = sys.modules.get("ray")
    return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None


async def _cancel_other_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _why(summary: StepSummary) -> str:
    metrics = summary.metrics
    failed = int(metrics.get("failed_requests", 0))
    parts = [f"headroom {metrics.get('slo_headroom', 0):.2f}", f"attainment {metrics.get('slo_attainment', 0):.0%}"]
    if failed:
        parts.append(f"{failed} failed requests")
    if metrics.get("overloaded"):
        parts.append(f"TTFT grew {metrics.get('ttft_growth', 0):.2f} s/s (not sustainable)")
    return ", ".join(parts)


def driver_pool_factory(context: TrialContext) -> PoolFactory:
    """Pools of Ray actors started from this process, outside Ray Tune (the confirmation phase, the
    benchmarks); Ray must be running."""
    from trainables.pool import start_ray_pool

    async def factory(spec: EngineSpec, replicas: int, health: HealthPolicy) -> EnginePool:
        return await start_ray_pool(
            spec,
            replicas,
            placement_group=None,
            first_bundle=0,
            start_timeout_s=context.start_timeout_s,
            health=health,
            replace=True,
        )

    return factory


def run_capacity_search(
    runner: TrialRunner, on_step: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Start `runner`'s pool, run every step of its capacity search, always shut the pool down; returns
    every step's result (the last one carries the trial's outcome)."""
    results: list[dict[str, Any]] = []
    try:
        runner.start()
        while True:
            result = runner.next_step()
            results.append(result)
            if on_step is not None:
                on_step(result)
            if result["done"]:
                return results
    finally:
        runner.close()


def measure_on_ray(
    context: TrialContext,
    params: dict[str, Any],
    trial_id: str,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One capacity search of `params` on a fresh pool started from this process: its final result
    (`on_step` gets every step's, as it ends)."""
    runner = TrialRunner(context, params, driver_pool_factory(context), trial_id=trial_id)
    return run_capacity_search(runner, on_step)[-1]
