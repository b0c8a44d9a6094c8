"""`tuner record` against a stub upstream served on loopback: bytes pass unchanged, rows come in arrival order
with the upstream's counts, failures and aborts get a status, and the file holds no text, no secret, no
guessable id."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tuner.cli import main
from tuner.record.proxy import PromptTokens, RecordingProxy
from tuner.record.trace import ArrivalOrder, Keyring, RecordedRow
from tuner.record.upstream import AiohttpUpstream
from tuner.record.usage import BodyScanner, EventScanner
from tuner.workload.formats import load_workload
from tuner.workload.stats import summarize

ROOT = Path(__file__).resolve().parents[2]
PROMPT_SECRET = "the-prompt-text-must-never-be-stored"
COMPLETION_SECRET = "the-completion-text-must-never-be-stored"
API_KEY = "sk-the-api-key-must-never-be-stored"


# --- the stub upstream: an OpenAI-compatible server in a few lines ----------------------------------


def stub_upstream(seen: list[dict[str, Any]]) -> Starlette:
    """Answers completions and chat completions: prompt tokens = words of the prompt, output = max_tokens
    tokens. In the body: `delay_s` delays the answer, `chunk_delay_s` each chunk, `fail` answers 500,
    `bare` answers without usage, `watch_s` waits that long for the client to go (noted in `seen`)."""

    async def complete(request: Request) -> Response:
        body = await request.json()
        seen.append({"body": body, "headers": dict(request.headers)})
        if "messages" in body:
            prompt = " ".join(m["content"] for m in body["messages"])
        else:
            prompt = body["prompt"]
        prompt_tokens, output_tokens = len(prompt.split()), int(body.get("max_tokens", 4))
        await asyncio.sleep(body.get("delay_s", 0))
        for _ in range(int(body.get("watch_s", 0) * 20)):
            if await request.is_disconnected():
                seen.append({"gone": True})
                return Response(status_code=499)
            await asyncio.sleep(0.05)
        if body.get("fail"):
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if body.get("bare"):
            return JSONResponse({"choices": [{"text": "abcdef"}]})
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens, "total_tokens": 0}
        if not body.get("stream"):
            answer = {"id": "x", "choices": [{"index": 0, "text": COMPLETION_SECRET}], "usage": usage}
            return JSONResponse(answer)

        async def events():
            for i in range(output_tokens):
                await asyncio.sleep(body.get("chunk_delay_s", 0))
                chunk = {"id": "x", "choices": [{"index": 0, "text": f"{COMPLETION_SECRET}{i}"}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "stub"}]}, headers={"x-upstream": "yes"})

    return Starlette(
        routes=[
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/models", models),
        ]
    )


def _serve_in_thread(app: Any) -> tuple[Any, threading.Thread, int]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, sock.getsockname()[1]


class Stub:
    def __init__(self, url: str, seen: list[dict[str, Any]]) -> None:
        self.url = url
        self.seen = seen


@pytest.fixture(scope="module")
def served() -> Iterator[Stub]:
    seen: list[dict[str, Any]] = []
    server, thread, port = _serve_in_thread(stub_upstream(seen))
    yield Stub(f"http://127.0.0.1:{port}", seen)
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def stub(served: Stub) -> Stub:
    served.seen.clear()
    return served


class CharTokenizer:
    """One token per character; the chat template as the tiny model's (role: content, one line each)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=True, **_) -> str:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


class Recording:
    """A proxy in front of the upstream at `url`, its rows collected in memory; `client` talks to the proxy."""

    def __init__(self, url: str, *, tokenizer: Any = None, max_requests: int | None = None, **kw: Any) -> None:
        self.lines: list[str] = []
        self.order = ArrivalOrder(self.lines.extend, **kw)
        self.upstream = AiohttpUpstream(url)
        self.tokens = PromptTokens(tokenizer) if tokenizer else None
        self.proxy = RecordingProxy(
            self.upstream,
            self.order,
            Keyring(),
            tokenizer=self.tokens,
            session_header="x-session",
            max_requests=max_requests,
        )
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(self.proxy), base_url="http://proxy")

    async def __aenter__(self) -> Recording:
        await self.upstream.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self.upstream.__aexit__()
        if self.tokens is not None:
            self.tokens.close()

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]


def run(coroutine_function: Callable[[], Any]) -> Any:
    return asyncio.run(coroutine_function())


# --- pure parts ---------------------------------------------------------------------------------------


def test_rows_are_written_in_arrival_order_whatever_the_finishing_order() -> None:
    written: list[list[str]] = []
    order = ArrivalOrder(written.append)
    tickets = [order.arrive(at) for at in (10.0, 10.5, 11.25)]
    order.finish(tickets[2], tickets[2].row("ok", 3, 30))
    order.finish(tickets[1], tickets[1].row("error"))
    assert written == []
    order.finish(tickets[0], tickets[0].row("ok", 1, 10))
    assert [json.loads(line)["arrival_s"] for line in written[0]] == [0.0, 0.5, 1.25]
    assert [json.loads(line).get("status", "ok") for line in written[0]] == ["ok", "error", "ok"]
    order.finish(tickets[0], tickets[0].row("ok", 9, 9))  # a second answer for a written row: ignored
    assert sum(order.written.values()) == 3


def test_reorder_buffer_is_bounded_and_close_writes_requests_in_flight_as_aborted() -> None:
    lines: list[str] = []
    order = ArrivalOrder(lines.extend, max_waiting=2)
    slow, *fast = [order.arrive(float(t)) for t in range(4)]
    for ticket in fast[:2]:
        order.finish(ticket, ticket.row("ok", 1, 1))
    assert lines == []
    order.finish(fast[2], fast[2].row("ok", 1, 1))  # a third row waiting: the slow one is written unfinished
    assert [json.loads(line).get("status", "ok") for line in lines] == ["unfinished", "ok", "ok", "ok"]
    late = order.arrive(9.0)
    assert order.close() == 1 and json.loads(lines[-1])["status"] == "aborted"
    order.finish(late, late.row("ok", 1, 1))
    assert len(lines) == 5 and order.in_flight == 0


def test_keyed_ids_are_equal_for_equal_prefixes_and_differ_between_recordings() -> None:
    first, second = Keyring(), Keyring()
    shared = list(range(1024))
    a = first.prefix_ids(shared + [1, 2, 3])
    b = first.prefix_ids(shared + [4, 5])
    assert len(a) == len(b) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert first.prefix_ids(shared[:600])[0] == a[0] and len(first.prefix_ids(shared[:512])) == 1
    assert not set(second.prefix_ids(shared)) & set(first.prefix_ids(shared))
    assert first.session_id("alice") == first.session_id("alice") != second.session_id("alice")
    assert all(0 <= i < 2**63 for i in a)


def test_a_row_rejects_an_unknown_status() -> None:
    with pytest.raises(ValueError, match="status must be one of"):
        RecordedRow(0.0, 1, 1, status="fine")


def test_scanners_find_usage_in_split_bytes_and_long_bodies() -> None:
    stream = (
        b'data: {"choices": [{"text": "a"}]}\r\n\r\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}\n\n'
        b"data: [DONE]\n\n"
    )
    scanner = EventScanner()
    events = [event for i in range(len(stream)) for event in scanner.feed(stream[i : i + 1])]
    assert b"".join(event for event, _ in events) == stream and scanner.rest() == b""
    assert [usage_only for _, usage_only in events] == [False, True, False]
    assert scanner.usage is not None and (scanner.usage.prompt_tokens, scanner.usage.completion_tokens) == (7, 2)
    long_text = "x" * (3 << 20)
    body = json.dumps({"choices": [{"text": long_text}], "usage": {"prompt_tokens": 5, "completion_tokens": 9}})
    scanner_body = BodyScanner()
    for start in range(0, len(body), 65536):
        scanner_body.feed(body[start : start + 65536].encode())
    usage = scanner_body.usage()
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (5, 9)


# --- the proxy in process, the upstream on loopback ----------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("client_asks_usage", [False, True])
def test_streams_reach_the_client_byte_for_byte_and_are_counted(stub: Stub, path: str, client_asks_usage: bool) -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 5, "stream": True}
    body.update({"messages": [{"role": "user", "content": "one two three"}]} if "chat" in path else {"prompt": "a b c"})
    if client_asks_usage:
        body["stream_options"] = {"include_usage": True}

    async def scenario():
        async with httpx.AsyncClient(base_url=stub.url) as direct:
            expected = (await direct.post(path, json=body)).content
        async with Recording(stub.url) as recording:
            answer = await recording.client.post(path, json=body)
        return expected, answer, recording

    expected, answer, recording = run(scenario)
    assert answer.status_code == 200 and answer.content == expected
    assert (b'"usage"' in answer.content) is client_asks_usage  # the proxy's own usage chunk never reaches the client
    assert stub.seen[-1]["body"]["stream_options"]["include_usage"] is True  # ... but the upstream was asked for it
    assert recording.rows() == [{"arrival_s": 0.0, "prompt_tokens": 3, "output_tokens": 5}]


def test_a_plain_answer_passes_unchanged_and_headers_reach_the_upstream(stub: Stub) -> None:
    body = {"model": "m", "prompt": "a b c d", "max_tokens": 2}

    async def scenario():
        async with Recording(stub.url) as recording:
            answer = await recording.client.post(
                "/v1/completions?x=1", json=body, headers={"authorization": f"Bearer {API_KEY}"}
            )
        return answer, recording

    answer, recording = run(scenario)
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == COMPLETION_SECRET
    assert stub.seen[0]["body"] == body and stub.seen[0]["headers"]["authorization"] == f"Bearer {API_KEY}"
    assert recording.rows() == [{"arrival_s": 0.0, "prompt_tokens": 4, "output_tokens": 2}]


def test_other_paths_are_forwarded_and_not_recorded(stub: Stub) -> None:
    async def scenario():
        async with Recording(stub.url) as recording:
            answer = await recording.client.get("/v1/models")
            missing = await recording.client.get("/nowhere")
        return answer, missing, recording

    answer, missing, recording = run(scenario)
    assert answer.json() == {"data": [{"id": "stub"}]} and answer.headers["x-upstream"] == "yes"
    assert missing.status_code == 404
    assert recording.lines == [] and recording.order.arrived == 0


def test_after_max_requests_requests_are_forwarded_unrecorded_and_the_limit_is_signalled(stub: Stub) -> None:
    async def scenario():
        async with Recording(stub.url, max_requests=2) as recording:
            body = {"prompt": "a", "max_tokens": 1}
            answers = [await recording.client.post("/v1/completions", json=body) for _ in range(3)]
        return answers, recording

    answers, recording = run(scenario)
    assert [a.status_code for a in answers] == [200, 200, 200] and len(stub.seen) == 3
    assert len(recording.lines) == 2 and recording.proxy.limit_reached.is_set()


def test_rows_keep_arrival_order_when_answers_finish_out_of_order(stub: Stub) -> None:
    delays = [0.3, 0.0, 0.15, 0.05]

    async def scenario():
        async with Recording(stub.url) as recording:
            tasks = []
            for i, delay in enumerate(delays):
                body = {"prompt": " ".join(["w"] * (i + 1)), "max_tokens": 1, "delay_s": delay, "stream": i % 2 == 1}
                tasks.append(asyncio.ensure_future(recording.client.post("/v1/completions", json=body)))
                await asyncio.sleep(0.02)
            answers = await asyncio.gather(*tasks)
        return answers, recording

    answers, recording = run(scenario)
    assert all(answer.status_code == 200 for answer in answers)
    rows = recording.rows()
    assert [row["prompt_tokens"] for row in rows] == [1, 2, 3, 4]
    arrivals = [row["arrival_s"] for row in rows]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0 and arrivals[-1] >= 0.05


def test_upstream_errors_and_an_unreachable_upstream_are_rows_with_status_error(stub: Stub) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there

    async def scenario():
        async with Recording(stub.url) as recording:
            failed = await recording.client.post("/v1/completions", json={"prompt": "a b", "fail": True})
        async with Recording(closed) as unreachable:
            gateway = await unreachable.client.post("/v1/completions", json={"prompt": "a b"})
        return failed, recording, gateway, unreachable

    failed, recording, gateway, unreachable = run(scenario)
    assert failed.status_code == 500 and failed.json() == {"error": {"message": "boom"}}
    assert recording.rows() == [{"arrival_s": 0.0, "prompt_tokens": 0, "output_tokens": 0, "status": "error"}]
    assert gateway.status_code == 502
    assert [row["status"] for row in unreachable.rows()] == ["error"]


def _scope(length: int) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(length).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }


def _hang_up(recording: Recording, body: bytes, *, after_bytes: bool, wait_s: float = 0.0) -> list[dict[str, Any]]:
    """Call the proxy as an ASGI server would for a client that hangs up: after the first body bytes it
    receives, or `wait_s` after sending its request. Returns what the proxy sent."""
    sent: list[dict[str, Any]] = []

    async def scenario():
        got_bytes = asyncio.Event()
        calls = 0

        async def receive() -> dict[str, Any]:
            nonlocal calls
            calls += 1
            if calls == 1:
                return {"type": "http.request", "body": body, "more_body": False}
            if after_bytes:
                await got_bytes.wait()
            else:
                await asyncio.sleep(wait_s)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                got_bytes.set()

        async with recording:
            await asyncio.wait_for(recording.proxy(_scope(len(body)), receive, send), timeout=10)
            await asyncio.sleep(0.3)  # the upstream notices

    run(scenario)
    return sent


def test_a_client_that_goes_away_mid_stream_leaves_an_aborted_row(stub: Stub) -> None:
    body = json.dumps({"prompt": "a b c", "max_tokens": 50, "stream": True, "chunk_delay_s": 0.02}).encode()
    recording = Recording(stub.url)
    sent = _hang_up(recording, body, after_bytes=True)
    chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
    assert 1 <= len(chunks) < 50
    assert recording.rows() == [{"arrival_s": 0.0, "prompt_tokens": 0, "output_tokens": 0, "status": "aborted"}]


def test_a_client_that_goes_away_before_the_answer_cancels_the_upstream_request(stub: Stub) -> None:
    body = json.dumps({"prompt": "a b c", "max_tokens": 5, "watch_s": 5}).encode()
    recording = Recording(stub.url)
    _hang_up(recording, body, after_bytes=False, wait_s=0.2)
    assert {"gone": True} in stub.seen  # the upstream saw its client go, as it would without the proxy
    assert recording.rows() == [{"arrival_s": 0.0, "prompt_tokens": 0, "output_tokens": 0, "status": "aborted"}]


def test_the_file_holds_no_text_no_key_and_only_keyed_ids(stub: Stub) -> None:
    system = "You are a careful assistant. " * 30  # 870 characters: one whole shared block and more
    bodies = [
        {
            "model": "m",
            "user": "alice@example.com",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"{PROMPT_SECRET} {i}"}],
        }
        for i in range(2)
    ]

    async def scenario():
        recordings = []
        for _ in range(2):
            async with Recording(stub.url, tokenizer=CharTokenizer()) as recording:
                for body in bodies:
                    await recording.client.post(
                        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {API_KEY}"}
                    )
                await recording.client.post(
                    "/v1/completions", json={"prompt": PROMPT_SECRET, "stream": True}, headers={"x-session": "bob"}
                )
            recordings.append(recording)
        return recordings

    first, second = run(scenario)
    text = "\n".join(first.lines)
    for secret in (PROMPT_SECRET, COMPLETION_SECRET, API_KEY, "alice", "bob", "careful"):
        assert secret not in text
    rows = first.rows()
    assert set(rows[0]) == {"arrival_s", "prompt_tokens", "output_tokens", "prefix_ids", "session_id"}
    # The system prompt's first 512-token block is shared, the rest of each prompt is not.
    assert rows[0]["prefix_ids"][0] == rows[1]["prefix_ids"][0]
    assert rows[0]["prefix_ids"][1] != rows[1]["prefix_ids"][1]
    assert rows[0]["session_id"] == rows[1]["session_id"] != rows[2]["session_id"]
    again = second.rows()
    assert again[0]["prefix_ids"][0] != rows[0]["prefix_ids"][0] and again[0]["session_id"] != rows[0]["session_id"]
    # The chat template applied as the server does: role lines and the generation prompt counted.
    template = CharTokenizer().apply_chat_template(bodies[0]["messages"])
    assert len(rows[0]["prefix_ids"]) == -(-len(template) // 512)


def test_with_a_tokenizer_tokens_are_counted_when_the_upstream_reports_none(stub: Stub) -> None:
    async def scenario():
        async with Recording(stub.url, tokenizer=CharTokenizer()) as recording:
            await recording.client.post("/v1/completions", json={"prompt": "xyz", "bare": True})
        return recording

    rows = run(scenario).rows()
    assert rows[0]["prompt_tokens"] == 4 and rows[0]["output_tokens"] == 6  # BOS + 3 characters; 6 characters


# --- the canonical format's status --------------------------------------------------------------------


def test_status_rows_are_counted_and_dropped_on_import(tmp_path: Path) -> None:
    trace = tmp_path / "recorded.jsonl"
    trace.write_text(
        '{"arrival_s": 0.0, "prompt_tokens": 3, "output_tokens": 0, "status": "error"}\n'
        '{"arrival_s": 0.5, "prompt_tokens": 4, "output_tokens": 2}\n'
        '{"arrival_s": 0.7, "prompt_tokens": 4, "output_tokens": 2, "status": "ok"}\n'
        '{"arrival_s": 0.9, "prompt_tokens": 4, "output_tokens": 1, "status": "aborted"}\n'
    )
    workload = load_workload(trace)
    assert [r.arrival_s for r in workload.requests] == [0.0, pytest.approx(0.2)]
    summary = summarize(workload)
    assert summary["rows_read"] == 4 and summary["dropped"] == {"status aborted": 1, "status error": 1}
    inspected = CliRunner().invoke(main, ["workload", "inspect", str(trace)])
    assert inspected.exit_code == 0 and "status aborted: 1; status error: 1" in inspected.output


def test_an_unknown_status_is_an_error_naming_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1}\n'
        '{"arrival_s": 1, "prompt_tokens": 3, "output_tokens": 1, "status": "fine"}\n'
    )
    result = CliRunner().invoke(main, ["workload", "inspect", str(trace)])
    assert result.exit_code == 2 and f"{trace}:2: status must be one of ok, error, aborted, unfinished" in result.output


# --- the command --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--upstream", "ftp://host"], "--upstream must be an http:// or https:// URL"),
        (["--upstream", "http://me:secret@host:8000"], "--upstream must not carry a user or password"),
        (["--upstream", "http://h:1", "--listen", "8001"], "--listen must be HOST:PORT"),
        (["--upstream", "http://h:1", "--listen", "127.0.0.1:99999"], "--listen must be HOST:PORT"),
        (["--upstream", "http://h:1", "--session-header", "Authorization"], "--session-header must name a header"),
        (["--upstream", "http://h:1", "--tokenizer", "/no/such/tokenizer"], "cannot load tokenizer"),
        (["--upstream", "http://h:1", "--out", "EXISTING"], "the file exists"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    existing = tmp_path / "existing.jsonl"
    existing.write_text("keep me\n")
    args = [str(existing) if a == "EXISTING" else a for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "trace.jsonl")]
    result = CliRunner().invoke(
        main, ["record", "--listen", "127.0.0.1:0", *args] if "--listen" not in args else ["record", *args]
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert existing.read_text() == "keep me\n" and not (tmp_path / "trace.jsonl").exists()


def test_click_range_errors_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["record", "--upstream", "http://h:1", "--out", str(tmp_path / "t.jsonl"), "--max-requests", "0"]
    )
    assert result.exit_code == 2 and "--max-requests" in result.output


def test_sigterm_stops_cleanly_writing_finished_rows_and_requests_in_flight(tmp_path: Path, stub: Stub) -> None:
    out = tmp_path / "trace.jsonl"
    proxy = subprocess.Popen(
        [sys.executable, "-m", "tuner", "record", "--upstream", stub.url]
        + ["--listen", "127.0.0.1:0", "--out", str(out), "--grace-s", "0.5", "--progress-s", "0.2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proxy.stdout is not None
        first = proxy.stdout.readline()
        assert first.startswith("recording http://127.0.0.1:"), first
        url = first.split()[1]
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 3}).status_code == 200
            with client.stream(
                "POST", "/v1/completions", json={"prompt": "c", "max_tokens": 100, "stream": True, "chunk_delay_s": 0.1}
            ) as streaming:
                chunks = streaming.iter_raw()
                next(chunks)  # the stream has begun: stop the proxy while it runs
                proxy.send_signal(signal.SIGTERM)
                with pytest.raises(httpx.HTTPError):
                    for _ in chunks:
                        pass
        output, _ = proxy.communicate(timeout=30)
    finally:
        if proxy.poll() is None:
            proxy.kill()
    assert proxy.returncode == 0, output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"arrival_s": 0.0, "prompt_tokens": 2, "output_tokens": 3}
    assert rows[1]["status"] == "aborted" and len(rows) == 2
    assert "recorded 2 requests" in output and "aborted 1" in output and "proxy time per request" in output
