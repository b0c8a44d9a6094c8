"""Plain records of one load step: what the replay plans to send, and what it recorded of each request.

They live here, below both `tuner` (metrics, the step planner) and `trainables` (replay, pool), so that
the pure logic never imports the code that runs engines. Nothing here holds prompt text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a step's plan: when to send it (seconds from step start) and what to ask."""

    index: int
    scheduled_s: float
    prompt_token_ids: tuple[int, ...]
    output_tokens: int
    in_warmup: bool = False


@dataclass(frozen=True)
class RequestRecord:
    """The client's record of one replayed request; all times in seconds from the step's start.

    Latencies count from `sent_s`, the moment the request left the client (its first send, when it was
    retried). `ok` is False when the request failed or missed the step deadline; `error` says why.
    """

    index: int
    scheduled_s: float
    sent_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float | None
    finished_s: float | None
    token_gaps_s: tuple[float, ...] = ()
    queue_s: float | None = None
    ok: bool = True
    error: str | None = None
    in_warmup: bool = False
    replica: int = -1
    retries: int = 0
    replica_error: bool = False  # it failed because its replica raised (see trainables.protocol.Finished)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; None for 1-token outputs (undefined)."""
        if self.finished_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finished_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def send_lag_s(self) -> float:
        return self.sent_s - self.scheduled_s
