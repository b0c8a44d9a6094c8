"""Importers for the CSV traces, columns read by name: Azure LLM inference 2023/2024, BurstGPT."""

from __future__ import annotations

import calendar
import csv
import functools
import re
from collections.abc import Iterator
from datetime import datetime

from tuner.workload.rows import Parsed, ReadOptions, Row, TimeOrder
from tuner.workload.source import SourceText, parse_count, parse_number

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
BURSTGPT_SESSION = "Session ID"

_WALL_CLOCK = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?")
_NS = 1_000_000_000


def csv_header(source: SourceText) -> tuple[int, list[str]]:
    """Return the line number and stripped column names of the file's first non-blank line."""
    number, line = source.first_content_line()
    return number, [name.strip() for name in next(csv.reader([line]))]


def _csv_rows(
    source: SourceText, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, {column: text}) for each data row, checking the header and column count.

    Only the `required` and `optional` columns are returned; others are ignored. Raises
    WorkloadError for missing columns and for rows with the wrong number of fields.
    """
    header_line, header = csv_header(source)
    missing = [name for name in required if name not in header]
    if missing:
        raise source.error(
            header_line,
            f"missing column(s) {', '.join(map(repr, missing))}; the header has {', '.join(map(repr, header))}",
        )
    wanted = {name: header.index(name) for name in (*required, *optional) if name in header}
    for number, line in source.lines():
        if number <= header_line or not line.strip():
            continue
        fields = line.split(",") if '"' not in line else next(csv.reader([line]))
        if len(fields) != len(header):
            hint = " (truncated line?)" if len(fields) < len(header) else ""
            raise source.error(number, f"expected {len(header)} columns, found {len(fields)}{hint}")
        yield number, {name: fields[index] for name, index in wanted.items()}


@functools.lru_cache(maxsize=64)
def _midnight_s(date: str) -> int | None:
    """Epoch seconds of a 'YYYY-MM-DD' day's start (UTC), None for an impossible date.

    Cached: a trace's timestamps fall on few days, and this is the slow part of a row.
    """
    try:
        day = datetime.strptime(date, "%Y-%m-%d")
    except ValueError:
        return None
    return calendar.timegm(day.timetuple())


def parse_wall_clock_ns(source: SourceText, line: int, field: str, text: str) -> int:
    """Parse 'YYYY-MM-DD HH:MM:SS[.fffffff][Z|+HH:MM]' into integer nanoseconds since the epoch.

    Integers keep Azure's 7 fractional digits exact where a float of epoch seconds would not.
    A time without an offset is read as UTC (only differences matter).
    """
    match = _WALL_CLOCK.fullmatch(text.strip())
    if match is None:
        raise source.error(line, f"{field} is not a 'YYYY-MM-DD HH:MM:SS[.fffffff]' time: {text!r}")
    date, hour, minute, second = match.group(1, 2, 3, 4)
    midnight = _midnight_s(date)
    if midnight is None or int(hour) > 23 or int(minute) > 59 or int(second) > 59:
        raise source.error(line, f"{field} is not a valid time: {text!r}")
    seconds = midnight + int(hour) * 3600 + int(minute) * 60 + int(second)
    offset = match.group(6)
    if offset and offset != "Z":
        sign = 1 if offset[0] == "+" else -1
        digits = offset[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    fraction = (match.group(5) or "").ljust(9, "0")
    return seconds * _NS + int(fraction)


def read_azure(source: SourceText, options: ReadOptions) -> Parsed:
    """Azure LLM inference traces, 2023 and 2024: `TIMESTAMP,ContextTokens,GeneratedTokens`.

    TIMESTAMP is wall-clock time with up to 7 (any 1-9) fractional digits; arrival = timestamp
    minus the first timestamp.
    """
    order = TimeOrder(source, "TIMESTAMP")
    rows: list[Row] = []
    for number, fields in _csv_rows(source, AZURE_COLUMNS):
        time_ns = parse_wall_clock_ns(source, number, "TIMESTAMP", fields["TIMESTAMP"])
        order.check(number, time_ns, fields["TIMESTAMP"].strip())
        rows.append(
            Row(
                line=number,
                time=time_ns,
                prompt_tokens=parse_count(source, number, "ContextTokens", fields["ContextTokens"]),
                output_tokens=parse_count(source, number, "GeneratedTokens", fields["GeneratedTokens"]),
            )
        )
    return Parsed(rows=rows, rows_read=len(rows), ticks_per_second=_NS)


def read_burstgpt(source: SourceText, options: ReadOptions) -> Parsed:
    """BurstGPT, every release layout: columns found by header name, `Timestamp` in seconds.

    Some releases insert `Session ID` and `Elapsed time` after `Timestamp`; the session id is kept.
    A row with 0 response tokens is a failed request: dropped and counted.
    """
    order = TimeOrder(source, "Timestamp")
    parsed = Parsed(rows=[], rows_read=0, ticks_per_second=1, extra={"time_unit": "s"})
    for number, fields in _csv_rows(source, BURSTGPT_COLUMNS, (BURSTGPT_SESSION,)):
        parsed.rows_read += 1
        time = parse_number(source, number, "Timestamp", fields["Timestamp"])
        order.check(number, time)
        prompt = parse_count(source, number, "Request tokens", fields["Request tokens"])
        output = parse_count(source, number, "Response tokens", fields["Response tokens"])
        if output == 0:
            parsed.dropped["failed request (0 response tokens)"] += 1
            continue
        session = fields.get(BURSTGPT_SESSION, "").strip() or None
        parsed.rows.append(Row(number, time, prompt, output, session_id=session))
    return parsed
