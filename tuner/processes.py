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
import signal
import time
from collections.abc import Callable

OWNER_VAR = "VLLM_TUNER_OWNER"


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
