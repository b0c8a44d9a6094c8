"""Resume after the driver was killed (SIGKILL): finished trials are not rerun, interrupted trials' runs are
closed, no duplicate runs appear, the final front covers every trial, and nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ENGINE_PATTERN, ROOT, leftover_processes, run_cli

pytestmark = pytest.mark.integration


def test_a_killed_search_resumes_without_rerunning_or_duplicating(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    config = str(ROOT / "tests" / "fixtures" / "search-short.yaml")
    args = ["search", "--config", config, "--name", "resume-test", "--tracking-uri", uri, "--no-confirm"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "tuner", *args],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seen: list[str] = []
    deadline = time.monotonic() + 600
    assert driver.stdout is not None
    for line in driver.stdout:
        seen.append(line)
        ended = [x for x in seen if " completed:" in x or " early_stopped:" in x or " infeasible:" in x]
        if ended and "trial 2/4" in "".join(seen) or time.monotonic() > deadline:
            break
    time.sleep(3)  # let the second trial get going, then kill the driver mid-search
    driver.send_signal(signal.SIGKILL)
    driver.wait(30)
    killed_at = time.time()
    assert any(" completed:" in x or " early_stopped:" in x for x in seen), "".join(seen)[-2000:]
    # Engines die with their actors at once; Ray's own agents notice their raylet is gone within ~2 min.
    assert leftover_processes(wait_s=60, pattern=ENGINE_PATTERN) == []
    assert leftover_processes(wait_s=180) == [], "a killed driver must not leave engines or Ray behind"

    result = run_cli(*args, "--resume")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "resuming search 'resume-test'" in result.stdout

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("resume-test")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("run_kind") == "search"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    ids = [r.data.tags["trial_id"] for r in trials]
    # No duplicates, and the whole budget: a trial Tune had created but not started when the driver
    # died gives its sample back.
    assert len(ids) == len(set(ids)) == 4, ids
    assert any(r.info.start_time / 1000 > killed_at for r in trials), "the resumed search ran new trials"
    assert any(r.data.tags["status_reason"].startswith("interrupted") for r in trials)
    assert all(r.info.status != "RUNNING" for r in trials)
    assert all(r.data.tags["trial_status"] in ("completed", "early_stopped", "infeasible") for r in trials)
    recorded = json.loads(open(client.download_artifacts(parents[0].info.run_id, "trials.json", str(tmp_path))).read())
    assert sorted(row["trial_id"] for row in recorded["trials"]) == sorted(ids)
    assert leftover_processes() == []
