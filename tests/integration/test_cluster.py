"""Bigger than one machine: `--address` runs the trials on an existing Ray cluster, here a local
two-node cluster (ray.cluster_utils.Cluster, one CPU per node), and the trials land on both nodes. The
search replays an imported production trace (Azure's CSV, scaled down): the import is tested here too."""

from __future__ import annotations

import json
import os

import pytest
from helpers import ENGINE_PATTERN, ROOT, leftover_processes, run_cli

pytestmark = pytest.mark.integration


def test_trials_are_placed_on_both_nodes_of_an_existing_cluster(tmp_path):
    os.environ["RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper"] = "true"
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    try:
        result = run_cli(
            "search",
            "--config",
            str(ROOT / "tests" / "fixtures" / "search-cluster.yaml"),
            "--address",
            cluster.address,
            "--tracking-uri",
            uri,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    finally:
        cluster.shutdown()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("e2e-cluster")
    runs = client.search_runs([experiment.experiment_id])
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parent = next(r for r in runs if r.data.tags.get("run_kind") == "search")
    workload = json.loads(open(client.download_artifacts(parent.info.run_id, "workload.json", str(tmp_path))).read())
    assert workload["format"] == "azure" and workload["transforms"], workload
    assert float(parent.data.params["reference_rps"]) == pytest.approx(4.0, rel=0.01), "the trace's scaled rate"
    assert len(trials) == 2
    nodes = {r.data.tags.get("replica_nodes") for r in trials}
    assert None not in nodes and len(nodes) == 2, f"both nodes used: {nodes}"
    assert all(r.data.tags["trial_status"] in ("completed", "early_stopped") for r in trials)
    assert leftover_processes(wait_s=30, pattern=ENGINE_PATTERN) == []
