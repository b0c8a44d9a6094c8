"""A pytest plugin: the run's exit code is its tests' verdict, not how the interpreter tears down afterwards.

The integration run hosts vLLM engines, Ray drivers and their event loops in one process for ~40 minutes.
CI once failed on it with exit code 139 after every test had passed (2026-12-06): a segmentation fault
after pytest's summary, while the interpreter finalised third-party native modules (CPython 3.11.7 itself
can crash there, python/cpython#113566: the repr of an asyncio future during finalisation). So once the
session is over and reported, the exit handlers run (Ray's shutdown, multiprocessing's reaping of its
children, logging's flush) and the process ends with the session's status without finalising the
interpreter. A crash in a test or an exit handler still fails the run, and `python -X faulthandler`
(scripts/test.sh) prints every thread's stack when one happens.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

import pytest

_session: pytest.Session | None = None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    global _session
    _session = session
    gc.collect()  # what the tests left behind is finalised now, while every module is whole


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _session is None or hasattr(config, "workerinput"):  # no session ran, or an xdist worker: exit as usual
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(_session.exitstatus))
