"""Importer results (rows in source time units, drop counts) and how they become a Workload."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.workload.records import Request, Workload
from tuner.workload.source import SourceText

Tokenizer = Callable[[str], Sequence[int]]
"""Turns prompt text into token ids; only the count is used."""


@dataclass(frozen=True)
class ReadOptions:
    """Options an importer may need; each importer reads only the ones that apply to it."""

    time_unit: str | None = None
    tokenizer: Tokenizer | None = None
    sharegpt_rate_rps: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class Row:
    """One request as read, its time still in the source's ticks (see `Parsed.ticks_per_second`)."""

    line: int
    time: float | int
    prompt_tokens: int
    output_tokens: int
    prefix_ids: tuple[int, ...] = ()
    session_id: str | None = None
    prompt_text: str | None = field(default=None, repr=False)


@dataclass
class Parsed:
    """An importer's result: rows in file order, how many were read, why some were dropped.

    `extra` holds format-specific provenance (time unit, prefix block size, generated arrivals).
    """

    rows: list[Row]
    rows_read: int
    ticks_per_second: int | float = 1
    dropped: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)


class TimeOrder:
    """Checks that timestamps never go backwards, naming the offending line."""

    def __init__(self, source: SourceText, field_name: str) -> None:
        self._source = source
        self._field = field_name
        self._last: float | int | None = None
        self._last_shown = ""
        self._last_line = 0

    def check(self, line: int, value: float | int, shown: str | None = None) -> None:
        """Raise WorkloadError if `value` is earlier than the previous row's time.

        `shown` is how the value is spelled in the file, when that reads better than `value`.
        """
        shown = repr(value) if shown is None else repr(shown)
        if self._last is not None and value < self._last:
            raise self._source.error(
                line,
                f"{self._field} goes backwards: {shown} after {self._last_shown} on line "
                f"{self._last_line} (rows must be in arrival order)",
            )
        self._last = value
        self._last_shown = shown
        self._last_line = line


def build_workload(source: SourceText, parsed: Parsed, provenance: dict[str, Any]) -> Workload:
    """Turn parsed rows into a Workload whose first kept request arrives at 0 s.

    Rows with zero prompt or zero output tokens cannot be replayed: they are dropped and counted.
    `provenance` (source, format, ...) is completed with the hash, row counts and drops.
    Raises WorkloadError if no request is left.
    """
    dropped = Counter(parsed.dropped)
    kept: list[Row] = []
    for row in parsed.rows:
        if row.prompt_tokens == 0:
            dropped["zero prompt tokens"] += 1
        elif row.output_tokens == 0:
            dropped["zero output tokens"] += 1
        else:
            kept.append(row)
    if not kept:
        if parsed.rows_read == 0:
            raise source.error(None, "the file holds no requests")
        raise source.error(None, f"workload is empty after filtering: {describe_dropped(dict(dropped))}")
    origin = kept[0].time
    ticks = parsed.ticks_per_second
    requests = tuple(
        Request(
            arrival_s=float((row.time - origin) / ticks),
            prompt_tokens=row.prompt_tokens,
            output_tokens=row.output_tokens,
            prefix_ids=row.prefix_ids,
            session_id=row.session_id,
            prompt_text=row.prompt_text,
        )
        for row in kept
    )
    full = {
        **provenance,
        "sha256": source.sha256,
        "rows_read": parsed.rows_read,
        "dropped": dict(sorted(dropped.items())),
        **parsed.extra,
        "transforms": [],
    }
    return Workload(requests=requests, provenance=full)


def describe_dropped(dropped: dict[str, int]) -> str:
    """One line listing drop reasons and counts, e.g. '17 dropped (zero output tokens: 17)'."""
    total = sum(dropped.values())
    if total == 0:
        return "none dropped"
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(dropped.items()))
    return f"{total} dropped ({reasons})"
