"""The confirmation's reserve of the time budget, re-estimated from the search's trials as they report
(tuner.confirm.ConfirmReserve), and the Ray Tune stopper that ends the search by it (tuner.search)."""

from __future__ import annotations

import pickle
import time

import pytest
from ray.tune.search import Searcher

from tuner.confirm import (
    RESERVE_MARGIN,
    ConfirmCost,
    ConfirmReserve,
    TrialTiming,
    active_reserve,
    remeasurement_s,
    set_active_reserve,
)
from tuner.search import ReserveGate, ReserveStopper

BASELINE = {"max_num_seqs": 256, "num_replicas": 1}


def _step(wall: float, capacity: float, *, start: float = 40.0, params=None, done: bool = True) -> dict:
    return {
        "step_wall_s": wall,
        "engine_start_s": start,
        "capacity_rps_per_accel": capacity,
        "config": params or {"max_num_seqs": 16, "num_replicas": 1},
        "done": done,
    }


def test_a_remeasurement_costs_a_start_three_steps_and_a_teardown_of_the_configs_it_will_measure():
    base = TrialTiming(30.0, [10.0, 14.0, 12.0, 12.0], 5.0, baseline=True, done=True)
    best = TrialTiming(40.0, [20.0] * 4, 9.0, done=True)
    second = TrialTiming(50.0, [30.0] * 4, 8.0, done=True)
    failed = TrialTiming(60.0, [90.0] * 4, 0.0, done=True)  # passed nothing: never a finalist, not measured
    running = TrialTiming(20.0, [5.0], 99.0)  # one step in, still running: its first step carries the warm-up
    timings = [base, best, second, failed, running]
    one = remeasurement_s(timings, 1, reference_step=False, teardown_s=5.0)
    assert one == pytest.approx(((30 + 5 + 3 * 12) + (40 + 5 + 3 * 20)) / 2), "finished trials only"
    two = remeasurement_s(timings, 2, reference_step=False, teardown_s=5.0)
    assert two == pytest.approx(((30 + 5 + 36) + (40 + 5 + 60) + (50 + 5 + 90)) / 3)
    with_reference = remeasurement_s(timings, 1, reference_step=True, teardown_s=5.0)
    assert with_reference == pytest.approx(one + (12 + 20) / 2), "one step more at the reference load"
    # A trial that failed early caps its config's re-measurement at what the whole trial took.
    short = TrialTiming(30.0, [10.0], 5.0, baseline=True, done=True)
    assert remeasurement_s([short], 1, reference_step=False, teardown_s=5.0) == pytest.approx(30 + 5 + 10)
    assert remeasurement_s([TrialTiming(30.0)], 1, reference_step=False, teardown_s=5.0) is None, "no step yet"
    assert remeasurement_s([running], 1, reference_step=False, teardown_s=5.0) is None, "none finished yet"
    # Nothing passed a load yet and no baseline among them: every finished trial stands in.
    assert remeasurement_s([failed], 1, reference_step=False, teardown_s=5.0) == pytest.approx(60 + 5 + 270)


def test_under_the_majority_rule_a_remeasurement_counts_one_and_a_half_steps_more():
    """The ending failure of a warm re-measurement is measured once or twice more under majority."""
    long = TrialTiming(30.0, [10.0] * 8, 5.0, baseline=True, done=True)
    once = remeasurement_s([long], 1, reference_step=False, teardown_s=5.0)
    majority = remeasurement_s([long], 1, reference_step=False, teardown_s=5.0, failure_rule="majority")
    assert (once, majority) == (pytest.approx(30 + 5 + 3 * 10), pytest.approx(30 + 5 + 4.5 * 10))
    voting = ConfirmReserve(
        ConfirmCost(78.0, 4),
        rounds=2,
        deadline=1e9,
        finalists=1,
        baseline=BASELINE,
        reference_step=False,
        teardown_s=5.0,
        failure_rule="majority",
        progress=lambda _: None,
    )
    for _ in range(8):
        voting.observe("t1", _step(10.0, 5.0, start=30.0, params=BASELINE, done=False))
    voting.observe("t1", _step(10.0, 5.0, start=30.0, params=BASELINE))
    assert voting.cost().measurement_s == pytest.approx(30 + 5 + 4.5 * 10)

    from tuner.config import load_config
    from tuner.search import confirm_cost, prepare

    # The demo's 11-minute budget leaves the majority rule's reserve less than one trial: a longer one here.
    budget = {"budget.time_budget_s": 900}
    plain = confirm_cost(prepare(load_config(overrides=budget))).measurement_s
    voted = confirm_cost(prepare(load_config(overrides={**budget, "capacity.failure_rule": "majority"}))).measurement_s
    assert voted > plain


def _trial(reserve: ConfirmReserve, trial_id: str, wall: float, capacity: float, **kw) -> None:
    """A whole trial of three steps of `wall` seconds each, as its results arrive."""
    for i in range(3):
        reserve.observe(trial_id, _step(wall, capacity, done=i == 2, **kw))


def _reserve(deadline: float, lines: list[str], rounds: int = 2) -> ConfirmReserve:
    return ConfirmReserve(
        ConfirmCost(78.0, 2 * rounds),
        rounds=rounds,
        deadline=deadline,
        finalists=1,
        baseline=BASELINE,
        reference_step=False,
        teardown_s=5.0,
        progress=lines.append,
    )


def test_the_reserve_follows_the_trials_a_slow_host_ends_the_search_sooner():
    static = ConfirmCost(78.0, 4).reserve_s  # 390 s
    lines: list[str] = []
    slow = _reserve(1000.0, lines)
    assert slow.cost().measurement_s == 78.0 and "the config's estimate; no trial had finished" in slow.describe()
    _trial(slow, "t1", 15.0, 5.0, start=45.0, params=BASELINE)
    _trial(slow, "t2", 16.0, 7.0, start=47.0)
    measured = slow.cost().measurement_s
    assert measured == pytest.approx(((45 + 5 + 45) + (47 + 5 + 48)) / 2) and measured > 78.0
    assert slow.timings["t1"].baseline and not slow.timings["t2"].baseline
    assert slow.reserve_s() == pytest.approx(measured * 4 * RESERVE_MARGIN)
    assert not slow.should_stop(now=1000.0 - measured * 4 * RESERVE_MARGIN - 1)
    assert slow.should_stop(now=1000.0 - static), "at the static line the re-estimated reserve no longer fits"
    assert lines and "search ended with 6.5 min of the budget left for the confirmation (8.1 min held" in lines[0]
    assert "re-estimated from the 2 trial(s) that finished; the config's estimate 78s" in lines[0]
    assert slow.should_stop(now=0.0) and len(lines) == 1, "once ended, it stays ended and says so once"

    # A faster host than the config's estimate: the config's reserve stands (more rounds may then fit).
    fast = _reserve(1000.0, [])
    _trial(fast, "t1", 5.0, 5.0, start=20.0, params=BASELINE)
    _trial(fast, "t2", 5.0, 9.0, start=20.0)
    assert fast.cost().measurement_s < 78.0 and fast.reserve_s() == static
    assert not fast.should_stop(now=1000.0 - static - 1) and fast.should_stop(now=1000.0 - static)


def test_rounds_beyond_the_useful_three_are_held_at_the_configs_estimate_not_at_the_measured_cost():
    """5 planned rounds: the reserve holds 3 of them at the measured cost when that is more than all 5 at the
    config's estimate, never all 5 at the measured cost (which left the search too few trials, replayed)."""
    reserve = _reserve(10_000.0, [], rounds=5)
    static = reserve.static.reserve_s  # 10 x 78 s x 1.25 = 975 s
    _trial(reserve, "t1", 15.0, 5.0, start=45.0, params=BASELINE)
    _trial(reserve, "t2", 16.0, 7.0, start=47.0)
    measured = reserve.cost().measurement_s  # 97.5 s
    assert reserve.reserve_s() == static, "3 rounds at 97.5 s (731 s) are less than the config's 975 s"
    _trial(reserve, "t1", 60.0, 5.0, start=45.0, params=BASELINE)  # steps of a minute: much slower
    _trial(reserve, "t2", 60.0, 7.0, start=47.0)
    measured = reserve.cost().measurement_s
    assert measured > 130 and reserve.reserve_s() == pytest.approx(6 * measured * RESERVE_MARGIN)
    assert reserve.reserve_s() > static


def test_the_reserve_is_held_only_once_there_is_a_finalist_to_spend_it_on():
    lines: list[str] = []
    reserve = _reserve(1000.0, lines)
    reserve.observe("t1", _step(15.0, 5.0, params=BASELINE))
    reserve.observe("t2", _step(15.0, 0.0))  # failed its first step: nothing to confirm against the baseline
    assert not reserve.should_stop(now=900.0), "the baseline alone: the search keeps the budget"
    assert reserve.should_stop(now=1000.0), "no time left at all"
    assert "0.0 min of the budget left" in lines[0]
    reserve.ended = None
    reserve.observe("t2", _step(15.0, 6.0))
    assert reserve.should_stop(now=900.0)


def test_the_stopper_feeds_the_running_searchs_reserve_and_survives_ray_tunes_pickling():
    stopper = pickle.loads(pickle.dumps(ReserveStopper()))
    assert not stopper("t1", _step(15.0, 5.0)) and not stopper.stop_all(), "no search running: never stops"
    lines: list[str] = []
    reserve = _reserve(0.0, lines)  # the budget is spent
    set_active_reserve(reserve)
    try:
        assert active_reserve() is reserve
        assert stopper("t1", {"training_iteration": 1}) is False and not reserve.timings, "not a load step"
        assert stopper("t1", _step(15.0, 5.0)) is False and reserve.timings["t1"].walls == [15.0]
        assert stopper.stop_all() and lines
    finally:
        set_active_reserve(None)
    assert active_reserve() is None


def test_a_round_holds_only_the_finalists_found_so_far():
    """2 finalists planned, 1 found: a round is 2 measurements, not 3 (the confirmation measures no more)."""
    reserve = ConfirmReserve(
        ConfirmCost(78.0, 3 * 3), rounds=3, deadline=10_000.0, finalists=2, baseline=BASELINE,
        reference_step=False, teardown_s=5.0, progress=lambda line: None,
    )  # fmt: skip
    _trial(reserve, "t1", 15.0, 5.0, start=45.0, params=BASELINE)
    _trial(reserve, "t2", 15.0, 7.0, start=45.0)
    assert reserve.reserve_s() == pytest.approx(2 * 3 * 95.0 * RESERVE_MARGIN)
    _trial(reserve, "t3", 15.0, 6.0, start=45.0, params={"max_num_seqs": 64, "num_replicas": 1})
    assert reserve.reserve_s() == pytest.approx(3 * 3 * 95.0 * RESERVE_MARGIN)
    _trial(reserve, "t4", 15.0, 8.0, start=45.0, params={"max_num_seqs": 8, "num_replicas": 1})
    assert reserve.reserve_s() == pytest.approx(3 * 3 * 95.0 * RESERVE_MARGIN), "at most `finalists` of them"


def test_a_resumed_search_holds_the_reserve_for_the_finalists_recorded_before_it_stopped():
    """Ray Tune does not report a resumed search's finished trials again: the reserve adopts the recorded
    rows, so a finalist found before the driver stopped is still one, with its measured times."""
    from tuner.recorded import TrialRow

    rows = [
        TrialRow("t1", "r1", "completed", params=BASELINE,
                 metrics={"capacity_rps_per_accel": 5.0, "engine_start_s": 45.0},
                 steps=({"step_wall_s": 15.0}, {"step_wall_s": 15.0})),
        TrialRow("t2", "r2", "early_stopped", params={"max_num_seqs": 16, "num_replicas": 1},
                 metrics={"capacity_rps_per_accel": 7.0, "engine_start_s": 45.0, "step_wall_s": 15.0}),
        TrialRow("t3", "r3", "infeasible", params={"max_num_seqs": 8, "num_replicas": 1}),
    ]  # fmt: skip
    reserve = _reserve(1000.0, [])
    assert reserve.stop_at() == 1000.0, "nothing adopted: no finalist, the whole budget"
    reserve.adopt(rows)
    assert set(reserve.timings) == {"t1", "t2"} and reserve.timings["t1"].baseline
    # the baseline's trial ran to its end in 2 steps (its re-measurement capped there); the interrupted one
    # is a finalist but not in the estimate (it did not finish)
    assert reserve.cost().measurement_s == pytest.approx(45 + 5 + 2 * 15)
    assert reserve.stop_at() == pytest.approx(1000.0 - reserve.reserve_s()) and reserve.reserve_s() > 0


def test_a_trial_that_ended_infeasible_after_passing_a_load_is_no_finalist():
    reserve = _reserve(1000.0, [])
    reserve.observe("t1", _step(15.0, 5.0, params=BASELINE))
    reserve.observe("t2", _step(15.0, 7.0))
    assert reserve.stop_at() < 1000.0
    reserve.observe("t2", {"trial_status": "infeasible", "status_reason": "the pool failed", "done": True})
    assert reserve.timings["t2"].capacity == 0.0 and reserve.stop_at() == 1000.0


def test_with_no_confirmation_planned_the_stopper_still_ends_the_search_at_the_budget():
    """A search begun with a confirmation and resumed with --no-confirm restores no Tune time budget: the
    reserve of nothing ends it at the budget, and says so plainly."""
    lines: list[str] = []
    reserve = ConfirmReserve(
        ConfirmCost(0.0, 0), rounds=0, deadline=100.0, finalists=1, baseline=BASELINE,
        reference_step=False, teardown_s=5.0, progress=lines.append,
    )  # fmt: skip
    reserve.observe("t2", _step(15.0, 7.0))
    assert reserve.reserve_s() == 0.0 and not reserve.should_stop(now=99.0)
    assert reserve.should_stop(now=100.0) and lines == ["search ended: the time budget is spent"]


def test_no_trial_is_started_that_could_not_report_a_load_step_before_the_search_must_end():
    lines: list[str] = []
    reserve = _reserve(1000.0, lines)
    assert reserve.first_step_s() is None and reserve.room_for_a_trial(now=999.0), "no step yet: nothing to go by"
    reserve.observe("t1", _step(20.0, 5.0, start=30.0, params=BASELINE))
    reserve.observe("t1", _step(12.0, 5.0, start=30.0, params=BASELINE))  # later steps: not a first step
    reserve.observe("t2", _step(20.0, 0.0, start=40.0, done=False))  # running, one step in: its first step counts
    assert reserve.first_step_s() == pytest.approx(5.0 + (50.0 + 60.0) / 2), "teardown, engine start, first step"
    # No finalist yet (t2 passed nothing): the search may run to the deadline.
    assert reserve.room_for_a_trial(now=1000.0 - 60.0)
    assert not lines and reserve.closed is None
    assert not reserve.room_for_a_trial(now=1000.0 - 59.0)
    assert lines == [
        "no new trial: one would report its first load step about 60s after it starts (as the trials so far "
        "measured), and the time budget ends in 59s"
    ]
    assert not reserve.room_for_a_trial(now=0.0) and len(lines) == 1, "closed once, said once"
    assert not reserve.should_stop(now=1000.0 - 59.0), "a trial still running is not ended by it"

    # With a finalist, the line is the reserve's.
    lines.clear()
    held = _reserve(1000.0, lines)
    held.observe("t1", _step(20.0, 5.0, start=30.0, params=BASELINE))
    held.observe("t2", _step(20.0, 6.0, start=30.0))
    stop_at = held.stop_at()
    assert stop_at < 1000.0 - 55.0
    assert held.room_for_a_trial(now=stop_at - 55.0) and not held.room_for_a_trial(now=stop_at - 54.0)
    assert "the search ends for the confirmation's reserve" in lines[0] and lines[0].endswith("in 54s")


class _Counting(Searcher):
    """A searcher that suggests {"n": 1}, {"n": 2}, ... and counts how often it was asked."""

    def __init__(self) -> None:
        super().__init__(metric="capacity_rps_per_accel", mode="max")
        self.asked = 0

    def suggest(self, trial_id: str) -> dict | None:
        self.asked += 1
        return {"n": self.asked}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass


def test_the_gate_finishes_the_searcher_when_no_trial_fits_and_keeps_the_concurrency_limit():
    gate = pickle.loads(pickle.dumps(ReserveGate(_Counting(), max_concurrent=1)))
    inner = gate.searcher
    assert gate.suggest("a") == {"n": 1}, "no search running in this process: no reserve, no gate"
    lines: list[str] = []
    reserve = _reserve(1000.0, lines)
    reserve.observe("a", _step(20.0, 5.0, start=30.0, params=BASELINE))  # a trial's first step takes 55 s
    set_active_reserve(reserve)
    try:
        # Trial a is running: no suggestion, and no judgement yet (a may still change the reserve).
        assert gate.suggest("b") is None and inner.asked == 1 and reserve.closed is None
        gate.on_trial_complete("a", result={})
        reserve.deadline = time.monotonic() + 1000.0
        assert gate.suggest("b") == {"n": 2}, "time for a first step: a new trial"
        gate.on_trial_complete("b", result={})
        reserve.deadline = time.monotonic() + 50.0  # less than a first step takes
        assert gate.suggest("c") == Searcher.FINISHED and inner.asked == 2, "the searcher is not even asked"
        assert reserve.closed is not None and lines == [reserve.closed]
    finally:
        set_active_reserve(None)
