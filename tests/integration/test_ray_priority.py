"""A trial's replay client runs at the driver's priority: Ray nices its workers by 15 (its driver and daemons
keep theirs), which let any busy process of the driver's session take the CPU from a trial's client (sends
2.4 s late with two busy neighbours, docs/benchmarks.md). A search's workers, on the Ray it starts and on an
existing cluster, keep the driver's niceness (tuner.processes.worker_env)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import LEAK_PATTERN, ROOT, leftover_processes

pytestmark = pytest.mark.integration

NICENESS = """
import os, ray

@ray.remote(num_cpus=0)
def niceness():
    return os.nice(0)

@ray.remote(num_cpus=0)
class Actor:
    def niceness(self):
        return os.nice(0)

def measure():
    actor = Actor.remote()
    found = (ray.get(niceness.remote()), ray.get(actor.niceness.remote()))
    ray.kill(actor)
    return found

print("driver", os.nice(0), os.nice(0))
"""

LOCAL = (
    NICENESS
    + """
from tuner.search import start_ray
start_ray(None)
try:
    print("search", *measure())
finally:
    ray.shutdown()
"""
)

# A cluster started without the search's environment (as a user's `ray start` would be): Ray's own default
# for a plain driver first (so the check can fail), then the search's driver.
CLUSTER = (
    NICENESS
    + """
from ray.cluster_utils import Cluster
from tuner.search import start_ray
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
try:
    ray.init(address=cluster.address)
    print("plain", *measure())
    ray.shutdown()
    start_ray(cluster.address)
    print("search", *measure())
    ray.shutdown()
finally:
    cluster.shutdown()
"""
)


def _run(script: str) -> dict[str, tuple[int, ...]]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_worker_niceness", "RAY_ADDRESS")}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, text=True, capture_output=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    found = {}
    for line in result.stdout.splitlines():
        name, *values = line.split()
        if name in ("driver", "plain", "search"):
            found[name] = tuple(int(v) for v in values)
    return found


def test_a_local_rays_workers_run_at_the_drivers_priority():
    found = _run(LOCAL)
    assert found["search"] == found["driver"], found
    assert leftover_processes(wait_s=30, pattern=LEAK_PATTERN) == []


def test_a_searchs_workers_on_an_existing_cluster_run_at_the_drivers_priority():
    found = _run(CLUSTER)
    driver = found["driver"][0]
    assert driver < 19, "a driver at niceness 19 cannot tell Ray's default from ours"
    assert found["plain"] == (min(driver + 15, 19),) * 2, f"Ray's default worker niceness changed: {found}"
    assert found["search"] == found["driver"], found
    assert leftover_processes(wait_s=30, pattern=LEAK_PATTERN) == []
