"""The `record` command: serve the recording proxy (uvicorn) until stopped, then write what is left and summarise."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import click

from tuner.errors import ConfigError


@dataclass(frozen=True)
class RecordSettings:
    """What `tuner record` was asked to do, validated."""

    upstream: str
    host: str
    port: int
    out: Path
    tokenizer: str | None = None
    session_header: str | None = None
    max_requests: int | None = None
    duration_s: float | None = None
    grace_s: float = 5.0
    progress_s: float = 10.0


@dataclass(frozen=True)
class RecordSummary:
    """What a recording wrote: rows by status, and the proxy's own time per request (seconds)."""

    out: Path
    written: dict[str, int]
    overhead_p50_s: float | None
    overhead_p95_s: float | None
    overhead_samples: int

    def line(self) -> str:
        total = sum(self.written.values())
        statuses = ", ".join(f"{status} {count}" for status, count in sorted(self.written.items()))
        line = f"recorded {total} requests to {self.out}" + (f" ({statuses})" if total else "")
        if self.overhead_p50_s is not None and self.overhead_p95_s is not None:
            line += (
                f"; proxy time per request p50 {self.overhead_p50_s * 1e3:.3f} ms, "
                f"p95 {self.overhead_p95_s * 1e3:.3f} ms ({self.overhead_samples} requests)"
            )
        return line


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) as (host, port); raise ConfigError otherwise."""
    host, colon, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen must be HOST:PORT with a port in 0-65535, but got {value!r}")
    return host, int(port)


def check_upstream(value: str) -> str:
    """The upstream base URL without a trailing slash; raise ConfigError unless http(s)://host[:port][/path]."""
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError as exc:
        raise ConfigError(f"--upstream is not a URL: {value!r} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(f"--upstream must be an http:// or https:// URL with a host, but got {value!r}")
    if url.query or url.fragment:
        raise ConfigError(f"--upstream must not carry a query or fragment, but got {value!r}")
    if url.username is not None or url.password is not None:
        # A credential in the URL would be printed and logged; clients send their own Authorization header.
        raise ConfigError("--upstream must not carry a user or password (user:password@host): it would be printed")
    return value.rstrip("/")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer from a local path or id; raise ConfigError if it cannot be loaded."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("--tokenizer needs the 'transformers' package") from None
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load tokenizer {name!r}: {str(exc).splitlines()[0]}") from None


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free one); raise ConfigError if it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"--listen {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--listen {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def run_recording(settings: RecordSettings, progress: Callable[[str], None]) -> RecordSummary:
    """Record until SIGINT/SIGTERM, `max_requests` recorded or `duration_s` passed; returns the summary.

    Raises ConfigError (before anything is served) for an output file that exists or cannot be made,
    a tokenizer that cannot be loaded, or an address that cannot be listened on.
    """
    tokenizer = load_tokenizer(settings.tokenizer) if settings.tokenizer else None
    sock = bind(settings.host, settings.port)
    try:
        out = settings.out.open("x", encoding="utf-8", newline="\n")
    except FileExistsError:
        sock.close()
        raise ConfigError(f"--out {settings.out}: the file exists (a recording never overwrites one)") from None
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--out {settings.out}: cannot create the file: {exc.strerror or exc}") from None
    with sock, out:
        return _run(_record(settings, sock, out, tokenizer, progress))


def _run(coroutine: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


async def _record(
    settings: RecordSettings, sock: socket.socket, out: TextIO, tokenizer: Any, progress: Callable[[str], None]
) -> RecordSummary:
    import uvicorn

    from tuner.record.proxy import PromptTokens, RecordingProxy
    from tuner.record.trace import ArrivalOrder, Keyring
    from tuner.record.upstream import AiohttpUpstream

    def write(lines: list[str]) -> None:
        out.writelines(line + "\n" for line in lines)
        out.flush()  # a row written is a row kept, whatever happens to the process next

    order = ArrivalOrder(write)
    prompt_tokens = PromptTokens(tokenizer) if tokenizer is not None else None
    async with AiohttpUpstream(settings.upstream) as upstream:
        proxy = RecordingProxy(
            upstream,
            order,
            Keyring(),
            tokenizer=prompt_tokens,
            session_header=settings.session_header,
            max_requests=settings.max_requests,
        )
        config = uvicorn.Config(
            proxy,
            lifespan="off",
            log_level="warning",
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=settings.grace_s,  # type: ignore[arg-type]  # any number works
        )
        server = _Server(config)
        host, port = sock.getsockname()[:2]
        where = f"[{host}]" if ":" in host else host
        progress(f"recording http://{where}:{port} -> {settings.upstream}, writing {settings.out}")
        if not is_loopback(settings.host):
            progress(f"note: listening on {settings.host}, beyond loopback: whoever reaches it reaches the upstream")
        started = time.monotonic()
        watchers = [
            asyncio.ensure_future(_stop_when(server, proxy.limit_reached, settings.duration_s)),
            asyncio.ensure_future(_report(order, started, settings.progress_s, progress)),
        ]
        try:
            await server.serve(sockets=[sock])
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            aborted = order.close()
            if prompt_tokens is not None:
                prompt_tokens.close()
        if aborted:
            progress(f"{aborted} request(s) still in flight at the stop, written with status aborted")
    overheads = sorted(proxy.overheads)
    return RecordSummary(
        out=settings.out,
        written=dict(order.written),
        overhead_p50_s=statistics.median(overheads) if overheads else None,
        overhead_p95_s=overheads[min(len(overheads) - 1, int(0.95 * len(overheads)))] if overheads else None,
        overhead_samples=len(overheads),
    )


async def _stop_when(server: Any, limit_reached: asyncio.Event, duration_s: float | None) -> None:
    try:
        await asyncio.wait_for(limit_reached.wait(), timeout=duration_s)
    except asyncio.TimeoutError:
        pass
    server.should_exit = True


async def _report(order: Any, started: float, every_s: float, progress: Callable[[str], None]) -> None:
    while True:
        await asyncio.sleep(every_s)
        written = sum(order.written.values())
        failed = written - order.written.get("ok", 0)
        progress(
            f"[{time.monotonic() - started:6.0f}s] recorded {written} requests"
            + (f" ({failed} not ok)" if failed else "")
            + f", {order.in_flight} in flight"
        )


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a SIGINT/SIGTERM is a clean stop: not raised again once the server is down,
        so the command exits 0 after writing everything."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, handler)

    return Server


def _Server(config: Any) -> Any:  # noqa: N802 - a class made on first use, so importing the CLI stays light
    return _server_class()(config)


@click.command(name="record")
@click.option("--upstream", required=True, metavar="URL", help="The OpenAI-compatible server to forward to.")
@click.option(
    "--listen",
    default="127.0.0.1:8001",
    show_default=True,
    metavar="HOST:PORT",
    help="Where clients connect (port 0: any free port). Loopback unless told otherwise.",
)
@click.option(
    "--out", required=True, type=click.Path(dir_okay=False), help="Canonical JSONL to write (must not exist)."
)
@click.option(
    "--tokenizer",
    default=None,
    metavar="NAME_OR_PATH",
    help="The served model's tokenizer: prefix ids (chat template applied), and counts the upstream omits.",
)
@click.option(
    "--session-header",
    default=None,
    metavar="NAME",
    help="Request header that names the session (else the body's `user` field).",
)
@click.option("--max-requests", type=click.IntRange(min=1), default=None, help="Stop after recording this many.")
@click.option(
    "--duration-s", type=click.FloatRange(min=0, min_open=True), default=None, help="Stop after this many seconds."
)
@click.option(
    "--grace-s",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="On stop, how long requests in flight may finish before they are cut and written as aborted.",
)
@click.option(
    "--progress-s",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Print a progress line this often.",
)
def record(
    upstream: str,
    listen: str,
    out: str,
    tokenizer: str | None,
    session_header: str | None,
    max_requests: int | None,
    duration_s: float | None,
    grace_s: float,
    progress_s: float,
) -> None:
    """Record your own traffic: a pass-through proxy writing one canonical row per completion request, no text."""
    host, port = parse_listen(listen)
    if session_header is not None and (not session_header.strip() or session_header.lower() == "authorization"):
        raise ConfigError(f"--session-header must name a header other than authorization, but got {session_header!r}")
    settings = RecordSettings(
        upstream=check_upstream(upstream),
        host=host,
        port=port,
        out=Path(out),
        tokenizer=tokenizer,
        session_header=session_header,
        max_requests=max_requests,
        duration_s=duration_s,
        grace_s=grace_s,
        progress_s=progress_s,
    )
    summary = run_recording(settings, progress=lambda line: click.echo(line))
    click.echo(summary.line())
