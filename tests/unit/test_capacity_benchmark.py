"""benchmarks/capacity.py: single trials prepared without the search's confirmation phase, and the analysis
of a repeatability series' spread (no engine is started here)."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from benchmark_modules import load

capacity = load("capacity")


def test_the_full_settings_prepare_without_the_searchs_time_budget_check():
    """With the full settings a trial costs more than the embedded time budget leaves after the
    confirmation's reserve; `repeatability` and `fidelity` run single trials, so that check must not
    refuse them (it did: `repeatability --settings full` stopped with budget.time_budget_s's error)."""
    for name in ("full", "demo"):
        prepared = capacity._prepared(capacity._settings(name))
        assert prepared.config.confirm_rounds() == 0
    assert capacity._prepared(capacity._settings("full")).config.capacity.resolution == 0.1


def test_the_crossing_interpolates_inside_the_bracket_and_only_there():
    """The diagnostic that separates the bracket's quantisation from the runs' own spread: where headroom
    crosses 1 between the highest pass below the lowest fail and that fail."""
    # (load factor, arrival rps, passed, headroom, TTFT growth), in the order a capacity search runs them.
    loads = [
        (1.0, 5.0, True, 3.0, 0.0),
        (2.0, 10.0, True, 2.0, 0.0),
        (4.0, 20.0, False, 0.1, 0.3),
        (2.83, 14.0, True, 1.5, 0.0),
        (3.36, 16.8, False, 0.5, 0.05),
    ]
    # headroom 1.5 -> 0.5: the crossing is half-way, geometrically: 14 * (16.8 / 14) ** 0.5.
    assert capacity.crossing(14.0, loads) == pytest.approx(14.0 * 1.2**0.5)
    # Between the capacity and the lowest fail, whatever the headroom values.
    steep = [*loads[:3], (2.83, 14.0, True, 9.0, 0.0), (3.36, 16.8, False, 0.0, 0.4)]
    assert 14.0 < capacity.crossing(14.0, steep) < 16.8
    # A fail on sustainability alone (headroom still >= 1) says nothing about where: mid-bracket.
    sustained = [*loads[:4], (3.36, 16.8, False, 1.2, 0.2)]
    assert capacity.crossing(14.0, sustained) == pytest.approx(14.0 * 1.2**0.5)
    # Censored (no fail) and no pass below the lowest fail: no crossing.
    assert capacity.crossing(20.0, [row for row in loads if row[2]]) is None
    assert capacity.crossing(None, loads) is None
    assert capacity.crossing(2.0, [(1.0, 5.0, False, 0.5, 0.0), (2.0, 10.0, True, 2.0, 0.0)]) is None
    assert capacity.crossing(2.0, [(1.0, 5.0, False, 0.5, 0.0), (0.5, 2.5, True, 2.0, 0.0)]) == pytest.approx(
        2.0 * 2 ** (1 / 1.5)
    )


def test_a_series_spread_reports_the_crossings_cv_and_rank_correlations():
    def run(cap, probe, tpot):
        rows = [(2.83, cap, True, 1.5, 0.0), (3.36, cap * 1.1, False, 0.5, 0.05)]
        return {"capacity": cap, "loads": rows, "host_probe_s": probe, "ref_tpot_p50_ms": tpot, "start_s": 30}

    spread = capacity._spread([run(15.0, 0.9, 30.0), run(16.0, 0.8, 28.0), run(18.0, 0.7, 25.0)])
    assert spread["cv"] == pytest.approx(statistics.stdev([15, 16, 18]) / statistics.fmean([15, 16, 18]))
    assert spread["crossing_cv"] == pytest.approx(spread["cv"])  # every crossing the same fraction up
    # Faster host (shorter probe), faster engine (lower TPOT): higher capacity; constant start: no figure.
    assert spread["spearman_capacity_vs"] == {"host_probe_s": -1.0, "ref_tpot_p50_ms": -1.0, "start_s": None}
    # A series recorded before the probe existed gets no figure for it, not a wrong one.
    old = [{k: v for k, v in run(c, 0, 0).items() if k != "host_probe_s"} for c in (15.0, 16.0, 18.0)]
    assert capacity._spread(old)["spearman_capacity_vs"]["host_probe_s"] is None


def test_back_to_back_pairs_remove_a_drift_they_share():
    """Two slow runs then two fast ones: the capacities spread widely, each pair only by its own noise."""
    runs = [{"capacity": c, "loads": []} for c in (10.0, 10.5, 20.0, 21.0)]
    spread = capacity._spread(runs)
    assert spread["pairs"] == 2
    assert spread["sd_log"] > 0.3
    # Both pairs' ratio is 1.05; one config measured twice has expected ratio 1, so that is noise.
    assert spread["paired_sd_log"] == pytest.approx(math.log(1.05) / math.sqrt(2))
    shuffled = capacity._spread([{"capacity": c, "loads": []} for c in (10.0, 20.0, 21.0, 10.5)])
    assert shuffled["paired_sd_log"] > 0.3  # the drift falls between a pair's runs: nothing removed
    assert capacity._spread(runs[:1])["paired_sd_log"] is None  # one run is no pair


def test_the_engines_split_puts_the_spread_where_it_lives():
    """One-way random-effects split of log capacity: searches repeated on one engine (within) against
    engines' own levels (between, what a fresh engine adds)."""
    # Each engine repeats the same two values: all the spread is within an engine, none between.
    same_levels = capacity._variance_components([[10.0, 20.0], [20.0, 10.0], [10.0, 20.0]])
    assert same_levels["sd_log_between_engines"] == pytest.approx(0.0)
    assert same_levels["sd_log_within_engine"] == pytest.approx(math.log(2) / math.sqrt(2))
    assert same_levels["p_same_level"] == pytest.approx(1.0)
    # Engines at 10 and 20, each repeating within 10%: nearly all the spread is between engines.
    levels = capacity._variance_components([[10.0, 11.0], [20.0, 22.0], [10.0, 11.0], [20.0, 22.0]])
    assert levels["sd_log_within_engine"] == pytest.approx(math.log(1.1) / math.sqrt(2))
    assert levels["sd_log_between_engines"] > 5 * levels["sd_log_within_engine"]
    assert levels["p_same_level"] < 0.001


def test_pass_by_load_counts_every_search_step_at_each_load():
    runs = [
        {"loads": [(1.0, 5.0, True, 6.0, 0.0), (2.0, 10.0, True, 4.0, 0.0), (4.0, 20.0, False, 0.1, 0.2)]},
        {"loads": [(1.0, 5.0, True, 5.0, 0.0), (2.0, 10.0, False, 0.2, 0.2), (1.4142, 7.1, True, 2.5, 0.0)]},
    ]
    table = capacity.pass_by_load(runs)
    assert [row["load_factor"] for row in table] == [1.0, 1.414, 2.0, 4.0]
    assert [(row["passed"], row["steps"]) for row in table] == [(2, 2), (1, 1), (1, 2), (0, 1)]
    assert table[2]["pass_headroom"] == [4.0] and table[2]["fail_headroom"] == [0.2]
    summary = capacity._engines_summary(
        [[{"capacity": 20.0, **runs[0]}, {"capacity": 10.0, **runs[1]}], [{"capacity": 20.0, **runs[0]}] * 2]
    )
    assert summary["capacities"] == [[20.0, 10.0], [20.0, 20.0]]
    assert summary["first_search_cv"] == 0.0 and summary["cv_all"] > 0.2
    assert summary["mean_by_order"] == [20.0, 15.0] and summary["median"] == 20.0
    assert summary["pass_by_load"][-1] == {
        "load_factor": 4.0,
        "steps": 3,
        "passed": 0,
        "pass_headroom": [],
        "fail_headroom": [0.1, 0.1, 0.1],
    }


def test_the_hosts_steal_is_a_share_of_cpu_time_between_readings():
    assert capacity._steal_fraction((10, 1000), (60, 2000)) == pytest.approx(0.05)
    assert capacity._steal_fraction(None, (60, 2000)) is None
    assert capacity._steal_fraction((10, 1000), (10, 1000)) is None  # no time passed: no figure
    reading = capacity._cpu_times()  # Linux here: steal never exceeds the total
    assert reading is not None and 0 <= reading[0] <= reading[1]


def test_the_verdict_replay_draws_each_recorded_runs_breaking_point_over_its_series_median(tmp_path, monkeypatch):
    replay = load("verdict_replay")
    bracketed = [(2.0, 10.0, True, 3.0, 0.0), (4.0, 20.0, False, 0.0, 0.3)]  # crossing 10 * 2 ** (2 / 3)
    recorded = {
        "repeatability_x": {"runs": [{"capacity": c, "loads": []} for c in (10.0, 10.0, 20.0)]},
        "engines_x": {"runs": [[{"capacity": 30.0, "loads": []}, {"capacity": 10.0, "loads": bracketed}]]},
    }
    monkeypatch.setattr(replay, "CAPACITY", tmp_path / "capacity.json")
    replay.CAPACITY.write_text(json.dumps(recorded))
    # Each series centred on its own median (levels move between nights); no fail, no crossing: the capacity.
    assert replay.recorded_factors(["repeatability_x"]) == [1.0, 1.0, 2.0]
    low = 10.0 * 2 ** (2 / 3)
    middle = (30.0 + low) / 2
    assert replay.recorded_factors(["engines_x"]) == pytest.approx([30.0 / middle, low / middle])
    with pytest.raises(ValueError, match="no section 'nope'"):
        replay.recorded_factors(["nope"])


class _Scripted:
    """A random source returning scripted values, then 0.5."""

    def __init__(self, values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0) if self.values else 0.5


def _breaks_at_two(factor):  # passes below 1.9x, a coin flip at 2x, fails from 3x
    return 1.0 if factor < 1.9 else (0.5 if factor < 3 else 0.0)


def test_the_rule_replay_decides_a_load_by_its_rule():
    rules = load("capacity_rules")
    assert rules._decided("once", [False]) is False
    assert rules._decided("two_strikes", [False]) is None
    assert rules._decided("two_strikes", [False, True]) is True
    assert rules._decided("two_strikes", [False, False]) is False
    assert rules._decided("majority", [False, True]) is None
    assert rules._decided("majority", [False, True, False]) is False
    assert rules._decided("majority", [False, True, True]) is True
    assert rules._decided("majority", [False, False]) is False
    assert rules._decided("majority", [True]) is True
    # A pass measured again above a failure that then failed is one pass and one failure, in any order.
    assert rules._decided("majority", [True, False]) is None
    assert rules._decided("two_strikes", [True, False]) is True
    assert rules._decided("once", [True, False]) is False


def test_the_rule_replay_measures_the_searchs_lowest_failure_again_and_searches_on_above_it():
    """vLLM-free: the real planner with scripted draws. 1x passes, 2x fails once (0.9 > 0.5): today's
    rule refines below 2x; `majority` measures 2x again, and two passes there make it a pass, so the
    search goes on above 2x and its capacity is 2x; one more failure there confirms it."""
    rules = load("capacity_rules")
    from tuner.capacity import CapacityPlan

    plan = CapacityPlan(resolution=0.1)
    capacity, measurements = rules.search(plan, "once", _breaks_at_two, _Scripted([0.0, 0.9]))
    assert capacity == pytest.approx(2 ** (7 / 8)) and measurements == 5  # 1x, 2x, then 2^(1/2, 3/4, 7/8)
    # 1x, 2x fails; refined to 2^(7/8); 2x again: passes (0.1), then passes (0.2): search on above 2x.
    capacity, measurements = rules.search(plan, "majority", _breaks_at_two, _Scripted([0.0, 0.9, 0, 0, 0, 0.1, 0.2]))
    assert capacity == pytest.approx(2.0) and measurements > 7
    capacity, measurements = rules.search(plan, "majority", _breaks_at_two, _Scripted([0.0, 0.9, 0, 0, 0, 0.1, 0.9]))
    assert capacity == pytest.approx(2 ** (7 / 8)) and measurements == 7
    capacity, _ = rules.search(plan, "two_strikes", _breaks_at_two, _Scripted([0.0, 0.9, 0, 0, 0, 0.1]))
    assert capacity == pytest.approx(2.0)


def test_the_rule_replay_makes_pass_rates_fall_with_load_and_summarises_searches():
    rules = load("capacity_rules")
    table = [
        {"load_factor": 1.0, "steps": 10, "passed": 10},
        {"load_factor": 2.0, "steps": 10, "passed": 8},
        {"load_factor": 4.0, "steps": 10, "passed": 9},  # noise: pooled with 2x to 0.85 each
        {"load_factor": 8.0, "steps": 10, "passed": 0},
    ]
    p = rules.pass_rate(table)
    assert p(0.5) == 1.0 and p(2.0) == pytest.approx(0.85) and p(4.0) == pytest.approx(0.85)
    assert p(2**0.5) == pytest.approx(0.925) and p(16.0) == 0.0
    summary = rules.figures([10.0, 10.0, 10.0, 10.0, 10.0, 7.0, 10.0, 10.0, 10.0, 10.0], [5, 7] * 5)
    assert summary["deep"] == pytest.approx(0.1)  # 7 is below 80% of the median 10
    assert summary["cv5_within_5pct"] == pytest.approx(0.5)  # the first five agree, the second five do not
    assert summary["measurements"] == 6.0


_TREE = """
import os, time
def named(title):
    with open("/proc/self/comm", "w") as comm:
        comm.write(title)
if os.fork() == 0:
    named("VLLM::EngineCore")
    if os.fork() == 0:
        named("VLLM::Worker_TP0")
        while True:
            pass
time.sleep(120)
"""


def test_placement_finds_vllms_scheduler_and_worker_under_the_server_and_reads_their_time():
    """`placement` places the processes vLLM names VLLM::EngineCore and VLLM::Worker under the API server
    (a stand-in tree here, named as vLLM names them), and reads what their threads ran (schedstat)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    server = subprocess.Popen([sys.executable, "-c", _TREE], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        names: dict[str, int] = {}
        while time.monotonic() < deadline and len(names) < 2:
            names = {capacity._comm(pid): pid for pid in capacity._descendants(server.pid)}
            time.sleep(0.05)
        assert set(names) == {"VLLM::EngineCor", "VLLM::Worker_TP"}, names  # the kernel keeps 15 characters
        worker = names["VLLM::Worker_TP"]
        time.sleep(0.3)
        ran, waited = capacity._schedstat([worker])
        assert ran > 0.05 and waited >= 0, (ran, waited)  # the stand-in worker spins
        capacity._renice([worker], 7)
        assert os.getpriority(os.PRIO_PROCESS, worker) == 7
        assert capacity._descendants(worker) == [] and capacity._comm(10**9) == ""
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.mark.parametrize("arms", ["beside/20", "over/0", "apart", "apart/-1"])
def test_placement_refuses_an_arm_it_cannot_set_in_one_line(arms, monkeypatch, capsys):
    assert "placement: --arms WHERE/NICE" in _refused(monkeypatch, capsys, "placement", ["--arms", f"beside/15,{arms}"])


def _refused(monkeypatch, capsys, command: str, argv: list[str]) -> str:
    """What `capacity.py COMMAND ARGV` says on stderr when it exits 2 before running COMMAND (which, if
    the check is gone, fails the test instead of starting a benchmark)."""
    monkeypatch.setattr("sys.argv", ["capacity.py", command, *argv])
    monkeypatch.setattr(capacity, command, lambda args: pytest.fail(f"{command} ran with {argv}"))
    with pytest.raises(SystemExit) as exit_:
        capacity.main()
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_placement_says_that_raising_a_priority_needs_root(monkeypatch):
    import os

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    with pytest.raises(SystemExit, match="niceness 0 needs root"):
        capacity._renice([os.getpid()], 0)


def test_fresh_pools_close_every_pool_and_stop_ray_when_the_loop_stops_early(monkeypatch):
    """`engines`, `rules` and `placement` run their searches over `_fresh_pools`: a loop that fails half-way
    (or a pool that cannot start) still closes what it started and stops Ray."""
    import contextlib

    import trainables.trial

    events: list[str] = []

    class Runner:
        def __init__(self, context, params, factory, trial_id):
            self.trial_id, self.failure = trial_id, "no KV cache" if trial_id == "engine2" else None

        def start(self):
            events.append(f"start {self.trial_id}")

        def close(self):
            events.append(f"close {self.trial_id}")

    monkeypatch.setattr(trainables.trial, "TrialRunner", Runner)
    monkeypatch.setattr(trainables.trial, "driver_pool_factory", lambda context: None)
    monkeypatch.setattr(capacity, "start_local_ray", lambda: events.append("ray up"))
    monkeypatch.setattr(capacity, "stop_ray", lambda: events.append("ray down"))
    monkeypatch.setattr(capacity, "_host_probe", lambda: 0.25)

    with pytest.raises(RuntimeError), contextlib.closing(capacity._fresh_pools(None, {}, 5)) as pools:
        for engine, runner, probe in pools:
            assert probe == 0.25 and runner.trial_id == f"engine{engine}"
            if engine == 1:
                raise RuntimeError("a search failed")
    assert events == ["ray up", "start engine0", "close engine0", "start engine1", "close engine1", "ray down"]

    events.clear()
    with pytest.raises(SystemExit, match="engine 2 failed to start: no KV cache"):
        with contextlib.closing(capacity._fresh_pools(None, {}, 5)) as pools:
            assert [engine for engine, _, _ in pools] == [0, 1]
    assert events[-2:] == ["close engine2", "ray down"] and "start engine3" not in events


def test_side_by_side_gives_each_sides_spread_and_how_the_pairs_move_together():
    """The peer's repeatability beside the tool's: equal spreads that move together (a common drift)
    leave a paired ratio that does not move; a side whose capacities repeat has CV 0."""
    drift = [10.0, 12.0, 9.0, 11.0]
    row = capacity.side_by_side([v * 1.1 for v in drift], drift)
    assert row["tool_cv"] == pytest.approx(row["peer_cv"]) == pytest.approx(capacity._cv(drift))
    assert row["paired_sd_log"] == pytest.approx(0.0, abs=1e-12)
    assert row["log_ratios"] == [pytest.approx(math.log(1.1), abs=1e-4)] * 4
    apart = capacity.side_by_side([10.0, 10.0, 10.0], [9.0, 11.0, 10.0])
    assert apart["tool_cv"] == 0.0 and apart["peer_cv"] == pytest.approx(0.1)
    assert apart["paired_sd_log"] == pytest.approx(apart["peer_sd_log"])
    assert capacity.side_by_side([10.0], [9.0]) == {} and capacity.side_by_side([10.0, 9.0], [9.0]) == {}
    assert "repeatability needs 2 or more" in capacity._side_by_side_line({})


def _fidelity_section(settings, **configs):
    """A recorded fidelity section: per config, each side's capacities by repeat."""
    return {
        "settings": settings,
        "configs": {
            name: {"params": {}, **{side: [{"capacity": c} for c in caps] for side, caps in sides.items()}}
            for name, sides in configs.items()
        },
    }


def test_pooled_fidelity_pairs_each_repeat_within_its_config_and_pools_by_settings_and_serving():
    """Each repeat's tool capacity over the peer's of the same repeat and config, pooled over configs and
    sections of the same settings and serving: the geometric-mean ratio with its 95% t-interval."""
    from scipy.stats import t

    results = {
        "fidelity_full_a": _fidelity_section("full", one={"tool:openai-server": [10.0, 12.0], "peer": [10.0, 11.0]}),
        "fidelity_full_b": _fidelity_section("full", two={"tool:openai-server": [11.0, 10.0], "peer": [10.0, 10.0]}),
        "fidelity_demo": _fidelity_section(
            "demo",
            one={"tool:openai-server": [10.0, 0.0], "tool:in-process": [8.0, 8.0], "peer": [10.0, 10.0]},
        ),
        "repeatability_full": {"runs": [{"capacity": 1.0}]},
    }
    pooled = capacity.pooled_fidelity(results)
    assert set(pooled) == {
        "full settings, openai-server serving",
        "demo settings, openai-server serving",
        "demo settings, in-process serving",
    }
    full = pooled["full settings, openai-server serving"]
    logs = [0.0, math.log(12 / 11), math.log(1.1), 0.0]
    half = t.ppf(0.975, 3) * statistics.stdev(logs) / 2
    assert full["pairs"] == 4 and full["ratio"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert full["ci95"] == pytest.approx(
        [math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)]
    )
    assert full["df"] == [2, 2] and full["sd_ratio"] == pytest.approx(
        capacity.spread_ratio([[10.0, 12.0], [11.0, 10.0]], [[10.0, 11.0], [10.0, 10.0]])["sd_ratio"]
    )
    assert full["within_10pct"] is False and 0.05 < full["p"] < 1  # 1.05 on average, but 4 pairs cannot say within 10%
    # A repeat with a capacity of 0 has no ratio: one pair is left, too few for an interval.
    assert pooled["demo settings, openai-server serving"] == {"pairs": 1}
    assert "too few" in capacity._pooled_line("demo", {"pairs": 1})
    # Ratios that all agree: a point interval, outside the 10% goal when the tool reads 20% low.
    low = pooled["demo settings, in-process serving"]
    assert low["ratio"] == pytest.approx(0.8) and low["ci95"] == pytest.approx([0.8, 0.8])
    assert low["within_10pct"] is False and low["p"] == 0.0
    steady = capacity.paired_ratio([0.01, -0.01, 0.02, -0.02, 0.0, 0.01])
    assert steady["within_10pct"] is True and steady["ci95"][0] < 1 < steady["ci95"][1]
    assert "tool/peer 1.002" in capacity._pooled_line("full", steady) and "6 paired repeats" in capacity._pooled_line(
        "full", steady
    )


def test_pooled_fidelity_by_kind_keeps_each_machine_kinds_repeats_apart():
    """Pooled over kinds, one kind's slow tool run is diluted by another kind's steady pairs; by kind,
    each kind's ratio and spread stand alone, and a section recorded before the kind was gives its own row."""
    icelake = {"cpu_model": "Intel Xeon", "bf16_native": False, "cpus": 2}
    epyc = {"cpu_model": "AMD EPYC", "bf16_native": True, "cpus": 2}
    results = {
        "fidelity_demo_a": {
            **_fidelity_section("demo", one={"tool:openai-server": [5.0, 10.0], "peer": [10.0, 10.0]}),
            "machine": icelake,
        },
        "fidelity_demo_b": {
            **_fidelity_section("demo", one={"tool:openai-server": [10.0, 11.0], "peer": [10.0, 11.0]}),
            "machine": epyc,
        },
        "fidelity_demo_c": {
            **_fidelity_section("demo", two={"tool:openai-server": [9.0, 10.0], "peer": [10.0, 9.0]}),
            "machine": icelake,
        },
        "fidelity_demo": _fidelity_section("demo", one={"tool:openai-server": [8.0, 8.0], "peer": [8.0, 8.0]}),
    }
    pooled = capacity.pooled_fidelity(results, by_kind=True)
    intel = "demo settings, openai-server serving, Intel Xeon (no native bfloat16)"
    assert set(pooled) == {
        intel,
        "demo settings, openai-server serving, AMD EPYC (native bfloat16)",
        "demo settings, openai-server serving, machine kind not recorded",
    }
    logs = [math.log(0.5), 0.0, math.log(0.9), math.log(10 / 9)]
    assert pooled[intel]["pairs"] == 4 and pooled[intel]["ratio"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert pooled[intel]["sd_ratio"] == pytest.approx(
        capacity.spread_ratio([[5.0, 10.0], [9.0, 10.0]], [[10.0, 10.0], [10.0, 9.0]])["sd_ratio"]
    )
    epyc_row = pooled["demo settings, openai-server serving, AMD EPYC (native bfloat16)"]
    assert epyc_row["ratio"] == pytest.approx(1.0) and epyc_row["pairs"] == 2
    # Over all kinds the same repeats are one row, the Intel's slow run diluted by the others' pairs.
    everything = capacity.pooled_fidelity(results)["demo settings, openai-server serving"]
    assert everything["pairs"] == 8 and everything["ratio"] > pooled[intel]["ratio"]


def test_spread_ratio_pools_each_sides_spread_within_its_series_and_bounds_the_ratio():
    """Each side's SD of log capacity pooled within its series (two configs at different levels are not
    spread), the ratio tool/peer and its 95% interval from the F distribution."""
    from scipy.stats import f

    tool, peer = [[10.0, 11.0, 12.0], [20.0, 22.0]], [[10.0, 10.5, 11.0], [20.0, 21.0]]

    def pooled_variance(series):
        logs = [[math.log(v) for v in s] for s in series]
        return sum((len(s) - 1) * statistics.variance(s) for s in logs) / sum(len(s) - 1 for s in logs)

    row = capacity.spread_ratio(tool, peer)
    assert row["df"] == [3, 3] and row["tool_sd_log"] < 0.1  # the levels 10 and 20 are not spread
    assert row["tool_sd_log"] == pytest.approx(math.sqrt(pooled_variance(tool)))
    ratio = pooled_variance(tool) / pooled_variance(peer)
    assert row["sd_ratio"] == pytest.approx(math.sqrt(ratio)) and row["sd_ratio"] > 1
    assert row["sd_ratio_ci95"] == pytest.approx(
        [math.sqrt(ratio / f.ppf(0.975, 3, 3)), math.sqrt(ratio / f.ppf(0.025, 3, 3))]
    )
    assert row["sd_ratio_ci95"][0] < 1 < row["sd_ratio_ci95"][1]  # 3 degrees of freedom cannot tell
    assert "ratio 1.9" in capacity._spread_ratio_line(row) and "3 and 3 degrees" in capacity._spread_ratio_line(row)
    exact = capacity.spread_ratio(tool, [[10.0, 10.0, 10.0], [20.0, 20.0]])
    assert "sd_ratio" not in exact and exact["peer_sd_log"] == 0.0
    assert "no ratio" in capacity._spread_ratio_line(exact)
    assert capacity.spread_ratio([[10.0]], [[10.0]]) == {} and capacity._spread_ratio_line({}) == ""


def test_bootstrap_sd_ratio_resamples_each_repeat_as_a_pair_within_its_series():
    """The resampled interval of the SD ratio: repeats drawn within each series (two configs' levels are
    not spread), each repeat's tool and peer capacity together (identical sides give exactly 1)."""
    tool = [[10.0, 10.4, 9.6, 10.2, 9.8, 10.6], [20.0, 20.8, 19.2, 20.4, 19.6, 21.2]]
    peer = [[10.0, 10.2, 9.8, 10.1, 9.9, 10.3], [20.0, 20.4, 19.6, 20.2, 19.8, 20.6]]
    row = capacity.spread_ratio(tool, peer)
    low, high = row["sd_ratio_bootstrap_ci95"]
    # the tool spreads twice as much within each series; pooled flat, the levels 10 and 20 would swamp that
    assert 1.5 < low <= row["sd_ratio"] <= high < 3 and row["sd_ratio"] == pytest.approx(2.0, rel=0.05)
    assert "resampling the repeats 1." in capacity._spread_ratio_line(row)
    assert capacity.bootstrap_sd_ratio(tool, tool) == [1.0, 1.0]  # pairs kept: both sides drawn alike
    assert capacity.bootstrap_sd_ratio(tool, peer) == capacity.bootstrap_sd_ratio(tool, peer)  # seeded
    # a peer that repeats exactly in a resample makes that ratio unbounded, not an error
    steady = capacity.bootstrap_sd_ratio([[10.0, 11.0, 12.0]], [[10.0, 10.0, 10.5]])
    assert steady is not None and steady[1] == math.inf
    assert capacity.bootstrap_sd_ratio([[10.0, 10.0]], [[10.0, 10.0]]) is None  # no spread anywhere
    assert capacity.bootstrap_sd_ratio([[10.0]], [[11.0]]) is None  # no series with 2 repeats


@pytest.mark.parametrize(
    "argv", [["--configs", "defaults"], ["--configs", "vllm-defaults,"], ["--servings", "http"], ["--repeats", "0"]]
)
def test_fidelity_refuses_a_config_or_serving_it_does_not_have_in_one_line(argv, monkeypatch, capsys):
    assert "fidelity: --configs from vllm-defaults, small-batch" in _refused(monkeypatch, capsys, "fidelity", argv)


def test_fidelity_measures_only_the_configs_asked_for_each_side_in_turn(monkeypatch, tmp_path):
    """`--configs vllm-defaults --servings openai-server --repeats 2`: the tool's trial and the peer's search
    of the baseline alone, interleaved, and the side-by-side spread in the results section named by the label."""
    order, saved = [], {}

    def trial(context, params, name, on_step):
        order.append(("tool", context.serving, params["max_num_seqs"]))
        return {
            "steps": [],
            "capacity_rps_per_accel": 10.0 + len(order),
            "capacity_hi_rps_per_accel": 12.0,
            "capacity_censored": 0,
            "wall_s": 1.0,
            "start_s": 1.0,
            "status_reason": "ok",
        }

    def peer(prepared, params, work, *, seed):
        order.append(("peer", seed, params["max_num_seqs"]))
        return {"capacity": 10.0, "hi": 11.0, "reason": "ok"}

    monkeypatch.setattr(capacity, "run_trial", trial)
    monkeypatch.setattr(capacity, "peer_capacity", peer)
    monkeypatch.setattr(capacity, "start_local_ray", lambda: None)
    monkeypatch.setattr(capacity, "stop_ray", lambda: None)
    monkeypatch.setattr(capacity.time, "sleep", lambda s: None)
    monkeypatch.setattr(capacity, "_save", lambda section, payload: saved.update({section: payload}))
    monkeypatch.setattr(capacity, "_plot_fidelity", lambda rows, sides, filename: saved.update(plot=filename))
    monkeypatch.setattr(
        "sys.argv",
        [
            "capacity.py",
            "fidelity",
            "--configs",
            "vllm-defaults",
            "--servings",
            "openai-server",
            "--repeats",
            "2",
            "--settings",
            "demo",
            "--label",
            "here",
        ],
    )
    capacity.main()
    baseline = capacity._prepared().baseline["max_num_seqs"]
    assert order == [
        ("tool", "openai-server", baseline),
        ("peer", 1, baseline),
        ("tool", "openai-server", baseline),
        ("peer", 2, baseline),
    ]
    section = saved["fidelity_demo_here"]
    assert list(section["configs"]) == ["vllm-defaults"]
    row = section["verdicts"]["vllm-defaults"]["openai-server"]
    assert [r["capacity"] for r in section["configs"]["vllm-defaults"]["tool:openai-server"]] == [11.0, 13.0]
    assert row["peer_cv"] == 0.0 and row["tool_cv"] == pytest.approx(capacity._cv([11.0, 13.0]))
    assert saved["plot"] == "capacity_fidelity_demo_here.png"


def test_arms_run_side_by_side_on_each_pool_in_rotating_order_under_their_own_settings(monkeypatch):
    """`settings` (and `rules`): on every fresh pool one search per arm, each under its arm's trial context,
    the first arm rotating from pool to pool; results by arm with pool and position."""
    searched: list[tuple[int, str]] = []

    class Runner:
        def __init__(self, engine):
            self.engine, self.context = engine, None

    def pools(context, params, count):
        assert context == "ctx 20 s" and count == 3  # the pools start under the first arm's context
        yield from ((engine, Runner(engine), 0.25) for engine in range(count))

    def search(runner, on_step):
        searched.append((runner.engine, runner.context))
        capacity_ = 10.0 + runner.engine + (0.5 if runner.context == "ctx 40 s" else 0.0)
        return {
            "steps": [],
            "capacity_rps_per_accel": capacity_,
            "capacity_hi_rps_per_accel": None,
            "capacity_censored": 0,
            "wall_s": 1.0,
            "start_s": 1.0,
            "status_reason": "ok",
        }

    monkeypatch.setattr(capacity, "_fresh_pools", pools)
    monkeypatch.setattr(capacity, "_search_on", search)
    by_arm = capacity._arms_on_pools("ctx 20 s", {}, 3, {"20 s": "ctx 20 s", "40 s": "ctx 40 s"})
    assert searched == [
        (0, "ctx 20 s"),
        (0, "ctx 40 s"),
        (1, "ctx 40 s"),
        (1, "ctx 20 s"),
        (2, "ctx 20 s"),
        (2, "ctx 40 s"),
    ]
    assert [r["capacity"] for r in by_arm["40 s"]] == [10.5, 11.5, 12.5]
    assert [(r["engine"], r["position"]) for r in by_arm["40 s"]] == [(0, 1), (1, 0), (2, 1)]


@pytest.mark.parametrize(
    "arms",
    [
        ["capacity.min_window_s=40"],  # one arm: nothing to compare
        ["capacity.min_window_s=40", "capacity.min_window_s=40"],  # the same arm twice
        ["capacity.min_window_s=20", "model.max_model_len=512"],  # another engine in one arm
        ["capacity.min_window_s=20", "capacity.min_window_s"],  # no value
    ],
)
def test_settings_refuses_arms_it_cannot_compare_in_one_line(arms, monkeypatch, capsys):
    err = _refused(monkeypatch, capsys, "settings", [f"--arm={arm}" for arm in arms])
    assert "settings: at least 2 different --arm 'capacity.KEY=VALUE;...'" in err


def test_settings_names_the_arm_whose_value_the_config_refuses_before_starting_anything(monkeypatch, capsys):
    monkeypatch.setattr(
        "sys.argv", ["capacity.py", "settings", "--arm", "capacity.min_window_s=20", "--arm", "capacity.resolution=-1"]
    )
    monkeypatch.setattr(capacity, "_arms_on_pools", lambda *args: pytest.fail("started pools"))
    with pytest.raises(SystemExit) as exit_:
        capacity.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "settings: --arm 'capacity.resolution=-1'" in err and "resolution" in err.split("-1'", 1)[1]


def test_settings_measures_each_arm_under_its_own_settings_and_saves_the_series(monkeypatch):
    """Each arm's trial context carries its overrides on top of --settings (here the step length); the
    pools start under the first arm's; the section holds each arm's spread, plan and every search."""
    seen, saved = {}, {}

    def arms_on_pools(context, params, engines, arms):
        seen.update(first=context, arms=arms, engines=engines)
        run = {"capacity": 10.0, "steps": 5, "wall_s": 100.0}
        return {name: [dict(run), {**run, "capacity": 11.0}] for name in arms}

    monkeypatch.setattr(capacity, "_arms_on_pools", arms_on_pools)
    monkeypatch.setattr(capacity, "_save", lambda section, payload: saved.update({section: payload}))
    monkeypatch.setattr(
        "sys.argv",
        [
            "capacity.py",
            "settings",
            "--engines",
            "2",
            "--arm",
            "capacity.min_window_s=20",
            "--arm",
            "capacity.min_window_s=40;capacity.tail_requests=5",
            "--label",
            "here",
        ],
    )
    capacity.main()
    first, second = seen["arms"].values()
    assert seen["first"] is first and seen["engines"] == 2
    assert (first.sample.min_window_s, second.sample.min_window_s) == (20, 40)
    assert (first.sample.min_measured, second.sample.min_measured) == (
        200,
        100,
    )  # full settings' 10 tail requests, then 5
    section = saved["settings_full_here"]
    assert set(section["arms"]) == set(section["plans"]) == set(seen["arms"])
    assert section["arms"]["capacity.min_window_s=20"]["capacities"] == [10.0, 11.0]
    assert section["overrides"]["capacity.min_window_s"] == 20 and section["engines"] == 2
