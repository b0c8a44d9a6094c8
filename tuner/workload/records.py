"""Frozen records of a workload: the requests of a trace and where they came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Request:
    """One recorded request: when it arrived and how many tokens went in and came out.

    `prefix_ids` name prompt-prefix blocks (`PREFIX_BLOCK_TOKENS` tokens each): two requests whose
    `prefix_ids` share a leading run share that many prompt-prefix tokens, so replay exercises the
    prefix cache for real. `prompt_text`, when the trace carried text, is tokenized by the caller and
    never logged anywhere.
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_ids: tuple[int, ...] = ()
    session_id: str | None = None
    prompt_text: str | None = field(default=None, repr=False)


PREFIX_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Workload:
    """An ordered list of requests (arrival times from 0, non-decreasing) and its provenance.

    `provenance` is a JSON-serialisable dict: source file, format, content hash and the list of
    transformations applied, in order. It is what MLflow records about the workload.
    """

    requests: tuple[Request, ...]
    provenance: dict[str, Any]

    @property
    def duration_s(self) -> float:
        """Seconds from the first to the last arrival (0 for fewer than two requests)."""
        if len(self.requests) < 2:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def mean_rate_rps(self) -> float:
        """Recorded request rate: requests per second over the trace's span."""
        if self.duration_s <= 0:
            return float(len(self.requests))
        # n requests span n-1 gaps; the rate of a renewal process is gaps / span.
        return (len(self.requests) - 1) / self.duration_s
