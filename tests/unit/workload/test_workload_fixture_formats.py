"""Importers of formats with no real sample here, on small fixtures written from their docs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.workload import FORMATS, load_workload
from tuner.workload.canonical import write_canonical

Tokenizer = Callable[[str], list[int]]


def test_registry_names() -> None:
    assert list(FORMATS) == [
        "canonical",
        "azure",
        "mooncake",
        "burstgpt",
        "timed_trace",
        "sharegpt",
    ]


def test_timed_trace(fixtures: Path) -> None:
    workload = load_workload(fixtures / "timed_trace.jsonl")  # auto
    assert workload.provenance["format"] == "timed_trace"
    assert workload.provenance["time_unit"] == "s"
    assert "seconds assumed" in workload.provenance["detected"]
    assert workload.provenance["hash_block_tokens"] == 16
    assert [r.arrival_s for r in workload.requests] == [0.0, 0.75, 1.5, 3.25]
    assert [r.prompt_tokens for r in workload.requests] == [600, 520, 200, 16]
    assert [r.output_tokens for r in workload.requests] == [20, 10, 5, 4]
    # 32 chunks of 16 tokens make one 512-token prefix block: the first two requests share
    # their first 32 chunks, hence block 0; the third shares only 10 chunks, hence nothing.
    assert [r.prefix_ids for r in workload.requests] == [(0, 1), (0, 2), (3,), (4,)]


def test_timed_trace_detected_by_chunk_count(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3]}\n'
        '{"timestamp": 2, "input_length": 20, "output_length": 3, "hash_ids": [1, 9]}\n'
    )
    workload = load_workload(path)
    assert workload.provenance["format"] == "timed_trace"
    assert "16-token chunks" in workload.provenance["detected"]
    assert workload.duration_s == 2.0


def test_timed_trace_in_milliseconds_when_told(fixtures: Path) -> None:
    workload = load_workload(fixtures / "timed_trace.jsonl", "timed_trace", time_unit="ms")
    assert workload.provenance["time_unit"] == "ms"
    assert [r.arrival_s for r in workload.requests] == [0.0, 0.00075, 0.0015, 0.00325]


def test_auto_with_time_unit_ms_picks_mooncake(fixtures: Path) -> None:
    workload = load_workload(fixtures / "timed_trace.jsonl", time_unit="ms")
    assert workload.provenance["format"] == "mooncake"
    assert "--time-unit ms given" in workload.provenance["detected"]


def test_sharegpt(fixtures: Path, tokenizer: Tokenizer) -> None:
    workload = load_workload(fixtures / "sharegpt.json", tokenizer=tokenizer, seed=3)
    assert workload.provenance["format"] == "sharegpt"
    assert workload.provenance["rows_read"] == 5
    assert workload.provenance["dropped"] == {
        "no reply after the first human turn": 2,
        "zero output tokens": 1,
    }
    assert [(r.prompt_tokens, r.output_tokens) for r in workload.requests] == [(5, 2), (3, 3)]
    assert [r.session_id for r in workload.requests] == ["c1", "c2"]
    assert workload.requests[1].prompt_text == "name three colours"
    gap = np.random.default_rng(3).exponential(1.0, size=1)[0]
    assert [r.arrival_s for r in workload.requests] == [0.0, gap]
    assert workload.provenance["arrivals"] == {"process": "poisson", "rate_rps": 1.0, "seed": 3}


def test_sharegpt_rate_and_seed(fixtures: Path, tokenizer: Tokenizer) -> None:
    def arrivals(**kwargs: float) -> list[float]:
        loaded = load_workload(fixtures / "sharegpt.json", "sharegpt", tokenizer=tokenizer, **kwargs)
        return [r.arrival_s for r in loaded.requests]

    assert arrivals(seed=1) == arrivals(seed=1)
    assert arrivals(seed=1) != arrivals(seed=2)
    assert arrivals(seed=1, sharegpt_rate_rps=10.0)[1] == pytest.approx(arrivals(seed=1)[1] / 10)


def test_sharegpt_prompt_text_never_in_repr(fixtures: Path, tokenizer: Tokenizer) -> None:
    workload = load_workload(fixtures / "sharegpt.json", tokenizer=tokenizer)
    assert "colours" not in repr(workload.requests)


def test_sharegpt_as_json_lines(tmp_path: Path, tokenizer: Tokenizer) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"conversations": [{"from": "user", "value": "a b"}, {"from": "assistant", "value": "c"}]}\n')
    workload = load_workload(path, tokenizer=tokenizer)
    assert workload.provenance["format"] == "sharegpt"
    assert [(r.prompt_tokens, r.output_tokens) for r in workload.requests] == [(2, 1)]


def test_azure_2024(fixtures: Path) -> None:
    # Same columns as 2023; CRLF line endings, no final newline, crossing midnight.
    workload = load_workload(fixtures / "azure2024.csv")
    assert workload.provenance["format"] == "azure"
    assert [r.arrival_s for r in workload.requests] == [0.0, 0.002, 0.002, 1.5010001]
    assert [r.prompt_tokens for r in workload.requests] == [4808, 3180, 110, 7433]
    assert [r.output_tokens for r in workload.requests] == [10, 8, 27, 14]


@pytest.mark.parametrize(
    ("first", "second", "gap"),
    [
        ("2024-05-10 00:00:00.0096680+00:00", "2024-05-10 00:00:01.0096680+00:00", 1.0),
        ("2024-05-10 02:00:00+02:00", "2024-05-10 00:00:00.5Z", 0.5),
        ("2024-05-10T00:00:00", "2024-05-10T00:01:00.123456789", 60.123456789),
    ],
)
def test_azure_timestamp_variants(tmp_path: Path, first: str, second: str, gap: float) -> None:
    path = tmp_path / "a.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{first},1,1\n{second},1,1\n")
    assert load_workload(path, "azure").duration_s == gap


def test_burstgpt_with_session_columns(fixtures: Path) -> None:
    workload = load_workload(fixtures / "burstgpt_sessions.csv")
    assert workload.provenance["format"] == "burstgpt"
    assert workload.provenance["rows_read"] == 4
    assert workload.provenance["dropped"] == {"failed request (0 response tokens)": 1}
    assert [r.arrival_s for r in workload.requests] == [0.0, 3.0, 28.0]
    assert [r.prompt_tokens for r in workload.requests] == [472, 1087, 1360]
    assert [r.output_tokens for r in workload.requests] == [18, 230, 647]
    assert [r.session_id for r in workload.requests] == ["1001", "1001", "1003"]


def test_canonical(fixtures: Path, tokenizer: Tokenizer) -> None:
    workload = load_workload(fixtures / "canonical.jsonl", tokenizer=tokenizer)
    assert workload.provenance["format"] == "canonical"
    assert [r.arrival_s for r in workload.requests] == [0.0, 0.42, 0.42, 1.5]
    assert [r.prompt_tokens for r in workload.requests] == [1020, 1100, 700, 5]
    assert workload.requests[1].prefix_ids == (0, 1, 2)
    assert workload.requests[1].session_id == "u17"
    assert workload.requests[3].prompt_text == "summarise the following five words"


def test_canonical_round_trip(fixtures: Path, tokenizer: Tokenizer, tmp_path: Path) -> None:
    original = load_workload(fixtures / "canonical.jsonl", tokenizer=tokenizer)
    out = tmp_path / "out.jsonl"
    write_canonical(original, out)
    assert "summarise" not in out.read_text()  # text only when asked
    again = load_workload(out)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_ids, r.session_id) for r in again.requests] == [
        (r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_ids, r.session_id) for r in original.requests
    ]
    write_canonical(original, out, include_prompt_text=True)
    assert json.loads(out.read_text().splitlines()[3])["prompt"] == "summarise the following five words"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temp file left behind


def test_bom_and_crlf_are_accepted(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_bytes(
        b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        b"2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:50.9951690,396,109\r\n"
    )
    assert load_workload(azure).duration_s == pytest.approx(4.314579)
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_bytes(
        b"\xef\xbb\xbf"
        b'{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}\r\n'
        b'{"timestamp": 1500, "input_length": 10, "output_length": 2, "hash_ids": [0]}\r\n'
    )
    assert load_workload(mooncake).duration_s == 1.5
    canonical = tmp_path / "c.jsonl"
    canonical.write_bytes(b'\xef\xbb\xbf{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1}\r\n')
    assert len(load_workload(canonical).requests) == 1


def test_arrivals_rebased_to_first_kept_request(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "100,ChatGPT,5,0,5,Conversation log\n"
        "104,ChatGPT,5,7,12,Conversation log\n"
        "110,ChatGPT,5,7,12,Conversation log\n"
    )
    assert [r.arrival_s for r in load_workload(path).requests] == [0.0, 6.0]


def test_zero_length_rows_are_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0,0,4\n2023-11-16 18:15:47.0,5,0\n2023-11-16 18:15:48.0,5,5\n"
    )
    workload = load_workload(path)
    assert len(workload.requests) == 1
    assert workload.provenance["dropped"] == {"zero output tokens": 1, "zero prompt tokens": 1}


def test_time_unit_rejected_for_formats_without_one(traces: Path) -> None:
    with pytest.raises(ConfigError, match="--time-unit applies to mooncake and timed_trace only"):
        load_workload(traces / "BurstGPT_1.first400.csv", time_unit="ms")
    with pytest.raises(ConfigError, match="time_unit must be one of ms, s"):
        load_workload(traces / "BurstGPT_1.first400.csv", time_unit="h")


@pytest.mark.parametrize(
    "name",
    [
        "timed_trace.jsonl",
        "sharegpt.json",
        "azure2024.csv",
        "burstgpt_sessions.csv",
        "canonical.jsonl",
    ],
)
def test_provenance_is_json(fixtures: Path, tokenizer: Tokenizer, name: str) -> None:
    provenance = load_workload(fixtures / name, tokenizer=tokenizer).provenance
    assert json.loads(json.dumps(provenance)) == provenance
    assert provenance["transforms"] == []
    assert {"source", "format", "detected", "time_unit", "sha256", "rows_read", "dropped"} <= set(provenance)
