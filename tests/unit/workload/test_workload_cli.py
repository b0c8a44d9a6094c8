"""The `workload` CLI: inspect, convert, synth, and one-line errors that write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import main
from tuner.workload import load_workload

MOONCAKE = "mooncake_conversation_first3000.jsonl"


def run(*args: str) -> object:
    return CliRunner().invoke(main, ["workload", *(str(a) for a in args)])  # as `python -m tuner` runs it


def test_inspect_json(traces: Path) -> None:
    result = run("inspect", traces / "BurstGPT_1.first400.csv", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["format"] == "burstgpt"
    assert summary["requests"] == 383
    assert summary["duration_s"] == 37_269.0
    assert summary["dropped"] == {"failed request (0 response tokens)": 17}
    assert set(summary["prompt_tokens"]) == {"mean", "p50", "p90", "p99", "max"}


def test_inspect_text(traces: Path) -> None:
    result = run("inspect", traces / MOONCAKE)
    assert result.exit_code == 0, result.output
    assert "requests        3,000" in result.stdout
    assert "milliseconds assumed" in result.stdout
    assert "prefix sharing" in result.stdout


def test_inspect_time_unit_settles_the_format(traces: Path) -> None:
    result = run("inspect", traces / MOONCAKE, "--time-unit", "s", "--json")
    summary = json.loads(result.stdout)
    assert summary["format"] == "timed_trace"
    assert summary["duration_s"] == 987_000.0


def test_convert_round_trip(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    result = run("convert", traces / MOONCAKE, "--out", out)
    assert result.exit_code == 0, result.output
    assert "wrote 3,000 requests" in result.stdout
    original = load_workload(traces / MOONCAKE)
    converted = load_workload(out)
    assert converted.provenance["format"] == "canonical"
    assert converted.requests == original.requests


def test_convert_with_transforms(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    result = run(
        "convert",
        traces / MOONCAKE,
        "--out",
        out,
        "--first",
        "500",
        "--max-model-len",
        "8192",
        "--overflow",
        "drop",
        "--target-rate",
        "2",
    )
    assert result.exit_code == 0, result.output
    converted = load_workload(out)
    assert all(r.prompt_tokens + r.output_tokens <= 8192 for r in converted.requests)
    assert converted.mean_rate_rps == pytest.approx(2.0)
    dropped = 500 - len(converted.requests)
    assert dropped > 0
    assert f"dropped {dropped:,}: longer than max_model_len 8192" in result.stdout


def test_convert_clip_reports_count(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    result = run("convert", traces / MOONCAKE, "--out", out, "--max-model-len", "4096")
    assert result.exit_code == 0, result.output
    original = load_workload(traces / MOONCAKE)
    over = sum(r.prompt_tokens + r.output_tokens > 4096 for r in original.requests)
    assert f"clipped {over:,} to max_model_len 4096" in result.stdout
    assert len(load_workload(out).requests) == 3_000


def test_convert_sharegpt_never_writes_text_unless_asked(
    fixtures: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tuner.workload.cli.load_hf_tokenizer", lambda name: lambda text: text.split())
    out = tmp_path / "s.jsonl"
    result = run("convert", fixtures / "sharegpt.json", "--tokenizer", "ws", "--out", out)
    assert result.exit_code == 0, result.output
    assert "colours" not in out.read_text()
    assert "colours" not in result.output
    result = run(
        "convert",
        fixtures / "sharegpt.json",
        "--tokenizer",
        "ws",
        "--out",
        out,
        "--include-prompt-text",
    )
    assert "colours" in out.read_text()
    assert "colours" not in result.output


def test_synth_reproducible(traces: Path, tmp_path: Path) -> None:
    args = ["synth", "--from", traces / "BurstGPT_1.first400.csv", "--rate", "5", "--count", "200"]
    first, second, other = tmp_path / "1.jsonl", tmp_path / "2.jsonl", tmp_path / "3.jsonl"
    assert run(*args, "--seed", "4", "--out", first).exit_code == 0
    assert run(*args, "--seed", "4", "--out", second).exit_code == 0
    assert run(*args, "--seed", "5", "--out", other).exit_code == 0
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()
    assert len(load_workload(first).requests) == 200


def test_synth_gamma_duration(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.jsonl"
    result = run(
        "synth",
        "--from",
        traces / "BurstGPT_1.first400.csv",
        "--rate",
        "10",
        "--duration",
        "60",
        "--arrivals",
        "gamma",
        "--cv",
        "2",
        "--seed",
        "1",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    assert all(r.arrival_s < 60 for r in load_workload(out).requests)


def _assert_one_line_error(result: object, *fragments: str) -> None:
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    lines = result.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1, result.stderr  # type: ignore[attr-defined]
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_bad_input_exits_non_zero_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,abc,4\n")
    out = tmp_path / "out.jsonl"
    for args in (
        ["inspect", bad],
        ["convert", bad, "--out", out],
        ["synth", "--from", bad, "--rate", "1", "--count", "3", "--out", out],
    ):
        _assert_one_line_error(run(*args), f"{bad}:2: ContextTokens is not an integer: 'abc'")
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.csv"]


def test_bad_input_keeps_an_existing_output(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    _assert_one_line_error(run("convert", empty, "--out", out), f"{empty}:1: file is empty")
    _assert_one_line_error(
        run("convert", traces / MOONCAKE, "--out", out, "--time-scale", "-1"),
        "workload.transforms.time_scale",
    )
    _assert_one_line_error(
        run("convert", traces / MOONCAKE, "--out", out, "--window-start", "5000"),
        "is empty after filtering",
    )
    assert out.read_text() == "previous\n"


def test_time_unit_on_csv_is_an_error(traces: Path) -> None:
    _assert_one_line_error(
        run("inspect", traces / "BurstGPT_1.first400.csv", "--time-unit", "ms"),
        "--time-unit applies to mooncake and timed_trace only",
    )


def test_unknown_format_is_a_usage_error(traces: Path) -> None:
    result = run("inspect", traces / MOONCAKE, "--format", "parquet")
    assert result.exit_code == 2
    assert "canonical" in result.stderr


def test_synth_needs_count_or_duration(traces: Path, tmp_path: Path) -> None:
    result = run("synth", "--from", traces / MOONCAKE, "--rate", "1", "--out", tmp_path / "o")
    assert result.exit_code == 2
    assert "exactly one of --duration or --count" in result.stderr
    assert not (tmp_path / "o").exists()


def test_debug_shows_the_traceback_for_workload_commands_too(tmp_path):
    from tuner.errors import WorkloadError

    missing = tmp_path / "missing.jsonl"
    plain = run("inspect", missing)
    assert plain.exit_code == 2 and plain.output.strip().startswith("error: ") and "Traceback" not in plain.output
    debug = CliRunner().invoke(main, ["--debug", "workload", "inspect", str(missing)])
    assert isinstance(debug.exception, WorkloadError), "with --debug the error is raised, not turned into one line"


def test_a_directory_where_a_file_belongs_is_one_line(traces: Path, tmp_path: Path) -> None:
    for args, flag in (
        (["inspect", tmp_path], "'FILE'"),
        (["convert", tmp_path, "--out", tmp_path / "o.jsonl"], "'FILE'"),
        (["convert", traces / MOONCAKE, "--out", tmp_path], "'--out'"),
        (["synth", "--from", tmp_path, "--rate", "1", "--count", "3", "--out", tmp_path / "o.jsonl"], "'--from'"),
    ):
        result = run(*args)
        assert result.output == f"error: Invalid value for {flag}: File '{tmp_path}' is a directory.\n", args  # type: ignore[attr-defined]
        assert result.exit_code == 2  # type: ignore[attr-defined]
    assert list(tmp_path.iterdir()) == []
