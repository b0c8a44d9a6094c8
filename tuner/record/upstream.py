"""The recorder's one HTTP client: requests to the upstream server over aiohttp, answers as raw byte streams.

aiohttp rather than httpx: httpx's connection pool spends time per request that grows with the number
of open connections (docs/benchmarks.md), and a proxy holds one per concurrent request. The answer's
body is passed on as received: transfer-decoded, never decompressed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from tuner.record.proxy import UpstreamAnswer, UpstreamError

# Idle connections are dropped before the server's own keep-alive timeout (uvicorn: 5 s) ends them, so
# a request is rarely sent on a connection the server is closing.
KEEPALIVE_S = 2.0


class AiohttpUpstream:
    """`Upstream` for a server at `base_url`; use as an async context manager (one session, one pool)."""

    def __init__(self, base_url: str) -> None:
        self._base = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AiohttpUpstream:
        # No connection limit and no read timeout: the proxy must not queue or cut what the upstream serves.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: Any) -> UpstreamAnswer:
        """Send a request (`target`: path and query); the answer once its status and headers are in.

        Raises UpstreamError if the server cannot be reached or answers with something not HTTP.
        """
        assert self._session is not None, "use AiohttpUpstream as an async context manager"
        fields = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        try:
            response = await self._session.request(
                method, self._base + target, headers=fields, data=body, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from None
        finished = False

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal finished
            try:
                async for data in response.content.iter_any():
                    yield data
            except (aiohttp.ClientError, OSError) as exc:
                raise UpstreamError(f"{type(exc).__name__}: {exc}") from None
            finished = True

        async def close() -> None:
            # A whole answer leaves its connection for the next request; a cut one closes it, so the
            # upstream sees the client go (vLLM then aborts the request).
            if finished:
                response.release()
            else:
                response.close()

        return UpstreamAnswer(response.status, list(response.raw_headers), chunks(), close)
