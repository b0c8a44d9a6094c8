"""The canonical trace format: its definition, its reader and its writer.

Canonical format
----------------
JSON lines (UTF-8), one request per line, in arrival order:

    {"arrival_s": 0.0, "prompt_tokens": 1020, "output_tokens": 129}
    {"arrival_s": 0.42, "prompt_tokens": 1100, "output_tokens": 500, "prefix_ids": [0, 1, 2],
     "session_id": "u17"}                                  (one line in the file)
    {"arrival_s": 1.5, "prompt": "Summarise this ...", "output_tokens": 64}

- `arrival_s` (number >= 0, required): arrival time in seconds from the start of the trace, never
  decreasing from one line to the next.
- `prompt_tokens` (integer >= 0) or `prompt` (string), one of them required: the prompt length in
  tokens, or the prompt text, tokenized with the model's tokenizer on import. With both, the
  length is `prompt_tokens` and the text is kept for replay.
- `output_tokens` (integer >= 0, required): output length in tokens; replay forces exactly that.
- `prefix_ids` (list of integers, optional): prompt-prefix blocks of 512 tokens each. Requests whose
  lists share a leading run share that many prompt blocks, so prefix caching is exercised for real.
- `session_id` (string, optional): the conversation or user the request belongs to.
- `status` (string, optional, "ok" when absent): what became of the request when it was recorded:
  "ok", "error" (the server answered with an error or could not be reached), "aborted" (the client
  went away, or the recording stopped, before the answer was complete) or "unfinished" (still running
  when the recorder had to write it). Rows that are not "ok" are counted and dropped on import, with
  their status as the reason: their token counts are not what a replay should force.

Any other key is an error (a typo must not pass silently). Arrivals are re-based on import so the
first request arrives at 0 s. Requests with 0 prompt or 0 output tokens cannot be replayed: they
are dropped and counted with the reason. Blank lines are ignored; a UTF-8 BOM and CRLF line endings
are accepted. The writer never writes prompt text unless asked to.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from tuner.errors import WorkloadError
from tuner.workload.jsonl_formats import json_objects
from tuner.workload.records import Workload
from tuner.workload.rows import Parsed, ReadOptions, Row, TimeOrder
from tuner.workload.source import SourceText, json_count, json_number

CANONICAL_KEYS = (
    "arrival_s",
    "prompt_tokens",
    "prompt",
    "output_tokens",
    "prefix_ids",
    "session_id",
    "status",
)
STATUSES = ("ok", "error", "aborted", "unfinished")
"""The values of `status`: "ok" rows are replayed, the others are counted and dropped."""


def read_canonical(source: SourceText, options: ReadOptions) -> Parsed:
    """Read the canonical JSON-lines format; `prompt` text needs `options.tokenizer`."""
    order = TimeOrder(source, "arrival_s")
    rows: list[Row] = []
    read = 0
    dropped: Counter[str] = Counter()
    for number, record in json_objects(source):
        read += 1
        unknown = sorted(set(record) - set(CANONICAL_KEYS))
        if unknown:
            raise source.error(
                number,
                f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(CANONICAL_KEYS)}",
            )
        for key in ("arrival_s", "output_tokens"):
            if key not in record:
                raise source.error(number, f"missing key {key!r}")
        arrival = json_number(source, number, "arrival_s", record["arrival_s"])
        if arrival < 0:
            raise source.error(number, f"arrival_s is negative: {arrival!r}")
        order.check(number, arrival)
        status = record.get("status", "ok")
        if status not in STATUSES:
            raise source.error(number, f"status must be one of {', '.join(STATUSES)}, but got {status!r}")
        text = record.get("prompt")
        if text is not None and not isinstance(text, str):
            raise source.error(number, "prompt is not a string")
        if "prompt_tokens" in record:
            prompt_tokens = json_count(source, number, "prompt_tokens", record["prompt_tokens"])
        elif text is None:
            raise source.error(number, "missing key 'prompt_tokens' (or 'prompt' text)")
        elif options.tokenizer is None:
            raise source.error(number, "'prompt' text needs a tokenizer (pass --tokenizer)")
        else:
            prompt_tokens = len(options.tokenizer(text))
        output_tokens = json_count(source, number, "output_tokens", record["output_tokens"])
        if status != "ok":
            dropped[f"status {status}"] += 1
            continue
        rows.append(
            Row(
                line=number,
                time=arrival,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                prefix_ids=_prefix_ids(source, number, record.get("prefix_ids", [])),
                session_id=_session_id(source, number, record.get("session_id")),
                prompt_text=text,
            )
        )
    return Parsed(rows=rows, rows_read=read, ticks_per_second=1, dropped=dropped, extra={"time_unit": "s"})


def _prefix_ids(source: SourceText, line: int, raw: object) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(item, int) and not isinstance(item, bool) for item in raw):
        raise source.error(line, "prefix_ids is not a list of integers")
    return tuple(raw)


def _session_id(source: SourceText, line: int, raw: object) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    raise source.error(line, "session_id is not a string")


def canonical_lines(workload: Workload, *, include_prompt_text: bool = False) -> list[str]:
    """Return the workload as canonical JSON lines (no newlines); text only if asked."""
    lines = []
    for request in workload.requests:
        record: dict[str, object] = {
            "arrival_s": request.arrival_s,
            "prompt_tokens": request.prompt_tokens,
            "output_tokens": request.output_tokens,
        }
        if request.prefix_ids:
            record["prefix_ids"] = list(request.prefix_ids)
        if request.session_id is not None:
            record["session_id"] = request.session_id
        if include_prompt_text and request.prompt_text is not None:
            record["prompt"] = request.prompt_text
        lines.append(json.dumps(record, ensure_ascii=False))
    return lines


def write_canonical(workload: Workload, path: str | Path, *, include_prompt_text: bool = False) -> None:
    """Write the workload in the canonical format, atomically: a temp file renamed into place.

    Prompt text is written only with `include_prompt_text=True`. Raises WorkloadError if the file
    cannot be written; then nothing is left at `path` that was not there before.
    """
    target = Path(path)
    lines = canonical_lines(workload, include_prompt_text=include_prompt_text)
    # A temp file beside the target, renamed over it: readers never see half a file, and a
    # failure leaves whatever was at `path` before.
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "x", encoding="utf-8", newline="\n") as handle:
            handle.writelines(line + "\n" for line in lines)
        os.replace(temp, target)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise WorkloadError(f"{target}: cannot write the file: {exc.strerror or exc}") from None
