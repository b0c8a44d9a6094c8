"""Every importer of a real public trace, checked against counts computed here with csv/json."""

from __future__ import annotations

import csv
import hashlib
import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from tuner.workload import load_workload

AZURE = "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = "mooncake_conversation_first3000.jsonl"
BURSTGPT = "BurstGPT_1.first400.csv"


def _azure_seconds(stamp: str) -> Decimal:
    """Seconds since the epoch, exact to the 7th fractional digit."""
    whole, fraction = stamp.split(".")
    epoch = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return Decimal(int(epoch)) + Decimal("0." + fraction)


def test_azure_2023(traces: Path) -> None:
    path = traces / AZURE
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    workload = load_workload(path)  # auto
    assert workload.provenance["format"] == "azure"
    assert len(rows) == len(workload.requests) == 19_366
    first = _azure_seconds(rows[0]["TIMESTAMP"])
    expected = [float(_azure_seconds(r["TIMESTAMP"]) - first) for r in rows]
    assert [r.arrival_s for r in workload.requests] == expected
    assert workload.duration_s == 3501.721937
    assert [r.prompt_tokens for r in workload.requests] == [int(r["ContextTokens"]) for r in rows]
    assert [r.output_tokens for r in workload.requests] == [int(r["GeneratedTokens"]) for r in rows]
    assert workload.provenance["rows_read"] == 19_366
    assert workload.provenance["dropped"] == {}
    assert workload.provenance["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert workload.provenance["source"] == str(path)


def test_mooncake(traces: Path) -> None:
    path = traces / MOONCAKE
    records = [json.loads(line) for line in path.read_text().splitlines()]
    workload = load_workload(path)  # auto
    assert workload.provenance["format"] == "mooncake"
    assert workload.provenance["time_unit"] == "ms"
    assert "milliseconds assumed" in workload.provenance["detected"]
    assert len(records) == len(workload.requests) == 3_000
    assert workload.duration_s == 987.0
    assert [r.arrival_s for r in workload.requests] == [
        (rec["timestamp"] - records[0]["timestamp"]) / 1000 for rec in records
    ]
    assert [r.prefix_ids for r in workload.requests] == [tuple(rec["hash_ids"]) for rec in records]
    assert [r.prompt_tokens for r in workload.requests] == [rec["input_length"] for rec in records]
    assert [r.output_tokens for r in workload.requests] == [rec["output_length"] for rec in records]


def test_mooncake_read_as_seconds_when_told(traces: Path) -> None:
    workload = load_workload(traces / MOONCAKE, time_unit="s")
    # The time unit settles which of the two formats sharing these keys auto picks.
    assert workload.provenance["format"] == "timed_trace"
    assert workload.provenance["time_unit"] == "s"
    assert workload.provenance["hash_block_tokens"] == 512  # recognised from the id counts
    assert workload.duration_s == 987_000.0
    assert workload.requests[0].prefix_ids == tuple(range(14))


def test_burstgpt(traces: Path) -> None:
    path = traces / BURSTGPT
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    ok = [r for r in rows if int(r["Response tokens"]) > 0]
    workload = load_workload(path)  # auto
    assert workload.provenance["format"] == "burstgpt"
    assert len(rows) == workload.provenance["rows_read"] == 400
    assert len(ok) == len(workload.requests) == 383
    assert workload.provenance["dropped"] == {"failed request (0 response tokens)": 17}
    assert workload.duration_s == float(ok[-1]["Timestamp"]) - float(ok[0]["Timestamp"]) == 37_269.0
    assert [r.prompt_tokens for r in workload.requests] == [int(r["Request tokens"]) for r in ok]
    assert [r.output_tokens for r in workload.requests] == [int(r["Response tokens"]) for r in ok]


@pytest.mark.parametrize(("name", "fmt"), [(AZURE, "azure"), (MOONCAKE, "mooncake"), (BURSTGPT, "burstgpt")])
def test_explicit_format_matches_auto(traces: Path, name: str, fmt: str) -> None:
    auto = load_workload(traces / name)
    explicit = load_workload(traces / name, fmt)
    assert explicit.requests == auto.requests
    assert explicit.provenance["detected"] is None
