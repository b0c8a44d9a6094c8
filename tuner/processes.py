"""The processes a search starts on this machine, found by a mark in their environment, and waited for.

Every Ray worker of a search, and every vLLM server, engine core and guard those workers start, inherits
`OWNER_VAR=<the search driver's pid>` (Ray's runtime environment carries it to the workers; the servers
inherit the workers' environment). A server stopped while it is still starting is ended by its guard
(trainables/server_guard.py) up to its grace period after Ray has shut down, so without waiting the
command could return while such a server still runs for some seconds (seen once on a fresh clone,
2026-12-04: gone 18 s after the command). `wait_for_owned` waits for them, and kills what outlives the
wait, so nothing of ours is left when the command returns. Linux's /proc; elsewhere it finds nothing.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from collections.abc import Callable

OWNER_VAR = "VLLM_TUNER_OWNER"
WORKER_NICENESS_VAR = "RAY_worker_niceness"

# Ports for the servers we start (vLLM's, Ray Serve's HTTP proxy). A port the kernel hands out (bind to port
# 0) lies in its ephemeral range, which every outgoing connection also draws from: Ray starting between our
# pick and the server's bind opened enough connections to take it once ("Failed to bind to address
# '127.0.0.1:37667'", CI, 2026-12-06). So the pick lies below that range and above Ray's worker ports
# (10002-19999 by default); the kernel never gives such a port to a connection, only an explicit bind takes it.
SERVER_PORTS_FROM = 20000
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
# When the file cannot be read: from Linux's default low to the top (other systems reach 65535).
EPHEMERAL_DEFAULT = (32768, 65535)
_PICK = random.SystemRandom()


def worker_env() -> dict[str, str]:
    """Environment that runs Ray's workers (a trial's replay client, its replicas, their vLLM servers and
    engines, Ray Serve's replicas) at the driver's priority. Ray raises every worker's niceness by 15 and
    leaves its driver and daemons as they are, so on a small machine each busy process of the driver's
    session took the CPU from a trial's replay client, where the confirmation's client (in the driver) kept
    its priority (docs/measurement.md, "Priority"). A user's own RAY_worker_niceness wins."""
    return {WORKER_NICENESS_VAR: os.environ.get(WORKER_NICENESS_VAR, "0")}


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (and for binds to port 0)."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as text:
            low, high = (int(part) for part in text.read().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return low, high


def free_port(host: str = "127.0.0.1", *, tries: int = 200) -> int:
    """A port free on `host` now, outside the kernel's ephemeral range (see SERVER_PORTS_FROM); when none of
    `tries` such ports is free (or the range leaves none), a port the kernel picks."""
    low, high = ephemeral_range()
    candidates = [*range(SERVER_PORTS_FROM, min(low, 65536)), *range(max(high + 1, SERVER_PORTS_FROM), 65536)]
    # The system's randomness: a trial or test that seeds `random` must not make two servers pick alike.
    for port in _PICK.sample(candidates, min(tries, len(candidates))):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_zombie(pid: int) -> bool:
    """Whether `pid` has exited and waits for its parent to reap it (it runs nothing, holds no port). Raises
    OSError (or IndexError on a malformed stat line) when there is no such process."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"


def owned_processes(owner: int) -> list[int]:
    """Pids of the live processes whose environment carries OWNER_VAR=owner (the caller excluded)."""
    mark = f"{OWNER_VAR}={owner}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if is_zombie(int(entry)):
                continue
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if mark in environ.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, IndexError):  # ended meanwhile, or not ours to read
            continue
    return found


def wait_for_owned(
    owner: int, timeout_s: float = 35.0, progress: Callable[[str], None] = print, poll_s: float = 0.5
) -> list[int]:
    """Wait until no process carries `owner`'s mark; after `timeout_s`, SIGKILL the rest and say so.
    Returns the pids that had to be killed (empty when all ended by themselves)."""
    deadline = time.monotonic() + timeout_s
    said = False
    while pids := owned_processes(owner):
        if time.monotonic() >= deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            progress(f"killed {len(pids)} process(es) of this search still running {timeout_s:g}s after Ray shut down")
            return pids
        if not said:
            progress(f"waiting for {len(pids)} process(es) of this search to stop (vLLM servers shutting down)")
            said = True
        time.sleep(poll_s)
    return []
