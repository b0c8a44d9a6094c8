"""The engine protocol that replay and the router need, and the plain records they exchange
(the client's own records, `RequestRecord`, live in `tuner.records`).

The replay and pool code own this interface; the vLLM actor (`trainables.vllm_engine`) implements it,
and so does the test stand-in (`tests/stand_in.py`). Nothing here imports vLLM or Ray.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GenerateRequest:
    """What one replica is asked to generate: exact prompt token ids and an exact output length."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_tokens: int


@dataclass(frozen=True)
class FirstToken:
    """Streamed by a replica as soon as the first output token exists (the client stamps arrival)."""

    request_id: str


@dataclass(frozen=True)
class Finished:
    """Streamed last: the replica's own view of the request.

    `token_gaps_s` are the gaps between successive output tokens as the replica received them from
    the engine (len = output tokens - 1), which gives inter-token latency without comparing clocks
    across processes. `queue_s` is the engine's own queueing time when it reports one.
    """

    request_id: str
    output_tokens: int
    token_gaps_s: tuple[float, ...]
    queue_s: float | None = None
    error: str | None = None
    retries: int = 0
    replica_error: bool = False  # the replica itself (its actor, server or engine) raised, not the request


StreamItem = FirstToken | Finished


class Engine(Protocol):
    """One replica: a started engine that generates, answers pings and shuts down."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[StreamItem]:
        """Yield `FirstToken` once (unless the request fails first), then exactly one `Finished`."""
        ...

    async def ping(self) -> float:
        """Answer a heartbeat; returns the replica's monotonic clock."""
        ...

    async def abort(self, request_ids: list[str]) -> None:
        """Stop generating the given requests (unknown ids are ignored)."""
        ...

    async def reset_prefix_cache(self) -> None:
        """Drop cached prefixes so the next load step reuses nothing from earlier ones."""
        ...

    async def shutdown(self) -> None:
        """Stop the engine and every process it started."""
        ...
