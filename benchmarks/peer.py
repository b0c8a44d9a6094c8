"""The peer users trust (tuner.peer: vLLM's own OpenAI server started from the exported `vllm-serve.yaml`,
driven by vLLM's own `bench serve`, judged with this tool's SLO rule), for the benchmarks.

Used by benchmarks/fidelity.py (at the workload's own rate) and benchmarks/capacity.py (a capacity
search over request rate with the same step sample, planner and SLO rule as the tool's trials).
Not part of the package: benchmarks only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner import peer  # noqa: E402
from tuner.peer import ENGINE_CORE, _bench, bench, free_port, records, write_timed_trace  # noqa: E402, F401


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


@contextmanager
def vllm_server(config_text: str, work: Path, port: int, *, timeout_s: float = 300) -> Iterator[str]:
    """tuner.peer.vllm_server on a config given as text (written into `work`)."""
    config = work / f"vllm-serve-{port}.yaml"
    config.write_text(config_text)
    with peer.vllm_server(config, work, port, timeout_s=timeout_s) as url:
        yield url
