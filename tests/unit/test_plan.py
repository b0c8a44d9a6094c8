"""The replica plan: the rate profile of a trace, replicas from the confirmed capacity and a headroom,
Little's law for Serve's target, and the plan in the exported files, checked by Ray Serve's and KubeRay's
own schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_export import _serve_validate, _verdict, build_store, kuberay_schema, standard_trials

from tuner.export import ExportOptions, export_search
from tuner.plan import no_plan_reason, rate_profile, replica_plan, replicas_for
from tuner.recorded import SearchRecord, TrialRow


def test_the_rate_profile_counts_whole_minutes_and_leaves_a_partial_one_out():
    # 3 minutes: 60, 120 and 30 requests, then 5 requests in a partial 4th minute.
    arrivals = [i for i in range(60)] + [60 + i / 2 for i in range(120)] + [120 + 2 * i for i in range(30)]
    arrivals += [180 + i for i in range(5)]
    profile = rate_profile(arrivals)
    assert profile is not None and profile["bins"] == 3 and profile["bin_s"] == 60
    assert profile["trough"] == pytest.approx(0.5) and profile["peak"] == pytest.approx(2.0)
    assert profile["mean"] == pytest.approx((60 + 120 + 30) / 180)
    assert profile["trough"] <= profile["mean"] <= profile["p99"] <= profile["peak"]
    short = rate_profile([0.0, 1.0, 2.0, 4.0])  # shorter than a minute: one bin as long as the trace
    assert short is not None and short["bins"] == 1 and short["mean"] == pytest.approx(1.0)
    assert rate_profile([3.0]) is None and rate_profile([]) is None


def _trial(capacity: float, steps: list[tuple[float, bool, float]], **params) -> TrialRow:
    return TrialRow(
        "t1",
        "r1",
        "completed",
        params=params,
        metrics={"capacity_rps_per_accel": capacity, "num_accelerators": 1.0},
        steps=tuple({"offered_rps": rate, "slo_pass": float(ok), "e2e_mean_s": e2e} for rate, ok, e2e in steps),
    )


def _record(profile: dict | None = None, verdict: dict | None = None) -> SearchRecord:
    workload = {"rate_profile": profile} if profile else {}
    return SearchRecord("e", "p", "u", "ttft:p95<1s", (), workload=workload, verdict=verdict or {})


PROFILE = {"trough": 2.0, "mean": 9.0, "p99": 23.0, "peak": 25.0}


def test_replicas_come_from_the_confirmed_lower_bound_less_the_headroom():
    trial = _trial(12.0, [(5.0, True, 0.8), (10.0, True, 1.2), (20.0, False, 3.0)])
    rounds = [{"capacity_rps_per_accel": c} for c in (11.0, 10.0, 12.5)]
    plan = replica_plan(_record(PROFILE, {"measurements": {"t1": rounds}}), trial, headroom=0.2)
    assert plan is not None and plan.capacity_rps == 10.0 and plan.operating_rps == pytest.approx(8.0)
    assert dict(plan.replicas) == {"trough": 1, "mean": 2, "p99": 3, "peak": 4}
    assert (plan.min_replicas, plan.max_replicas) == (1, 4) and plan.autoscales
    # Little's law at the operating point: 8/s x the mean E2E of the highest passing step at or below it (5/s: 0.8 s).
    assert plan.target_ongoing_requests == pytest.approx(6.4) and "Little's law" in plan.in_flight_source
    assert plan.autoscaling_config() == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 6.4}
    assert "Ray Serve autoscales 1-4 replicas" in " ".join(plan.lines())


def test_a_target_rate_is_a_fixed_count_and_no_rate_is_no_plan():
    trial = _trial(10.0, [(10.0, True, 1.0)], tensor_parallel_size=2)  # one replica = 2 accelerators: 20/s
    plan = replica_plan(_record(), trial, headroom=0.5, target_rps=25.0)
    assert plan is not None and plan.capacity_rps == 20.0 and plan.operating_rps == 10.0
    assert dict(plan.replicas) == {"target": 3} and not plan.autoscales and plan.autoscaling_config() is None
    assert replica_plan(_record(), trial) is None, "no profile recorded and no target: nothing to plan for"
    assert replica_plan(_record(PROFILE), _trial(0.0, [])) is None, "a capacity of 0 plans nothing"
    # A confirmation round that passed no load: no plan, and the reason is that, not a missing profile.
    zero = _record(PROFILE, {"measurements": {"t1": [{"capacity_rps_per_accel": 9.0}, {"capacity_rps_per_accel": 0}]}})
    assert replica_plan(zero, trial, target_rps=5.0) is None
    assert "passed no load" in no_plan_reason(zero, trial) and "--target-rps" not in no_plan_reason(zero, trial)
    assert "give --target-rps" in no_plan_reason(_record(), trial)
    assert replicas_for(8.0, 8.0) == 1 and replicas_for(8.01, 8.0) == 2 and replicas_for(0.0, 8.0) == 1


def test_the_exported_files_carry_the_plan_and_pass_serve_and_kuberay_schemas(tmp_path: Path):
    import jsonschema

    uri = build_store(
        tmp_path,
        "planned",
        standard_trials(),
        workload={"source": "/data/chat.jsonl", "format": "canonical", "sha256": "ab" * 32, "rate_profile": PROFILE},
        verdict=_verdict("win00002"),
    )
    out = tmp_path / "out"
    export_search(uri, "planned", out)
    document = yaml.safe_load((out / "serve-llm.yaml").read_text())
    _, [llm] = _serve_validate(document)
    config = llm.deployment_config
    assert "num_replicas" not in config, "Ray Serve rejects num_replicas beside autoscaling_config"
    scaling = config["autoscaling_config"]
    assert scaling["min_replicas"] == 1 and scaling["max_replicas"] > 1 and scaling["target_ongoing_requests"] >= 1
    from ray.serve.config import AutoscalingConfig

    AutoscalingConfig(**scaling)
    manifest = yaml.safe_load((out / "rayservice.yaml").read_text())
    assert list(jsonschema.Draft7Validator(kuberay_schema()).iter_errors(manifest)) == []
    [workers] = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (workers["minReplicas"], workers["maxReplicas"]) == (1, scaling["max_replicas"])
    assert manifest["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    best = json.loads((out / "best.json").read_text())
    assert best["plan"]["max_replicas"] == scaling["max_replicas"] and best["plan"]["headroom"] == 0.2
    assert "Replica plan:" in (out / "vllm-serve.yaml").read_text()

    # A target rate: a fixed count, num_replicas as Serve expects it; without either, the trial's count, said so.
    export_search(uri, "planned", tmp_path / "fixed", options=ExportOptions(target_rps=100.0))
    fixed = yaml.safe_load((tmp_path / "fixed" / "serve-llm.yaml").read_text())
    deployment = fixed["applications"][0]["args"]["llm_configs"][0]["deployment_config"]
    assert deployment["num_replicas"] > 1 and "autoscaling_config" not in deployment
    plain = build_store(tmp_path / "plain", "plain", standard_trials())
    export_search(plain, "plain", tmp_path / "plain-out")
    assert "give --target-rps" in json.loads((tmp_path / "plain-out" / "best.json").read_text())["plan"]["note"]
