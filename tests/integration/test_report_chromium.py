"""The report renders in headless Chromium (Debian's `chromium`) with no script error and every plot drawn."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from unit.test_export import build_store, standard_trials, trial

from tuner.report import generate_report

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=10000",
    "--window-size=1400,2600",
]


def _chromium(tmp_path: Path, page: Path, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )


class _Plots(HTMLParser):
    """The class attribute of every element whose id starts with `plot-`."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if (found.get("id") or "").startswith("plot-"):
            self.plots[str(found["id"])] = found.get("class") or ""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store")
    # Enough trials for the importance plot (report.MIN_IMPORTANCE_TRIALS).
    more = [
        trial(f"more{i:04d}", "completed", [0.6 + 0.05 * i, 1.7, 3.0], params={"max_num_seqs": 8 * (i + 2)})
        for i in range(6)
    ]
    build_store(root, "chat", standard_trials() + more)
    uri = build_store(
        root,
        "code",
        [
            trial("c1", "completed", [0.3, 0.6, 2.5]),
            trial("c2", "completed", [0.2, 0.5, 1.5], params={"max_num_seqs": 48}),
            trial("c3", "infeasible", reason="engine failed to start"),
        ],
    )
    return generate_report(uri, ["chat", "code"], root / "report").html_path


def test_report_renders_in_headless_chromium_without_script_errors(report: Path, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing, but CI installs Debian's chromium")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    rendered = _chromium(tmp_path, report, "--dump-dom")
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    console = [line for line in rendered.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not [line for line in console if "error" in line.lower() or "uncaught" in line.lower()], console

    parser = _Plots()
    parser.feed(rendered.stdout)
    expected = {
        "plot-comparison",
        "plot-pareto-0",
        "plot-curves-0",
        "plot-importance-0",
        "plot-pareto-1",
        "plot-curves-1",
    }
    assert expected <= set(parser.plots)
    assert all("js-plotly-plot" in parser.plots[p] for p in expected), parser.plots  # plotly drew each one
    assert rendered.stdout.count('class="main-svg"') >= len(expected)

    shot = tmp_path / "report.png"
    captured = _chromium(tmp_path, report, f"--screenshot={shot}")
    assert captured.returncode == 0, captured.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
