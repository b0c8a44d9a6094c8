"""Fixtures shared by integration tests: one local Ray per module, bound to loopback, reaping orphans."""

from __future__ import annotations

import os

import pytest
from helpers import ENGINE_PATTERN, leftover_processes


@pytest.fixture(scope="module")
def ray_local():
    os.environ["RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper"] = "true"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from tuner.processes import worker_env

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"VLLM_LOGGING_LEVEL": "WARNING", **worker_env()}},  # priorities as in a search
    )
    yield ray
    ray.shutdown()
    assert leftover_processes(wait_s=30, pattern=ENGINE_PATTERN) == []
