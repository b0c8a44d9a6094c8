"""The registry of trace formats chosen by name, format auto-detection, and `load_workload`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError, WorkloadError
from tuner.workload.canonical import read_canonical
from tuner.workload.csv_formats import (
    AZURE_COLUMNS,
    BURSTGPT_COLUMNS,
    csv_header,
    read_azure,
    read_burstgpt,
)
from tuner.workload.jsonl_formats import (
    LENGTH_KEYS,
    MOONCAKE_BLOCK_TOKENS,
    TIME_UNITS,
    TIMED_TRACE_CHUNK_TOKENS,
    read_mooncake,
    read_timed_trace,
)
from tuner.workload.records import Workload
from tuner.workload.rows import Parsed, ReadOptions, Tokenizer, build_workload
from tuner.workload.sharegpt import read_sharegpt
from tuner.workload.source import SourceText, read_source


@dataclass(frozen=True)
class TraceFormat:
    """A trace format users name with `--format`: what it is and the function that reads it."""

    name: str
    description: str
    read: Callable[[SourceText, ReadOptions], Parsed]
    takes_time_unit: bool = False


FORMATS: dict[str, TraceFormat] = {
    fmt.name: fmt
    for fmt in (
        TraceFormat("canonical", "canonical JSON lines (arrival_s, prompt_tokens, ...)", read_canonical),
        TraceFormat("azure", "Azure LLM inference 2023/2024 CSV", read_azure),
        TraceFormat("mooncake", "Mooncake JSONL (ms timestamps, 512-token hash_ids)", read_mooncake, True),
        TraceFormat("burstgpt", "BurstGPT CSV (any release layout)", read_burstgpt),
        TraceFormat("timed_trace", "vLLM benchmark timed_trace JSONL (s timestamps)", read_timed_trace, True),
        TraceFormat("sharegpt", "ShareGPT conversation JSON (needs a tokenizer)", read_sharegpt),
    )
}


def known_formats() -> str:
    """The names accepted by `--format`, for error messages and help."""
    return ", ".join(["auto", *FORMATS])


def get_format(name: str) -> TraceFormat:
    """Return the registered format `name`; raise WorkloadError listing the known ones otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise WorkloadError(f"unknown trace format {name!r}; known: {known_formats()}") from None


def detect_format(source: SourceText, time_unit: str | None = None) -> tuple[str, str]:
    """Guess a file's format from its header or first record.

    Returns (format name, why: one line for the user). Mooncake and timed_trace share their keys:
    an explicit `time_unit` settles which ("ms": mooncake, "s": timed_trace); otherwise the first
    record's hash_ids and timestamp decide and the reason says what was assumed.
    Raises WorkloadError naming line and known formats when nothing matches.
    """
    number, line = source.first_content_line()
    stripped = line.lstrip()
    if stripped.startswith("["):
        return "sharegpt", "a JSON array (ShareGPT conversations)"
    if stripped.startswith("{"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise source.error(
                number, f"cannot detect the format: the first line is not a JSON object ({exc.msg})"
            ) from None
        if not isinstance(record, dict):
            raise source.error(number, "cannot detect the format: the first line is not a JSON object")
        if "arrival_s" in record:
            return "canonical", "first record has 'arrival_s'"
        if "conversations" in record:
            return "sharegpt", "first record has 'conversations'"
        if all(key in record for key in LENGTH_KEYS):
            return _mooncake_or_timed_trace(record, time_unit)
        keys = ", ".join(map(repr, list(record)[:8]))
        raise source.error(
            number,
            f"cannot detect the format from the first record's keys ({keys}); pass --format (known: {known_formats()})",
        )
    _, header = csv_header(source)
    if all(name in header for name in AZURE_COLUMNS):
        return "azure", f"CSV header {','.join(AZURE_COLUMNS)}"
    if all(name in header for name in BURSTGPT_COLUMNS):
        return "burstgpt", f"CSV header with {', '.join(BURSTGPT_COLUMNS)}"
    raise source.error(
        number,
        f"cannot detect the format from this header or first record; pass --format (known: {known_formats()})",
    )


def _mooncake_or_timed_trace(record: dict[str, object], time_unit: str | None) -> tuple[str, str]:
    shared = "keys timestamp/input_length/output_length, shared by mooncake and timed_trace"
    if time_unit == "ms":
        return "mooncake", f"{shared}; --time-unit ms given"
    if time_unit == "s":
        return "timed_trace", f"{shared}; --time-unit s given"
    timestamp = record.get("timestamp")
    if isinstance(timestamp, float) and not timestamp.is_integer():
        return (
            "timed_trace",
            f"{shared}; fractional timestamp, so seconds assumed (pass --time-unit ms if not)",
        )
    hash_ids, prompt = record.get("hash_ids"), record.get("input_length")
    if _ids_cover(hash_ids, prompt, TIMED_TRACE_CHUNK_TOKENS):
        return "timed_trace", (
            f"{shared}; hash_ids are {TIMED_TRACE_CHUNK_TOKENS}-token chunks, so timed_trace "
            "with seconds assumed (pass --time-unit ms if not)"
        )
    blocks = "hash_ids are 512-token blocks and " if _ids_cover(hash_ids, prompt, MOONCAKE_BLOCK_TOKENS) else ""
    return "mooncake", (
        f"{shared}; {blocks}integer timestamps, so mooncake with milliseconds assumed (pass --time-unit s if not)"
    )


def _ids_cover(hash_ids: object, prompt: object, block_tokens: int) -> bool:
    """Whether the id count is ceil(prompt / block_tokens) for a prompt long enough to tell."""
    return (
        isinstance(hash_ids, list)
        and isinstance(prompt, int)
        and prompt > TIMED_TRACE_CHUNK_TOKENS
        and len(hash_ids) == math.ceil(prompt / block_tokens)
    )


def load_workload(
    path: str | Path,
    format: str = "auto",  # noqa: A002 - the name users know the option by
    *,
    time_unit: str | None = None,
    tokenizer: Tokenizer | None = None,
    sharegpt_rate_rps: float = 1.0,
    seed: int = 0,
) -> Workload:
    """Read a trace file into a Workload whose first request arrives at 0 s.

    `format` is a name from FORMATS or "auto" (detected from the header or first record; the
    provenance's `detected` says what was picked and why). `time_unit` ("ms" or "s") applies to
    mooncake and timed_trace only. `tokenizer` is needed for text (sharegpt, canonical `prompt`);
    `sharegpt_rate_rps` and `seed` set ShareGPT's generated Poisson arrivals.

    Provenance: source, format, detected, time_unit, sha256, rows_read, dropped {reason: count},
    format-specific entries, and an empty `transforms` list.
    Raises WorkloadError (one line naming file and line) for unreadable or malformed input, an
    unknown format, or a file with no replayable request; ConfigError for a bad `time_unit`.
    """
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise ConfigError(f"time_unit must be one of {', '.join(TIME_UNITS)}, but got {time_unit!r}")
    if format != "auto":
        get_format(format)
    source = read_source(path)
    detected = None
    name = format
    if name == "auto":
        name, detected = detect_format(source, time_unit)
    trace_format = get_format(name)
    if time_unit is not None and not trace_format.takes_time_unit:
        raise ConfigError(f"--time-unit applies to mooncake and timed_trace only, not to {trace_format.name}")
    options = ReadOptions(time_unit=time_unit, tokenizer=tokenizer, sharegpt_rate_rps=sharegpt_rate_rps, seed=seed)
    parsed = trace_format.read(source, options)
    provenance = {
        "source": source.path,
        "format": trace_format.name,
        "detected": detected,
        "time_unit": parsed.extra.pop("time_unit", None),
    }
    return build_workload(source, parsed, provenance)
