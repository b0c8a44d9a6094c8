"""Unit tests of the report: what it says of a search, that its HTML is self-contained, where it goes."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_export import build_store, cli, row, standard_trials, trial

from tuner.recorded import SearchRecord, load_search
from tuner.report import (
    build_report,
    comparison_table,
    default_out_dir,
    gain_lines,
    generate_report,
    param_importance,
    summarize,
    trial_table,
)
from tuner.tracking import client_for


@pytest.fixture(scope="module")
def two_searches(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("store")
    build_store(root, "chat", standard_trials())
    return build_store(
        root,
        "code",
        [
            trial("c1", "completed", [0.3, 0.6, 2.5]),
            trial("c2", "completed", [0.2, 0.5, 1.5], params={"max_num_seqs": 48}),
            trial("c3", "infeasible", reason="engine failed to start: out of KV cache"),
        ],
        workload={"source": "/data/code.jsonl", "sha256": "ef" * 32},
        model="/models/other",
    )


@pytest.fixture(scope="module")
def rendered(two_searches: str) -> tuple[str, str]:
    client = client_for(two_searches)
    return build_report([load_search(client, "chat"), load_search(client, "code")], generated="2026-01-01 00:00")


def test_summary_finds_front_winner_baseline_and_gain(two_searches: str) -> None:
    summary = summarize(load_search(client_for(two_searches), "chat"))
    assert summary.winner.trial_id == "win00002" and summary.baseline.trial_id == "base0001"
    assert [t.trial_id for t in summary.front] == ["fast0003", "win00002"]
    assert summary.gain == pytest.approx(2.0)
    assert summary.counts == {"completed": 3, "early_stopped": 1, "infeasible": 1}
    lines = gain_lines(summary)
    assert lines[0].startswith("No confirmation phase ran: every figure below is one measurement")
    assert "x2.00 (+100%) in the search" in lines[1]
    assert any(line.startswith("TTFT p95 at the reference load: 0.4 s against 1.5 s") for line in lines)


def test_gain_when_the_baseline_passed_nothing_or_is_the_winner(tmp_path: Path) -> None:
    uri = build_store(tmp_path, "weak-base", [trial("b", "completed", [3.0]), trial("w", "completed", [0.1, 0.2, 3.0])])
    assert "fails the SLO at every load tried" in gain_lines(summarize(load_search(client_for(uri), "weak-base")))[1]
    uri = build_store(tmp_path, "best-base", [trial("b", "completed", [0.1, 0.2, 0.3]), trial("w", "completed", [3.0])])
    assert "itself the best" in gain_lines(summarize(load_search(client_for(uri), "best-base")))[1]


def test_the_confirmed_verdict_leads_and_names_the_recommended_config(tmp_path: Path) -> None:
    verdict = {
        "winner": "base0001",
        "baseline": "base0001",
        "rounds": 4,
        "text": "not distinguishable from the baseline at this noise (95% CI 0.91-1.18); vLLM's defaults are fine",
        "measurements": {
            "base0001": [{"round": 1, "capacity_rps_per_accel": 2.0, "hi_rps_per_accel": 2.2}],
            "win00002": [{"round": 1, "capacity_rps_per_accel": 2.1, "hi_rps_per_accel": None}],
        },
    }
    uri = build_store(tmp_path, "confirmed", standard_trials(), verdict=verdict)
    summary = summarize(load_search(client_for(uri), "confirmed"))
    assert summary.winner.trial_id == "base0001", "the search's highest single measurement does not win"
    lines = gain_lines(summary)
    assert lines[0].startswith("Confirmed in 4 paired rounds against the baseline")
    assert "(95% CI 0.91-1.18)" in lines[0] and lines[0].endswith("Recommended: the baseline.")
    from tuner.report import pareto_figure

    traces = {trace.name: trace for trace in pareto_figure(summary).data}
    rounds = traces["confirmation rounds (bracket each)"]
    assert len(rounds.y) == 2 and rounds.y[0] == pytest.approx((2.0 * 2.2) ** 0.5)
    assert "winner (confirmed)" in traces


def test_confirmed_latency_intervals_replace_the_one_step_comparison(tmp_path: Path) -> None:
    interval = (
        "TTFT p95 at the reference load x0.60 the baseline's (95% CI 0.50-0.72 over 3 paired rounds, lower than "
        "the baseline's)"
    )
    verdict = {
        "winner": "win00002",
        "baseline": "base0001",
        "rounds": 3,
        "text": "x2.00 the baseline's capacity (95% CI 1.60-2.50)",
        "comparisons": [
            {
                "trial_id": "win00002",
                "reference_latency": [
                    {"metric": "ref_ttft_p95_s", "pairs": 3, "ratio": 0.6, "text": interval},
                    {"metric": "ref_tpot_p95_s", "pairs": 1, "ratio": None, "text": "too few"},
                ],
            }
        ],
        "measurements": {},
    }
    uri = build_store(tmp_path, "latency", standard_trials(), verdict=verdict)
    lines = gain_lines(summarize(load_search(client_for(uri), "latency")))
    assert interval + "." in lines
    assert not any(line.startswith("TTFT p95 at the reference load:") for line in lines), "not the one-step line"
    tpot = next(line for line in lines if line.startswith("TPOT p95 at the reference load:"))
    assert "one step each in the search, no interval" in tpot, "no interval for TPOT: the one-step line says so"


def test_every_trial_is_in_the_table_with_status_and_reason(two_searches: str) -> None:
    header, rows = trial_table(summarize(load_search(client_for(two_searches), "chat")))
    by_id = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
    assert set(by_id) == {"base0001", "win00002", "fast0003", "stop0004", "dead0005"}
    assert by_id["dead0005"]["status"] == "infeasible" and by_id["dead0005"]["reason"] == "engine failed to start: KV"
    assert by_id["stop0004"]["capacity rps/accel"] == "≥ 2"  # a lower bound
    assert by_id["win00002"]["role"] == "winner, pareto" and by_id["base0001"]["role"] == "baseline"
    assert "max_num_seqs" in header and "enable_chunked_prefill" not in header  # only params that varied


def test_importance_over_enough_trials_and_a_note_otherwise(two_searches: str, tmp_path: Path) -> None:
    importance = param_importance(load_search(client_for(two_searches), "chat"), minimum=4)
    assert importance.values and set(importance.values) <= {
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "num_replicas",
    }
    assert sum(importance.values.values()) == pytest.approx(1.0)
    assert "baseline" not in importance.note
    few = param_importance(load_search(client_for(two_searches), "chat"))
    assert not few.values and "4 completed or early-stopped trial(s), at least 10 are needed" in few.note


class _Tags(HTMLParser):
    """Collects the tags of a page (script bodies are raw text to the parser, so plotly.js is skipped)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_html_is_self_contained_with_every_plot(rendered: tuple[str, str]) -> None:
    page, _ = rendered
    parser = _Tags()
    parser.feed(page)
    scripts = [attrs for tag, attrs in parser.tags if tag == "script"]
    assert page.startswith("<!DOCTYPE html>") and scripts
    assert not [a for a in scripts if a.get("src")], "every script is inline: the page works offline"
    assert not [a for tag, a in parser.tags if tag in ("link", "img", "iframe") and (a.get("href") or a.get("src"))]
    assert page.count("Plotly.newPlot") >= 5 and len(scripts) == 1 + page.count("Plotly.newPlot")
    ids = set(re.findall(r'id="(plot-[a-z0-9-]+)"', page))
    assert {
        "plot-comparison",
        "plot-pareto-0",
        "plot-curves-0",
        "plot-pareto-1",
        "plot-curves-1",
    } <= ids
    assert not {"plot-importance-0", "plot-importance-1"} & ids  # too few trials: a note instead
    assert "at least 10 are needed" in page
    assert "Pareto fronts side by side" in page and "baseline" in page and "winner (max capacity)" in page


def test_the_front_leaves_out_a_config_that_passed_the_same_load_more_slowly() -> None:
    """Two configs that passed one load (12.6399 and 12.6363 rps/accel: the arrival jitter) are a tie in
    capacity, so the one with the slower reference TTFT is dominated, not on the front by 0.03%."""
    rows = (
        row("a", "completed", 12.6399, 0.5),
        row("b", "completed", 12.6363, 0.3),
        row("c", "completed", 10.63, 0.1),
    )
    summary = summarize(SearchRecord("e", "p", "u", "ttft:p95<2s", rows))
    assert [t.trial_id for t in summary.front] == ["c", "b"]
    assert summary.winner is not None and summary.winner.trial_id == "b"


def test_markdown_has_comparison_front_gain_and_trial_tables(rendered: tuple[str, str]) -> None:
    _, markdown = rendered
    assert markdown.startswith("# vllm-tuner report: chat, code")
    for heading in (
        "## Comparison",
        "## Search chat",
        "## Search code",
        "### Pareto front",
        "### Throughput-latency curves",
        "### Parameter importance",
        "### All trials",
        "### Winner against the baseline",
    ):
        assert heading in markdown
    assert "| dead0005 |  | infeasible |" in markdown and "engine failed to start: out of KV cache" in markdown
    assert "| early_stopped |" in markdown


def test_comparison_lines_up_workloads_and_models(two_searches: str) -> None:
    client = client_for(two_searches)
    header, rows = comparison_table([summarize(load_search(client, n)) for n in ("chat", "code")])
    table = [dict(zip(header, r, strict=True)) for r in rows]
    assert [r["experiment"] for r in table] == ["chat", "code"]
    assert table[0]["workload"].startswith("chat.jsonl abab") and table[1]["model"] == "other"
    assert table[0]["gain"] == "x2.00" and table[1]["trials (completed/early-stopped/infeasible)"] == "2/0/1"


def test_generate_report_writes_both_files_and_logs_them_to_each_parent_run(two_searches: str, tmp_path: Path) -> None:
    result = generate_report(two_searches, ["chat", "code"], tmp_path / "out")
    assert result.html_path.read_text().startswith("<!DOCTYPE html>") and result.markdown_path.exists()
    client = client_for(two_searches)
    for record in result.records:
        names = {a.path for a in client.list_artifacts(record.parent_run_id)}
        assert {"report.html", "report.md"} <= names


def test_report_command(two_searches: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(),
        [
            "report",
            "--experiment",
            "chat",
            "--experiment",
            "code",
            "--tracking-uri",
            two_searches,
            "--out",
            str(tmp_path / "r"),
            "--no-log",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.html").exists() and "wrote" in result.output
    missing = CliRunner().invoke(
        cli(),
        ["report", "--experiment", "nope", "--tracking-uri", two_searches, "--out", str(tmp_path / "x")],
    )
    assert missing.exit_code == 2 and "no MLflow experiment named 'nope'" in missing.output


def test_default_out_dir_is_file_safe() -> None:
    assert default_out_dir(Path("/r"), ["a b", "c/d"]) == Path("/r/reports/a-b+c-d")


def test_capacity_text_says_what_was_measured_and_never_calls_an_unmeasured_trial_a_failure():
    """A trial the budget ended while its engine was still starting reported no step: it has no capacity,
    not 'failed the SLO at every load tried' (the progress line of a demo run said that of such a trial)."""
    from tuner.recorded import TrialRow
    from tuner.report import capacity_cell
    from tuner.tracking import capacity_text

    assert capacity_text({}, "early_stopped") == "no capacity (no load step finished)"
    assert capacity_text({"capacity_rps_per_accel": 3.0}, "infeasible") == "no capacity (infeasible)"
    failed = {"capacity_rps_per_accel": 0.0, "capacity_hi_rps_per_accel": 2.65}
    assert (
        capacity_text(failed, "completed")
        == "capacity 0: failed the SLO at every load tried (lowest failing 2.65 rps/accel)"
    )
    censored = {"capacity_rps_per_accel": 15.94, "capacity_censored": 1.0}
    assert capacity_text(censored, "completed") == "capacity >= 15.9 rps/accel (censored: no step failed)"
    bracket = {"capacity_rps_per_accel": 12.64, "capacity_hi_rps_per_accel": 15.03, "capacity_censored": 0.0}
    assert capacity_text(bracket, "early_stopped") == "capacity 12.6 rps/accel (bracket 12.6-15)"
    assert capacity_cell(TrialRow("t", "r", "early_stopped")) == "-"
    assert capacity_cell(TrialRow("t", "r", "completed", metrics=failed)) == "0 (fails at 2.65)"
    assert capacity_cell(TrialRow("t", "r", "early_stopped", metrics=bracket)).startswith("12.6 (fails at 15")
