"""Unit tests of `tuner validate` without a server: rates, the planning capacity, the comparison file,
the verdict and ratios, the MLflow record, and bad input as one line with exit code 2 before anything starts.
The real servers and bench serve are exercised by tests/integration/test_validate_stacks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_export import _verdict, build_store, standard_trials

from tuner.errors import ConfigError
from tuner.plan import confirmed_lower_bound
from tuner.recorded import SearchRecord, TrialRow, load_search
from tuner.validate import Measured, Rate, Served, ValidationOutcome, parse_rates, user_config


def test_rates_are_auto_or_positive_numbers_per_server():
    assert parse_rates("auto") is None
    assert parse_rates("1, 2.5") == [Rate("r1", 1.0), Rate("r2", 2.5)]
    for bad, says in (("abc", "'abc' is not a number"), ("0", "> 0"), ("1,-2", "> 0"), ("nan", "> 0"), ("", "''")):
        with pytest.raises(ConfigError, match="--rates") as error:
            parse_rates(bad)
        assert says in str(error.value)


def test_a_comparison_file_is_a_vllm_serve_config_named_in_every_error(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"--against .*missing.yaml: no such file"):
        user_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"--against .*bad.yaml: not valid YAML"):
        user_config(tmp_path / "bad.yaml")
    (tmp_path / "nomodel.yaml").write_text("port: 8000\n")
    with pytest.raises(ConfigError, match="needs a `model` key"):
        user_config(tmp_path / "nomodel.yaml")
    (tmp_path / "mine.yaml").write_text("model: /models/x\nserved-model-name: prod\nmax-num-seqs: 8\n")
    assert user_config(tmp_path / "mine.yaml") == ("prod", "/models/x")


def test_a_comparison_file_on_ray_serve_is_its_engine_arguments_without_the_servers_own(tmp_path: Path):
    from tuner.validate import user_engine_args

    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "model: /models/x\nserved-model-name: prod\nhost: 0.0.0.0\nport: 9000\napi-key: s3cret\n"
        "max-num-seqs: 8\nenable-prefix-caching: true\nkv-cache-memory-bytes: 1000000\n"
    )
    args, left_out = user_engine_args(mine)
    assert args == {"max_num_seqs": 8, "enable_prefix_caching": True, "kv_cache_memory_bytes": 1000000}
    assert left_out == ["host", "port", "api-key"]


def test_the_scale_up_check_counts_running_engine_replicas_from_serves_states(tmp_path: Path):
    from tuner.serve_stack import replica_timeline
    from tuner.validate import _replicas, _running

    log = tmp_path / "replicas.jsonl"
    log.write_text(
        '{"t": 1.0, "deployments": {"OpenAiIngress": {"RUNNING": 1}, "LLMServer:tiny": {"RUNNING": 1}}}\n'
        '{"t": 3.0, "deployments": {"OpenAiIngress": {"RUNNING": 1}, '
        '"LLMServer:tiny": {"RUNNING": 1, "STARTING": 1}}}\n'
        '{"t": 5.0, "deployments": {"OpenAiIngress": {"RUNNING": 1}, "LLMServer:tiny": {"RUNNING": 2}}}\n'
        '{"t": 7.0, "deploy'  # cut short when the child was stopped
    )
    timeline = replica_timeline(log)
    assert [t for t, _ in timeline] == [1.0, 3.0, 5.0]
    assert [_running(d) for _, d in timeline] == [1, 1, 2], "the ingress is not an engine replica"
    assert [_replicas(d) for _, d in timeline] == [1, 2, 2], "a starting replica is one Serve added"
    assert replica_timeline(tmp_path / "missing.jsonl") == []


def test_the_scale_up_check_needs_ray_serve_and_a_burst_long_enough(tmp_path: Path):
    from tuner.cli import main

    uri = build_store(tmp_path, "scale", standard_trials())
    argv = ["validate", "--experiment", "scale", "--tracking-uri", uri, "--out", str(tmp_path / "out")]
    for extra, says in (
        (["--scale-up-s", "120"], "--scale-up-s: the scale-up check runs on Ray Serve"),
        (["--stack", "ray-serve", "--scale-up-s", "30"], "--scale-up-s must be 0 (off) or at least 60 s"),
    ):
        result = CliRunner().invoke(main, [*argv, *extra])
        assert result.exit_code == 2, result.output
        assert [line for line in result.output.splitlines() if line.startswith("error: ")] == [
            next(line for line in result.output.splitlines() if says in line)
        ]


def _record(verdict: dict | None) -> SearchRecord:
    return SearchRecord("e", "p", "u", "ttft:p95<1s", (), verdict=verdict or {})


def test_the_scale_up_burst_keeps_twice_the_target_in_flight_by_littles_law():
    from tuner.validate import burst_rate

    # CI's run: 1.5/s per replica, target 1.7, and requests that finish in ~0.45 s on a fast machine: twice the
    # rate keeps ~1.35 in flight, under the target, and Serve (rightly) added nothing. The burst is sized instead.
    rps, basis = burst_rate(Rate("r1", 1.5), 1.7, 0.45)
    assert rps == pytest.approx(7.56) and basis.startswith("Little's law: twice the target's 1.7 in flight"), basis
    assert "twice that rate, 3/s, would keep only 1.4" in basis
    # Slow requests: twice the rate already keeps more than twice the target in flight.
    assert burst_rate(Rate("planned", 4.0), 1.7, 1.2) == (
        8.0,
        "twice the planned rate per replica: at least 9.6 in flight by Little's law, against the target's 1.7",
    )
    # No target in the export (Serve's default) or no latency measured: twice the rate.
    assert burst_rate(Rate("r1", 1.5), None, 0.45) == (3.0, "twice the r1 rate per replica")
    assert burst_rate(Rate("r1", 1.5), 1.7, None) == (3.0, "twice the r1 rate per replica")


def test_the_planning_capacity_is_the_lowest_confirmation_measurement():
    trial = TrialRow("w", "r", "completed", metrics={"capacity_rps_per_accel": 9.0})
    rounds = [{"capacity_rps_per_accel": c} for c in (7.5, 6.0, 8.0)]
    assert confirmed_lower_bound(_record({"measurements": {"w": rounds}}), trial) == (
        6.0,
        "the lowest of its 3 confirmation measurements",
    )
    # A round that passed no load: nothing to plan with (the caller asks for --rates).
    failed = [*rounds, {"capacity_rps_per_accel": 0.0}]
    assert confirmed_lower_bound(_record({"measurements": {"w": failed}}), trial)[0] == 0.0
    # No confirmation: the trial's own capacity search, said so.
    value, source = confirmed_lower_bound(_record(None), trial)
    assert value == 9.0 and "no confirmation" in source


def _measured(role: str, rate: Rate, passed: bool, goodput: float, ttft: float) -> Measured:
    return Measured("vllm", role, rate, passed, {"goodput_rps": goodput, "ttft_p95_s": ttft}, 20.0)


def test_the_verdict_is_the_exported_config_at_the_planned_rate_and_ratios_pair_like_with_like(tmp_path: Path):
    planned, capacity = Rate("planned", 4.0), Rate("capacity", 5.0)
    served = [
        Served("exported", "trial w", tmp_path / "a.yaml", "e", "/m"),
        Served("comparison", "defaults", tmp_path / "b.yaml", "e", "/m"),
    ]
    outcome = ValidationOutcome("e", "w", "ttft:p95<1s", [planned, capacity], served)
    outcome.measured += [
        _measured("exported", planned, True, 4.0, 0.5),
        _measured("exported", capacity, False, 3.0, 1.5),  # failing at capacity does not fail the validation
        _measured("comparison", planned, False, 2.0, 2.0),
        _measured("comparison", capacity, False, 0.0, 3.0),
    ]
    assert (
        outcome.held
        and "held the SLO 'ttft:p95<1s' at the planned 4 requests/s per replica (held on vllm)" in outcome.text()
    )
    ratios = {r["rate"]: r for r in outcome.ratios()}
    assert ratios["planned"]["goodput_ratio"] == 2.0 and ratios["planned"]["ttft_p95_ratio"] == 0.25
    assert ratios["capacity"]["goodput_ratio"] is None, "a comparison with zero goodput is no ratio, never a division"
    document = json.loads(json.dumps(outcome.document()))
    assert document["held"] is True and len(document["measurements"]) == 4
    assert {m["config"] for m in document["measurements"]} == {"exported", "comparison"}
    outcome.measured[0] = _measured("exported", planned, False, 1.0, 1.2)
    assert not outcome.held and "missed" in outcome.text()
    assert not ValidationOutcome("e", "w", "s", [planned], served).held, "nothing measured is not a pass"


def test_a_validation_is_recorded_as_a_nested_run_of_the_search(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    from tuner.tracking import client_for, record_validation

    uri = build_store(tmp_path, "checked", standard_trials(), verdict=_verdict("win00002"))
    client = client_for(uri)
    parent = load_search(client, "checked").parent_run_id
    served = [Served("exported", "trial win00002", tmp_path / "vllm-serve.yaml", "checked", "/m")]
    served[0].config_path.write_text("model: /m\n")
    planned = Rate("planned", 3.2)
    outcome = ValidationOutcome("checked", "win00002", "ttft:p95<2s", [planned], served)
    outcome.measured.append(_measured("exported", planned, True, 3.1, 0.4))
    document = outcome.document()
    (tmp_path / "validation.json").write_text(json.dumps(document))
    run_id = record_validation(
        client, "checked", parent, document, [tmp_path / "validation.json", served[0].config_path]
    )
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.data.tags["run_kind"] == "validate" and run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["validated_trial"] == "win00002" and run.info.status == "FINISHED"
    assert run.data.metrics["vllm.exported.planned.goodput_rps"] == pytest.approx(3.1)
    assert run.data.metrics["held"] == 1.0
    assert {a.path for a in client.list_artifacts(run_id)} >= {"validation.json", "vllm-serve.yaml"}
    # Readers of the search never take it for a trial; the report shows it.
    record = load_search(client, "checked")
    assert {t.trial_id for t in record.trials} == {t["trial_id"] for t in standard_trials()}
    assert record.validation["text"] == document["text"]
    from tuner.report import build_report

    page, markdown = build_report([record])
    assert "Validation through the serving stack" in page and "| vllm | exported | planned | 3.2 | pass |" in markdown


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rates", "fast"], "--rates: 'fast' is not a number"),
        (["--rates", "0"], "--rates: every rate must be > 0"),
        (["--headroom", "1.5"], "--headroom must be in [0, 1)"),
        (["--against", "nowhere.yaml"], "nowhere.yaml: no such file"),
        (["--workload", "missing.jsonl"], "--workload missing.jsonl: no such file"),
        (["--experiment", "nobody"], "nobody"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_starts(tmp_path: Path, args: list[str], says: str):
    from tuner.cli import main

    uri = build_store(tmp_path, "checked", standard_trials())
    base = {"--experiment": "checked", "--tracking-uri": uri, "--out": str(tmp_path / "out")}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["validate", *(x for pair in base.items() for x in pair)]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.output
    assert "Traceback" not in result.output


def test_serve_is_believed_unable_to_place_a_replica_only_when_it_says_so_three_times():
    from tuner.serve_stack import _stuck

    def said(deployment: str) -> str:
        return (
            f"WARNING controller -- Deployment '{deployment}' in application 'app' has 1 replicas that have taken "
            "more than 30s to be scheduled. Resources required for each replica: {'CPU': 2.0}\n"
        )

    # A slow start: both deployments waited past 30 s once or twice, then started.
    assert _stuck("INFO start\n" + said("LLMServer:app") + said("OpenAiIngress") + said("LLMServer:app")) is None
    stuck = _stuck(said("LLMServer:app") + said("OpenAiIngress") + said("LLMServer:app") + said("LLMServer:app"))
    assert stuck is not None and stuck.group(1) == "LLMServer:app" and "to be scheduled" in stuck.group(0)


def test_against_none_serves_and_measures_the_export_alone_on_each_stack(tmp_path: Path, monkeypatch):
    """`--against none`: no comparison config is written, started or measured; the SLO alone judges."""
    import contextlib

    from tuner import validate as module
    from tuner.tiny_model import ensure_tiny_model

    started: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def fake_started(server: Served, work: Path, port: int):
        started.append((server.stack, server.role))
        yield f"http://127.0.0.1:{port}"

    def fake_measure(peer, context, slo, url, server, rate, *, step, work):
        return Measured(server.stack, server.role, rate, True, {"goodput_rps": rate.rps}, 1.0)

    monkeypatch.setattr(module, "_started", fake_started)
    monkeypatch.setattr(module, "_measure", fake_measure)
    uri = build_store(tmp_path, "alone", standard_trials(), slo="ttft:p95<60s", model=str(ensure_tiny_model()))
    out = tmp_path / "out"
    outcome = module.validate(
        tracking_uri=uri, experiment="alone", out_dir=out, against="none", rates="1", progress=lambda _: None
    )
    assert started == [("vllm", "exported"), ("ray-serve", "exported")]
    assert [m.role for m in outcome.measured] == ["exported", "exported"] and outcome.held
    assert outcome.ratios() == [] and not list(out.glob("comparison-*"))
    assert any("no comparison (--against none)" in note for note in outcome.notes)
