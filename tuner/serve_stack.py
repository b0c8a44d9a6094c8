"""Ray Serve as a validation stack: the exported `serve-llm.yaml` deployed on a Ray instance of its own.

`serve_app` starts `python -m tuner.serve_stack CONFIG PORT` in a session of its own: a fresh local Ray
(loopback only, no dashboard) on which each application of the Serve config is built by its own
`import_path` with its own `args`, as `serve run` does; only Serve's HTTP address is set (127.0.0.1 and
`PORT`). The parent waits until `/v1/models` lists the model, and stops the whole session on the way
out (Serve, Ray and the engine with it). A replica that Serve reports as unschedulable (three times: a slow
start is reported once or twice), or a stack that exits or is not ready in time, is a StackError carrying
Serve's own message.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuner.errors import StackError

# Serve's controller says so when a replica cannot be placed ("... taken more than 30s to be scheduled ..."),
# once per 30 s while it waits. Once is not enough: on a slow 2-core hour both of a validated app's replicas
# waited more than 30 s and then started (2026-12-04), so a deployment must be said to wait this many times.
UNSCHEDULABLE = re.compile(
    r"Deployment '([^']*)' in application '[^']*' has \d+ replicas? that have taken more than \d+s to be "
    r"scheduled.*",
    re.IGNORECASE,
)
UNSCHEDULABLE_REPEATS = 3
READY_MARK = "tuner.serve_stack: applications deployed"


@contextmanager
def serve_app(
    config: Path,
    work: Path,
    port: int,
    served_name: str,
    *,
    timeout_s: float = 420,
    replicas_log: Path | None = None,
) -> Iterator[str]:
    """Deploy the Serve config `config` on a fresh local Ray; yields the base URL of its HTTP proxy. With
    `replicas_log`, the child appends each deployment's replica states to it every 2 s (`replica_timeline`)."""
    from trainables.vllm_engine import start_pinned
    from tuner.peer import stop_group
    from tuner.processes import worker_env

    log_path = work / f"ray-serve-{port}.log"
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # as tuner.search starts a local Ray (its node IP is 127.0.0.1)
        "RAY_ADDRESS": "",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
        **worker_env(),  # Serve's replicas and their engines at the client's priority, as in a search
    }
    with log_path.open("w") as log:
        argv = [sys.executable, "-m", "tuner.serve_stack", str(config), str(port)]
        stack = start_pinned([*argv, *([str(replicas_log)] if replicas_log else [])], [], env=env, stdout=log)
        try:
            _wait_ready(port, served_name, stack, log_path, timeout_s)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_group(stack, grace_s=90, leader_first=True)


def _wait_ready(port: int, served_name: str, stack, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        stuck = _stuck(text)
        if stuck:
            raise StackError(f"Ray Serve could not schedule a replica: {_clip(stuck.group(0))} (log: {log_path})")
        if stack.poll() is not None:
            raise StackError(f"Ray Serve exited before it was ready: {_last_error(text)} (log: {log_path})")
        if READY_MARK in text and served_name in _models(port) and _completes(port, served_name):
            return
        time.sleep(2)
    raise StackError(f"Ray Serve did not list model {served_name!r} within {timeout_s:.0f}s (log: {log_path})")


def _stuck(text: str) -> re.Match[str] | None:
    """Serve's last word on a deployment it has said UNSCHEDULABLE_REPEATS times it cannot place, if any."""
    seen: dict[str, int] = {}
    for match in UNSCHEDULABLE.finditer(text):
        seen[match.group(1)] = seen.get(match.group(1), 0) + 1
        if seen[match.group(1)] >= UNSCHEDULABLE_REPEATS:
            return match
    return None


def replica_timeline(path: Path) -> list[tuple[float, dict[str, dict[str, int]]]]:
    """(wall time, deployment -> {replica state: count}) as the child logged them, oldest first."""
    timeline = []
    for line in path.read_text().splitlines() if path.exists() else ():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short when the child was stopped
        timeline.append((float(entry["t"]), entry["deployments"]))
    return timeline


def _log_replicas(path: Path) -> None:
    from ray import serve

    deployments = {
        name: {str(state.value if hasattr(state, "value") else state): n for state, n in d.replica_states.items()}
        for app in serve.status().applications.values()
        for name, d in app.deployments.items()
    }
    with path.open("a") as out:
        out.write(json.dumps({"t": time.time(), "deployments": deployments}) + "\n")


def _models(port: int) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
            return [str(m.get("id")) for m in json.loads(response.read()).get("data", [])]
    except (OSError, ValueError):
        return []


def _completes(port: int, served_name: str) -> bool:
    """One 1-token completion answered: the engine behind the ingress is up, not only the ingress."""
    body = json.dumps({"model": served_name, "prompt": "ready", "max_tokens": 1}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # short: the loop reads the log between
            return response.status == 200
    except (OSError, ValueError):
        return False


def _last_error(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return _clip((errors or lines or ["(no output)"])[-1])


def _clip(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _deploy(config_path: str, port: int, replicas_log: str | None = None) -> None:
    """The child: what `serve run CONFIG` does (the config validated by Serve's own schema, Serve started
    with its http/grpc/controller options, the applications deployed), on a fresh local Ray bound to
    loopback and with Serve's HTTP port set to `port`; then wait for SIGTERM and shut everything down."""
    import logging

    import yaml

    raw = yaml.safe_load(Path(config_path).read_text())
    raw["http_options"] = {**(raw.get("http_options") or {}), "host": "127.0.0.1", "port": port}
    import ray
    from ray.serve import shutdown
    from ray.serve._private import api as serve_api
    from ray.serve._private.constants import SERVE_NAMESPACE
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(raw)
    ray.init(
        address="local",
        namespace=SERVE_NAMESPACE,
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level=logging.WARNING,
    )
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        client = serve_api.serve_start(
            http_options=config.http_options.model_dump(),
            proxy_location=config.proxy_location,
            grpc_options=gRPCOptions(**config.grpc_options.model_dump()),
            controller_options=config.controller_options,
        )
        client.deploy_apps(config, _blocking=False)
        print(READY_MARK, flush=True)
        logged = 0.0
        while not stopping:
            if replicas_log and time.monotonic() - logged >= 2:
                logged = time.monotonic()
                try:
                    _log_replicas(Path(replicas_log))
                except Exception as error:  # a status call during start-up or shutdown: the next one will do
                    print(f"tuner.serve_stack: replica status unavailable: {error}", flush=True)
            time.sleep(0.5)
    finally:
        shutdown()
        ray.shutdown()


if __name__ == "__main__":
    _deploy(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
