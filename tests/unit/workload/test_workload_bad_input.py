"""Bad trace files: one-line WorkloadErrors naming the file and the 1-based line of the file."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.errors import WorkloadError
from tuner.workload import load_workload

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
MOON = '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}\n'

# (case id, format, file content, line the error names (None: the file only), message pattern)
CASES: list[tuple[str, str, str | bytes, int | None, str]] = [
    ("empty", "auto", "", 1, "file is empty"),
    ("blank", "auto", "\n  \r\n", 1, "file is empty"),
    ("bom only", "auto", b"\xef\xbb\xbf", 1, "file is empty"),
    ("header only", "azure", AZURE_HEADER, None, "the file holds no requests"),
    ("not utf8", "auto", b"TIMESTAMP,ContextTokens\n\xff\xfe,1\n", 2, "not UTF-8"),
    (
        "azure truncated",
        "auto",
        AZURE_HEADER + AZURE_ROW + "2023-11-16 18:15:50.9951690,396",
        3,
        r"expected 3 columns, found 2 \(truncated line\?\)",
    ),
    (
        "azure extra column",
        "azure",
        AZURE_HEADER + AZURE_ROW + "2023-11-16 18:15:50.9,3,4,5\n",
        3,
        "expected 3 columns, found 4",
    ),
    (
        "azure wrong columns",
        "azure",
        "TIMESTAMP,Context,GeneratedTokens\n" + AZURE_ROW,
        1,
        "missing column\\(s\\) 'ContextTokens'; the header has 'TIMESTAMP', 'Context'",
    ),
    (
        "azure non-numeric",
        "auto",
        AZURE_HEADER + AZURE_ROW + "2023-11-16 18:15:50.9,abc,4\n",
        3,
        "ContextTokens is not an integer: 'abc'",
    ),
    (
        "azure negative",
        "auto",
        AZURE_HEADER + "2023-11-16 18:15:50.9,3,-5\n",
        2,
        "GeneratedTokens is negative: -5",
    ),
    (
        "azure nan length",
        "auto",
        AZURE_HEADER + "2023-11-16 18:15:50.9,nan,5\n",
        2,
        "ContextTokens is not an integer: 'nan'",
    ),
    (
        "azure bad time",
        "auto",
        AZURE_HEADER + "16/11/2023 18:15,3,5\n",
        2,
        "TIMESTAMP is not a 'YYYY-MM-DD HH:MM:SS\\[.fffffff\\]' time: '16/11/2023 18:15'",
    ),
    (
        "azure impossible date",
        "auto",
        AZURE_HEADER + "2023-02-30 18:15:00,3,5\n",
        2,
        "TIMESTAMP is not a valid time",
    ),
    (
        "azure backwards",
        "auto",
        AZURE_HEADER + AZURE_ROW + "2023-11-16 18:15:45.0,3,5\n",
        3,
        "TIMESTAMP goes backwards: '2023-11-16 18:15:45.0' after '2023-11-16 18:15:46.6805900' on line 2",
    ),
    (
        "burstgpt missing column",
        "burstgpt",
        "Timestamp,Model,Request tokens\n5,ChatGPT,3\n",
        1,
        "missing column\\(s\\) 'Response tokens'",
    ),
    (
        "burstgpt nan time",
        "auto",
        BURST_HEADER + "nan,ChatGPT,3,4,7,API log\n",
        2,
        "Timestamp is NaN",
    ),
    (
        "burstgpt inf time",
        "auto",
        BURST_HEADER + "inf,ChatGPT,3,4,7,API log\n",
        2,
        "Timestamp is not finite",
    ),
    (
        "burstgpt text time",
        "auto",
        BURST_HEADER + "soon,ChatGPT,3,4,7,API log\n",
        2,
        "Timestamp is not a number: 'soon'",
    ),
    (
        "burstgpt backwards",
        "auto",
        BURST_HEADER + "9,ChatGPT,3,4,7,API log\n\n8,ChatGPT,3,4,7,API log\n",
        4,
        "Timestamp goes backwards: 8.0 after 9.0 on line 2",
    ),
    (
        "burstgpt float tokens",
        "auto",
        BURST_HEADER + "9,ChatGPT,3.5,4,7,API log\n",
        2,
        "Request tokens is not an integer: '3.5'",
    ),
    (
        "mooncake truncated",
        "auto",
        MOON + '{"timestamp": 3, "input_len',
        2,
        r"invalid JSON \(truncated line\?\)",
    ),
    (
        "mooncake missing key",
        "mooncake",
        '{"timestamp": 0, "input_length": 5}\n',
        1,
        "missing key\\(s\\) 'output_length'",
    ),
    (
        "mooncake nan length",
        "mooncake",
        MOON + '{"timestamp": 1, "input_length": NaN, "output_length": 2}\n',
        2,
        "input_length is NaN",
    ),
    (
        "mooncake nan time",
        "mooncake",
        MOON + '{"timestamp": NaN, "input_length": 5, "output_length": 2}\n',
        2,
        "timestamp is NaN",
    ),
    (
        "mooncake negative",
        "mooncake",
        MOON + '{"timestamp": 1, "input_length": 5, "output_length": -1}\n',
        2,
        "output_length is negative: -1",
    ),
    (
        "mooncake string length",
        "mooncake",
        '{"timestamp": 1, "input_length": "5", "output_length": 1}\n',
        1,
        "input_length is not an integer: '5'",
    ),
    (
        "mooncake bool length",
        "mooncake",
        '{"timestamp": 1, "input_length": true, "output_length": 1}\n',
        1,
        "input_length is not an integer: true",
    ),
    (
        "mooncake fractional length",
        "mooncake",
        '{"timestamp": 1, "input_length": 2.5, "output_length": 1}\n',
        1,
        "input_length is not an integer: 2.5",
    ),
    (
        "mooncake backwards",
        "auto",
        '{"timestamp": 5, "input_length": 5, "output_length": 1}\n' + MOON,
        2,
        "timestamp goes backwards: 0.0 after 5.0 on line 1",
    ),
    (
        "mooncake bad hash ids",
        "mooncake",
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n',
        1,
        "hash_ids is not a list of integers",
    ),
    ("jsonl not an object", "mooncake", MOON + "[1, 2]\n", 2, "expected a JSON object, found list"),
    (
        "canonical unknown key",
        "auto",
        '{"arrival_s": 0, "promt_tokens": 3, "output_tokens": 1}\n',
        1,
        "unknown key\\(s\\) 'promt_tokens'; known: arrival_s, prompt_tokens",
    ),
    (
        "canonical missing output",
        "canonical",
        '{"arrival_s": 0, "prompt_tokens": 3}\n',
        1,
        "missing key 'output_tokens'",
    ),
    (
        "canonical negative arrival",
        "canonical",
        '{"arrival_s": -1, "prompt_tokens": 3, "output_tokens": 1}\n',
        1,
        "arrival_s is negative: -1.0",
    ),
    (
        "canonical text without tokenizer",
        "canonical",
        '{"arrival_s": 0, "prompt": "hi", "output_tokens": 1}\n',
        1,
        "'prompt' text needs a tokenizer",
    ),
    (
        "canonical no prompt",
        "canonical",
        '{"arrival_s": 0, "output_tokens": 1}\n',
        1,
        "missing key 'prompt_tokens' \\(or 'prompt' text\\)",
    ),
    ("undetectable csv", "auto", "a,b,c\n1,2,3\n", 1, "cannot detect the format from this header"),
    (
        "undetectable json",
        "auto",
        '{"t": 1}\n',
        1,
        "cannot detect the format from the first record's keys \\('t'\\)",
    ),
    (
        "broken first json",
        "auto",
        '{"t": \n',
        1,
        "cannot detect the format: the first line is not a JSON object",
    ),
    (
        "all failed",
        "auto",
        BURST_HEADER + "9,ChatGPT,3,0,3,API log\n",
        None,
        r"workload is empty after filtering: 1 dropped \(failed request \(0 response tokens\): 1\)",
    ),
]


@pytest.mark.parametrize(
    ("fmt", "content", "line", "pattern"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_input(tmp_path: Path, fmt: str, content: str | bytes, line: int | None, pattern: str) -> None:
    path = tmp_path / "trace.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(WorkloadError) as caught:
        load_workload(path, fmt)
    message = str(caught.value)
    assert "\n" not in message
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert message.startswith(where), message
    assert re.search(pattern, message[len(where) :]), message


def test_unknown_format_lists_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a\n")
    with pytest.raises(
        WorkloadError,
        match=(
            r"^unknown trace format 'parquet'; known: auto, canonical, azure, mooncake, burstgpt, "
            r"timed_trace, sharegpt$"
        ),
    ):
        load_workload(path, "parquet")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.csv"
    with pytest.raises(WorkloadError, match=f"^{re.escape(str(path))}: cannot read the file"):
        load_workload(path)


SHAREGPT_CASES = [
    (
        "truncated",
        '[\n  {"conversations": [\n    {"from": "human", "value": "hi"}\n',
        4,
        "invalid JSON \\(truncated file\\?\\)",
    ),
    (
        "no conversations",
        '[\n  {"conversations": []},\n  {"id": 3}\n]\n',
        3,
        "expected an object with a 'conversations' list",
    ),
    (
        "value not text",
        '[\n  {"conversations": [{"from": "human", "value": 3}]}\n]\n',
        2,
        "each turn needs a string 'value'",
    ),
    ("text after array", "[]\n[]\n", 2, "unexpected text after the JSON array"),
]


@pytest.mark.parametrize(
    ("content", "line", "pattern"),
    [c[1:] for c in SHAREGPT_CASES],
    ids=[c[0] for c in SHAREGPT_CASES],
)
def test_bad_sharegpt(
    tmp_path: Path, tokenizer: Callable[[str], list[int]], content: str, line: int, pattern: str
) -> None:
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(WorkloadError) as caught:
        load_workload(path, "sharegpt", tokenizer=tokenizer)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}: "), message
    assert re.search(pattern, message), message


def test_sharegpt_needs_a_tokenizer(fixtures: Path) -> None:
    with pytest.raises(WorkloadError, match="ShareGPT text needs a tokenizer"):
        load_workload(fixtures / "sharegpt.json")


def test_sharegpt_errors_never_show_text(tmp_path: Path, tokenizer: Callable[[str], list[int]]) -> None:
    path = tmp_path / "s.json"
    path.write_text('[{"conversations": [{"from": "human", "value": "secret words"}, {"from": 7}]}]')
    with pytest.raises(WorkloadError) as caught:
        load_workload(path, tokenizer=tokenizer)
    assert "secret" not in str(caught.value)
