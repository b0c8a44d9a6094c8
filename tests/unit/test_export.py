"""Unit tests of export: picking under an SLO, re-judging, and each file checked by its consumer's own parser.

A small synthetic MLflow store (SQLite in a tmp dir) mirrors what a search records; `build_store` is
shared with `test_report.py`.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from tuner.errors import ExportError, TrackingError
from tuner.export import ExportOptions, deployment_for, export_search, scrub, vllm_serve_config
from tuner.recorded import SearchRecord, TrialRow, coerce_param, load_search
from tuner.selection import judge, pick_trial, rejudge, step_passes
from tuner.slo import parse_slo
from tuner.tracking import MLFLOW_INFINITY

SLO = "ttft:p95<2s; tpot:p95<50ms"
FACTORS = (0.5, 1.0, 2.0)
REFERENCE_RPS = 2.0
PENALTY = 60.0
KUBERAY_SCHEMA = Path(__file__).resolve().parent.parent / "fixtures" / "kuberay" / "ray.io_rayservices.yaml"
SPACE = {
    "parameters": {
        "max_num_seqs": {"type": "int", "low": 2, "high": 64, "step": 1, "log": True},
        "max_num_batched_tokens": {"type": "int", "low": 64, "high": 2048, "step": 64, "log": False},
        "gpu_memory_utilization": {"type": "float", "low": 0.2, "high": 1.0, "step": 0.05, "log": False},
        "num_replicas": {"type": "categorical", "choices": [1, 2]},
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
    },
    "constraints": ["max_num_batched_tokens >= max_num_seqs"],
    "baseline": "vllm-defaults",
}


# --- a synthetic store mirroring what `tuner.search` records --------------------------------------


def trial(
    trial_id: str,
    status: str,
    ttft: list[float] | None = None,
    tpot: list[float] | None = None,
    *,
    params: dict[str, Any] | None = None,
    failed: list[float] | None = None,
    e2e: list[float] | None = None,
    accelerators: int = 1,
    reason: str = "",
) -> dict[str, Any]:
    """A trial spec: per-step TTFT/TPOT p95 (seconds) over the ladder; no steps for an infeasible one."""
    base = {
        "max_num_seqs": 16,
        "max_num_batched_tokens": 512,
        "gpu_memory_utilization": 0.5,
        "num_replicas": 1,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
    }
    return {
        "trial_id": trial_id,
        "status": status,
        "ttft": ttft or [],
        "tpot": tpot or [0.01] * len(ttft or []),
        "failed": failed,
        "e2e": e2e,
        "params": {**base, **(params or {})},
        "accelerators": accelerators,
        "reason": reason or f"{status} for the test",
    }


def _step_metrics(spec: dict[str, Any], *, slo_statistics: bool = True) -> list[dict[str, float]]:
    """Per-step metrics as the trainable reports them (capacity and ref latencies carried forward).

    The steps climb FACTORS and stop at the first failure, as a capacity search's climb does.
    """
    from tuner.capacity import Observation, bracket
    from tuner.metrics import capacity_metrics

    steps, seen, ref = [], [], {}
    accelerators = spec["accelerators"]
    for index, ttft in enumerate(spec["ttft"]):
        tpot = spec["tpot"][index]
        failed = (spec["failed"] or [0.0] * len(spec["ttft"]))[index]
        e2e = (spec["e2e"] or [ttft + 0.5] * len(spec["ttft"]))[index]
        factor = FACTORS[index]
        offered = factor * REFERENCE_RPS * accelerators
        passed = ttft <= 2.0 and tpot <= 0.05 and failed == 0
        seen.append(Observation(factor, offered / accelerators, passed))
        if factor == 1.0:
            ref = {"ref_ttft_p95_s": ttft, "ref_tpot_p95_s": tpot, "ref_e2e_p95_s": e2e}
        metrics = {
            "load_step": index + 1.0,
            "load_factor": factor,
            "offered_rps": offered,
            "achieved_rps": offered,
            "slo_pass": float(passed),
            "slo_headroom": min(2.0 / ttft, 0.05 / tpot),
            "slo_attainment": 1.0 if passed else 0.5,
            "goodput_rps": offered if passed else offered / 2,
            "output_tok_s": 50 * offered,
            "failed_requests": failed,
            "num_accelerators": float(accelerators),
            "arrival_rps": offered,
            "measured_requests": 100.0,
            "engine_start_s": 20.0,
            **capacity_metrics(bracket(seen), accelerators),
        }
        for metric, value in (
            ("ttft", ttft),
            ("tpot", tpot),
            ("e2e", e2e),
            ("itl", tpot),
            ("queue", ttft / 2),
        ):
            for stat, scale in (("mean", 0.6), ("p50", 0.5), ("p90", 0.9), ("p95", 1.0), ("p99", 1.2)):
                metrics[f"{metric}_{stat}_s"] = value * scale
                if slo_statistics:  # failed requests make the tail infinite, as the search's rule has it
                    tail = failed > 0 and metric in ("ttft", "tpot", "e2e") and stat in ("p95", "p99")
                    metrics[f"slo_{metric}_{stat}_s"] = MLFLOW_INFINITY if tail else value * scale
        metrics.update(ref or {"ref_ttft_p95_s": PENALTY, "ref_tpot_p95_s": PENALTY, "ref_e2e_p95_s": PENALTY})
        steps.append(metrics)
    return steps


def build_store(
    root: Path,
    experiment: str,
    trials: list[dict[str, Any]],
    *,
    slo: str = SLO,
    device: str = "cpu",
    baseline: dict[str, Any] | None = None,
    workload: dict[str, Any] | None = None,
    model: str = "/models/tiny",
    engine_args: dict[str, Any] | None = None,
    verdict: dict[str, Any] | None = None,
    cores: int = 1,
    capacity: dict[str, Any] | None = None,
) -> str:
    """Record a search as `tuner.search` does (parent run, documents, nested trial runs, and with `verdict`
    a confirmation measurement of each trial it names plus verdict.json); returns the URI. `capacity`
    adds to the search's capacity section (its step sample is what `validate` replays)."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from tuner.tracking import PARENT_TAG, start_parent_run

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    exp_id = (
        found.experiment_id
        if found
        else client.create_experiment(experiment, artifact_location=(root / "artifacts" / experiment).as_uri())
    )
    config = {
        "name": experiment,
        "model": {"path": None, "max_model_len": 2048, "engine_args": engine_args or {}},
        "hardware": {"device": device, "cpu_cores_per_replica": cores, "kv_budget_mib": 64.0},
        "slo": slo,
        "capacity": {"start_factor": FACTORS[0], "growth": 2.0, "max_factor": FACTORS[-1], **(capacity or {})},
        "objectives": [
            {"metric": "capacity_rps_per_accel", "mode": "max"},
            {"metric": "ref_ttft_p95_s", "mode": "min"},
        ],
    }
    provenance = workload or {
        "source": "/data/chat.jsonl",
        "format": "canonical",
        "sha256": "ab" * 32,
        "transforms": [{"op": "fit_to_context", "max_model_len": 2048, "clipped": 0}],
    }
    parent = start_parent_run(
        client,
        experiment,
        run_name="search-test",
        params={
            "slo": slo,
            "space": "cpu-smoke",
            "model": model,
            "workload": provenance.get("source"),
            "reference_rps": REFERENCE_RPS,
            "capacity_plan": json.dumps(
                {
                    "start_factor": FACTORS[0],
                    "growth": 2.0,
                    "max_factor": FACTORS[-1],
                    "min_factor": FACTORS[0],
                    "resolution": 0.1,
                    "noise": 0.0,
                }
            ),
            "num_samples": len(trials),
            "device": device,
            "objectives": "max:capacity_rps_per_accel,min:ref_ttft_p95_s",
        },
        tags={"slo": slo, "workload_sha256": str(provenance.get("sha256", ""))},
        documents={
            "search_config.yaml": yaml.safe_dump(config),
            "search_space.yaml": yaml.safe_dump(SPACE),
            "workload.json": provenance,
            "baseline.json": baseline if baseline is not None else trials[0]["params"] if trials else {},
        },
    )
    for number, spec in enumerate(trials):
        run = client.create_run(
            exp_id,
            run_name=f"trial-{spec['trial_id']}",
            start_time=1_000_000 + number,
            tags={PARENT_TAG: parent, "trial_id": spec["trial_id"], "trial_status": "running"},
        )
        run_id = run.info.run_id
        for key, value in spec["params"].items():
            client.log_param(run_id, key, value)
        steps = (
            _step_metrics(spec)
            if spec["status"] != "infeasible"
            else [
                {
                    "load_step": 1.0,
                    "capacity_rps": 0.0,
                    "capacity_rps_per_accel": 0.0,
                    "capacity_censored": 0.0,
                    "slo_pass": 0.0,
                    "slo_headroom": 0.0,
                    "slo_attainment": 0.0,
                    "goodput_rps": 0.0,
                    "ref_ttft_p95_s": PENALTY,
                    "ref_tpot_p95_s": PENALTY,
                    "ref_e2e_p95_s": PENALTY,
                    "num_accelerators": float(spec["accelerators"]),
                }
            ]
        )
        for metrics in steps:
            step = int(metrics["load_step"])
            client.log_batch(run_id, metrics=[Metric(k, v, 1_700_000_000_000 + step, step) for k, v in metrics.items()])
        client.set_tag(run_id, "trial_status", spec["status"])
        client.set_tag(run_id, "status_reason", spec["reason"])
        client.set_terminated(run_id, "FAILED" if spec["status"] == "infeasible" else "FINISHED")
    if verdict is not None:
        for trial_id in {verdict["winner"], verdict["baseline"]}:
            run = client.create_run(
                exp_id,
                run_name=f"confirm-{trial_id}-r1",
                start_time=2_000_000,
                tags={
                    PARENT_TAG: parent,
                    "run_kind": "confirm",
                    "confirms_trial": trial_id,
                    "trial_status": "completed",
                },
            )
            client.log_metric(run.info.run_id, "capacity_rps_per_accel", 99.0)
            client.set_terminated(run.info.run_id, "FINISHED")
        client.log_dict(parent, verdict, "verdict.json")
    client.set_terminated(parent, "FINISHED")
    return uri


def standard_trials() -> list[dict[str, Any]]:
    """Baseline (cap 2), a winner (cap 4), a faster-but-smaller one (cap 2), early-stopped, infeasible."""
    return [
        trial(
            "base0001",
            "completed",
            [0.5, 1.5, 3.0],
            params={"max_num_seqs": 128, "max_num_batched_tokens": 2048, "gpu_memory_utilization": 0.9},
        ),
        trial(
            "win00002",
            "completed",
            [0.2, 0.4, 1.0],
            params={"max_num_seqs": 32, "enable_prefix_caching": False, "gpu_memory_utilization": 0.75},
        ),
        trial("fast0003", "completed", [0.1, 0.2, 2.5], params={"max_num_seqs": 8}),
        trial("stop0004", "early_stopped", [0.3, 0.9], params={"max_num_seqs": 4}),
        trial(
            "dead0005",
            "infeasible",
            params={"gpu_memory_utilization": 0.2},
            reason="engine failed to start: KV",
        ),
    ]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return build_store(tmp_path_factory.mktemp("store"), "exp-a", standard_trials())


def row(trial_id: str, status: str, capacity: float, ttft: float, **metrics: float) -> TrialRow:
    return TrialRow(
        trial_id,
        f"run-{trial_id}",
        status,
        metrics={"capacity_rps_per_accel": capacity, "ref_ttft_p95_s": ttft, **metrics},
    )


# --- pure logic -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("True", True),
        ("False", False),
        ("16", 16),
        ("-3", -3),
        ("0.75", 0.75),
        ("1e-3", 0.001),
        ("None", None),
        ("auto", "auto"),
    ],
)
def test_params_logged_as_strings_come_back_typed(text: str, value: Any) -> None:
    assert coerce_param(text) == value and type(coerce_param(text)) is type(value)


def test_max_capacity_breaks_ties_on_lower_reference_ttft() -> None:
    rows = [row("a", "completed", 4.0, 0.5), row("b", "completed", 4.0, 0.3), row("c", "completed", 3.0, 0.1)]
    assert pick_trial(rows, "max-capacity").trial_id == "b"


def test_a_tie_is_the_same_load_passed_not_equal_decimals() -> None:
    """Capacities are measured arrival rates: three trials of vLLM's defaults that passed one load measured
    12.6399, 12.6363 and 12.6385 rps/accel (the AVX-512 search-cost table). Configs at one load are a tie,
    decided by the reference TTFT; a config one load higher (15.03) wins on capacity whatever its TTFT."""
    rows = [row("a", "completed", 12.6399, 0.5), row("b", "completed", 12.6363, 0.3), row("c", "completed", 10.63, 0.1)]
    assert pick_trial(rows, "max-capacity").trial_id == "b"
    rows.append(row("d", "completed", 15.03, 0.9))
    assert pick_trial(rows, "max-capacity").trial_id == "d"
    # a same-load tie in TTFT too goes to the earlier trial
    assert pick_trial([row("e", "completed", 12.6385, 0.3), *rows[:2]], "max-capacity").trial_id == "e"


def test_the_knee_is_chosen_from_a_front_without_same_load_ties() -> None:
    """'a' passed the same load as 'b' (the arrival jitter gives it 0.03% more) with a slower TTFT, so it is
    not on the front: the knee is found among b, c and d (c), not on a latency scale stretched to a's 0.9 s
    (which made b the knee)."""
    rows = [
        row("a", "completed", 12.6399, 0.9),
        row("b", "completed", 12.6363, 0.3),
        row("c", "completed", 10.63, 0.25),
        row("d", "completed", 5.31, 0.2),
    ]
    assert pick_trial(rows, "knee").trial_id == "c"


def test_min_latency_picks_the_lowest_reference_ttft_with_capacity() -> None:
    rows = [
        row("a", "completed", 4.0, 0.5),
        row("b", "early_stopped", 1.0, 0.2),
        row("z", "completed", 0.0, 0.01),
        row("d", "infeasible", 9.0, 0.001),
    ]
    assert pick_trial(rows, "min-latency").trial_id == "b"


def test_knee_is_the_compromise_of_the_front() -> None:
    rows = [
        row("cap", "completed", 10.0, 5.0),
        row("knee", "completed", 9.0, 0.6),
        row("lat", "completed", 1.0, 0.5),
        row("dominated", "completed", 5.0, 3.0),
    ]
    assert pick_trial(rows, "knee").trial_id == "knee"


def test_infeasible_and_zero_capacity_trials_are_never_picked() -> None:
    rows = [
        row("dead", "infeasible", 5.0, 0.1),
        row("zero", "completed", 0.0, 0.1),
        row("running", "running", 5.0, 0.1),
    ]
    for pick in ("max-capacity", "min-latency", "knee"):
        with pytest.raises(ExportError, match="no trial passed"):
            pick_trial(rows, pick)
    with pytest.raises(ValueError, match="pick must be one of"):
        pick_trial(rows, "best")


def test_step_passes_needs_every_term_within_bound_and_no_failed_request() -> None:
    slo = parse_slo("ttft:p95<1s; e2e:p99<3s")
    good = {"ttft_p95_s": 0.9, "e2e_p99_s": 2.9, "failed_requests": 0.0}
    assert step_passes(good, slo)
    assert not step_passes({**good, "ttft_p95_s": 1.01}, slo)
    assert not step_passes({**good, "failed_requests": 1.0}, slo)
    assert not step_passes({"ttft_p95_s": 0.1, "failed_requests": 0.0}, slo)  # a term's metric missing
    assert not step_passes({**good, "e2e_p99_s": math.nan}, slo)


def test_rejudge_under_a_stricter_slo_lowers_capacity(store: str) -> None:
    from tuner.tracking import client_for

    record = load_search(client_for(store), "exp-a")
    used, trials, rejudged = judge(record, "ttft:p95<0.45s; tpot:p95<50ms")
    by_id = {t.trial_id: t for t in trials}
    assert rejudged and used == "ttft:p95<450ms; tpot:p95<50ms"
    assert by_id["win00002"].capacity == pytest.approx(2.0)  # 0.2, 0.4 pass; 1.0 fails
    assert by_id["base0001"].capacity == pytest.approx(0.0)  # 0.5 > 0.45 at the first step
    assert by_id["fast0003"].capacity == pytest.approx(2.0)
    assert by_id["dead0005"].capacity == 0.0
    assert pick_trial(trials, "max-capacity").trial_id == "fast0003"  # tie at 2.0, lower ref TTFT


def test_rejudge_under_a_laxer_slo_is_censored_where_the_search_measured(store: str) -> None:
    from tuner.tracking import client_for

    record = load_search(client_for(store), "exp-a")
    _, trials, rejudged = judge(record, "ttft:p95<10s")
    by_id = {t.trial_id: t for t in trials}
    assert rejudged
    assert by_id["base0001"].capacity == pytest.approx(4.0)  # passes the top step now
    assert by_id["base0001"].metrics["capacity_censored"] == 1.0  # no measured load fails: a lower bound
    assert "capacity_hi_rps_per_accel" not in by_id["base0001"].metrics
    assert by_id["stop0004"].capacity == pytest.approx(2.0)
    assert by_id["stop0004"].metrics["capacity_censored"] == 1.0  # stopped early: a lower bound


def _step(load: float, ttft_p95: float, failed: float, *, recorded_slo: bool) -> dict[str, float]:
    step = {
        "load_factor": load,
        "offered_rps": load,
        "arrival_rps": load,
        "ttft_p95_s": ttft_p95,
        "failed_requests": failed,
    }
    if recorded_slo:
        step["slo_ttft_p95_s"] = MLFLOW_INFINITY if failed >= 5 else ttft_p95
    return step


def test_rejudging_applies_the_searchs_own_rule_to_failed_requests() -> None:
    # 3 failed requests in 100 leave the p95 finite (the search passed that step); 5 make it infinite.
    steps = tuple(_step(load, 0.1, failed, recorded_slo=True) for load, failed in ((1.0, 0.0), (2.0, 3.0), (4.0, 5.0)))
    judged = rejudge(TrialRow("t", "r", "completed", steps=steps), parse_slo("ttft:p95<1s"))
    assert judged.capacity == pytest.approx(2.0)
    assert judged.metrics["capacity_hi_rps_per_accel"] == pytest.approx(4.0)
    assert step_passes(steps[1], parse_slo("ttft:p95<1s")) and not step_passes(steps[2], parse_slo("ttft:p95<1s"))


def test_rejudging_a_majority_search_counts_a_failure_outvoted_by_two_passes_as_a_pass() -> None:
    # 2x failed, then passed twice when measured again (2 of 3); 4x failed twice.
    loads = ((1.0, 0.1), (2.0, 3.0), (2.0, 0.1), (2.0, 0.1), (4.0, 3.0), (4.0, 3.0))
    steps = tuple(_step(load, ttft, 0.0, recorded_slo=True) for load, ttft in loads)
    plan = json.dumps({"resolution": 0.1, "failure_rule": "majority"})
    record = SearchRecord(
        "e", "p", "u", "ttft:p95<2s", (TrialRow("t", "r", "completed", steps=steps),), params={"capacity_plan": plan}
    )
    assert record.failure_rule == "majority"
    _, (judged,), rejudged = judge(record, "ttft:p95<1s")
    assert rejudged and judged.capacity == pytest.approx(2.0) and judged.metrics["capacity_hi_rps_per_accel"] == 4.0
    once = rejudge(TrialRow("t", "r", "completed", steps=steps), parse_slo("ttft:p95<1s"))
    assert once.capacity == pytest.approx(1.0)  # under `once` the first failure at 2x decides


def test_steps_recorded_before_slo_statistics_fail_on_any_failed_request() -> None:
    steps = tuple(_step(load, 0.1, failed, recorded_slo=False) for load, failed in ((1.0, 0.0), (2.0, 3.0)))
    judged = rejudge(TrialRow("t", "r", "completed", steps=steps), parse_slo("ttft:p95<1s"))
    assert judged.capacity == pytest.approx(1.0) and judged.metrics["capacity_hi_rps_per_accel"] == 2.0


def test_a_growing_queue_fails_a_step_under_a_tighter_ttft_bound() -> None:
    step = {**_step(1.0, 0.5, 0.0, recorded_slo=True), "ttft_projected_s": 4.0}
    assert step_passes(step, parse_slo("ttft:p95<5s"))
    assert not step_passes(step, parse_slo("ttft:p95<3s"))


def test_the_recorded_slo_spelled_differently_keeps_the_search_verdicts(store: str) -> None:
    from tuner.tracking import client_for

    record = load_search(client_for(store), "exp-a")
    used, trials, rejudged = judge(record, "tpot:p95<0.05s;ttft:p95<2000ms")
    assert not rejudged and used == SLO and trials == record.trials
    assert judge(record, None)[2] is False


def test_scrub_drops_prompt_text_and_secret_named_keys() -> None:
    document = {
        "source": "x.jsonl",
        "prompt": "hello",
        "api_key": "sk-1",
        "nested": [{"HF_TOKEN": "hf_x", "prompt_tokens_mean": 12}],
    }
    assert scrub(document) == {"source": "x.jsonl", "nested": [{"prompt_tokens_mean": 12}]}


# --- reading MLflow -------------------------------------------------------------------------------


def test_load_search_reads_trials_steps_and_documents(store: str) -> None:
    from tuner.tracking import client_for

    record = load_search(client_for(store), "exp-a")
    assert record.slo == SLO and record.device == "cpu" and record.model == "/models/tiny"
    assert record.max_model_len == 2048 and record.kv_budget_mib == 64.0
    assert record.capacity_plan["start_factor"] == FACTORS[0] and record.capacity_plan["max_factor"] == FACTORS[-1]
    assert [t.trial_id for t in record.trials] == ["base0001", "win00002", "fast0003", "stop0004", "dead0005"]
    winner = record.trials[1]
    assert winner.params["enable_prefix_caching"] is False and winner.params["max_num_seqs"] == 32
    assert [s["load_step"] for s in winner.steps] == [1.0, 2.0, 3.0]
    assert winner.steps[1]["ttft_p95_s"] == pytest.approx(0.4)
    assert record.baseline_trial().trial_id == "base0001"
    assert record.workload["sha256"] == "ab" * 32


def test_load_search_takes_the_newest_search_that_has_trials(tmp_path: Path) -> None:
    from tuner.tracking import client_for, start_parent_run

    uri = build_store(tmp_path, "exp", [trial("old00001", "completed", [0.1, 0.2, 0.3])])
    build_store(tmp_path, "exp", [trial("new00001", "completed", [0.1, 0.2, 3.0])])
    client = client_for(uri)
    start_parent_run(client, "exp", run_name="crashed-before-any-trial", params={}, tags={"slo": SLO}, documents={})
    assert [t.trial_id for t in load_search(client, "exp").trials] == ["new00001"]


def test_unknown_experiment_is_a_tracking_error(store: str) -> None:
    from tuner.tracking import client_for

    with pytest.raises(TrackingError, match="no MLflow experiment named 'nope'"):
        load_search(client_for(store), "nope")


# --- the files, each checked by its consumer ------------------------------------------------------


@pytest.fixture(scope="module")
def exported(store: str, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export")
    export_search(store, "exp-a", out)
    return out


@pytest.fixture(scope="module")
def vllm_parser():
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def parse(path: Path):
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--config", str(path)])
        validate_parsed_serve_args(args)
        return args

    return parse


def test_vllm_serve_yaml_is_read_by_vllms_own_parser(exported: Path, vllm_parser) -> None:
    text = (exported / "vllm-serve.yaml").read_text()
    assert "no-enable-prefix-caching: true" in text and "enable-prefix-caching: false" not in text
    args = vllm_parser(exported / "vllm-serve.yaml")
    assert args.model == "/models/tiny" and args.served_model_name == ["exp-a"]
    assert args.host == "127.0.0.1" and args.port == 8000 and args.max_model_len == 2048
    assert args.max_num_seqs == 32 and args.max_num_batched_tokens == 512
    assert args.kv_cache_memory_bytes == int(0.75 * 64 * 2**20)
    assert args.enable_chunked_prefill is True and args.enable_prefix_caching is False
    assert args.enforce_eager is True  # as every trial's engine ran
    assert args.gpu_memory_utilization != 0.75  # the searched fraction went in as bytes of KV cache


def test_vllm_serve_yaml_on_gpu_keeps_the_memory_fraction_and_the_model_uri(tmp_path: Path, vllm_parser) -> None:
    uri = build_store(
        tmp_path,
        "gpu-exp",
        [
            trial(
                "g1",
                "completed",
                [0.1, 0.2, 3.0],
                params={
                    "gpu_memory_utilization": 0.92,
                    "max_num_seqs": 256,
                    "enable_chunked_prefill": False,
                    "max_num_batched_tokens": 4096,
                },
            )
        ],
        device="gpu",
        engine_args={"skip_tokenizer_init": True, "dtype": "bfloat16"},
    )
    export_search(
        uri,
        "gpu-exp",
        tmp_path / "out",
        options=ExportOptions(model_uri="Qwen/Qwen2.5-0.5B-Instruct", host="0.0.0.0", port=9000),
    )
    args = vllm_parser(tmp_path / "out" / "vllm-serve.yaml")
    assert args.model == "Qwen/Qwen2.5-0.5B-Instruct" and args.served_model_name == ["Qwen/Qwen2.5-0.5B-Instruct"]
    assert args.gpu_memory_utilization == 0.92 and args.kv_cache_memory_bytes is None
    assert args.enable_chunked_prefill is False and args.dtype == "bfloat16" and args.port == 9000
    assert args.skip_tokenizer_init is False  # a measuring-only setting never reaches the deployment
    assert "beyond loopback" in (tmp_path / "out" / "vllm-serve.yaml").read_text()


def _serve_validate(document: dict[str, Any]):
    from ray.serve.llm import LLMConfig, LLMServingArgs
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(document)
    configs = [LLMConfig(**llm) for app in document["applications"] for llm in app["args"]["llm_configs"]]
    for app in document["applications"]:
        LLMServingArgs.model_validate(app["args"])  # what build_openai_app checks its args against
    return schema, configs


def test_serve_llm_yaml_validates_with_serve_schema_and_llm_config(exported: Path) -> None:
    text = (exported / "serve-llm.yaml").read_text()
    document = yaml.safe_load(text)
    schema, [llm] = _serve_validate(document)
    app = schema.applications[0]
    assert app.import_path == "ray.serve.llm:build_openai_app" and app.route_prefix == "/"
    assert schema.http_options.host == "127.0.0.1"
    assert llm.engine_kwargs["max_num_seqs"] == 32 and llm.engine_kwargs["enable_prefix_caching"] is False
    assert llm.engine_kwargs["kv_cache_memory_bytes"] == int(0.75 * 64 * 2**20)
    assert llm.deployment_config["num_replicas"] == 1
    assert llm.deployment_config["health_check_period_s"] == 10.0  # Serve's defaults: nothing was searched
    assert llm.deployment_config["health_check_timeout_s"] == 30.0
    assert llm.accelerator_config.kind == "cpu"
    # The ingress asks for no core of its own on CPU: with Serve's default of 1 it never scheduled on 2 cores.
    assert app.args["ingress_deployment_config"] == {"ray_actor_options": {"num_cpus": 0}}
    comment = next(line for line in text.splitlines() if "failure threshold" in line)
    assert "fixed at 3" in comment and comment.strip().startswith("#")


def test_serve_llm_yaml_carries_replicas_heartbeats_and_accelerator(tmp_path: Path) -> None:
    uri = build_store(
        tmp_path,
        "hb",
        [
            trial(
                "h1",
                "completed",
                [0.1, 0.2, 3.0],
                accelerators=2,
                params={
                    "num_replicas": 2,
                    "heartbeat_period_s": 2.5,
                    "heartbeat_timeout_s": 7.0,
                    "failure_threshold": 5,
                },
            )
        ],
    )
    export_search(uri, "hb", tmp_path / "out", options=ExportOptions(target_accelerator="H100"))
    text = (tmp_path / "out" / "serve-llm.yaml").read_text()
    _, [llm] = _serve_validate(yaml.safe_load(text))
    assert llm.deployment_config == {
        "num_replicas": 2,
        "health_check_period_s": 2.5,
        "health_check_timeout_s": 7.0,
    }
    assert llm.accelerator_type == "H100"
    assert "failure_threshold=5" in text
    for pool_param in ("num_replicas", "heartbeat_period_s", "failure_threshold"):
        assert pool_param not in llm.engine_kwargs
    best = json.loads((tmp_path / "out" / "best.json").read_text())
    assert best["deployment"]["searched_failure_threshold"] == 5 and best["deployment"]["serve_failure_threshold"] == 3
    manifest = yaml.safe_load((tmp_path / "out" / "rayservice.yaml").read_text())
    worker = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (
        worker["replicas"] == 2
        and worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    )


def test_unknown_target_accelerator_is_a_clear_error(store: str, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="--target-accelerator 'H1000'"):
        export_search(store, "exp-a", tmp_path / "out", options=ExportOptions(target_accelerator="H1000"))
    assert not (tmp_path / "out").exists()


def kuberay_schema(strict: bool = True) -> dict[str, Any]:
    """The vendored RayService v1 schema; `strict` closes objects as `kubectl --validate=strict` would."""
    crd = yaml.safe_load(KUBERAY_SCHEMA.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    if strict:
        close(schema)
    return schema


def test_rayservice_yaml_matches_the_kuberay_crd_schema(exported: Path) -> None:
    import jsonschema

    manifest = yaml.safe_load((exported / "rayservice.yaml").read_text())
    validator = jsonschema.Draft7Validator(kuberay_schema())
    assert list(validator.iter_errors(manifest)) == []
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    serve = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    _, [llm] = _serve_validate(serve)
    assert llm.engine_kwargs["max_num_seqs"] == 32
    assert serve["http_options"]["host"] == "0.0.0.0"  # inside the pod, so the k8s Service can reach it


@pytest.mark.parametrize("breakage", ["typo", "wrong_type", "missing_head", "config_as_mapping"])
def test_the_vendored_schema_rejects_broken_manifests(exported: Path, breakage: str) -> None:
    import jsonschema

    manifest = yaml.safe_load((exported / "rayservice.yaml").read_text())
    spec = manifest["spec"]
    if breakage == "typo":
        spec["rayClusterConfig"]["workerGroupSpecs"][0]["replica"] = 1
    elif breakage == "wrong_type":
        spec["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "one"
    elif breakage == "missing_head":
        del spec["rayClusterConfig"]["headGroupSpec"]
    else:
        spec["serveConfigV2"] = yaml.safe_load(spec["serveConfigV2"])
    assert list(jsonschema.Draft7Validator(kuberay_schema()).iter_errors(manifest))


def test_best_json_has_params_metrics_and_provenance_and_no_secret(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_do_not_leak")
    uri = build_store(
        tmp_path,
        "prov",
        standard_trials(),
        workload={
            "source": "/data/t.jsonl",
            "sha256": "cd" * 32,
            "api_key": "sk-do-not-leak",
            "prompt": "a user's private prompt",
            "transforms": [{"op": "scale", "factor": 2}],
        },
    )
    result = export_search(uri, "prov", tmp_path / "out", options=ExportOptions(model_uri="org/prod-model"))
    best = json.loads(result.files["best.json"].read_text())
    assert best["experiment"] == "prov" and best["trial_id"] == "win00002" and best["parent_run_id"]
    assert best["params"]["max_num_seqs"] == 32 and best["metrics"]["capacity_rps_per_accel"] == pytest.approx(4.0)
    assert best["workload"]["sha256"] == "cd" * 32 and best["workload"]["transforms"] == [{"op": "scale", "factor": 2}]
    assert best["model"] == {
        "tuned_path": "/models/tiny",
        "model_uri": "org/prod-model",
        "served_model_name": "org/prod-model",
        "max_model_len": 2048,
    }
    assert best["hardware"]["device"] == "cpu" and best["hardware"]["kv_budget_mib"] == 64.0
    assert best["versions"]["vllm-tuner"] and best["versions"]["vllm"]["version"]
    assert [s["load_step"] for s in best["steps"]] == [1.0, 2.0, 3.0]
    for path in result.files.values():
        text = path.read_text()
        assert "do-not-leak" not in text and "private prompt" not in text
        if path.suffix == ".yaml":
            assert "/models/tiny" not in text and "org/prod-model" in text


def test_deployment_maps_the_kv_fraction_to_bytes_only_on_cpu() -> None:
    record = SearchRecord(
        "e",
        "p",
        "sqlite://",
        SLO,
        (),
        params={"device": "cpu", "model": "/m"},
        config={"hardware": {"kv_budget_mib": 100.0}, "model": {"max_model_len": 512}},
    )
    chosen = TrialRow("t", "r", "completed", params={"gpu_memory_utilization": 0.5, "enable_chunked_prefill": False})
    config = vllm_serve_config(deployment_for(record, chosen, ExportOptions()))
    assert config["kv-cache-memory-bytes"] == 50 * 2**20 and "gpu-memory-utilization" not in config
    assert config["no-enable-chunked-prefill"] is True and config["max-model-len"] == 512


def test_the_tiny_model_is_exported_in_float32_on_cpu_as_it_was_measured() -> None:
    def exported(model: str, device: str, engine_args: dict[str, Any]) -> dict[str, Any]:
        record = SearchRecord(
            "e",
            "p",
            "sqlite://",
            SLO,
            (),
            params={"device": device, "model": model},
            config={"model": {"max_model_len": 512, "engine_args": engine_args}},
        )
        return vllm_serve_config(deployment_for(record, TrialRow("t", "r", "completed", params={}), ExportOptions()))

    tiny = "/cache/models/tiny-llama-v1"
    assert exported(tiny, "cpu", {})["dtype"] == "float32"
    assert exported(tiny, "cpu", {"dtype": "bfloat16"})["dtype"] == "bfloat16", "the config's own dtype wins"
    assert "dtype" not in exported(tiny, "gpu", {}) and "dtype" not in exported("/m", "cpu", {})


# --- the command ----------------------------------------------------------------------------------


def cli() -> click.Group:
    from tuner.cli import TunerGroup
    from tuner.report_cli import export, report

    return TunerGroup(name="tuner", commands={"export": export, "report": report})


def test_export_command_writes_the_four_files(store: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(),
        [
            "export",
            "--experiment",
            "exp-a",
            "--tracking-uri",
            store,
            "--out",
            str(tmp_path / "out"),
            "--pick",
            "min-latency",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "trial fast0003 (min-latency)" in result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "best.json",
        "rayservice.yaml",
        "serve-llm.yaml",
        "vllm-serve.yaml",
    ]


def test_export_with_no_feasible_trial_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    uri = build_store(
        tmp_path,
        "all-dead",
        [trial("d1", "infeasible"), trial("d2", "infeasible"), trial("s1", "early_stopped", [3.0])],
    )
    result = CliRunner().invoke(
        cli(), ["export", "--experiment", "all-dead", "--tracking-uri", uri, "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: experiment 'all-dead': no feasible trial")
    assert "2 infeasible" in lines[0] and "1 early-stopped" in lines[0]
    assert not (tmp_path / "out").exists()


def test_export_under_a_slo_no_trial_meets_is_a_clear_error(store: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(),
        [
            "export",
            "--experiment",
            "exp-a",
            "--tracking-uri",
            store,
            "--slo",
            "ttft:p95<1ms",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 2 and "under SLO 'ttft:p95<1ms'" in result.output


def test_export_of_an_unknown_experiment_is_a_clear_error(store: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(), ["export", "--experiment", "missing", "--tracking-uri", store, "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2 and "no MLflow experiment named 'missing'" in result.output


def test_export_with_an_unreadable_slo_is_a_clear_error(store: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(),
        [
            "export",
            "--experiment",
            "exp-a",
            "--tracking-uri",
            store,
            "--slo",
            "ttft<2s",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and "SLO term 'ttft<2s'" in result.output


# --- the confirmation's verdict ---------------------------------------------------------------------------


def _verdict(winner: str, baseline: str = "base0001", distinguishable: bool = True) -> dict[str, Any]:
    return {
        "winner": winner,
        "baseline": baseline,
        "ratio": 1.9 if distinguishable else 1.04,
        "ci_low": 1.5 if distinguishable else 0.9,
        "ci_high": 2.4 if distinguishable else 1.2,
        "confidence": 0.95,
        "distinguishable": distinguishable,
        "rounds": 4,
        "tied_with": [],
        "tie_rule": "fewer accelerators, then lower TTFT p95 at the reference load",
        "text": "x1.90 the baseline's capacity (95% CI 1.50-2.40)"
        if distinguishable
        else "not distinguishable from the baseline at this noise (95% CI 0.90-1.20); vLLM's defaults are fine",
    }


def test_confirmation_runs_never_enter_the_searchs_trials(tmp_path: Path) -> None:
    uri = build_store(tmp_path, "confirmed", standard_trials(), verdict=_verdict("win00002"))
    from mlflow.tracking import MlflowClient

    record = load_search(MlflowClient(tracking_uri=uri), "confirmed")
    assert [t.trial_id for t in record.trials] == [t["trial_id"] for t in standard_trials()]
    assert record.verdict["winner"] == "win00002"


def test_a_baseline_the_confirmation_could_not_beat_is_what_the_export_recommends(tmp_path: Path) -> None:
    uri = build_store(tmp_path, "tied", standard_trials(), verdict=_verdict("base0001", distinguishable=False))
    result = export_search(uri, "tied", tmp_path / "out")
    assert result.trial.trial_id == "base0001", "a config tied with the baseline never displaces it"
    best = json.loads((tmp_path / "out" / "best.json").read_text())
    assert best["verdict"]["distinguishable"] is False and best["verdict"]["applies"] is True
    assert {"ratio", "ci_low", "ci_high", "confidence", "rounds", "tied_with", "tie_rule"} <= set(best["verdict"])
    assert {"power_at_gain", "gain_tested", "rounds_for_power"} <= set(best["verdict"])
    header = (tmp_path / "out" / "vllm-serve.yaml").read_text()
    assert "Confirmed in 4 paired rounds against the baseline: not distinguishable" in header


def test_the_confirmed_winner_is_exported_with_its_interval(tmp_path: Path) -> None:
    latency = {"metric": "ref_ttft_p95_s", "pairs": 4, "ratio": 0.6, "ci_low": 0.5, "ci_high": 0.7, "text": "x0.60"}
    verdict = {**_verdict("win00002"), "comparisons": [{"trial_id": "win00002", "reference_latency": [latency]}]}
    uri = build_store(tmp_path, "won", standard_trials(), verdict=verdict)
    result = export_search(uri, "won", tmp_path / "out")
    assert result.trial.trial_id == "win00002"
    best = json.loads((tmp_path / "out" / "best.json").read_text())
    assert best["verdict"]["ratio"] == 1.9 and best["verdict"]["ci_low"] == 1.5
    assert best["verdict"]["reference_latency"] == [latency], "the exported trial's latency intervals"
    assert "95% CI 1.50-2.40" in (tmp_path / "out" / "serve-llm.yaml").read_text()
    # Another pick is the user's choice: the verdict is reported, and says it was about another trial.
    other = export_search(uri, "won", tmp_path / "latency", pick="min-latency")
    best = json.loads((tmp_path / "latency" / "best.json").read_text())
    assert other.trial.trial_id != "win00002" and best["verdict"]["applies"] is False
    assert "recommends trial win00002" in best["verdict"]["note"]


def test_an_export_without_a_confirmation_has_no_verdict(store: str, tmp_path: Path) -> None:
    export_search(store, "exp-a", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "best.json").read_text())["verdict"] is None
