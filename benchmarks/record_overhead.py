"""What `tuner record` adds: its latency per request and its throughput limit, in front of an instant stub upstream.

A real CPU engine's TTFT varies more from run to run than the proxy could add, so the upstream here
answers at once (a fixed completion, or a stream of 16 chunks with usage when asked). Each run:

- latency: 1000 requests one at a time, alternating blocks of 100 through the proxy and straight to the
  stub; the end-to-end difference at p50/p95 (time to the whole answer; for streams also to the first
  chunk), and the proxy's own figure (timed inside it: arrival to upstream call, plus upstream's first
  byte to the client's), which `tuner record` prints when it stops;
- throughput: 64 concurrent clients for 8 s through the proxy and straight to the stub: completed
  requests per second.

for plain answers and for streams, each run with fresh proxies.

    .venv/bin/python benchmarks/record_overhead.py [--runs 3]   # about 3 minutes on a 2-core machine

Writes reports/benchmarks/record_overhead.json and prints a summary. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
CHUNKS = 16
LATENCY_REQUESTS = 1000
BLOCK = 100
CONCURRENCY = 64
THROUGHPUT_S = 8.0
BODIES = {
    "plain": {"model": "stub", "prompt": "a b c d", "max_tokens": CHUNKS},
    "stream": {"model": "stub", "prompt": "a b c d", "max_tokens": CHUNKS, "stream": True},
}


# --- the instant upstream ----------------------------------------------------------------------------

_USAGE = {"prompt_tokens": 4, "completion_tokens": CHUNKS, "total_tokens": 4 + CHUNKS}
_ANSWER = json.dumps(
    {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "x" * 64}], "usage": _USAGE}
)
_CHUNK = b'data: {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "x"}]}\n\n'
_USAGE_CHUNK = f"data: {json.dumps({'id': 'c', 'choices': [], 'usage': _USAGE})}\n\n".encode()


async def stub(scope: dict, receive: Any, send: Any) -> None:
    """An OpenAI-compatible completions endpoint that answers at once."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if b'"stream": true' not in body:
        answer = _ANSWER.encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(CHUNKS):
        await send({"type": "http.response.body", "body": _CHUNK, "more_body": True})
    if b'"include_usage": true' in body:
        await send({"type": "http.response.body", "body": _USAGE_CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def _serve_stub(port: int) -> None:
    import uvicorn

    uvicorn.run(stub, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off")


# --- processes -----------------------------------------------------------------------------------------


def _wait_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port}")


class Proxy:
    """`python -m tuner record` in front of the stub, as a user runs it."""

    def __init__(self, upstream: str, work: Path) -> None:
        self.out = work / f"trace-{time.monotonic_ns()}.jsonl"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tuner", "record", "--upstream", upstream, "--listen", "127.0.0.1:0"]
            + ["--out", str(self.out), "--progress-s", "3600"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        if not first.startswith("recording "):
            raise SystemExit(f"tuner record did not start: {first}{self.process.stdout.read()}")
        self.url = first.split()[1]

    def stop(self) -> dict[str, Any]:
        """SIGTERM; the proxy's own summary: rows written and its time per request."""
        self.process.send_signal(signal.SIGTERM)
        output, _ = self.process.communicate(timeout=60)
        if self.process.returncode != 0:
            raise SystemExit(f"tuner record exited {self.process.returncode}: {output}")
        found = re.search(r"recorded (\d+) requests.*p50 ([\d.]+) ms, p95 ([\d.]+) ms", output)
        if found is None:
            raise SystemExit(f"no summary in: {output}")
        rows = self.out.read_text().count("\n")
        self.out.unlink()
        return {"rows": rows, "inside_p50_ms": float(found[2]), "inside_p95_ms": float(found[3])}


# --- load ----------------------------------------------------------------------------------------------


async def _one(session: Any, url: str, body: dict) -> tuple[float, float]:
    """(seconds to the first body bytes, seconds to the whole answer) of one request."""
    began = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as response:
        first = None
        async for _ in response.content.iter_any():
            if first is None:
                first = time.perf_counter() - began
        if response.status != 200:
            raise SystemExit(f"status {response.status}")
    return first or 0.0, time.perf_counter() - began


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(proxy_url: str, direct_url: str, body: dict) -> dict[str, float]:
    import aiohttp

    timings: dict[str, list[tuple[float, float]]] = {"proxy": [], "direct": []}
    async with aiohttp.ClientSession() as session:
        for url in (proxy_url, direct_url):  # warm-up: connections and code paths
            for _ in range(50):
                await _one(session, url, body)
        for block in range(LATENCY_REQUESTS // BLOCK):
            for name, url in (("proxy", proxy_url), ("direct", direct_url))[:: 1 if block % 2 == 0 else -1]:
                for _ in range(BLOCK // 2):
                    timings[name].append(await _one(session, url, body))
    result = {}
    for part, index in (("first_byte", 0), ("whole", 1)):
        for q, label in ((0.5, "p50"), (0.95, "p95")):
            proxied = _pct([t[index] for t in timings["proxy"]], q)
            direct = _pct([t[index] for t in timings["direct"]], q)
            result[f"{part}_{label}_direct_ms"] = round(direct * 1e3, 3)
            result[f"{part}_{label}_added_ms"] = round((proxied - direct) * 1e3, 3)
    return result


async def throughput(url: str, body: dict) -> float:
    """Completed requests per second with CONCURRENCY clients for THROUGHPUT_S."""
    import aiohttp

    done = 0
    deadline = time.perf_counter() + THROUGHPUT_S

    async def client(session: Any) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await _one(session, url, body)
            done += 1

    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(CONCURRENCY)))
        return done / (time.perf_counter() - began)


def one_run(stub_url: str, work: Path) -> dict[str, Any]:
    run: dict[str, Any] = {}
    for mode, body in BODIES.items():
        proxy = Proxy(stub_url, work)
        measured = asyncio.run(latency(proxy.url, stub_url, body))
        measured.update(proxy.stop())
        proxy = Proxy(stub_url, work)
        direct = asyncio.run(throughput(stub_url, body))
        through = asyncio.run(throughput(proxy.url, body))
        loaded = proxy.stop()
        measured.update(
            {
                "throughput_direct_rps": round(direct, 1),
                "throughput_proxy_rps": round(through, 1),
                "throughput_rows": loaded["rows"],
                "inside_p50_ms_under_load": loaded["inside_p50_ms"],
            }
        )
        run[mode] = measured
        print(mode, json.dumps(measured), flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    stub_process = subprocess.Popen([sys.executable, __file__, "_stub", str(port)], cwd=ROOT)
    try:
        _wait_port(port)
        stub_url = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as work:
            runs = [one_run(stub_url, Path(work)) for _ in range(args.runs)]
    finally:
        stub_process.send_signal(signal.SIGTERM)
        stub_process.wait(30)
    summary: dict[str, Any] = {}
    for mode in BODIES:
        for key in runs[0][mode]:
            values = [run[mode][key] for run in runs]
            summary[f"{mode}.{key}"] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "settings": {
            "latency_requests": LATENCY_REQUESTS,
            "concurrency": CONCURRENCY,
            "throughput_s": THROUGHPUT_S,
            "stream_chunks": CHUNKS,
            "runs": args.runs,
        },
        "runs": runs,
        "summary": summary,
    }
    out = ROOT / "reports" / "benchmarks" / "record_overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_stub":
        _serve_stub(int(sys.argv[2]))
    else:
        main()
