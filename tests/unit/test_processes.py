"""tuner.processes: the search's own processes, found by the mark in their environment, waited for."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time

from tuner import processes
from tuner.processes import OWNER_VAR, SERVER_PORTS_FROM, ephemeral_range, free_port, owned_processes, wait_for_owned


def _marked(owner: int, seconds: float) -> subprocess.Popen:
    env = {**os.environ, OWNER_VAR: str(owner)}
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], env=env)


def test_the_search_waits_for_its_own_processes_and_only_its_own():
    owner = 900_000_000 + os.getpid()  # no real pid: only the processes started here carry it
    mine, other = _marked(owner, 1.5), _marked(owner + 1, 30)
    try:
        time.sleep(0.3)
        assert owned_processes(owner) == [mine.pid]
        lines: list[str] = []
        began = time.monotonic()
        assert wait_for_owned(owner, timeout_s=20, progress=lines.append, poll_s=0.1) == []
        assert time.monotonic() - began >= 0.8, "it waited for the marked process to end"
        assert mine.poll() is not None or owned_processes(owner) == []
        assert lines == ["waiting for 1 process(es) of this search to stop (vLLM servers shutting down)"]
        assert other.poll() is None, "another search's process is not ours to wait for or kill"
    finally:
        other.kill()
        mine.kill()


def test_what_outlives_the_wait_is_killed_and_named():
    owner = 910_000_000 + os.getpid()
    stuck = _marked(owner, 60)
    try:
        time.sleep(0.3)
        lines: list[str] = []
        assert wait_for_owned(owner, timeout_s=0.5, progress=lines.append, poll_s=0.1) == [stuck.pid]
        stuck.wait(timeout=5)  # its status may be 0 where another test's SIGCHLD handling reaped it first
        assert owned_processes(owner) == [], "killed: nothing of this owner is left"
        assert lines[-1] == "killed 1 process(es) of this search still running 0.5s after Ray shut down"
    finally:
        stuck.kill()


def test_a_server_port_lies_outside_the_range_connections_draw_from_and_is_free():
    low, high = ephemeral_range()
    assert low <= high  # the kernel's file was read (or the default)
    room = low > SERVER_PORTS_FROM or high < 65535
    for _ in range(50):
        port = free_port()
        if room:
            assert SERVER_PORTS_FROM <= port < low or port > high, port  # no outgoing connection can take it
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # and it is free


def _two_free_ports() -> int:
    """A port p with p + 1 free too (p from the ephemeral range, so p + 1 may be a connection's: retried)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port < 65535:
            with socket.socket() as a, socket.socket() as b:
                try:
                    a.bind(("127.0.0.1", port))
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port


def test_a_port_in_use_is_passed_over(monkeypatch):
    busy = _two_free_ports()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", busy))
        taken.listen()
        monkeypatch.setattr(processes, "ephemeral_range", lambda: (busy + 2, 65535))
        monkeypatch.setattr(processes, "SERVER_PORTS_FROM", busy)  # two candidates: the busy port and busy + 1
        picks = {free_port() for _ in range(20)}
    assert picks == {busy + 1}


def test_seeding_random_does_not_make_two_servers_pick_alike():
    pairs = []
    for _ in range(3):
        random.seed(7)
        first = free_port()
        random.seed(7)
        pairs.append(first == free_port())
    assert not all(pairs)  # seeded alike, picked alike three times: the pick would follow `random`


def test_without_a_readable_range_everything_from_linux_default_low_is_avoided(monkeypatch):
    monkeypatch.setattr(processes, "EPHEMERAL_RANGE_FILE", "/nonexistent/ip_local_port_range")
    assert ephemeral_range() == (32768, 65535)
    assert SERVER_PORTS_FROM <= free_port() < 32768
