"""benchmarks/confirmation.py: the equal-engine-time replay of the search with and without confirmation,
on a synthetic grid table whose truth is known (no engine is started)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest
from benchmark_modules import load

search_cost = load("search_cost")
confirmation = load("confirmation")
REF = 5.3
BASELINE = {"max_num_seqs": 96, "max_num_batched_tokens": 2048, "num_replicas": 1}


def _entry(params: dict, capacity: float, rng: random.Random) -> dict:
    """A recorded trial whose breaking point is `capacity`: climb 1x, 2x, 4x, ... until a step fails; the
    failing step stands for the refinement too (its capacity is the refined bracket's lower end)."""
    steps, t, passed, factor, step = [], 0.0, 0.0, 1.0, 1
    while True:
        rps = REF * factor
        wall = 11.0 + rng.random()
        t += wall
        ok = rps <= capacity
        passed = rps if ok else passed
        steps.append(
            {
                "load_step": step,
                "load_factor": factor,
                "phase": "climb",
                "slo_headroom": capacity / rps,
                search_cost.METRIC: passed,
                "capacity_hi_rps_per_accel": None if ok else rps,
                "num_accelerators": params["num_replicas"],
                "ref_ttft_p95_s": 0.1,
                "step_wall_s": wall,
                "t_end_s": 30.0 + t,
            }
        )
        if not ok or factor >= 16:
            break
        factor, step = factor * 2, step + 1
    last = steps[-1]
    if last["capacity_hi_rps_per_accel"] is not None:  # refined: a bracket 10% wide around the breaking point
        last[search_cost.METRIC], last["capacity_hi_rps_per_accel"] = capacity * 0.95, capacity * 1.05
    return {
        "params": params,
        "start_s": 30.0,
        "steps": steps,
        "teardown_s": 3.0,
        "wall_s": last["t_end_s"] + 3.0,
        search_cost.METRIC: last[search_cost.METRIC],
        "capacity_hi_rps_per_accel": last["capacity_hi_rps_per_accel"],
    }


def _table(tmp_path: Path, truth) -> Path:
    setup = search_cost._setup()
    names = list(setup.space.tunable)
    rng = random.Random(7)
    configs = {}
    for point in search_cost.grid_points(setup.space):
        mean = truth(point)
        # repeats whose bracket moves with the noise: each repeat's breaking point x lognormal(0, 5%)
        repeats = [_entry(point, mean * rng.lognormvariate(0, 0.05), rng) for _ in range(3)]
        configs[search_cost.key(point, names)] = {"params": point, "repeats": repeats}
    meta = {
        "config": search_cost.CONFIG.read_text(),
        "space": search_cost.SPACE.read_text(),
        "workload": "bundled",
        "tunable": names,
    }
    (tmp_path / "search_cost_grid_bundled.json").write_text(json.dumps({"meta": meta, "configs": configs}))
    return tmp_path


def _args(grid_dir: Path, **kw) -> argparse.Namespace:
    base = dict(workload="bundled", grid_dir=grid_dir, seeds=6, budgets_min=[30], finalists=[1], rounds=[3])
    return argparse.Namespace(**{**base, "max_trials": 96, "measurement_s": 70.0, **kw})


def test_within_cuts_the_running_trial_at_its_last_step_that_ended_in_time():
    rng = random.Random(1)
    entry = _entry({**BASELINE}, 30.0, rng)  # passes 5.3, 10.6, 21.2; fails 42.4 (refined: 28.5)
    e = search_cost.Evaluation(0, entry["params"], entry, entry[search_cost.METRIC], entry["wall_s"], 4)
    budget = entry["wall_s"] + entry["steps"][1]["t_end_s"] + 1
    ran, spent = confirmation.within([e, e], budget)
    assert spent == pytest.approx(budget)
    assert [round(r.value, 1) for r in ran] == [28.5, 10.6], "the cut trial keeps its second step's capacity"
    rows = [confirmation.row(r) for r in ran]
    assert [r.status for r in rows] == ["completed", "early_stopped"]
    ran, spent = confirmation.within([e, e], entry["wall_s"] + 5)  # the 2nd trial ends no step: nothing kept
    assert len(ran) == 1 and spent == pytest.approx(entry["wall_s"] + 5)


def _reserve(estimate_s: float, deadline: float):
    from tuner.confirm import ConfirmCost, ConfirmReserve

    return ConfirmReserve(
        ConfirmCost(estimate_s, 4),
        rounds=2,
        deadline=deadline,
        finalists=1,
        baseline=BASELINE,
        reference_step=False,
        teardown_s=5.0,
        progress=lambda line: None,
    )


def test_within_reserve_ends_the_search_where_the_re_estimated_reserve_needs_the_time_left():
    rng = random.Random(1)
    base = _entry({**BASELINE}, 30.0, rng)  # 4 steps: passes 5.3, 10.6, 21.2; fails 42.4
    other = _entry({**BASELINE, "max_num_seqs": 8}, 30.0, rng)
    trials = [
        search_cost.Evaluation(i, e["params"], e, e[search_cost.METRIC], e["wall_s"], 4)
        for i, e in enumerate([base, other, other])
    ]
    # The baseline alone holds nothing back; the second trial's first pass makes it a finalist, and the
    # re-estimate (start 30 + teardown 5 + 3 steps of about 11.5 s: about 70 s, x 4 x 1.25 = 350 s) then
    # needs more than the 300 s budget: the search ends at once, keeping that first step.
    ran, spent = confirmation.within_reserve(trials, _reserve(40.0, 300.0))
    assert [r.whole for r in ran] == [True, False] and ran[1].step is other["steps"][0]
    assert spent == pytest.approx(base["wall_s"] + other["steps"][0]["t_end_s"])
    # With room for them, three trials run whole (about 79 s each); the fourth is cut where the line falls,
    # before its first step ends: its time is spent, and it reports nothing.
    reserve = _reserve(40.0, 600.0)
    ran, spent = confirmation.within_reserve(trials + trials[1:], reserve)
    line = 600.0 - reserve.reserve_s()
    assert [r.whole for r in ran] == [True, True, True] and spent == pytest.approx(line)
    assert 330 < reserve.reserve_s() < 370 and spent < 600.0
    # The static rule (`within` at the budget less the config's reserve) knows nothing of the trials.
    ran, spent = confirmation.within(trials + trials[1:], 600.0 - 200.0)
    assert len(ran) == 5 and all(r.whole for r in ran) and 390 < spent <= 400.0, "all five, 80 s each"


def test_confirmation_keeps_the_baseline_when_nothing_beats_it(tmp_path):
    """Every config the baseline's equal (a flat table): the verdict must keep the baseline nearly always,
    while the search alone crowns whichever config drew the luckiest repeat; both within the budget."""
    out = confirmation.run(_args(_table(tmp_path, lambda p: 20.0)))
    cell = out["budgets_engine_min"]["30"]
    confirmed, alone = cell["1 finalist(s) x 3 rounds"], cell["search only"]
    adaptive = cell["1 finalist(s) x 3 rounds, adaptive reserve"]
    assert confirmed["baseline_picked"] >= 5 and confirmed["distinguishable"] <= 1
    assert adaptive["baseline_picked"] >= 5 and adaptive["distinguishable"] <= 1
    assert alone["baseline_picked"] <= 2
    assert confirmed["rounds_mean"] == adaptive["rounds_mean"] == 3
    # Its trials' re-measurements: start 30 s, teardown 5 s (the tool's), 3 steps of about 11.5 s.
    assert 65 < adaptive["measurement_estimate_s_mean"] < 75
    for arm in (confirmed, alone, adaptive):
        assert 0.9 * 1800 <= arm["engine_s_mean"] and arm["engine_s_max"] <= 1800 + 1e-6


def test_a_clear_winner_found_by_the_search_is_confirmed_and_a_budget_too_small_is_refused(tmp_path):
    """One config at 3x the rest: a search long enough to find it picks it, with or without confirmation,
    and the verdict displaces the baseline; a budget the confirmation's reserve (2 x 3 x 70 s, +25%) leaves no
    trial of is refused, as the tool refuses it."""

    def truth(p):
        return 60.0 if (p["max_num_seqs"], p["max_num_batched_tokens"], p["num_replicas"]) == (32, 512, 1) else 20.0

    out = confirmation.run(_args(_table(tmp_path, truth), budgets_min=[6, 45]))
    assert out["grid"]["best_set"][0]["params"]["max_num_seqs"] == 32 and len(out["grid"]["best_set"]) == 1
    long = out["budgets_engine_min"]["45"]
    for arm in ("search only", "1 finalist(s) x 3 rounds"):
        assert long[arm]["right"] >= 5, arm
    assert long["1 finalist(s) x 3 rounds"]["distinguishable"] >= 5
    assert "refused" in out["budgets_engine_min"]["6"]["1 finalist(s) x 3 rounds"]
    assert out["budgets_engine_min"]["6"]["search only"]["right"] <= long["search only"]["right"]


def test_search_cost_replay_of_grid_order_stops_at_the_best_config(tmp_path):
    """search_cost.simulate (the consumer of `evaluations`): grid order reaches the one best config at its
    place in the grid (4 x 4 x 2 points, (32, 512, 1) is the 21st), having paid for every trial before it."""

    def truth(p):
        return 60.0 if (p["max_num_seqs"], p["max_num_batched_tokens"], p["num_replicas"]) == (32, 512, 1) else 20.0

    grid_dir = _table(tmp_path, truth)
    setup = search_cost._setup()
    table = search_cost.load_table(grid_dir, "bundled", setup)
    result = search_cost.simulate(table, setup, "grid", seed=0)
    assert result["reached"] and result["trials"] == 21 and result["stopped"] == 0
    cheapest = sum(min(e["wall_s"] for e in c["repeats"]) for c in list(table.configs.values())[:21])
    assert result["engine_s"] >= cheapest
    assert search_cost.simulate(table, setup, "grid", seed=0, max_trials=20)["reached"] is False


def test_where_the_baseline_is_among_the_best_the_choice_is_made_on_reaching_another_best_config(tmp_path):
    """Every search starts with the baseline: in a table whose best set holds it, every search reaches the
    best with its first trial, so `beyond_baseline` asks for a best-set config other than the baseline."""

    def truth(p):
        point = (p["max_num_seqs"], p["max_num_batched_tokens"], p["num_replicas"])
        return {(32, 512, 1): 80.0, tuple(BASELINE.values()): 79.0}.get(point, 20.0)

    setup = search_cost._setup()
    assert search_cost.key(setup.baseline, list(setup.space.tunable)) == search_cost.key(BASELINE, list(BASELINE))
    table = search_cost.load_table(_table(tmp_path, truth), "bundled", setup)
    assert table.hit(setup.baseline) and len(table.best_set) == 2
    runs = [search_cost.simulate(table, setup, "random", seed=s) for s in range(6)]
    assert all(r["reached"] and r["trials"] == 1 for r in runs), "the baseline, first, is in the best set"
    beyond = [search_cost.simulate(table, setup, "random", seed=s, beyond_baseline=True) for s in range(6)]
    assert all(r["trials"] > 1 for r in beyond) and any(r["reached"] for r in beyond)
    # `compare` reports this too where the baseline is among the report table's best: a summary per strategy
    report = search_cost.beyond_baseline_report(
        table, setup, {}, 2, range(6), max_trials=96, strategies=("random", "grid-shuffled")
    )
    assert set(report) == {"random", "grid-shuffled"}
    assert report["random"]["median_trials"] > 1 and report["random"]["seeds"] == 6
    outside = search_cost.load_table(
        _table(tmp_path, lambda p: 80.0 if p["max_num_seqs"] == 32 else 20.0), "bundled", setup
    )
    assert not outside.hit(setup.baseline)
    assert search_cost.beyond_baseline_report(outside, setup, {}, 2, range(6), max_trials=96) == {}


def test_the_table_says_how_much_of_its_spread_follows_the_machines_speed(tmp_path):
    """A slow hour starts engines slowly and lowers every capacity measured in it: a table whose repeats
    scale with the host's speed shows a strong negative rank correlation with engine start time; one whose
    noise is the config's own shows none to speak of."""
    rng = random.Random(3)
    setup = search_cost._setup()
    names = list(setup.space.tunable)

    def table(drifting: bool) -> search_cost.Table:
        configs = {}
        for point in search_cost.grid_points(setup.space):
            repeats = []
            for _ in range(3):
                start = rng.uniform(30.0, 45.0)
                speed = 35.0 / start if drifting else rng.lognormvariate(0, 0.1)
                entry = _entry(point, 20.0 * speed, rng)
                entry["start_s"] = start
                repeats.append(entry)
            configs[search_cost.key(point, names)] = {"params": point, "repeats": repeats}
        return search_cost.Table({"meta": {"tunable": names}, "configs": configs}, tmp_path / "t.json")

    drifting, steady = table(True).drift(), table(False).drift()
    assert drifting is not None and steady is not None and drifting["trials"] == steady["trials"] == 96
    assert drifting["spearman_residual_vs_engine_start"] < -0.8 and drifting["p_value"] < 1e-6
    assert abs(steady["spearman_residual_vs_engine_start"]) < 0.3
    assert 0.05 < steady["pooled_sd_log_capacity"] < 0.2


def test_record_sets_aside_a_trial_whose_engine_start_says_the_host_ran_slow():
    entry = {"start_s": 53.6}
    assert search_cost.slow_host(entry, None) is None, "no limit given: every trial is kept"
    assert search_cost.slow_host(entry, 60.0) is None and search_cost.slow_host({"start_s": 47.0}, 47.0) is None
    assert search_cost.slow_host(entry, 47.0) == (
        "recorded while the host ran slow: engine start 53.6 s over --max-start-s 47"
    )


def test_compare_reports_on_a_table_of_another_folder_where_one_is_named(tmp_path):
    """A table of another CPU kind lives in a folder of its own (`record --grid-dir`); `compare
    --report-grid-dir` reports on it while choosing on the table in --grid-dir."""
    setup = search_cost._setup()
    for folder in ("here", "there"):
        (tmp_path / folder).mkdir()
    here = _table(tmp_path / "here", lambda p: 20.0 + p["max_num_seqs"] / 10)
    there = _table(tmp_path / "there", lambda p: 40.0 - p["max_num_seqs"] / 10)
    args = argparse.Namespace(grid_dir=here, choose_on="bundled", report_on="bundled", report_grid_dir=there)
    choose, report = search_cost.compared_tables(args, setup)
    assert choose.path.parent == here and report.path.parent == there
    assert choose.best_set != report.best_set, "the two tables are read, not one twice"
    args.report_grid_dir = None
    choose, report = search_cost.compared_tables(args, setup)
    assert report is choose


def test_a_config_measured_at_the_baselines_load_is_not_beyond_it(tmp_path):
    """Capacities are arrival rates at the planner's loads: a config that passed the baseline's load reports a
    rate a few hundredths of a percent off the baseline's (the AVX-512 tables: 14.986-14.992). That jitter
    must not make it the incumbent, or `beyond_baseline` counts a tie as a config above the defaults."""
    other = (32, 512, 1)

    def truth(p):
        return 40.0 if (p["max_num_seqs"], p["max_num_batched_tokens"], p["num_replicas"]) == other else 20.0

    grid_dir = _table(tmp_path, truth)
    path = grid_dir / "search_cost_grid_bundled.json"
    data = json.loads(path.read_text())

    def measured(point: tuple, values: list[float]) -> None:
        config = next(c for c in data["configs"].values() if tuple(c["params"].values())[:3] == point)
        for entry, value in zip(config["repeats"], values, strict=True):
            entry[search_cost.METRIC] = entry["steps"][-1][search_cost.METRIC] = value

    measured(tuple(BASELINE.values()), [40.00, 39.99, 40.01])
    measured(other, [40.02, 40.03, 40.02])  # the same load, every draw a little above every baseline's
    path.write_text(json.dumps(data))
    setup = search_cost._setup()
    table = search_cost.load_table(grid_dir, "bundled", setup)
    assert table.best_set == {
        search_cost.key(p, table.names) for p in (setup.baseline, dict(zip(BASELINE, other, strict=True)))
    }
    runs = [search_cost.simulate(table, setup, "random", seed=s, beyond_baseline=True) for s in range(4)]
    assert not any(r["reached"] for r in runs), "a tie at the baseline's load is not beyond the baseline"
    measured(other, [44.0, 44.1, 44.0])  # one load higher: beyond it
    path.write_text(json.dumps(data))
    table = search_cost.load_table(grid_dir, "bundled", setup)
    runs = [search_cost.simulate(table, setup, "random", seed=s, beyond_baseline=True) for s in range(4)]
    assert all(r["reached"] for r in runs)
    assert search_cost.above(40.5, 40.0) and not search_cost.above(40.1, 40.0) and search_cost.above(0.1, 0.0)
    assert search_cost.above(1.0, -float("inf")) and not search_cost.above(39.0, 40.0)


def test_the_replay_starts_a_round_as_the_tool_does_and_cuts_it_at_the_budget_s_end(tmp_path):
    """The replay's confirmation keeps the tool's round rule: a round starts when the time left holds
    ROUND_START_SHARE of its estimate, and one that runs past the budget is cut at its end and not counted
    (its engine time is the budget's, no more)."""
    from tuner.confirm import ROUND_START_SHARE
    from tuner.recorded import TrialRow

    setup = search_cost._setup()
    table = search_cost.load_table(_table(tmp_path, lambda p: 20.0), "bundled", setup)
    metrics = {search_cost.METRIC: 20.0, "capacity_hi_rps_per_accel": 22.0}
    rows = [
        TrialRow("t0", "", "completed", params=BASELINE, metrics=metrics),
        TrialRow("t1", "", "completed", params={**BASELINE, "max_num_seqs": 32}, metrics={**metrics}),
    ]

    def confirm(rounds: int, budget: float) -> tuple[float, int]:
        _, cost, done, _ = confirmation.confirm(
            table, rows, finalists=1, rounds=rounds, seed=3, spent=100.0, budget=100.0 + budget, estimate_s=70.0
        )
        return cost, done

    one, _ = confirm(1, 1e6)
    both, done = confirm(2, 1e6)
    second = both - one
    assert done == 2 and 0.8 < second / one < 1.25
    # Round 2 started with all but 1 s of what it takes: cut at the budget's end, not counted.
    assert confirm(2, both - 1) == (pytest.approx(both - 1), 1)
    # Round 2 started with its share of the estimate (round 1's pace) left: started, cut, not counted.
    assert confirm(2, one + ROUND_START_SHARE * one + 1) == (pytest.approx(one + ROUND_START_SHARE * one + 1), 1)
    # Less than that share left: not started; the time left is not spent.
    assert confirm(2, one + ROUND_START_SHARE * one - 1) == (pytest.approx(one), 1)
