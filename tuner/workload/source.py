"""Reading a trace file as text: its hash, its lines numbered as in the file, and one-line errors.

Every importer reads through `read_source`, so a BOM, CRLF line endings and a missing final newline
are handled once, and every error names the file and the 1-based line of the file (header included).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import WorkloadError


@dataclass(frozen=True)
class SourceText:
    """A trace file's decoded text (BOM removed) and the sha256 of its bytes as stored."""

    path: str
    text: str
    sha256: str

    def error(self, line: int | None, message: str) -> WorkloadError:
        """Return (not raise) a one-line WorkloadError naming this file and, if known, the line."""
        where = self.path if line is None else f"{self.path}:{line}"
        return WorkloadError(f"{where}: {message}")

    def lines(self) -> Iterator[tuple[int, str]]:
        """Yield (1-based line number, line without its line ending) for every line of the file."""
        for index, line in enumerate(self.text.split("\n")):
            yield index + 1, line.removesuffix("\r")

    def first_content_line(self) -> tuple[int, str]:
        """Return the first line that is not blank; the file is known not to be blank."""
        for number, line in self.lines():
            if line.strip():
                return number, line
        raise self.error(1, "file is empty")


def read_source(path: str | Path) -> SourceText:
    """Read a trace file as UTF-8 text.

    Returns a SourceText whose text has any UTF-8 BOM removed. Raises WorkloadError if the file
    cannot be read, is not UTF-8, or holds nothing but whitespace.
    """
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise WorkloadError(f"{name}: cannot read the file: {exc.strerror or exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise WorkloadError(f"{name}:{line}: the file is not UTF-8 text") from None
    source = SourceText(path=name, text=text, sha256=digest)
    if not text.strip():
        raise source.error(1, "file is empty")
    return source


def parse_count(source: SourceText, line: int, field: str, raw: object) -> int:
    """Parse a token count: a non-negative integer, from CSV text or a JSON value.

    JSON floats with an integral value (12.0) are accepted, as some tools write counts that way.
    Raises WorkloadError naming the field and the bad value otherwise.
    """
    if isinstance(raw, str):
        text = raw.strip()
        try:
            value = int(text)
        except ValueError:
            raise source.error(line, f"{field} is not an integer: {raw!r}") from None
    elif isinstance(raw, bool) or raw is None:
        raise source.error(line, f"{field} is not an integer: {_json_repr(raw)}")
    elif isinstance(raw, int):
        value = raw
    elif isinstance(raw, float):
        if math.isnan(raw):
            raise source.error(line, f"{field} is NaN")
        if not raw.is_integer():
            raise source.error(line, f"{field} is not an integer: {raw!r}")
        value = int(raw)
    else:
        raise source.error(line, f"{field} is not an integer: {_json_repr(raw)}")
    if value < 0:
        raise source.error(line, f"{field} is negative: {value}")
    return value


def parse_number(source: SourceText, line: int, field: str, raw: object) -> float:
    """Parse a time value: a finite number, from CSV text or a JSON number.

    Raises WorkloadError for text that is not a number, NaN, infinities, and JSON booleans.
    """
    if isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            raise source.error(line, f"{field} is not a number: {raw!r}") from None
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    else:
        raise source.error(line, f"{field} is not a number: {_json_repr(raw)}")
    if math.isnan(value):
        raise source.error(line, f"{field} is NaN")
    if math.isinf(value):
        raise source.error(line, f"{field} is not finite: {value}")
    return value


def json_count(source: SourceText, line: int, field: str, raw: object) -> int:
    """Like `parse_count` for a JSON value, where a string ("12") is an error, not a count."""
    if isinstance(raw, str):
        raise source.error(line, f"{field} is not an integer: {raw!r}")
    return parse_count(source, line, field, raw)


def json_number(source: SourceText, line: int, field: str, raw: object) -> float:
    """Like `parse_number` for a JSON value, where a string ("1.5") is an error, not a number."""
    if isinstance(raw, str):
        raise source.error(line, f"{field} is not a number: {raw!r}")
    return parse_number(source, line, field, raw)


def _json_repr(value: object) -> str:
    """Show a JSON value as JSON spells it, short enough for a one-line error."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
