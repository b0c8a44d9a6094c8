"""The server guard: nothing of a server's process group outlives the server or whoever started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainables.vllm_engine import start_pinned

GUARD = str(Path(__file__).resolve().parents[2] / "trainables" / "server_guard.py")

# A "server" that starts a helper process (as vLLM's server starts its engine core) and dies on SIGTERM
# without stopping it, as vLLM's server does while it is still starting.
SERVER = """
import subprocess, sys, time
helper = subprocess.Popen(["sleep", "300"])
open(sys.argv[1], "w").write(str(helper.pid))
time.sleep(300)
"""

STARTER = """
import subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from trainables.vllm_engine import start_pinned
start_pinned([sys.executable, sys.argv[2], sys.executable, "-c", sys.argv[3], sys.argv[4]], [],
             env=dict(__import__("os").environ), stdout=subprocess.DEVNULL)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for_file(path: Path, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_killed_starter_takes_the_servers_whole_group_with_it(tmp_path):
    marker = tmp_path / "helper.pid"
    root = str(Path(GUARD).parents[1])
    starter = subprocess.Popen([sys.executable, "-c", STARTER, root, GUARD, SERVER, str(marker)])
    try:
        helper = _wait_for_file(marker)
        assert _alive(helper)
        starter.kill()  # as a Ray actor dies: no clean-up code of ours runs
        starter.wait(10)
        assert _gone(helper), "the server's helper process outlived the process that started the server"
    finally:
        starter.kill()
        if marker.exists() and _alive(int(marker.read_text())):
            os.kill(int(marker.read_text()), signal.SIGKILL)


# Run in a process of its own: the exit status of a child can only be read by its parent, and only while
# SIGCHLD is not ignored; by the time this test runs, the pytest process may ignore it.
EXIT_STATUS = """
import os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from trainables.vllm_engine import start_pinned
guard, marker, server, kill = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "kill"
signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # pytest's own may be ignored (inherited through exec)
process = start_pinned([sys.executable, guard, sys.executable, "-c", server, marker], [], env=dict(os.environ),
                       stdout=subprocess.DEVNULL)
if kill:
    while not (os.path.exists(marker) and open(marker).read()):
        time.sleep(0.05)
    child = int(open(f"/proc/{process.pid}/task/{process.pid}/children").read().split()[0])
    os.kill(child, signal.SIGKILL)  # the server is killed (out of memory, say)
print(process.wait(20))
"""


def _exit_status(tmp_path: Path, server: str, kill: bool) -> tuple[int, int]:
    marker = tmp_path / f"helper-{kill}.pid"
    root = str(Path(GUARD).parents[1])
    out = subprocess.run(
        [sys.executable, "-c", EXIT_STATUS, root, GUARD, str(marker), server, "kill" if kill else "wait"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip()), _wait_for_file(marker)


def test_the_guard_ends_as_its_server_did_and_leaves_nothing(tmp_path):
    ends_with_3 = SERVER.replace("time.sleep(300)", "time.sleep(0.5); sys.exit(3)")
    code, helper = _exit_status(tmp_path, ends_with_3, kill=False)
    assert code == 3, "the guard exits with its server's status"
    assert _gone(helper)

    code, helper = _exit_status(tmp_path, SERVER, kill=True)
    assert code == -signal.SIGKILL, "the guard reports the server's own death"
    assert _gone(helper)


@pytest.mark.parametrize("nohup", [False, True], ids=["plain", "under-nohup"])
def test_a_guard_killed_with_its_actor_still_leaves_nothing(tmp_path, nohup):
    # Ray SIGKILLs an exiting worker's child processes: the guard itself dies without a word; the kernel
    # then hangs up its terminal, which ends the server and its helper, even when whoever started the
    # search ignored SIGHUP (`nohup`), which every process it starts inherits.
    marker = tmp_path / "helper.pid"
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN if nohup else signal.SIG_DFL)
    try:
        guard = start_pinned(
            [sys.executable, GUARD, sys.executable, "-c", SERVER, str(marker)],
            [],
            env=dict(os.environ),
            stdout=subprocess.DEVNULL,
        )
    finally:
        signal.signal(signal.SIGHUP, before)
    helper = _wait_for_file(marker)
    server = int(Path(f"/proc/{guard.pid}/task/{guard.pid}/children").read_text().split()[0])
    guard.kill()
    guard.wait(10)
    assert _gone(server) and _gone(helper), "the server and its helper outlived their guard"
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-g", str(guard.pid)], capture_output=True).stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-g", str(guard.pid)], capture_output=True).stdout == b"", (
        "nothing of the group is left"
    )
