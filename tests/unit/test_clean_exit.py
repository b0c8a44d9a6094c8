"""The test run's exit code is its tests' verdict (tests/clean_exit.py), checked on a child pytest run whose
test module crashes the interpreter's finalisation, as the integration run once did in CI (exit code 139)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent

CHILD = """
import atexit
import ctypes
import os
from pathlib import Path


class CrashesWhenFinalised:
    def __del__(self, read=ctypes.string_at):
        read(0)  # a segmentation fault, as in a native module torn down in the wrong order


KEPT_UNTIL_THE_INTERPRETER_ENDS = CrashesWhenFinalised()
atexit.register(Path(os.environ["EXIT_HANDLER_MARK"]).write_text, "ran")


def test_passes():
    pass


def test_fails_when_asked():
    assert os.environ.get("FAIL") != "1"
"""


def _run(tmp_path: Path, *options: str, fail: bool = False) -> tuple[int, bool]:
    (tmp_path / "test_child.py").write_text(CHILD)
    mark = tmp_path / "exit-handler-ran"
    mark.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "EXIT_HANDLER_MARK": str(mark),
        "FAIL": "1" if fail else "0",
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, "test_child.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, mark.exists()


def test_a_crash_after_the_session_does_not_change_its_verdict_and_exit_handlers_still_run(tmp_path):
    # Without the plugin the child's passing run ends in the crash: the check below can fail.
    code, _ = _run(tmp_path)
    assert code == -signal.SIGSEGV
    assert _run(tmp_path, "-p", "clean_exit") == (0, True)


def test_a_failing_test_still_fails_the_run(tmp_path):
    assert _run(tmp_path, "-p", "clean_exit", fail=True) == (1, True)
