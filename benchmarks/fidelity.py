"""Fidelity: do this tool's numbers agree with vLLM's own `bench serve` on the same trace and config?

    .venv/bin/python benchmarks/fidelity.py        # about 10 minutes on a 2-core machine

One single-replica config, the bundled workload at its recorded times (300 requests, 56 s), 3 repeats
on each side:
- the tool: the trial code a search runs (a vLLM engine in a Ray actor, the replay client), one step
  at 1.0x replaying the whole trace at its recorded times, a fresh engine per repeat;
- vLLM: `vllm-serve.yaml` written by the exporter for the same config, served by vLLM's OpenAI server,
  and `vllm bench serve --dataset-name timed_trace --self-timed` (vLLM's own code) replaying the same
  trace written as timed_trace JSONL (one 16-token hash id per chunk, none shared, as the workload has
  no prefix information).
Writes reports/benchmarks/fidelity.json and fidelity.png. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import peer  # noqa: E402

OUT = ROOT / "reports" / "benchmarks"
CONFIG = ROOT / "examples" / "default.yaml"
PARAMS = {
    "max_num_seqs": 16,
    "max_num_batched_tokens": 512,
    "gpu_memory_utilization": 0.9,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
}
# (tool metric, bench metric, scale to seconds) compared side by side
PAIRS = [
    ("request_rate_rps", "request_throughput", 1.0),
    ("output_tok_s", "output_throughput", 1.0),
    *[
        (f"ttft_{s}_s", f"{b}_ttft_ms", 1e-3)
        for s, b in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))
    ],
    *[
        (f"tpot_{s}_s", f"{b}_tpot_ms", 1e-3)
        for s, b in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))
    ],
]


def _prepared():
    from tuner.config import load_config
    from tuner.search import prepare

    return prepare(load_config(CONFIG), device_has_gpu=False)


# ------------------------------------------------------------------------------------------- the tool


def tool_side(prepared, repeats: int) -> list[dict[str, float]]:
    """`repeats` whole passes of the trace at its own times through the search's trial code."""
    import ray

    from trainables.pool import start_ray_pool
    from trainables.trial import TrialRunner
    from tuner.capacity import CapacityPlan
    from tuner.sampling import whole_trace
    from tuner.search import start_ray, trial_context

    workload = prepared.workload
    context = dataclasses.replace(
        trial_context(prepared),
        sample=whole_trace(workload),
        reference_rps=workload.mean_rate_rps,
        plan=CapacityPlan(start_factor=1.0, max_factor=1.0, min_factor=1.0),
        deadline_s=120.0,
        sustain_horizon_s=None,
        slo="e2e:p99<600s",
        trial_timeout_s=None,
    )
    start_ray(None)

    async def factory(spec, replicas, health):
        return await start_ray_pool(
            spec, replicas, placement_group=None, first_bundle=0, start_timeout_s=context.start_timeout_s, health=health
        )

    runs = []
    try:
        for repeat in range(repeats):
            runner = TrialRunner(context, PARAMS, factory, trial_id=f"fidelity{repeat}")
            try:
                runner.start()
                if runner.failure:
                    raise SystemExit(f"the tool's engine did not start: {runner.failure}")
                result = runner.next_step()
                records = runner.last_records
            finally:
                runner.close()
            completed = [r for r in records if r.ok]
            span = max(r.finished_s for r in completed)  # from the step's start, as bench serve counts
            run = {k: float(result[k]) for k, _, _ in PAIRS if k in result}
            run.update(
                request_rate_rps=len(completed) / span,
                output_tok_s=sum(r.output_tokens for r in completed) / span,
                reported_achieved_rps=float(result["achieved_rps"]),
                reported_output_tok_s=float(result["output_tok_s"]),
                completed=len(completed),
                requests=len(records),
                duration_s=span,
            )
            runs.append(run)
            print(f"tool run {repeat + 1}: {_brief(run)}", flush=True)
    finally:
        ray.shutdown()
    return runs


# ----------------------------------------------------------------------------------------------- vLLM


def vllm_side(prepared, repeats: int, work: Path) -> tuple[list[dict[str, float]], str]:
    from tuner.sampling import whole_trace

    port = peer.free_port()
    serve_config = peer.serve_yaml(prepared, PARAMS, port, "written by benchmarks/fidelity.py")
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
    runs = []
    with peer.vllm_server(serve_config, work, port):
        for repeat in range(repeats):
            # Fresh prompt ids per repeat: a second replay of the same ids would hit the prefix cache.
            trace = work / f"trace-{repeat}.jsonl"
            peer.write_timed_trace(whole_trace(prepared.workload), prepared.workload.mean_rate_rps, trace, step=repeat)
            name = f"bench-{repeat + 1}.json"
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "_bench",
                "--backend",
                "vllm",
                "--base-url",
                f"http://127.0.0.1:{port}",
                "--endpoint",
                "/v1/completions",
                "--model",
                "peer",
                "--tokenizer",
                prepared.model_path,
                "--dataset-name",
                "timed_trace",
                "--dataset-path",
                str(trace),
                "--self-timed",
                "--num-prompts",
                str(len(prepared.workload.requests)),
                "--temperature",
                "0",
                "--percentile-metrics",
                "ttft,tpot,itl,e2el",
                "--metric-percentiles",
                "50,90,95,99",
                "--save-result",
                "--result-dir",
                str(work),
                "--result-filename",
                name,
                "--disable-tqdm",
                "--seed",
                str(repeat + 1),
            ]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"vllm bench serve failed: {done.stderr.strip().splitlines()[-1:]}")
            raw = json.loads((work / name).read_text())
            run = {tool: float(raw[bench]) * scale for tool, bench, scale in PAIRS}
            run.update(completed=raw["completed"], requests=len(prepared.workload.requests), duration_s=raw["duration"])
            runs.append(run)
            print(f"vllm bench run {repeat + 1}: {_brief(run)}", flush=True)
    return runs, serve_config


# -------------------------------------------------------------------------------------------- compare


def _brief(run: dict[str, float]) -> str:
    return (
        f"{run['request_rate_rps']:.2f} req/s, {run['output_tok_s']:.0f} tok/s, TTFT p50 "
        f"{1000 * run['ttft_p50_s']:.0f} ms p99 {1000 * run['ttft_p99_s']:.0f} ms, TPOT p50 "
        f"{1000 * run['tpot_p50_s']:.1f} ms p99 {1000 * run['tpot_p99_s']:.1f} ms "
        f"({run['completed']}/{run['requests']} completed)"
    )


def _spread(values: list[float]) -> float:
    """Run-to-run spread: (max - min) / mean."""
    mean = statistics.fmean(values)
    return (max(values) - min(values)) / mean if mean else 0.0


def compare(tool: list[dict[str, float]], bench: list[dict[str, float]]) -> dict[str, Any]:
    rows = {}
    for metric, _, _ in PAIRS:
        t = [r[metric] for r in tool]
        b = [r[metric] for r in bench]
        ratio = statistics.fmean(t) / statistics.fmean(b)
        spread = max(_spread(t), _spread(b))
        allowed = max(0.05, 2 * spread)
        rows[metric] = {
            "tool_mean": statistics.fmean(t),
            "vllm_bench_mean": statistics.fmean(b),
            "ratio": round(ratio, 4),
            "tool_spread": round(_spread(t), 4),
            "vllm_bench_spread": round(_spread(b), 4),
            "allowed": round(allowed, 4),
            "within": abs(ratio - 1) <= allowed,
        }
    return rows


def plot(rows: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, ax = plt.subplots(figsize=(10, 4))
    ratios = [rows[n]["ratio"] for n in names]
    allowed = [rows[n]["allowed"] for n in names]
    ax.bar(
        range(len(names)),
        [r - 1 for r in ratios],
        color=["tab:green" if rows[n]["within"] else "tab:red" for n in names],
    )
    ax.errorbar(
        range(len(names)),
        [0] * len(names),
        yerr=allowed,
        fmt="none",
        ecolor="grey",
        capsize=4,
        label="allowed: max(5%, 2x run-to-run spread)",
    )
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("tool / vllm bench serve - 1")
    ax.legend()
    ax.set_title("This tool vs vLLM's bench serve on the same trace and config (3 repeats each)")
    fig.tight_layout()
    fig.savefig(OUT / "fidelity.png", dpi=110)
    plt.close(fig)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_bench":
        peer._bench(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs on each side (default 3)")
    args = parser.parse_args()
    prepared = _prepared()
    print(
        f"config {PARAMS}; workload {len(prepared.workload.requests)} requests over "
        f"{prepared.workload.duration_s:.1f}s at their recorded times",
        flush=True,
    )
    tool = tool_side(prepared, args.repeats)
    with tempfile.TemporaryDirectory(prefix="vllm-tuner-fidelity-") as tmp:
        bench, serve_config = vllm_side(prepared, args.repeats, Path(tmp))
    rows = compare(tool, bench)
    out = {
        "command": "benchmarks/fidelity.py",
        "params": PARAMS,
        "workload": prepared.workload.provenance,
        "repeats": args.repeats,
        "vllm_serve_yaml": serve_config,
        "metrics": rows,
        "all_within": all(r["within"] for r in rows.values()),
        "tool_runs": tool,
        "vllm_bench_runs": bench,
        "notes": [
            "request_rate_rps and output_tok_s on both sides: completed requests (tokens) over the time "
            "from the replay's start to the last completion, as bench serve counts; the tool's own "
            "achieved_rps/output_tok_s divide by the step's scheduled window instead (reported_*)."
        ],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fidelity.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(rows)
    for name, row in rows.items():
        print(
            f"{name:18s} tool/bench {row['ratio']:.3f} (spread tool {row['tool_spread']:.1%}, bench "
            f"{row['vllm_bench_spread']:.1%}; allowed +-{row['allowed']:.1%}) {'ok' if row['within'] else 'OUT'}"
        )
    print(f"wrote {OUT / 'fidelity.json'}", flush=True)


if __name__ == "__main__":
    main()
