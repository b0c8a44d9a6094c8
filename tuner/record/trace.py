"""What a recording writes: keyed hashes of sessions and prompt prefixes, and canonical rows in arrival order.

Nothing here does I/O or knows HTTP: the proxy hands in token ids, header values and token counts,
and a `write` callable that takes finished lines.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tuner.workload.canonical import STATUSES
from tuner.workload.records import PREFIX_BLOCK_TOKENS


class Keyring:
    """Keyed hashes (HMAC-SHA256) under a random key made for one recording and never stored.

    Equal inputs give equal ids within a recording, so shared prefixes and sessions stay visible;
    without the key no id can be checked against a guess (a user id, a short prompt), and two
    recordings never share ids.
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = secrets.token_bytes(32) if key is None else key

    def session_id(self, value: str) -> str:
        """The keyed hash of a client's session or user id: 16 hex digits."""
        return hmac.new(self._key, b"session\0" + value.encode("utf-8"), hashlib.sha256).hexdigest()[:16]

    def prefix_ids(self, tokens: Sequence[int], block_tokens: int = PREFIX_BLOCK_TOKENS) -> tuple[int, ...]:
        """One id per `block_tokens`-token block of the prompt (the last one may be partial).

        Block k's id hashes every token up to the end of block k, so two prompts share a leading run of
        ids exactly as far as they share whole leading blocks. Ids are non-negative 63-bit integers.
        """
        mac = hmac.new(self._key, b"prefix\0", hashlib.sha256)
        ids = []
        for start in range(0, len(tokens), block_tokens):
            mac.update(array("q", tokens[start : start + block_tokens]).tobytes())
            ids.append(int.from_bytes(mac.copy().digest()[:8], "big") >> 1)
        return tuple(ids)


@dataclass(frozen=True)
class RecordedRow:
    """One request as the trace file holds it: no text, ids already keyed."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_ids: tuple[int, ...] = ()
    session_id: str | None = None
    status: str = "ok"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, but got {self.status!r}")

    def line(self) -> str:
        """The canonical JSON line (no newline); `status` only when it is not "ok"."""
        record: dict[str, object] = {
            "arrival_s": round(self.arrival_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.prefix_ids:
            record["prefix_ids"] = list(self.prefix_ids)
        if self.session_id is not None:
            record["session_id"] = self.session_id
        if self.status != "ok":
            record["status"] = self.status
        return json.dumps(record, separators=(", ", ": "))


@dataclass
class Ticket:
    """A request in flight: its place in arrival order and what is known of it so far."""

    place: int
    arrival_s: float
    session_id: str | None = None
    prompt_tokens: int = 0
    prefix_ids: tuple[int, ...] = field(default=())

    def row(self, status: str, output_tokens: int = 0, prompt_tokens: int | None = None) -> RecordedRow:
        return RecordedRow(
            arrival_s=self.arrival_s,
            prompt_tokens=self.prompt_tokens if prompt_tokens is None else prompt_tokens,
            output_tokens=output_tokens,
            prefix_ids=self.prefix_ids,
            session_id=self.session_id,
            status=status,
        )


class ArrivalOrder:
    """Writes rows in arrival order although requests finish in any order: a bounded reorder buffer.

    `arrive` gives a request its place (arrival times relative to the first arrival); `finish` files
    its row; rows go to `write` as soon as every earlier arrival has gone. When more than
    `max_waiting` finished rows wait behind an unfinished request, that request is written with
    status "unfinished" (its answer, when it comes, is not recorded), so memory stays bounded
    whatever the traffic. `close` writes every request still in flight as "aborted".
    """

    def __init__(self, write: Callable[[list[str]], None], *, max_waiting: int = 10_000) -> None:
        if max_waiting < 1:
            raise ValueError(f"`max_waiting >= 1` must hold, but got {max_waiting}")
        self._write = write
        self._max_waiting = max_waiting
        self._origin: float | None = None
        self._arrived = 0
        self._next = 0  # the place of the first row not written yet
        self._in_flight: dict[int, Ticket] = {}
        self._finished: dict[int, RecordedRow] = {}
        self.written: Counter[str] = Counter()
        """Rows written so far, by status."""

    @property
    def in_flight(self) -> int:
        """Requests that arrived and have no row yet."""
        return len(self._in_flight)

    @property
    def arrived(self) -> int:
        return self._arrived

    def arrive(self, at: float, session_id: str | None = None) -> Ticket:
        """Place a request that arrived at clock time `at` (seconds); the first arrival is time 0."""
        if self._origin is None:
            self._origin = at
        ticket = Ticket(place=self._arrived, arrival_s=max(0.0, at - self._origin), session_id=session_id)
        self._arrived += 1
        self._in_flight[ticket.place] = ticket
        return ticket

    def finish(self, ticket: Ticket, row: RecordedRow) -> None:
        """File the row of `ticket`'s request and write what can be written; a ticket already written is ignored."""
        if self._in_flight.pop(ticket.place, None) is None:
            return
        self._finished[ticket.place] = row
        self._drain()
        while len(self._finished) > self._max_waiting:
            # After a drain the first row not written is always one still in flight.
            oldest = self._in_flight.pop(self._next)
            self._finished[self._next] = oldest.row("unfinished")
            self._drain()

    def close(self) -> int:
        """Write every request still in flight with status "aborted", then everything waiting; returns how many."""
        aborted = len(self._in_flight)
        for place, ticket in sorted(self._in_flight.items()):
            self._finished[place] = ticket.row("aborted")
        self._in_flight.clear()
        self._drain()
        return aborted

    def _drain(self) -> None:
        lines = []
        while self._next in self._finished:
            row = self._finished.pop(self._next)
            self.written[row.status] += 1
            lines.append(row.line())
            self._next += 1
        if lines:
            self._write(lines)
