"""Importers for the JSON-lines traces that share keys: Mooncake and vLLM benchmark's `timed_trace`.

Both carry `{"timestamp", "input_length", "output_length", "hash_ids"}` per line; other keys are
ignored. They differ in defaults only:

- Mooncake (kvcache-ai/Mooncake FAST'25 traces): `timestamp` in milliseconds; each `hash_ids`
  entry names a 512-token prompt block, so the ids are the prefix ids as they are.
- `timed_trace` (`vllm bench serve --dataset-name timed_trace`): vLLM multiplies `timestamp` by
  `--timed-trace-sec-multiplier` (default 1) to get seconds, so seconds here; each `hash_ids` entry
  names a `--timed-trace-chunk-hash-size`-token chunk (default 16). Runs of chunks are regrouped
  into 512-token prefix ids. A file whose `hash_ids` count matches 512-token blocks (a Mooncake
  trace fed to vLLM with `--timed-trace-chunk-hash-size 512`) is read with 512-token blocks.

`time_unit` ("ms" or "s") overrides either default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from tuner.workload.records import PREFIX_BLOCK_TOKENS
from tuner.workload.rows import Parsed, ReadOptions, Row, TimeOrder
from tuner.workload.source import SourceText, json_count, json_number

TIME_UNITS = {"ms": 1000, "s": 1}
MOONCAKE_BLOCK_TOKENS = 512
TIMED_TRACE_CHUNK_TOKENS = 16
LENGTH_KEYS = ("timestamp", "input_length", "output_length")


def json_objects(source: SourceText) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; raise WorkloadError on anything else."""
    for number, line in source.lines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise source.error(number, f"invalid JSON (truncated line?): {exc.msg}") from None
        if not isinstance(value, dict):
            raise source.error(number, f"expected a JSON object, found {type(value).__name__}")
        yield number, value


def hash_ids_of(source: SourceText, line: int, record: dict[str, Any]) -> tuple[int, ...]:
    """Return `hash_ids` as a tuple (empty if absent); raise WorkloadError unless a list of ints."""
    raw = record.get("hash_ids", [])
    if not isinstance(raw, list) or not all(isinstance(item, int) and not isinstance(item, bool) for item in raw):
        raise source.error(line, "hash_ids is not a list of integers")
    return tuple(raw)


def _read_rows(source: SourceText, unit: str) -> Parsed:
    """Read the shared keys of every line into rows, `hash_ids` as they are."""
    order = TimeOrder(source, "timestamp")
    rows: list[Row] = []
    for number, record in json_objects(source):
        missing = [key for key in LENGTH_KEYS if key not in record]
        if missing:
            raise source.error(number, f"missing key(s) {', '.join(map(repr, missing))}")
        time = json_number(source, number, "timestamp", record["timestamp"])
        order.check(number, time)
        rows.append(
            Row(
                line=number,
                time=time,
                prompt_tokens=json_count(source, number, "input_length", record["input_length"]),
                output_tokens=json_count(source, number, "output_length", record["output_length"]),
                prefix_ids=hash_ids_of(source, number, record),
            )
        )
    return Parsed(rows=rows, rows_read=len(rows), ticks_per_second=TIME_UNITS[unit])


def hash_block_tokens(rows: list[Row], default: int) -> int:
    """Guess how many prompt tokens one hash id covers: 512 or 16, from the first telling row.

    A row tells when it has hash ids and more than 16 prompt tokens, so the two sizes predict
    different id counts (ceil(prompt / size)). Returns `default` when no row tells.
    """
    for row in rows:
        if row.prefix_ids and row.prompt_tokens > TIMED_TRACE_CHUNK_TOKENS:
            count = len(row.prefix_ids)
            if count == math.ceil(row.prompt_tokens / MOONCAKE_BLOCK_TOKENS):
                return MOONCAKE_BLOCK_TOKENS
            if count == math.ceil(row.prompt_tokens / TIMED_TRACE_CHUNK_TOKENS):
                return TIMED_TRACE_CHUNK_TOKENS
            return default
    return default


def regroup_chunks(rows: list[Row], chunk_tokens: int) -> list[Row]:
    """Replace chunk ids (`chunk_tokens` each) by prefix ids of PREFIX_BLOCK_TOKENS each.

    A prefix id names a block *and everything before it*: two requests get the same id for block k
    iff their chunk ids agree up to the end of block k. Ids are numbered from 0 in first use.
    """
    per_block = PREFIX_BLOCK_TOKENS // chunk_tokens
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    regrouped: list[Row] = []
    for row in rows:
        parent = -1
        blocks: list[int] = []
        for start in range(0, len(row.prefix_ids), per_block):
            key = (parent, row.prefix_ids[start : start + per_block])
            parent = ids.setdefault(key, len(ids))
            blocks.append(parent)
        regrouped.append(Row(row.line, row.time, row.prompt_tokens, row.output_tokens, tuple(blocks)))
    return regrouped


def read_mooncake(source: SourceText, options: ReadOptions) -> Parsed:
    """Mooncake JSONL: timestamps in ms unless `time_unit` says otherwise; 512-token blocks."""
    unit = options.time_unit or "ms"
    parsed = _read_rows(source, unit)
    parsed.extra = {"time_unit": unit, "hash_block_tokens": MOONCAKE_BLOCK_TOKENS}
    return parsed


def read_timed_trace(source: SourceText, options: ReadOptions) -> Parsed:
    """vLLM `timed_trace` JSONL: seconds unless `time_unit` says otherwise; 16-token hash chunks."""
    unit = options.time_unit or "s"
    parsed = _read_rows(source, unit)
    chunk_tokens = hash_block_tokens(parsed.rows, TIMED_TRACE_CHUNK_TOKENS)
    if chunk_tokens != PREFIX_BLOCK_TOKENS:
        parsed.rows = regroup_chunks(parsed.rows, chunk_tokens)
    parsed.extra = {"time_unit": unit, "hash_block_tokens": chunk_tokens}
    return parsed
