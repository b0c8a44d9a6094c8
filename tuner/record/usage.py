"""Token counts in the bytes that pass the proxy: the `usage` of a JSON answer or of a server-sent event stream.

Both scanners hold a bounded amount of the answer (one event, or the head and tail of a JSON body),
whatever its length. Completion text is kept only when asked to (to count tokens locally when the
server reports none), only in memory, and is capped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_EVENT_BYTES = 1 << 20
"""An event longer than this is passed on unread (no usage can be taken from it)."""
MAX_BODY_BYTES = 1 << 20
"""A JSON answer up to this size is parsed whole; of a longer one only the tail is searched."""
MAX_TEXT_CHARS = 1 << 20
"""Completion text kept for counting tokens locally, at most."""

_EVENT_END = re.compile(rb"\r?\n\r?\n")
_TAIL_BYTES = 16 << 10
# A key spelled with bare quotes can only be a key: inside a JSON string its quotes would be escaped.
_TAIL_COUNT = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*(\d+)')


@dataclass(frozen=True)
class Usage:
    """Token counts as the server reported them (None where it did not)."""

    prompt_tokens: int | None
    completion_tokens: int | None


def usage_of(answer: Any) -> Usage | None:
    """The `usage` object of a parsed answer or chunk, or None if it has none."""
    if not isinstance(answer, dict) or not isinstance(answer.get("usage"), dict):
        return None
    usage = answer["usage"]

    def count(key: str) -> int | None:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    return Usage(count("prompt_tokens"), count("completion_tokens"))


def _texts(answer: Any) -> list[str]:
    """Completion text of every choice of an answer or chunk (completions `text`, chat `message`/`delta`)."""
    texts = []
    choices = answer.get("choices") if isinstance(answer, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        for value in (choice.get("text"), (choice.get("message") or {}), (choice.get("delta") or {})):
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                texts.append(value)
    return texts


class _TextKeeper:
    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.parts: list[str] = []
        self._chars = 0

    def add(self, answer: Any) -> None:
        if not self.keep or self._chars >= MAX_TEXT_CHARS:
            return
        for text in _texts(answer):
            self.parts.append(text)
            self._chars += len(text)

    @property
    def text(self) -> str:
        return "".join(self.parts)


class EventScanner:
    """Cuts a server-sent event stream into events as bytes arrive and reads each event's JSON data.

    `feed` returns the complete events so far as (bytes exactly as received, whether the event is a
    usage-only chunk: no choices, a `usage`). `usage` is the last usage seen; `text` the completion
    text, if kept. `rest` returns bytes after the last complete event.
    """

    def __init__(self, *, keep_text: bool = False) -> None:
        self._buffer = bytearray()
        self._searched = 0
        self._text = _TextKeeper(keep_text)
        self.usage: Usage | None = None

    @property
    def text(self) -> str:
        return self._text.text

    def feed(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        self._buffer += chunk
        events = []
        while True:
            found = _EVENT_END.search(self._buffer, max(0, self._searched - 3))
            if found is None:
                break
            event = bytes(self._buffer[: found.end()])
            del self._buffer[: found.end()]
            self._searched = 0
            events.append((event, self._read(event)))
        self._searched = len(self._buffer)
        if len(self._buffer) > MAX_EVENT_BYTES:
            events.append((bytes(self._buffer), False))
            self._buffer.clear()
            self._searched = 0
        return events

    def rest(self) -> bytes:
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def _read(self, event: bytes) -> bool:
        data = b"\n".join(
            line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")
        )  # several data lines make one payload
        if not data or data == b"[DONE]" or (b'"usage"' not in data and not self._text.keep):
            return False
        try:
            answer = json.loads(data)
        except ValueError:
            return False
        self._text.add(answer)
        usage = usage_of(answer)
        if usage is None:
            return False
        self.usage = usage
        return answer.get("choices") == []


class BodyScanner:
    """Finds `usage` in a JSON answer passed on in pieces: parsed whole up to MAX_BODY_BYTES, else
    searched in its last bytes (where servers put `usage`)."""

    def __init__(self, *, keep_text: bool = False) -> None:
        self._head = bytearray()
        self._tail = bytearray()
        self._whole = True
        self._keep_text = keep_text
        self.text = ""

    def feed(self, chunk: bytes) -> None:
        if self._whole and len(self._head) + len(chunk) <= MAX_BODY_BYTES:
            self._head += chunk
            return
        if self._whole:
            self._whole = False
            self._tail = self._head
            self._head = bytearray()
        self._tail += chunk
        del self._tail[:-_TAIL_BYTES]

    def usage(self) -> Usage | None:
        """The answer's usage, once all of it was fed; None if it has none."""
        if self._whole:
            try:
                answer = json.loads(self._head)
            except ValueError:
                return None
            keeper = _TextKeeper(self._keep_text)
            keeper.add(answer)
            self.text = keeper.text
            return usage_of(answer)
        counts = {key.decode(): int(value) for key, value in _TAIL_COUNT.findall(bytes(self._tail))}
        if not counts:
            return None
        return Usage(counts.get("prompt_tokens"), counts.get("completion_tokens"))
