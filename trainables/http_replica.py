"""A replica served by vLLM's OpenAI server, seen from the client: the `Engine` protocol over HTTP streaming.

Requests go straight from the replay client to the server (`/v1/completions`, token-id prompts,
`ignore_eos` with exactly the recorded output length, streamed), as a deployment's clients reach it;
timings are taken where they arrive, as vLLM's own `bench serve` takes them: the first streamed chunk is
the first token, later chunks give the inter-token gaps, and the usage chunk the output length. The
replica's host (its Ray actor, or the server object itself in tests) answers pings, freezes, and shuts
the server down.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

# Imported with this module, never on a load step's first request: importing aiohttp takes 0.15-0.2 s of
# CPU (a quiet 2-core AVX2 EPYC), and a replay client sharing the cores with two saturated replicas spent
# up to 1.2 s in it, sending the first step's requests that late (a 20 requests/s step measured at 16.1).
import aiohttp

from trainables.protocol import Finished, FirstToken, GenerateRequest, StreamItem

# How long a liveness check after a broken connection may take before the request just counts as failed.
_CHECK_S = 5.0
# A streamed completion chunk that carries tokens, and the final one that carries the usage.
TOKEN_CHUNK = b'"choices":[{'
USAGE_CHUNK = b'"usage":{'


class ServerHost(Protocol):
    """Whatever runs the server (its Ray actor): answers pings (raising once the server is gone), resets
    the prefix cache, freezes or kills the server, ends itself, shuts everything down."""

    async def ping(self) -> float: ...

    async def reset_prefix_cache(self) -> None: ...

    async def freeze(self) -> None: ...

    async def kill_server(self) -> None: ...

    async def kill(self) -> None: ...

    async def shutdown(self) -> None: ...


class HttpReplica:
    """The `Engine` protocol for one `VllmServer` at `url`, hosted by `host`."""

    def __init__(self, url: str, host: ServerHost, model: str) -> None:
        self.url = url
        self.host = host
        self.model = model
        self._session: Any = None
        self._open: dict[str, Any] = {}  # request id -> its streaming response, so abort can close it
        self._aborted: set[str] = set()  # requests whose streams abort() closed

    def _client(self):
        if self._session is None or self._session.closed:
            # No connection limit: an open-loop replay must never queue requests in the client.
            # Idle connections are dropped before the server's own keep-alive timeout (uvicorn: 5 s) ends
            # them, so a request is rarely sent on a connection the server is closing.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            )
        return self._session

    async def generate(self, request: GenerateRequest, attempt: int = 0) -> AsyncIterator[StreamItem]:
        # As vLLM's bench serve asks: ignore_eos gives exactly max_tokens tokens (no min_tokens, whose
        # logits processor would slow every decode step).
        body = {
            "model": self.model,
            "prompt": list(request.prompt_token_ids),
            "max_tokens": request.output_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        gaps: list[float] = []
        chunks, produced, last = 0, None, None
        try:
            async with self._client().post(
                f"{self.url}/v1/completions", json=body, headers={"X-Request-Id": request.request_id}
            ) as reply:
                self._open[request.request_id] = reply
                if reply.status != 200:
                    text = (await reply.text())[:300]
                    yield Finished(request.request_id, 0, (), error=f"HTTP {reply.status}: {_message(text)}")
                    return
                async for line in reply.content:
                    # Only the arrival time of a token chunk matters, so it is recognised without parsing
                    # its JSON (the client shares this machine's cores with the server it measures).
                    if TOKEN_CHUNK in line:
                        now = time.perf_counter()
                        if last is None:
                            yield FirstToken(request.request_id)
                        else:
                            gaps.append(now - last)
                        last, chunks = now, chunks + 1
                    elif USAGE_CHUNK in line and line.startswith(b"data:"):
                        usage = json.loads(line[5:]).get("usage") or {}
                        produced = int(usage.get("completion_tokens") or 0)
                    elif line.startswith(b"data: [DONE]"):
                        break
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            if request.request_id not in self._aborted:  # a broken stream, or a server that refused it
                await self._raise_if_dead(error)
            if (
                last is None
                and attempt == 0
                and isinstance(error, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))
            ):
                # Nothing came back and the server lives: the connection was stale, send it once more.
                async for item in self.generate(request, attempt=1):
                    yield item
                return
            yield Finished(request.request_id, chunks, tuple(gaps), error=f"{type(error).__name__}: {error}")
            return
        finally:
            self._open.pop(request.request_id, None)
            self._aborted.discard(request.request_id)
        produced = chunks if produced is None else produced
        # Tokens that arrive in one chunk arrived together: their gaps are 0, as in-process.
        gaps.extend([0.0] * max(0, produced - 1 - len(gaps)))
        yield Finished(request.request_id, produced, tuple(gaps[: max(0, produced - 1)]))

    async def _raise_if_dead(self, error: BaseException) -> None:
        """A broken connection proves nothing by itself: ask the host whether the server still lives."""
        try:
            await asyncio.wait_for(self.host.ping(), _CHECK_S)
        except asyncio.TimeoutError:
            return  # a busy or frozen server: the health monitor decides
        except Exception as death:
            raise death from error

    async def ping(self) -> float:
        return float(await self.host.ping())

    async def abort(self, request_ids: list[str]) -> None:
        """Close the given requests' streams: vLLM's server aborts a request whose client went away."""
        for request_id in request_ids:
            reply = self._open.pop(request_id, None)
            if reply is not None:
                self._aborted.add(request_id)
                reply.close()

    async def reset_prefix_cache(self) -> None:
        await self.host.reset_prefix_cache()

    async def freeze(self) -> None:
        await self.host.freeze()

    async def kill(self) -> None:
        """The server dies at once (its process group is killed), then its host; a host already gone
        took the server with it."""
        try:
            await asyncio.wait_for(self.host.kill_server(), _CHECK_S)
        except Exception:  # noqa: BLE001 - the host died first: its server went with it
            pass
        await self.host.kill()

    async def shutdown(self) -> None:
        session, self._session = self._session, None
        try:
            if session is not None:
                await session.close()
        finally:
            await self.host.shutdown()


def _message(text: str) -> str:
    try:
        return str(json.loads(text).get("message") or text)
    except (ValueError, AttributeError):
        return text
