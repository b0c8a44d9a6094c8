"""Leader of one vLLM server's process group: `python server_guard.py ARGV...` runs ARGV and makes sure that
nothing of it outlives the server or the process that started the guard.

vLLM's OpenAI server shuts its engine core down when it gets SIGTERM, but only once it is up: a server
stopped while it is still starting (a search killed while a trial starts its engines) exits at once and
leaves its engine core and workers running, owned by nobody. The guard is the group leader: it receives
SIGTERM when its parent dies (PR_SET_PDEATHSIG, set before exec by `start_pinned`) or when the group is
stopped, passes SIGTERM on to the server, and once the server has ended (or `GRACE_S` later) kills what
is left of the group. It exits as the server did (same status, same signal), so callers see the server's
own fate.

Ray SIGKILLs the child processes of an actor's worker when the worker exits, so the guard itself may die
before it has done its work. The guard therefore makes a pseudo-terminal its session's controlling
terminal: when it dies, however it dies, the kernel sends SIGHUP to the server's whole process group,
which ends the server, its engine core and its workers (none of them handles SIGHUP). Standard library
only: it runs before anything else is imported.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import termios
import time

GRACE_S = 25.0


def group_members(group: int) -> list[int]:
    """Pids of the live processes of process group `group`, the caller excluded."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            members.append(int(entry))
    return members


def kill_rest_of_group() -> None:
    group = os.getpgrp()
    for _ in range(50):
        members = group_members(group)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def hold_a_terminal() -> tuple[int, int] | None:
    """Give this session (the guard leads it) a pseudo-terminal as its controlling terminal. When the
    controlling process of a terminal dies, however it dies, the kernel sends SIGHUP to the terminal's
    foreground process group: the server's whole group. Returns the pty's fds (kept open), None if this
    system has no pseudo-terminals (then only a guard that lives to see its parent die cleans up)."""
    try:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    except OSError as error:
        print(
            f"server_guard: no controlling terminal ({error}): if the guard is killed, its server is not",
            file=sys.stderr,
            flush=True,
        )
        return None
    return master, slave


def main(argv: list[str]) -> int:
    # An ignored SIGCHLD is inherited through exec and makes the kernel reap children at once, so their
    # exit status is lost: the guard must read its server's.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # An ignored SIGHUP is inherited too (a search started under `nohup`): the server must not ignore the
    # SIGHUP that ends it when the guard dies. (Seen here: a driver killed under nohup left 2 servers running.)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    terminal = hold_a_terminal()  # noqa: F841 - held open for the guard's lifetime
    server = subprocess.Popen(argv)  # close_fds: the server never sees the terminal
    stop_at: list[float] = []

    def stop(signum: int, _frame: object) -> None:
        if not stop_at:
            stop_at.append(time.monotonic())
            try:
                server.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while server.poll() is None:
        if stop_at and time.monotonic() - stop_at[0] > GRACE_S:
            break
        time.sleep(0.2)
    kill_rest_of_group()
    code = server.wait()
    if code < 0:  # end the way the server ended
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
