"""The recording proxy: an ASGI application that forwards every request to the upstream server as it comes
and files one row per completion request (`/v1/completions`, `/v1/chat/completions`).

Bytes pass through as they arrive (an `Upstream` answer's raw chunks, Starlette's streaming response);
what is read of them is bounded (see `tuner.record.usage`). For a stream whose client did not ask for
usage, the proxy asks the upstream for it (`stream_options.include_usage`) and keeps the final
usage-only chunk from the client, who receives exactly what it would without the proxy. The proxy
defines the `Upstream` it needs; `tuner.record.upstream` implements it over aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tuner.record.trace import ArrivalOrder, Keyring, Ticket
from tuner.record.usage import BodyScanner, EventScanner, Usage

RECORDED_PATHS = ("/v1/completions", "/v1/chat/completions")
# Headers that belong to one connection, not to the request or answer they travel with.
_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
}
T = TypeVar("T")


class UpstreamError(Exception):
    """The upstream server could not be reached, or broke off an answer."""


@dataclass(frozen=True)
class UpstreamAnswer:
    """An answer whose status and headers are in: its body as raw chunks, and how to let it go.

    `close` must be awaited however the answer ends; a body not read to its end closes the connection.
    """

    status: int
    headers: list[tuple[bytes, bytes]]
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]

    def header(self, name: bytes) -> str | None:
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == name), None)


class Upstream(Protocol):
    """What the proxy needs of an HTTP client: one request out, its answer back as a stream."""

    async def send(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: Any
    ) -> UpstreamAnswer: ...  # raises UpstreamError


OVERHEAD_SAMPLES = 100_000
"""How many of the latest requests' proxy times are kept for the summary."""


class PromptTokens:
    """A request's prompt as token ids, made as vLLM's server makes them: a completions prompt with the
    tokenizer's special tokens, chat messages through the model's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        # One thread: off the event loop, and never two calls at once into a Rust tokenizer that
        # transformers reconfigures per call.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="record-tokenizer")

    def submit(self, work: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run `work(*args)` (`of`, `count`) on the tokenizer's thread; awaitable from the event loop."""
        return asyncio.get_running_loop().run_in_executor(self._pool, work, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def of(self, path: str, body: dict[str, Any]) -> list[int] | None:
        """The prompt's token ids, or None when there is no single prompt to tokenize (a batch) or it fails."""
        try:
            if path == "/v1/chat/completions":
                return self._chat(body)
            return self._completion(body)
        except Exception:  # a template or input the tokenizer rejects: the upstream will say so
            return None

    def count(self, text: str) -> int:
        """How many tokens `text` is (for completion text, when the upstream reports no usage)."""
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def _completion(self, body: dict[str, Any]) -> list[int] | None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str):
            return None
        return list(self._tokenizer.encode(prompt, add_special_tokens=body.get("add_special_tokens", True)))

    def _chat(self, body: dict[str, Any]) -> list[int] | None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        flat = [{**m, "content": _text_content(m.get("content"))} if isinstance(m, dict) else m for m in messages]
        kwargs = body.get("chat_template_kwargs") or {}
        text = self._tokenizer.apply_chat_template(
            flat,
            tools=body.get("tools"),
            tokenize=False,
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False),
            **kwargs,
        )
        return list(self._tokenizer.encode(text, add_special_tokens=body.get("add_special_tokens", False)))


def _text_content(content: Any) -> Any:
    """Chat content given as parts, as vLLM hands a text-only template: the text parts joined by newlines."""
    if not isinstance(content, list):
        return content
    return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


class RecordingProxy:
    """The ASGI application: forwards everything to `upstream`, records completion requests into `order`.

    `session_header` names a request header whose value identifies the session (else the body's
    `user` field); `tokenizer`, when given, makes prefix ids and counts tokens the upstream does not
    report. `overheads` holds the proxy's own time per recorded request (seconds from arrival to the
    upstream call plus from the upstream's first byte to the client's), for the closing summary.
    """

    def __init__(
        self,
        upstream: Upstream,
        order: ArrivalOrder,
        keyring: Keyring,
        *,
        tokenizer: PromptTokens | None = None,
        session_header: str | None = None,
        max_requests: int | None = None,
        max_body_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._upstream = upstream
        self.order = order
        self._keyring = keyring
        self._tokenizer = tokenizer
        self._session_header = session_header.lower() if session_header else None
        self._max_requests = max_requests
        self._max_body_bytes = max_body_bytes
        self._clock = clock
        self.overheads: deque[float] = deque(maxlen=OVERHEAD_SAMPLES)
        self.limit_reached = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan and websockets: nothing to do here
            return
        request = Request(scope, receive)
        at = self._clock()
        recording = (
            request.method == "POST"
            and scope["path"] in RECORDED_PATHS
            and (self._max_requests is None or self.order.arrived < self._max_requests)
        )
        if recording:
            response = await self._recorded(request, at)
        else:
            response = await self._forwarded(request)
        await response(scope, receive, send)

    def _send(self, request: Request, content: Any, *, identity: bool = False) -> Awaitable[UpstreamAnswer]:
        headers = [(k, v) for k, v in request.headers.raw if k not in _HOP_BY_HOP]
        if not isinstance(content, bytes) and (length := request.headers.get("content-length")) is not None:
            headers.append((b"content-length", length.encode()))  # a streamed body keeps its declared length
        if identity:  # a recorded answer is read on its way: ask for it uncompressed
            headers = [(k, v) for k, v in headers if k != b"accept-encoding"] + [(b"accept-encoding", b"identity")]
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return self._upstream.send(request.method, target, headers, content)

    async def _forwarded(self, request: Request) -> Response:
        """Any other request: passed on unchanged, both ways, and not recorded."""
        try:
            has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
            answer = await self._send(request, request.stream() if has_body else None)
        except UpstreamError as exc:
            return _bad_gateway(exc)
        return _Relayed(answer, answer.chunks)

    async def _recorded(self, request: Request, at: float) -> Response:
        session = request.headers.get(self._session_header) if self._session_header else None
        ticket = self.order.arrive(at)
        try:
            body = await _read_body(request, self._max_body_bytes)
        except ClientDisconnect:
            self.order.finish(ticket, ticket.row("aborted"))
            return Response(status_code=400)
        except _TooLarge:
            self.order.finish(ticket, ticket.row("error"))
            return Response(f"request body over {self._max_body_bytes} bytes\n", status_code=413)
        payload = _json_object(body)
        if session is None and isinstance(payload.get("user"), str):
            session = payload["user"]
        if session is not None:
            ticket.session_id = self._keyring.session_id(session)
        added_usage = False
        if payload.get("stream") is True and not _asks_for_usage(payload):
            options = payload.get("stream_options")
            options = options if isinstance(options, dict) else {}
            # continuous_usage_stats only counts with include_usage: off, so chunks stay as the client asked.
            payload["stream_options"] = {**options, "include_usage": True, "continuous_usage_stats": False}
            body = json.dumps(payload).encode()
            added_usage = True
        tokenizer = self._tokenizer
        prompt = (
            tokenizer.submit(tokenizer.of, request.url.path, payload) if tokenizer is not None and payload else None
        )
        sent = self._clock()
        try:
            answer = await _unless_gone(self._send(request, body, identity=True), request.receive)
        except UpstreamError as exc:
            await self._finish(ticket, prompt, None, "error", "")
            return _bad_gateway(exc)
        except _ClientGone:
            # As without the proxy: the client's going cancels the upstream request (vLLM then aborts it).
            self._abandon(ticket, prompt)
            return Response(status_code=499)
        events = _is_event_stream(answer)
        return _Relayed(
            answer,
            self._relay(answer, ticket, prompt, events, added_usage, before=sent - at),
            on_close=lambda: self._abandon(ticket, prompt),
        )

    async def _relay(
        self,
        answer: UpstreamAnswer,
        ticket: Ticket,
        prompt: asyncio.Future[list[int] | None] | None,
        events: bool,
        added_usage: bool,
        before: float,
    ) -> AsyncIterator[bytes]:
        keep_text = self._tokenizer is not None
        stream = EventScanner(keep_text=keep_text) if events else None
        body = None if events else BodyScanner(keep_text=keep_text)
        first = True
        try:
            async for chunk in answer.chunks:
                received = self._clock()
                if stream is not None:
                    parts = stream.feed(chunk)
                    out = b"".join(event for event, usage_only in parts if not usage_only) if added_usage else chunk
                else:
                    assert body is not None
                    body.feed(chunk)
                    out = chunk
                if out:
                    yield out
                    if first:  # the client has the first bytes: the proxy's share of the time to them
                        self.overheads.append(before + self._clock() - received)
                        first = False
        except UpstreamError:
            # The upstream broke off mid-answer: recorded as an error, and the client's answer is cut too.
            await self._finish(ticket, prompt, None, "error", "")
            raise
        if stream is not None and (rest := stream.rest()):
            yield rest
        if first:
            self.overheads.append(before)
        usage = stream.usage if stream is not None else body.usage() if body is not None else None
        text = stream.text if stream is not None else body.text if body is not None else ""
        status = "ok" if 200 <= answer.status < 300 else "error"
        await self._finish(ticket, prompt, usage, status, text)

    async def _finish(
        self,
        ticket: Ticket,
        prompt: asyncio.Future[list[int] | None] | None,
        usage: Usage | None,
        status: str,
        text: str,
    ) -> None:
        tokens = await prompt if prompt is not None else None
        if tokens is not None:
            ticket.prompt_tokens = len(tokens)
            ticket.prefix_ids = self._keyring.prefix_ids(tokens)
        prompt_tokens = usage.prompt_tokens if usage is not None else None
        output_tokens = usage.completion_tokens if usage is not None else None
        if output_tokens is None and status == "ok" and self._tokenizer is not None:
            output_tokens = await self._tokenizer.submit(self._tokenizer.count, text)
        self.order.finish(ticket, ticket.row(status, output_tokens or 0, prompt_tokens))
        if self._max_requests is not None and sum(self.order.written.values()) >= self._max_requests:
            self.limit_reached.set()

    def _abandon(self, ticket: Ticket, prompt: asyncio.Future[list[int] | None] | None) -> None:
        """The client went away (or the server stopped) before the answer was complete."""
        if prompt is not None and prompt.done() and prompt.exception() is None and (tokens := prompt.result()):
            ticket.prompt_tokens = len(tokens)
            ticket.prefix_ids = self._keyring.prefix_ids(tokens)
        self.order.finish(ticket, ticket.row("aborted"))
        if self._max_requests is not None and sum(self.order.written.values()) >= self._max_requests:
            self.limit_reached.set()


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


async def _unless_gone(call: Awaitable[T], receive: Receive) -> T:
    """`call`'s result, unless the client disconnects first: then `call` is cancelled and _ClientGone raised.

    Only for after the request body was read: the next message an ASGI server delivers is the disconnect.
    """
    answer = asyncio.ensure_future(call)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (answer, gone):
            if not task.done():
                task.cancel()
        await asyncio.gather(answer, gone, return_exceptions=True)
    if answer.cancelled() or not answer.done():
        raise _ClientGone
    if gone.done() and not gone.cancelled() and answer.exception() is not None:
        raise _ClientGone
    return answer.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _TooLarge
    return bytes(body)


def _json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object; {} for anything else (the upstream will answer it with an error)."""
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _asks_for_usage(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _bad_gateway(error: UpstreamError) -> Response:
    return Response(f"upstream unreachable: {error}\n", status_code=502, media_type="text/plain")


def _is_event_stream(answer: UpstreamAnswer) -> bool:
    return "text/event-stream" in (answer.header(b"content-type") or "")


class _Relayed(StreamingResponse):
    """Starlette's streaming response, plus: the upstream's status and headers verbatim, and a cleanup that
    always runs (the client gone, the server stopping): the upstream answer is let go and, if the
    content did not run to its end, `on_close` is told."""

    def __init__(
        self,
        answer: UpstreamAnswer,
        content: AsyncIterator[bytes],
        *,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._done = False
        super().__init__(self._tracked(content), status_code=answer.status)
        self.raw_headers = [(k.lower(), v) for k, v in answer.headers if k.lower() not in _HOP_BY_HOP]
        length = answer.header(b"content-length")
        if length is not None and not _is_event_stream(answer):  # only an event stream may lose bytes
            self.raw_headers.append((b"content-length", length.encode("latin-1")))
        self._answer = answer
        self._content = content
        self._on_close = on_close

    async def _tracked(self, content: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in content:
            yield chunk
        self._done = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._done and self._on_close is not None:
                self._on_close()
            for iterator in (self.body_iterator, self._content, self._answer.chunks):
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
            await self._answer.close()
