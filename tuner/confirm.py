"""The confirmation phase: after the search, re-measure the finalists and the baseline side by side.

Each round measures every finalist and the baseline once, each on a fresh pool, in an order rotated from
round to round, so drift on a shared machine hits them alike. A measurement is a capacity search
warm-started from a bracket (its first load is the bracket's lower end, its climb factor the bracket's
width), not a new climb from the reference load: the trial's bracket in the first round, then the
latest closed bracket of that config's confirmation. Every measurement is a nested MLflow run
(`run_kind=confirm`, `confirms_trial`, `trial_status`) under the search's parent run, with every load
step's metrics at its step number, as a trial's run has them; `tuner.verdict` turns the rounds into the
verdict.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.capacity import CapacityPlan
from tuner.recorded import TrialRow
from tuner.selection import feasible_trials, highest_capacity
from tuner.space import matches_baseline
from tuner.tracking import capacity_text, close_confirm_run, log_confirm_step, open_confirm_run, step_text
from tuner.verdict import REFERENCE_LATENCIES, Measurement, Verdict, decide
from tuner.vocabulary import FEASIBLE_STATUSES, STATUS_REASON_TAG, STATUS_TAG, TrialStatus

if TYPE_CHECKING:
    from trainables.trial import TrialContext

# Measured repeatability of one capacity (coefficient of variation over repeats with a fresh engine each
# time, full settings, on the earlier machine; docs/benchmarks.md "Repeatability"): what the default number
# of rounds rests on. This machine measured a CV of 32.6% on 2026-12-03 (demo settings, its speed drifting
# by the hour): the verdict's interval takes the spread its rounds show, so it stays valid, with less power.
REPEATABILITY_CV = 0.049


def finalists(trials: Sequence[TrialRow], baseline: TrialRow | None, count: int) -> list[TrialRow]:
    """The `count` best trials under the SLO other than the baseline: highest capacity per accelerator,
    ties (the same load passed) to the lower reference TTFT p95 (`selection.highest_capacity`); trials that
    passed no load are never finalists."""
    candidates = [t for t in feasible_trials(trials) if t is not baseline]
    chosen: list[TrialRow] = []
    while candidates and len(chosen) < count:
        best = highest_capacity(candidates)
        chosen.append(best)
        candidates = [t for t in candidates if t is not best]
    return chosen


def warm_plan(
    plan: CapacityPlan,
    metrics: dict[str, float],
    reference_rps: float,
    resolution: float,
    *,
    reference_first: bool = False,
) -> CapacityPlan:
    """A capacity search that starts at the trial's capacity and climbs by its bracket's width.

    A trial whose bracket is already within `resolution` is re-measured in two steps when nothing moved
    (a pass at its capacity, a failure at its bracket's top; under the majority rule that failure is
    measured once or twice more); a censored trial starts at its lower bound
    and climbs as the search did; a trial that passed nothing starts at the search's lowest load. With
    `reference_first`, one more step at the reference load comes first, for its latencies.
    """
    capacity = metrics.get("capacity_rps_per_accel", 0.0)
    hi = metrics.get("capacity_hi_rps_per_accel")
    if capacity <= 0:
        start = plan.min_factor
        growth = plan.growth
    else:
        start = capacity / reference_rps
        growth = (hi / capacity) if hi is not None and hi > capacity else plan.growth
        growth = max(growth, 1 + resolution)
    return CapacityPlan(
        start_factor=start,
        growth=growth,
        max_factor=max(plan.max_factor, start),
        min_factor=min(plan.min_factor, start),
        resolution=resolution,
        noise=plan.noise,
        max_steps=plan.max_steps + int(reference_first),
        failure_rule=plan.failure_rule,
        reference_first=reference_first,
    )


def schedule(configs: Sequence[str], rounds: int) -> list[list[str]]:
    """The measurement order of each round: every config once, the order rotated by one each round."""
    n = len(configs)
    return [[configs[(r + i) % n] for i in range(n)] for r in range(rounds)]


# The time budget's reserve for the confirmation holds its planned measurements at this multiple of their
# estimate. At the estimate itself the last planned round hardly ever fitted: in the embedded demo (2026-12-02,
# a fresh clone) 4 measurements took 67-104 s against an estimate of 78 (mean 1.11x), so 2 of 3 rounds ran;
# replayed on the bundled search-cost table (benchmarks/confirmation.py, 100 seeds per budget) the budgets
# ran 2 of 3 rounds (2.8 once), 4 of 5, or 4.9-5.0 of 6.
RESERVE_MARGIN = 1.25

# A round is started when the time left holds this share of its estimate (its measurements at the mean of
# the confirmation's measurements so far). The budget's end is a hard one (a measurement still running then
# is stopped and its round not counted), so a round started short risks only budget time that nothing else
# would use, and when it ends in time the verdict gets its interval. In the embedded demo's recorded runs a
# second round took 0.91 (2026-12-02), 0.69, 0.79, 0.98 and 0.79 (Ice Lake, 2026-12-06) of that estimate: a first
# round can start from a trial's open bracket (the demo's finalist is often censored: the search ends at
# its first pass), later rounds from closed ones. Once it took far more (a measurement that descended: 163 s
# against 90). At the whole estimate the demo of 2026-12-06 16:05 did not start its second round, needing
# 228 s with 216 s left, and gave no interval.
ROUND_START_SHARE = 0.8


def round_starts(left_s: float, need_s: float) -> bool:
    """Whether a round estimated at `need_s` starts with `left_s` of the budget left (ROUND_START_SHARE)."""
    return need_s * ROUND_START_SHARE <= left_s


@dataclass(frozen=True)
class ConfirmCost:
    """Estimated engine seconds of one confirmation measurement, how many the rounds take, and the time
    budget's reserve for them (their estimate x RESERVE_MARGIN)."""

    measurement_s: float
    measurements: int

    @property
    def reserve_s(self) -> float:
        return self.measurement_s * self.measurements * RESERVE_MARGIN


@dataclass
class TrialTiming:
    """What one search trial's results say about the cost of re-measuring its config."""

    start_s: float = 0.0  # its pool's engine start
    walls: list[float] = field(default_factory=list)  # each load step's wall time
    capacity: float = 0.0  # the capacity it reported last (requests/s per accelerator)
    baseline: bool = False
    done: bool = False


def warm_steps(failure_rule: str) -> float:
    """Load steps of one warm-started re-measurement: a pass at the capacity, a failure at the bracket's
    top, often one more; under the majority rule that failure is measured once or twice more (1.5 on
    average when it is real)."""
    return 3.0 + (1.5 if failure_rule == "majority" else 0.0)


def remeasurement_s(
    timings: Sequence[TrialTiming],
    finalists: int,
    *,
    reference_step: bool,
    teardown_s: float,
    failure_rule: str = "once",
) -> float | None:
    """Engine seconds of one confirmation measurement as the search's finished trials measured them (None
    before any trial finished).

    A re-measurement is warm-started from the config's bracket: its engine start, about three steps (a pass
    at the capacity, a failure at the bracket's top, often one more; `warm_steps`: 1.5 more under the
    majority `failure_rule`), one more at the reference load first
    with `reference_step`, and a teardown; a step is taken at the mean wall of the trial's own steps, capped
    by the whole trial (a config that failed early re-measures as quickly). The mean is over the configs
    the confirmation will measure: the `finalists` best trials that passed a load, and the baseline. Only
    finished trials count: a trial's first step carries its warm-up (21 s against 11-14 s for the later
    ones in the demo of 2026-12-03), so a trial one step in would put a re-measurement 30% high, at the very
    moment a new finalist makes the search decide whether to stop.
    """
    reported = [t for t in timings if t.walls and t.done]
    leading = sorted((t for t in reported if t.capacity > 0 and not t.baseline), key=lambda t: -t.capacity)
    measured = leading[:finalists] + [t for t in reported if t.baseline] or reported
    if not measured:
        return None
    steps = warm_steps(failure_rule) + (1 if reference_step else 0)

    def cost(t: TrialTiming) -> float:
        return t.start_s + teardown_s + min(steps * sum(t.walls) / len(t.walls), sum(t.walls))

    return sum(cost(t) for t in measured) / len(measured)


# The fewest rounds whose interval is worth the time: on 2 pairs (1 degree of freedom) a t-interval hardly
# ever excludes 1 (0 of 400 replayed searches detected a 30% gain with 2 rounds, tests/unit/test_verdict.py).
USEFUL_ROUNDS = 3


class ConfirmReserve:
    """The time budget's reserve for the confirmation, re-estimated from the search's trials as they report.

    Until a trial has finished the reserve is the config's estimate for the planned rounds (`static`,
    tuner.search.confirm_cost). Then one measurement is taken at `remeasurement_s`, and the reserve is the
    larger of the config's and what min(planned rounds, USEFUL_ROUNDS) rounds cost at that measured rate,
    +RESERVE_MARGIN: a host or workload slower than the config suggests holds back more, so that the rounds
    an interval needs still run, while planned rounds beyond those never take the search's time for more
    than the config's estimate said (replayed on the recorded tables, holding 5 planned rounds at the
    measured cost left too few trials: docs/benchmarks.md). A round holds the baseline and the finalists
    found so far (at most `finalists`): the confirmation measures no more than there are. The search should
    end (`should_stop`) when the time left is within the reserve and some trial besides the baseline has
    passed a load (the confirmation then has a finalist to spend it on), and in any case when no time is
    left.
    """

    def __init__(
        self,
        static: ConfirmCost,
        *,
        rounds: int,
        deadline: float,
        finalists: int,
        baseline: Mapping[str, Any],
        reference_step: bool,
        teardown_s: float,
        failure_rule: str = "once",
        progress: Callable[[str], None] = print,
    ) -> None:
        self.static = static
        self.rounds = rounds
        self.deadline = deadline  # time.monotonic() at which the whole budget, confirmation included, is spent
        self.finalists = finalists
        self.baseline = dict(baseline)
        self.reference_step = reference_step
        self.teardown_s = teardown_s
        self.failure_rule = failure_rule
        self.progress = progress
        self.timings: dict[str, TrialTiming] = {}
        self.ended: str | None = None  # why the search was ended, once it was
        self.closed: str | None = None  # why no new trial is started, once none is

    def adopt(self, rows: Sequence[TrialRow]) -> None:
        """Take the trials a resumed search recorded before it stopped (Ray Tune does not report them again)."""
        for row in rows:
            if row.status not in FEASIBLE_STATUSES or row.trial_id in self.timings:
                continue
            walls = [float(s["step_wall_s"]) for s in row.steps if s.get("step_wall_s") is not None]
            if not walls and row.metrics.get("step_wall_s") is not None:
                walls = [float(row.metrics["step_wall_s"])]
            self.timings[row.trial_id] = TrialTiming(
                float(row.metrics.get("engine_start_s", 0.0) or 0.0),
                walls,
                row.capacity,
                baseline=matches_baseline(row.params, self.baseline),
                # every step's wall recorded, of a trial that ran to its end: it counts in the estimate
                done=row.status == TrialStatus.COMPLETED and len(walls) == len(row.steps) > 0,
            )

    def observe(self, trial_id: str, result: Mapping[str, Any]) -> None:
        """Take one trial result (a load step) into the estimate; a trial that ended infeasible (its pool
        failed after it had passed a load) is no finalist any more."""
        if "step_wall_s" not in result:
            if trial_id in self.timings and str(result.get(STATUS_TAG, "")) == TrialStatus.INFEASIBLE:
                self.timings[trial_id].capacity = 0.0
            return
        timing = self.timings.setdefault(
            trial_id, TrialTiming(baseline=matches_baseline(result.get("config") or {}, self.baseline))
        )
        timing.start_s = float(result.get("engine_start_s", timing.start_s))
        timing.walls.append(float(result["step_wall_s"]))
        timing.capacity = float(result.get("capacity_rps_per_accel", 0.0) or 0.0)
        timing.done = bool(result.get("done"))

    def _measured(self) -> float | None:
        return remeasurement_s(
            list(self.timings.values()),
            self.finalists,
            reference_step=self.reference_step,
            teardown_s=self.teardown_s,
            failure_rule=self.failure_rule,
        )

    def cost(self) -> ConfirmCost:
        """The confirmation's planned measurements at the current estimate of one."""
        measured = self._measured()
        return ConfirmCost(measured if measured is not None else self.static.measurement_s, self.static.measurements)

    def reserve_s(self) -> float:
        """The time held back for the confirmation (the class docstring), for the finalists there are so far."""
        measured = self._measured()
        if measured is None:
            return self.static.reserve_s
        per_round = 1 + min(self.finalists, max(self._found(), 1))
        planned = ConfirmCost(self.static.measurement_s, per_round * self.rounds).reserve_s
        useful = ConfirmCost(measured, per_round * min(self.rounds, USEFUL_ROUNDS)).reserve_s
        return max(planned, useful)

    def _found(self) -> int:
        """Trials besides the baseline that passed a load so far: the finalists there are."""
        return sum(t.capacity > 0 and not t.baseline for t in self.timings.values())

    def should_stop(self, now: float | None = None) -> bool:
        """Whether the search should end now to leave the confirmation its reserve (says why, once)."""
        if self.ended is not None:
            return True
        now = time.monotonic() if now is None else now
        if now < self.stop_at():
            return False
        self.ended = (
            f"search ended with {max(self.deadline - now, 0) / 60:.1f} min of the budget left for the "
            f"confirmation ({self.reserve_s() / 60:.1f} min held back): one measurement {self.describe()}"
            if self.static.measurements
            else "search ended: the time budget is spent"
        )
        self.progress(self.ended)
        return True

    def first_step_s(self) -> float | None:
        """Seconds from a trial's start to its first load step, as the trials so far measured them: its
        engine start and first step (warm-up included), and `teardown_s` for the pool before it to go and its
        own actor to start. None before any trial reported a step."""
        firsts = [t.start_s + t.walls[0] for t in self.timings.values() if t.walls]
        if not firsts:
            return None
        return self.teardown_s + sum(firsts) / len(firsts)

    def room_for_a_trial(self, now: float | None = None) -> bool:
        """Whether a trial started now could report a load step before the search must end (`stop_at`);
        when it could not, says so (once) and stays closed: such a trial would only be ended while its
        engine starts, and the confirmation would wait for it. Before any trial has reported a step there
        is nothing to judge by, so there is room."""
        if self.closed is not None or self.ended is not None:
            return False
        need = self.first_step_s()
        if need is None:
            return True
        now = time.monotonic() if now is None else now
        left = self.stop_at() - now
        if left >= need:
            return True
        until = (
            f"the search ends for the confirmation's reserve ({self.reserve_s() / 60:.1f} min held back)"
            if self._found() and self.static.measurements
            else "the time budget ends"
        )
        self.closed = (
            f"no new trial: one would report its first load step about {need:.0f}s after it starts (as the "
            f"trials so far measured), and {until} in {max(left, 0.0):.0f}s"
        )
        self.progress(self.closed)
        return False

    def stop_at(self) -> float:
        """When (time.monotonic()) the search should end, as the trials reported so far say: when the time left
        is the reserve once a trial besides the baseline has passed a load, else when no time is left."""
        return self.deadline - self.reserve_s() if self._found() else self.deadline

    def describe(self) -> str:
        """One measurement's estimate and where it comes from."""
        estimate = self.cost().measurement_s
        finished = sum(t.done and bool(t.walls) for t in self.timings.values())
        if not finished:
            return f"about {estimate:.0f}s (the config's estimate; no trial had finished)"
        return (
            f"about {estimate:.0f}s (re-estimated from the {finished} trial(s) that finished; the "
            f"config's estimate {self.static.measurement_s:.0f}s)"
        )


_ACTIVE: dict[str, ConfirmReserve] = {}


def active_reserve() -> ConfirmReserve | None:
    """The reserve of the search running in this process (a stopper restored by Ray Tune finds it here)."""
    return _ACTIVE.get("reserve")


def set_active_reserve(reserve: ConfirmReserve | None) -> None:
    _ACTIVE.pop("reserve", None)
    if reserve is not None:
        _ACTIVE["reserve"] = reserve


@dataclass
class ConfirmOutcome:
    """What the confirmation phase measured and decided."""

    verdict: Verdict
    measurements: dict[str, list[Measurement]]
    wall_s: float
    rounds_done: int
    notes: list[str]


# (context, params, trial id, on_step) -> the final result of one capacity search on a fresh pool; on_step,
# when given, is called with each step's result as it ends (the final one included)
Measure = Callable[["TrialContext", dict[str, Any], str, "Callable[[dict[str, Any]], None] | None"], dict[str, Any]]


def _without_unmeasured(result: dict[str, Any], reference_step: bool) -> dict[str, Any]:
    """`result` without the reference-load latencies when the measurement had no step there (they are only
    the penalty then)."""
    return result if reference_step else {k: v for k, v in result.items() if k not in REFERENCE_LATENCIES}


def _cut_note(round_: int, trial_id: str, taken: Sequence[Measurement], *, started: bool) -> str:
    """Why round `round_` is not counted: the time budget ended before or during `trial_id`'s measurement."""
    what = "during the measurement of" if started else "before the measurement of"
    kept = f"; its {len(taken)} finished measurement(s) are recorded" if taken else ""
    return f"the time budget ended {what} {trial_id} in confirmation round {round_}: the round is not counted{kept}"


@dataclass
class _Rounds:
    """What every measurement of a confirmation shares, and where each config's next one starts (the
    trial's bracket, then the latest closed one). `run_round` measures one round's configs in order."""

    context: TrialContext
    by_id: Mapping[str, TrialRow]
    measure: Measure
    resolution: float
    reference_step: bool
    deadline: float | None
    client: Any
    experiment: str
    parent_run_id: str
    progress: Callable[[str], None]
    start_from: dict[str, dict[str, float]]
    durations: list[float] = field(default_factory=list)

    def run_round(self, round_: int, order: Sequence[str]) -> tuple[list[Measurement], str]:
        """Round `round_`'s measurements, in `order`, and why the round is cut ("" when it is whole): the
        time budget ended before or during one of them."""
        taken: list[Measurement] = []
        for trial_id in order:
            outcome = self._one(round_, trial_id, taken)
            if isinstance(outcome, str):
                return taken, outcome
            taken.append(outcome)
        return taken, ""

    def _one(self, round_: int, trial_id: str, taken: Sequence[Measurement]) -> Measurement | str:
        """One measurement of `trial_id` on a fresh pool, or why the budget's end cut the round there."""
        context, client, progress = self.context, self.client, self.progress
        trial = self.by_id[trial_id]
        plan = warm_plan(
            context.plan,
            self.start_from[trial_id],
            context.reference_rps,
            self.resolution,
            reference_first=self.reference_step,
        )
        left = None if self.deadline is None else self.deadline - time.monotonic()
        if left is not None and left <= 0:
            return _cut_note(round_, trial_id, taken, started=False)
        # The budget's end is this measurement's time limit where it comes before the trials' own.
        budget_binds = left is not None and (context.trial_timeout_s is None or left < context.trial_timeout_s)
        round_context = dataclasses.replace(
            context,
            plan=plan,
            seed=context.seed + 1000 * round_,
            trial_timeout_s=left if budget_binds else context.trial_timeout_s,
        )
        run_id = (
            open_confirm_run(client, self.experiment, self.parent_run_id, trial_id, round_, dict(trial.params))
            if client is not None
            else ""
        )

        def log_step(step: dict[str, Any]) -> None:
            if step.get(STATUS_TAG) != TrialStatus.INFEASIBLE:
                progress(f"  confirm {trial_id} (round {round_}) {step_text(step)}")
            if client is not None and not step.get("done"):  # the last one is the outcome: logged below
                log_confirm_step(client, run_id, _without_unmeasured(step, self.reference_step))

        measuring = time.monotonic()
        try:
            result = self.measure(round_context, dict(trial.params), f"confirm{round_}-{trial_id}", log_step)
        except BaseException:
            if client is not None:
                reason = "the search ended during this measurement"
                close_confirm_run(client, run_id, None, TrialStatus.EARLY_STOPPED, reason)
            raise
        elapsed = time.monotonic() - measuring
        self.durations.append(elapsed)
        status = TrialStatus(str(result.get(STATUS_TAG, TrialStatus.COMPLETED)))
        if budget_binds and status == TrialStatus.INFEASIBLE and left is not None and elapsed >= left:
            note = _cut_note(round_, trial_id, taken, started=True)
            if client is not None:
                close_confirm_run(client, run_id, None, TrialStatus.EARLY_STOPPED, note)
            progress(f"  confirm {trial_id} (round {round_}): stopped at the time budget's end, round not counted")
            return note
        capacity = float(result.get("capacity_rps_per_accel", 0.0)) if status != TrialStatus.INFEASIBLE else 0.0
        hi = result.get("capacity_hi_rps_per_accel")
        result = _without_unmeasured(result, self.reference_step)
        reference = {
            k: float(result[k])
            for k in REFERENCE_LATENCIES
            if status != TrialStatus.INFEASIBLE and k in result and float(result[k]) < context.penalty_latency_s
        }
        measurement = Measurement(
            capacity,
            float(hi) if hi is not None else None,
            trial_id=trial_id,
            run_id=run_id,
            round=round_,
            reference=reference,
        )
        if measurement.capacity > 0 and measurement.hi is not None:
            self.start_from[trial_id] = {
                "capacity_rps_per_accel": capacity,
                "capacity_hi_rps_per_accel": measurement.hi,
            }
        if client is not None:
            close_confirm_run(client, run_id, result, status, str(result.get(STATUS_REASON_TAG, "")))
        progress(f"  confirm {trial_id} (round {round_}): {capacity_text(result, status)}")
        return measurement


def run_confirmation(
    *,
    context: TrialContext,
    trials: Sequence[TrialRow],
    baseline: TrialRow,
    count: int,
    rounds: int,
    resolution: float,
    measure: Measure,
    client: Any = None,
    experiment: str = "",
    parent_run_id: str = "",
    deadline: float | None = None,
    measurement_s: float = 0.0,
    reference_step: bool = False,
    progress: Callable[[str], None] = print,
) -> ConfirmOutcome:
    """Measure the finalists and the baseline in `rounds` interleaved rounds and decide the verdict.

    A round is started only if the time left before `deadline` (time.monotonic()) holds ROUND_START_SHARE
    of its estimate (each measurement at the mean so far, `measurement_s` before the first), and `deadline`
    is a hard end: a measurement still running then is stopped (its trial time limit is the time left),
    and its round, no longer paired, is recorded but not counted. With fewer than two rounds done there is
    no interval, and the verdict says so. With `reference_step`, each measurement starts at the reference
    load and carries its latencies there (the verdict's latency intervals). Each measurement is recorded as a
    nested MLflow run when `client` is given.
    """
    began = time.monotonic()
    chosen = finalists(trials, baseline, count)
    notes: list[str] = []
    by_id = {t.trial_id: t for t in [baseline, *chosen]}
    ids = [t.trial_id for t in chosen] + [baseline.trial_id]
    measured: dict[str, list[Measurement]] = {t: [] for t in ids}
    tie_key = {
        t.trial_id: (t.metrics.get("num_accelerators", 1.0), t.metrics.get("ref_ttft_p95_s", math.inf))
        for t in by_id.values()
    }
    if not chosen:
        notes.append("no trial other than the baseline passed a load step: nothing to confirm")
        return ConfirmOutcome(decide(measured, baseline.trial_id, notes=notes), measured, 0.0, 0, notes)
    done = 0
    measurer = _Rounds(
        context=context,
        by_id=by_id,
        measure=measure,
        resolution=resolution,
        reference_step=reference_step,
        deadline=deadline,
        client=client,
        experiment=experiment,
        parent_run_id=parent_run_id,
        progress=progress,
        start_from={t: dict(by_id[t].metrics) for t in ids},
    )
    for index, order in enumerate(schedule(ids, rounds)):
        durations = measurer.durations
        each_s = sum(durations) / len(durations) if durations else measurement_s
        now = time.monotonic()
        need = each_s * len(order)
        if deadline is not None and not round_starts(deadline - now, need):
            notes.append(
                f"the time budget allowed {done} of {rounds} confirmation rounds (a round of {len(order)} "
                f"measurements takes about {need / 60:.1f} min at {each_s:.0f}s each; "
                f"{max(deadline - now, 0.0) / 60:.1f} min were left)"
            )
            break
        short = (
            f" (about {need / 60:.1f} min at {each_s:.0f}s a measurement, {(deadline - now) / 60:.1f} min left: "
            "stopped at the time budget's end if it runs over)"
            if deadline is not None and now + need > deadline
            else ""
        )
        progress(f"confirmation round {index + 1}/{rounds}: {', '.join(order)}{short}")
        taken, cut = measurer.run_round(index + 1, order)
        if cut:  # the budget ended within this round: its measurements are recorded, the round not counted
            notes.append(cut)
            break
        for measurement in taken:
            measured[measurement.trial_id].append(measurement)
        done += 1
    # Fewer than 2 rounds done: the notes above say why (the budget; 1 round is not a valid setting), and
    # the verdict's text carries them.
    verdict = decide(
        measured, baseline.trial_id, tie_key=tie_key, notes=notes, baseline_feasible=bool(feasible_trials([baseline]))
    )
    return ConfirmOutcome(verdict, measured, time.monotonic() - began, done, notes)
