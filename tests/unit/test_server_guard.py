"""The server guard: nothing of a server's process group outlives the server or whoever started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_the_guard_ends_as_its_server_did_and_leaves_nothing(tmp_path):
    marker = tmp_path / "helper.pid"
    ends_with_3 = SERVER.replace("time.sleep(300)", "time.sleep(0.5); sys.exit(3)")
    guard = start_pinned([sys.executable, GUARD, sys.executable, "-c", ends_with_3, str(marker)], [],
                         env=dict(os.environ), stdout=subprocess.DEVNULL)
    assert guard.wait(20) == 3
    assert _gone(_wait_for_file(marker))

    marker.unlink()
    guard = start_pinned([sys.executable, GUARD, sys.executable, "-c", SERVER, str(marker)], [],
                         env=dict(os.environ), stdout=subprocess.DEVNULL)
    helper = _wait_for_file(marker)
    server = int(Path(f"/proc/{guard.pid}/task/{guard.pid}/children").read_text().split()[0])
    os.kill(server, signal.SIGKILL)  # the server is killed (out of memory, say)
    assert guard.wait(20) == -signal.SIGKILL, "the guard reports the server's own death"
    assert _gone(helper)


def test_a_guard_killed_with_its_actor_still_leaves_nothing(tmp_path):
    # Ray SIGKILLs an exiting worker's child processes: the guard itself dies without a word; the kernel
    # then hangs up its terminal, which ends the server and its helper.
    marker = tmp_path / "helper.pid"
    guard = start_pinned([sys.executable, GUARD, sys.executable, "-c", SERVER, str(marker)], [],
                         env=dict(os.environ), stdout=subprocess.DEVNULL)
    helper = _wait_for_file(marker)
    server = int(Path(f"/proc/{guard.pid}/task/{guard.pid}/children").read_text().split()[0])
    guard.kill()
    guard.wait(10)
    assert _gone(server) and _gone(helper), "the server and its helper outlived their guard"
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-g", str(guard.pid)], capture_output=True).stdout and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-g", str(guard.pid)], capture_output=True).stdout == b"", \
        "nothing of the group is left"
