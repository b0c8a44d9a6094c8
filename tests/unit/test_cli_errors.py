"""Bad input to `python -m tuner search`: one line naming the file/flag and field, exit 2, nothing in MLflow."""

from __future__ import annotations

import re
import shutil
import sys
import time
import types

import pytest
from click.testing import CliRunner

from tuner.cli import main
from tuner.errors import ConfigError

SPACE_OK = "parameters:\n  max_num_seqs: {type: int, low: 2, high: 8}\n"


@pytest.fixture
def invoke(tmp_path):
    db = tmp_path / "mlflow.db"

    def run(*args: str, space: str | None = None, config: str | None = None):
        extra: list[str] = []
        if space is not None:
            (tmp_path / "space.yaml").write_text(space)
            extra += ["--space", str(tmp_path / "space.yaml")]
        if config is not None:
            (tmp_path / "search.yaml").write_text(config)
            extra += ["--config", str(tmp_path / "search.yaml")]
        result = CliRunner().invoke(main, ["search", *extra, *args, "--tracking-uri", f"sqlite:///{db}"])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1, result.output
        assert not db.exists(), "nothing may be written to MLflow"
        return lines[0]

    return run


@pytest.mark.parametrize(
    "space, expected",
    [
        ("parameters:\n  max_num_seq: {type: int, low: 2, high: 8}\n", "parameters.max_num_seq: unknown parameter"),
        ("parameters:\n  max_num_seqs: {type: int, low: 9, high: 8}\n", "`low <= high` must hold"),
        ("parameters:\n  num_replicas: {type: categorical, choices: []}\n", "num_replicas.choices"),
        (
            "parameters:\n  max_num_seqs: {type: int, low: 64, high: 128}\n  max_num_batched_tokens: "
            "{type: int, low: 8, high: 32}\nconstraints: [max_num_batched_tokens >= max_num_seqs]\n",
            "can never hold",
        ),
        # Optuna cannot replay a baseline outside the space: caught before the search, not in its first trial.
        (
            "parameters:\n  max_num_seqs: {type: categorical, choices: [4, 12]}\n",
            "not among the choices [4, 12]; add it, or give 'baseline:' as a dict",
        ),
        (
            "parameters:\n  max_num_seqs: {type: categorical, choices: [4, 64]}\n  max_num_batched_tokens: "
            "{type: categorical, choices: [32, 128]}\nconstraints: [max_num_batched_tokens >= max_num_seqs]\n"
            "baseline: {max_num_seqs: 64, max_num_batched_tokens: 32}\n",
            "baseline: the given baseline has max_num_batched_tokens=32 and breaks the constraint",
        ),
    ],
)
def test_bad_search_spaces(invoke, space, expected):
    line = invoke(space=space)
    assert "space.yaml" in line and expected in line


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--slo", "ttft:p95<5"], "--slo: SLO term 'ttft:p95<5'"),
        (["--slo", "goodput:p95<5s"], "unknown metric 'goodput'"),
        (["--slo", "ttft:p42<5s"], "unknown percentile 'p42'"),
        (["--model", "/no/such/model"], "model.path: /no/such/model does not exist"),
        (["--config", "/no/such/search.yaml"], "/no/such/search.yaml: config file not found"),
        (["--num-samples", "0"], "--num-samples"),
    ],
)
def test_bad_flags(invoke, args, expected):
    assert expected in invoke(*args)


def test_objective_on_a_metric_that_is_not_reported(invoke):
    line = invoke(config="objectives: [{metric: happiness, mode: max}]\n")
    assert "objectives: 'happiness' is not a reported metric" in line


def test_trace_empty_after_filtering(invoke, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
        '{"arrival_s": 5, "prompt_tokens": 10, "output_tokens": 5}\n'
    )
    config = f"workload: {{path: {trace}, transforms: {{window_start_s: 100}}}}\n"
    assert "empty after filtering" in invoke(config=config)


def test_resources_no_node_can_provide(invoke):
    space = SPACE_OK + "  num_replicas: {type: categorical, choices: [1, 64]}\n"
    line = invoke("--dry-run", space=space)
    assert "num_replicas=64 needs 64 CPU" in line


def test_a_config_written_for_the_old_ladder_says_what_to_write_instead(invoke):
    line = invoke(config="ladder: {factors: [1.0, 2.0], step_duration_s: 12}\n")
    assert "search.yaml: ladder: the fixed load ladder was replaced by a capacity search" in line
    assert "capacity:" in line


def test_a_step_too_long_for_a_sparse_trace_is_an_up_front_error(invoke, tmp_path):
    trace = tmp_path / "sparse.jsonl"  # 1 request a minute: a 110-request step at 0.25x takes hours
    trace.write_text(
        "".join(f'{{"arrival_s": {60 * i}, "prompt_tokens": 10, "output_tokens": 5}}\n' for i in range(20))
    )
    line = invoke(config=f"workload: {{path: {trace}}}\n")
    assert "capacity: a step at the lowest load (0.25x the reference" in line
    assert "over capacity.max_step_s=600; raise workload.reference_rps" in line


def test_the_dry_run_prints_the_capacity_search_and_what_it_costs(tmp_path):
    result = CliRunner().invoke(main, ["search", "--dry-run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "capacity search: climb 1x, 2x, 4x, 8x, 16x, then bisect to 20%" in out
    assert (
        "each step replays the same sample: 4 windows of the trace at random offsets, 100 measured requests "
        "or 10s of them" in out
    )
    assert "estimated engine time: about" in out and "when its capacity is near 4x" in out
    assert "confirmation: the best 1 config(s) and the baseline re-measured in 2 interleaved rounds" in out
    assert re.search(r"about \d+s each; [\d.]+ min set aside: the estimate \+25% so that the planned rounds fit", out)
    assert re.search(r"of the 10 min budget, the search gets [\d.]+ min \(about \d of its 4 trials", out)
    assert not (tmp_path / "m.db").exists()
    off = CliRunner().invoke(
        main, ["search", "--dry-run", "--no-confirm", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    )
    assert off.exit_code == 0 and "confirmation: off (confirm.rounds 0 or --no-confirm)" in off.output


def test_a_model_in_half_precision_on_a_cpu_that_emulates_it_is_warned_about(tmp_path, monkeypatch):
    import tuner.tiny_model
    from tuner.config import load_config
    from tuner.search import prepare, setup_warnings

    monkeypatch.setattr(tuner.tiny_model, "cpu_has_native_bf16", lambda: False)
    assert setup_warnings(prepare(load_config())) == [], "the tiny model runs in float32 on CPU"
    user = tmp_path / "my-model"
    shutil.copytree(tuner.tiny_model.ensure_tiny_model(), user)
    warned = setup_warnings(prepare(load_config(overrides={"model.path": str(user)})))
    assert len(warned) == 1 and "this CPU has no native bfloat16" in warned[0] and "dtype auto" in warned[0]
    assert warned[0].endswith("set model.engine_args.dtype: float32 if that is how it will be served on such CPUs")
    fp32 = load_config(overrides={"model.path": str(user), "model.engine_args": {"dtype": "float32"}})
    assert setup_warnings(prepare(fp32)) == []
    monkeypatch.setattr(tuner.tiny_model, "cpu_has_native_bf16", lambda: True)
    assert setup_warnings(prepare(load_config(overrides={"model.path": str(user)}))) == []


def test_a_space_reaching_below_one_request_of_kv_cache_is_warned_about(tmp_path):
    from tuner.config import load_config
    from tuner.search import prepare, setup_warnings
    from tuner.space import SPACES_DIR

    space = (SPACES_DIR / "cpu-smoke.yaml").read_text()
    assert "gpu_memory_utilization: {type: float, low: 0.3," in space
    cpu = {"hardware.device": "cpu"}
    assert setup_warnings(prepare(load_config(overrides=cpu))) == [], (
        "the demo's space spends no trial on a refused start"
    )
    low = tmp_path / "low.yaml"
    low.write_text(space.replace("low: 0.3,", "low: 0.2,"))
    (warned,) = setup_warnings(prepare(load_config(overrides={**cpu, "space": str(low)})))
    assert warned.startswith("warning: space: gpu_memory_utilization from 0.2 reaches below 0.266, where the KV")
    assert "kv_budget_mib 64" in warned and "max_model_len 2048 (17 MiB at 8 KiB per token)" in warned
    assert warned.endswith("a low of 0.27 or more spends no trial on them")
    roomy = load_config(overrides={**cpu, "space": str(low), "hardware.kv_budget_mib": 96})
    assert setup_warnings(prepare(roomy)) == [], "0.2 x 96 MiB holds one request and vLLM's reserved block"
    short = load_config(overrides={**cpu, "space": str(low), "model.max_model_len": 1024})
    assert setup_warnings(prepare(short)) == []
    searched = tmp_path / "searched.yaml"  # the line moves with a searched max_model_len: no one line to name
    searched.write_text(
        space.replace("low: 0.3,", "low: 0.2,").replace(
            "parameters:\n", "parameters:\n  max_model_len: {type: categorical, choices: [1024, 2048]}\n"
        )
    )
    assert setup_warnings(prepare(load_config(overrides={**cpu, "space": str(searched)}))) == []


def test_the_dry_run_says_how_many_trials_the_budget_leaves_the_search():
    from tuner.config import load_config
    from tuner.search import confirm_cost, confirm_line, prepare, trial_cost

    prepared = prepare(load_config())
    reserve, trial = confirm_cost(prepared).reserve_s, trial_cost(prepared).typical_s
    tight = confirm_line(prepare(load_config(overrides={"budget.time_budget_s": reserve + 1.5 * trial})))
    assert "(about 1 of its 4 trials at the estimate; possibly the baseline alone, with nothing to confirm" in tight
    roomy = confirm_line(prepare(load_config(overrides={"budget.time_budget_s": reserve + 3.5 * trial})))
    assert "(about 3 of its 4 trials at the estimate) and the confirmation the rest" in roomy
    ample = confirm_line(prepare(load_config(overrides={"budget.time_budget_s": reserve + 10 * trial})))
    assert "(about 4 of its 4 trials at the estimate) and the confirmation the rest" in ample


def test_one_confirmation_round_is_refused_it_gives_no_interval(invoke):
    line = invoke(config="confirm: {rounds: 1}\n")
    assert "search.yaml: confirm.rounds: " in line and "1 round gives no interval: use 0 (off) or at least 2" in line


def test_a_time_budget_the_confirmation_would_use_up_is_an_up_front_error(invoke):
    line = invoke("--time-budget-s", "300")
    assert line.startswith("error: budget.time_budget_s: 300s leaves")
    assert "raise it, lower confirm.rounds, or pass --no-confirm" in line


def test_a_model_directory_without_config_json_is_named_before_any_engine_starts(invoke, tmp_path):
    (tmp_path / "not-a-model").mkdir()
    line = invoke("--model", str(tmp_path / "not-a-model"), "--dry-run")
    assert line == f"error: model.path: {tmp_path / 'not-a-model'} is not a model directory (it has no config.json)"


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("bogus://somewhere", "--tracking-uri bogus://somewhere: MLflow cannot track to a 'bogus' URI"),
        (
            "sqlite:////proc/no-such-dir/mlflow.db",
            "--tracking-uri sqlite:////proc/no-such-dir/mlflow.db: cannot create",
        ),
        (
            "http://127.0.0.1:1",
            "--tracking-uri http://127.0.0.1:1: no MLflow tracking server answers there (Connection refused)",
        ),
        (
            "sqlite:///TMP/garbage.db",
            "--tracking-uri sqlite:///TMP/garbage.db: TMP/garbage.db is not an SQLite database "
            "(file is not a database)",
        ),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ["search", "--dry-run"],
        ["export", "--experiment", "x", "--out", "OUT"],
        ["report", "--experiment", "x", "--out", "OUT"],
    ],
)
def test_an_unusable_tracking_uri_is_one_line(tmp_path, uri, expected, command):
    (tmp_path / "garbage.db").write_text("not a database: text long enough to fill SQLite's 100-byte header " * 3)
    uri, expected = uri.replace("TMP", str(tmp_path)), expected.replace("TMP", str(tmp_path))
    args = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    result = CliRunner().invoke(main, [*args, "--tracking-uri", uri])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {expected}"), result.output
    assert "Traceback" not in result.output


def _postgres_driver() -> str:
    """The module SQLAlchemy imports for a plain postgresql:// URI (psycopg2 before 2.1, psycopg since)."""
    from sqlalchemy.engine.url import make_url

    return make_url("postgresql://h/db").get_dialect().driver


def _tracking_error(uri: str) -> list[str]:
    result = CliRunner().invoke(main, ["search", "--dry-run", "--tracking-uri", uri])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return [line for line in result.output.splitlines() if line.startswith("error: ")]


def test_a_database_tracking_uri_without_its_driver_is_one_line(monkeypatch):
    driver = _postgres_driver()
    monkeypatch.setitem(sys.modules, driver, None)  # importing it fails, installed or not
    [line] = _tracking_error("postgresql://user:secret@127.0.0.1:1/mlflow")
    assert line.startswith(
        f"error: --tracking-uri postgresql://127.0.0.1:1/mlflow: its database driver {driver!r} cannot be imported ("
    ), line


def test_a_database_tracking_uri_with_no_server_is_one_line_and_shows_no_password(monkeypatch):
    # The driver is there (a stand-in module: SQLAlchemy only imports it), the server is not. The password
    # holds a /, which URIs should escape and SQLAlchemy reads anyway; one more in the query.
    monkeypatch.setitem(sys.modules, _postgres_driver(), types.ModuleType(_postgres_driver()))
    assert _tracking_error("postgresql://u:p/w@127.0.0.1:1/db?password=also-secret") == [
        "error: --tracking-uri postgresql://127.0.0.1:1/db?password=***: no database server accepts a connection at "
        "127.0.0.1:1 (Connection refused)"
    ]


@pytest.mark.parametrize(
    "uri",
    ["postgresql://u:pw@/db?host=/var/run/postgresql", "mysql+pymysql://u:pw@localhost/db", "mssql://u:pw@MY_DSN"],
)
def test_a_database_reached_by_socket_or_odbc_name_is_not_probed_over_tcp(monkeypatch, uri):
    from sqlalchemy.engine.url import make_url

    driver = make_url(uri).get_dialect().driver
    monkeypatch.setitem(sys.modules, driver, types.ModuleType(driver))
    from tuner.tracking import check_tracking_uri

    check_tracking_uri(uri)  # no error: nothing listens on this machine, and nothing was asked


@pytest.mark.parametrize("command", ["export", "report"])
def test_an_out_folder_that_cannot_be_created_is_one_line(tmp_path, command):
    (tmp_path / "a-file").write_text("")
    out = str(tmp_path / "a-file" / "deploy")
    result = CliRunner().invoke(
        main, [command, "--experiment", "x", "--out", out, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: --out {out}: cannot create the folder: Not a directory", result.output


def test_an_address_where_no_ray_cluster_listens_is_one_line(invoke):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    line = invoke("--address", f"127.0.0.1:{port}", "--dry-run")
    assert line == f"error: --address 127.0.0.1:{port}: no Ray cluster answers there (Connection refused)"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["search", "--config", "DIR"], "error: Invalid value for '--config': File 'DIR' is a directory."),
        (
            ["record", "--upstream", "http://x", "--out", "DIR"],
            "error: Invalid value for '--out': File 'DIR' is a directory.",
        ),
        (["report", "--experiment"], "error: Option '--experiment' requires an argument."),
        (["export", "--no-such-flag"], "error: No such option '--no-such-flag'."),
        (["no-such-command"], "error: No such command 'no-such-command'."),
        (["--no-such-flag", "search"], "error: No such option '--no-such-flag'."),
    ],
)
def test_a_bad_command_line_is_one_line_not_clicks_usage_text(tmp_path, args, expected):
    args = [str(tmp_path) if a == "DIR" else a for a in args]
    result = CliRunner().invoke(main, args)
    assert (result.exit_code, result.output) == (2, expected.replace("DIR", str(tmp_path)) + "\n")


def test_debug_and_help_still_show_clicks_text():
    debug = CliRunner().invoke(main, ["--debug", "export", "--no-such-flag"])
    assert debug.exit_code == 2 and "Usage:" in debug.output and "No such option '--no-such-flag'." in debug.output
    bare = CliRunner().invoke(main, ["workload"])
    assert "Usage:" in bare.output and "inspect" in bare.output and "error:" not in bare.output


def test_a_relative_model_path_that_is_neither_here_nor_on_the_hub_is_one_line_at_once(invoke, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no models/ folder here, and none beside the config
    began = time.monotonic()
    line = invoke("--model", "models/no-such-model-of-vllm-tuner", "--dry-run")
    assert line.startswith(
        "error: model.path: models/no-such-model-of-vllm-tuner: no such local directory (a relative path is "
        "taken from the config's folder or the working directory), and not a Hugging Face id that can be reached ("
    )
    # Offline: "https://huggingface.co did not answer: ConnectError: ..."; online: "... has no model of that id".
    assert "did not answer: " in line or "has no model of that id" in line
    assert time.monotonic() - began < 30, "not vLLM's minute of retries"


def test_a_hub_id_in_the_local_cache_is_a_model_even_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from tuner.search import _check_model_path

    snapshot = tmp_path / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    assert _check_model_path("org/cached") == "org/cached"
    with pytest.raises(ConfigError, match=r"model.path: org/other: no such local directory .*\(HF_HUB_OFFLINE is set"):
        _check_model_path("org/other")
