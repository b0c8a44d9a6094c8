"""Overhead of the tool itself: pool start-up against a bare engine, teardown and leftover processes,
replay send lag at rising request rates (engine idle and saturated), and router cost per request.

    .venv/bin/python benchmarks/overhead.py            # about 5 minutes on a 2-core machine

Writes reports/benchmarks/overhead.json and prints a summary. A measurement, not a test.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from stand_in import StandInEngine  # noqa: E402

from trainables.pool import EnginePool, start_ray_pool  # noqa: E402
from trainables.protocol import GenerateRequest  # noqa: E402
from trainables.replay import replay_step  # noqa: E402
from trainables.vllm_engine import EngineSpec, VllmEngine  # noqa: E402
from tuner.sampling import plan_step, sample_step  # noqa: E402
from tuner.tiny_model import ensure_tiny_model  # noqa: E402
from tuner.workload.records import Request, Workload  # noqa: E402

WORKLOAD = Workload(
    tuple(Request(arrival_s=i * 0.1, prompt_tokens=64, output_tokens=16) for i in range(100)), {"source": "benchmark"}
)


def _even(count: int):
    """`count` requests of the evenly spaced workload (cycled), no warm-up."""
    return sample_step(WORKLOAD, measured=count, warmup=0, windows=1, seed=0)


def _spec() -> EngineSpec:
    return EngineSpec(
        engine_args={
            "model": str(ensure_tiny_model()),
            "skip_tokenizer_init": True,
            "enforce_eager": True,
            "max_model_len": 1024,
            "max_num_seqs": 32,
            "max_num_batched_tokens": 512,
            "kv_cache_memory_bytes": 16 << 20,
            "distributed_executor_backend": "uni",
        }
    )


def _engine_processes() -> int:
    out = subprocess.run(["pgrep", "-f", "EngineCore|VLLM::Worker"], capture_output=True, text=True).stdout
    return len(out.split())


def _lag(records) -> dict:
    lags = sorted(r.send_lag_s for r in records)
    return {
        "requests": len(lags),
        "send_lag_p50_ms": round(1000 * lags[len(lags) // 2], 3),
        "send_lag_p99_ms": round(1000 * lags[min(len(lags) - 1, int(0.99 * len(lags)))], 3),
        "send_lag_max_ms": round(1000 * lags[-1], 3),
    }


async def bare_engine() -> dict:
    engine = VllmEngine(_spec())
    began = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - began
    began = time.perf_counter()
    await engine.shutdown()
    return {"start_s": round(start_s, 2), "shutdown_s": round(time.perf_counter() - began, 2)}


async def ray_pool(replicas: int) -> dict:
    began = time.perf_counter()
    pool = await start_ray_pool(_spec(), replicas, placement_group=None)
    start_s = time.perf_counter() - began
    saturated = plan_step(_even(360), rate_rps=60, step_seed=1, vocab_size=4096)
    records = await replay_step(pool, saturated, deadline_s=60, id_prefix="sat")
    began = time.perf_counter()
    await pool.shutdown()
    teardown_s = time.perf_counter() - began
    time.sleep(5)
    return {
        "replicas": replicas,
        "start_s": round(start_s, 2),
        "engine_start_s": [i["start_s"] for i in pool.info],
        "teardown_s": round(teardown_s, 2),
        "leftover_engine_processes_5s_after_teardown": _engine_processes(),
        "saturated_replay_60rps": {**_lag(records), "completed": sum(r.ok for r in records)},
    }


async def idle_send_lag() -> list[dict]:
    out = []
    for rate in (10, 50, 100, 200, 400, 800):
        pool = EnginePool([StandInEngine(tokens_per_s=1e6, max_batch=10_000, prefill_tokens_per_s=1e9)])
        plan = plan_step(_even(int(4 * rate)), rate_rps=rate, step_seed=2, vocab_size=4096)
        records = await replay_step(pool, plan, deadline_s=30, id_prefix=f"idle{rate}")
        out.append({"rate_rps": rate, **_lag(records)})
    return out


async def router_overhead(n: int = 5000) -> dict:
    engine = StandInEngine(tokens_per_s=1e9, max_batch=10_000, prefill_tokens_per_s=1e12)
    pool = EnginePool([engine, StandInEngine(tokens_per_s=1e9, max_batch=10_000, prefill_tokens_per_s=1e12)])
    request = GenerateRequest("r", tuple(range(16, 32)), 1)

    async def direct():
        async for _ in engine.generate(request):
            pass

    async def routed():
        async for _ in pool.generate(request):
            pass

    timings = {}
    for name, call in (("direct", direct), ("routed", routed)):
        began = time.perf_counter()
        for _ in range(n):
            await call()
        timings[name] = (time.perf_counter() - began) / n
    return {
        "direct_us": round(1e6 * timings["direct"], 1),
        "routed_us": round(1e6 * timings["routed"], 1),
        "router_overhead_us": round(1e6 * (timings["routed"] - timings["direct"]), 1),
    }


def main() -> None:
    os.environ["RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper"] = "true"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from tuner.processes import worker_env

    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results["router"] = asyncio.run(router_overhead())
    results["replay_send_lag_idle_engine"] = asyncio.run(idle_send_lag())
    results["bare_engine"] = asyncio.run(bare_engine())
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"VLLM_LOGGING_LEVEL": "WARNING", **worker_env()}},  # priorities as in a search
    )
    try:
        results["ray_pool_1"] = asyncio.run(ray_pool(1))
        results["ray_pool_2"] = asyncio.run(ray_pool(2))
    finally:
        ray.shutdown()
    results["leftover_engine_processes_after_ray_shutdown"] = _engine_processes()
    out = ROOT / "reports" / "benchmarks" / "overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
