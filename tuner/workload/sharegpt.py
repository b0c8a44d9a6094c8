"""Importer for ShareGPT-style conversation JSON: text tokenized by the caller, arrivals generated.

The file is a JSON array (or JSON lines) of `{"conversations": [{"from": "human", "value": text},
{"from": "gpt", "value": text}, ...], "id": ...}`. One request per conversation: the prompt is the
first human turn, the output length is the token count of the reply that follows it. ShareGPT has
no timestamps, so arrivals are a seeded Poisson process at `sharegpt_rate_rps`.

Prompt text is kept in `Request.prompt_text` for replay and never appears in an error or a log:
errors here name the line (where the conversation starts) and the key, never the value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.workload.rows import Parsed, ReadOptions, Row, Tokenizer
from tuner.workload.source import SourceText

HUMAN_ROLES = frozenset({"human", "user"})
REPLY_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing"})


def _array_items(source: SourceText) -> Iterator[tuple[int, Any]]:
    """Yield (line where the item starts, item) for each item of the top-level JSON array."""
    text = source.text
    decoder = json.JSONDecoder()
    position = text.index("[") + 1

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    position = skip(position)
    if position < len(text) and text[position] == "]":
        end_of_array = position
    else:
        while True:
            try:
                item, end = decoder.raw_decode(text, position)
            except json.JSONDecodeError as exc:
                raise source.error(exc.lineno, f"invalid JSON (truncated file?): {exc.msg}") from None
            yield line_of(position), item
            position = skip(end)
            if position < len(text) and text[position] == ",":
                position = skip(position + 1)
                continue
            if position < len(text) and text[position] == "]":
                end_of_array = position
                break
            raise source.error(
                line_of(min(position, len(text) - 1)),
                "invalid JSON (truncated file?): expected ',' or ']' after an item",
            )
    trailing = skip(end_of_array + 1)
    if trailing < len(text):
        raise source.error(line_of(trailing), "unexpected text after the JSON array")


def _items(source: SourceText) -> Iterator[tuple[int, Any]]:
    """Yield conversations with their line, from a JSON array or from JSON lines."""
    _, first = source.first_content_line()
    if first.lstrip().startswith("["):
        yield from _array_items(source)
        return
    for number, line in source.lines():
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise source.error(number, f"invalid JSON (truncated line?): {exc.msg}") from None


def _turns(source: SourceText, line: int, item: Any) -> list[tuple[str, str]]:
    """Return the (role, text) turns of one conversation; raise WorkloadError on a bad shape."""
    if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
        raise source.error(line, "expected an object with a 'conversations' list")
    turns = []
    for turn in item["conversations"]:
        if not isinstance(turn, dict) or not isinstance(turn.get("from"), str):
            raise source.error(line, "each turn needs a string 'from'")
        if not isinstance(turn.get("value"), str):
            raise source.error(line, "each turn needs a string 'value'")
        turns.append((turn["from"].lower(), turn["value"]))
    return turns


def poisson_arrivals(count: int, rate_rps: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process at `rate_rps`, the first at 0 s, reproducible by seed."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_rps, size=max(count - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:count]


def read_sharegpt(source: SourceText, options: ReadOptions) -> Parsed:
    """Read ShareGPT conversations into requests; needs `options.tokenizer`.

    Conversations without a human turn followed by a reply, or with empty prompt or reply, are
    dropped and counted. Raises WorkloadError without a tokenizer or on malformed JSON, and
    ConfigError unless the arrival rate is > 0.
    """
    tokenizer: Tokenizer | None = options.tokenizer
    if tokenizer is None:
        raise source.error(None, "ShareGPT text needs a tokenizer (pass --tokenizer)")
    if not options.sharegpt_rate_rps > 0:
        raise ConfigError(f"`sharegpt_rate_rps > 0` must hold, but got {options.sharegpt_rate_rps}")
    parsed = Parsed(rows=[], rows_read=0, ticks_per_second=1)
    kept: list[tuple[int, int, int, str, str | None]] = []
    for line, item in _items(source):
        parsed.rows_read += 1
        turns = _turns(source, line, item)
        human = next((i for i, (role, _) in enumerate(turns) if role in HUMAN_ROLES), None)
        if human is None or human + 1 >= len(turns) or turns[human + 1][0] not in REPLY_ROLES:
            parsed.dropped["no reply after the first human turn"] += 1
            continue
        prompt_text = turns[human][1]
        prompt_tokens = len(tokenizer(prompt_text))
        output_tokens = len(tokenizer(turns[human + 1][1]))
        if prompt_tokens == 0:
            parsed.dropped["zero prompt tokens"] += 1
            continue
        if output_tokens == 0:
            parsed.dropped["zero output tokens"] += 1
            continue
        raw_id = item.get("id")
        session = str(raw_id) if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) else None
        kept.append((line, prompt_tokens, output_tokens, prompt_text, session))
    arrivals = poisson_arrivals(len(kept), options.sharegpt_rate_rps, options.seed)
    parsed.rows = [
        Row(line, arrival, prompt, output, session_id=session, prompt_text=text)
        for (line, prompt, output, text, session), arrival in zip(kept, arrivals, strict=True)
    ]
    parsed.extra = {
        "arrivals": {
            "process": "poisson",
            "rate_rps": options.sharegpt_rate_rps,
            "seed": options.seed,
        }
    }
    return parsed
