"""`tuner record` between vLLM's `bench serve` and a real vLLM CPU server on the tiny model: one row per request
with the token counts vLLM reported, no text, and the workload reader gives back the arrivals bench sent."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, leftover_processes

pytestmark = pytest.mark.integration

COUNT = 24
BLOCK_CHUNKS = 32  # a 512-token prefix block is 32 of bench's 16-token hash-id chunks


def _trace(path: Path) -> list[dict]:
    """A timed_trace of COUNT requests 0.15-0.4 s apart; every third one shares its first 512 tokens with the
    others of its kind (a shared system prompt), the rest are prompts of their own, some over one block."""
    entries = []
    time_s, unique = 0.0, 10_000
    for i in range(COUNT):
        prompt = [100, 300, 520, 700, 1100][i % 5]
        chunks = math.ceil(prompt / 16)
        shared = list(range(BLOCK_CHUNKS)) if i % 3 == 0 and prompt > 512 else []
        ids = shared + list(range(unique, unique + chunks - len(shared)))
        unique += chunks
        entries.append(
            {"timestamp": round(time_s, 3), "input_length": prompt, "output_length": 4 + 3 * (i % 4), "hash_ids": ids}
        )
        time_s += 0.15 + 0.25 * ((i * 7) % 5) / 4
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return entries


def test_recording_bench_serve_against_vllm(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peer

    from tuner.tiny_model import ensure_tiny_model
    from tuner.workload.formats import load_workload

    model = str(ensure_tiny_model())
    trace = tmp_path / "trace.jsonl"
    entries = _trace(trace)
    port = peer.free_port()
    config = (
        f"model: {model}\nserved-model-name: tiny\nhost: 127.0.0.1\nport: {port}\nmax-model-len: 2048\n"
        "kv-cache-memory-bytes: 67108864\nenforce-eager: true\n"
    )
    out = tmp_path / "recorded.jsonl"
    with peer.vllm_server(config, tmp_path, port) as url:
        recorder = subprocess.Popen(
            [sys.executable, "-m", "tuner", "record", "--upstream", url, "--listen", "127.0.0.1:0"]
            + ["--out", str(out), "--tokenizer", model, "--max-requests", str(COUNT)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"},
            start_new_session=True,
        )
        try:
            assert recorder.stdout is not None
            first = recorder.stdout.readline()
            assert first.startswith("recording http://127.0.0.1:"), first + recorder.stdout.read()
            raw = peer.bench(
                first.split()[1],
                trace,
                COUNT,
                model_path=model,
                served_name="tiny",
                work=tmp_path,
                name="bench.json",
                seed=0,
            )
            output, _ = recorder.communicate(timeout=60)  # --max-requests: it stops by itself
        finally:
            if recorder.poll() is None:
                os.killpg(recorder.pid, signal.SIGKILL)
                recorder.wait(10)
    assert recorder.returncode == 0, output
    assert f"recorded {COUNT} requests" in output, output

    text = out.read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) == COUNT and not any(raw["errors"])
    # vLLM's own counts, request by request (bench sent them in trace order, the proxy wrote arrival order).
    assert [row["prompt_tokens"] for row in rows] == raw["input_lens"] == [e["input_length"] for e in entries]
    assert [row["output_tokens"] for row in rows] == raw["output_lens"] == [e["output_length"] for e in entries]
    # No text: numbers and keyed ids only.
    for row in rows:
        assert set(row) <= {"arrival_s", "prompt_tokens", "output_tokens", "prefix_ids"}, row
        assert len(row["prefix_ids"]) == math.ceil(row["prompt_tokens"] / 512)
    shared = [row["prefix_ids"][0] for row, entry in zip(rows, entries, strict=True) if entry["hash_ids"][0] == 0]
    assert len(shared) >= 2 and len(set(shared)) == 1
    others = [row["prefix_ids"][0] for row, entry in zip(rows, entries, strict=True) if entry["hash_ids"][0] != 0]
    assert len(set(others)) == len(others) and shared[0] not in others
    # The workload reader (what `workload inspect` and `search --workload` use) gives back bench's arrivals.
    workload = load_workload(out)
    assert [r.arrival_s for r in workload.requests] == [row["arrival_s"] for row in rows]
    sent = [e["timestamp"] for e in entries]
    drift = [abs(r.arrival_s - s) for r, s in zip(workload.requests, sent, strict=True)]
    assert max(drift) < 0.1, drift
    assert leftover_processes(wait_s=30, pattern="vllm.entrypoints.openai.api_server|tuner record") == []
