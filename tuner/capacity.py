"""The capacity search of one trial: which load to measure next, and what the measured steps say.

A config's capacity is the highest load it sustains within the SLO. It is searched as load testers
do: **climb** geometrically from the start load (the reference load, or a power of `growth` below it)
until a step fails or the maximum is reached, **descend** the same way if the very first step fails,
then **refine** by geometric bisection between the highest pass and the lowest failure until the
bracket is within the resolution (or the measured noise, whichever is wider). Pass/fail near the
breaking point is noisy, so the capacity is the highest pass *below the lowest failure*, never the
maximum of noisy passes; a pass above a failure is re-measured once, and if it passes again the trial
is flagged inconsistent and its bracket widened to cover both.

With the `majority` failure rule, the failure that would end the search is measured again until two
of three measurements agree; if it then passes, the search goes on above it. Passes are believed as
they are, so a load that passes a try with probability p counts as passed with p + (1 - p) p^2: the
load where that is even passes 40% of its tries ("two strikes", 1 - (1 - p)^2, would put it at 29%, a
plain coin flip at 50%). An outvoted failure hands the end of the search to the next failure above it,
measured again in its turn: usually one or two steps more per trial, bounded only by `max_steps`. An
inconsistent bracket (a pass measured twice above a failure) ends the search as under `once`. With the
default `once`, a failing step fails its load.

Everything here is a pure function of the observations so far, so the same rule serves the trial
(`next_factor`), the export's re-judging under another SLO and the tests (`bracket`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

# Two nominal loads this close are the same load (floating-point products of the growth factor).
_SAME = 1e-6
# How a failing step counts (see the module docstring).
FAILURE_RULES = ("once", "majority")


def same_load(a: float, b: float) -> bool:
    """Whether two nominal loads are the same load (products of the growth factor differ in the last bits)."""
    return math.isclose(a, b, rel_tol=_SAME)


# Two capacities this close passed the same load. A capacity is the arrival rate its step measured (counted
# requests over the span of their sends), so trials that passed one load report rates a little apart: at most
# 0.073% in the 429 trials of the recorded search-cost tables (benchmarks/search_cost.py), while two loads of
# a capacity search lie 18.8% apart at 20% resolution and at least 0.54% apart at 1%.
SAME_CAPACITY = 0.004


def same_capacity(a: float, b: float) -> bool:
    """Whether two measured capacities are the same load passed (a tie), not one config beating another."""
    return math.isclose(a, b, rel_tol=SAME_CAPACITY)


# The trial metrics that are capacities (measured rates), with the tolerance within which a Pareto front
# (`pareto.non_dominated`'s ties) counts two of them as one load: the tie rule of `same_capacity`.
CAPACITY_TIES: dict[str, float] = dict.fromkeys(
    ("capacity_rps", "capacity_rps_per_accel", "capacity_lo_rps_per_accel", "capacity_hi_rps_per_accel"),
    SAME_CAPACITY,
)


def rule_text(failure_rule: str) -> str:
    """What a failure rule adds to a description of the search ('' for the default)."""
    return ", the ending failure measured until 2 of 3 agree" if failure_rule == "majority" else ""


class Phase(str, Enum):
    """Why a step ran at its load."""

    CLIMB = "climb"  # the same loads, in the same order, for every trial: where ASHA compares trials
    DESCEND = "descend"  # the first step failed: looking for a load that passes
    REFINE = "refine"  # bisecting the bracket
    REMEASURE = "remeasure"  # a pass above a failure, measured once more
    REFERENCE = "reference"  # the reference load first, for its latencies (a warm-started re-measurement)

    def __str__(self) -> str:
        return self.value


class Limit(str, Enum):
    """Why the capacity search stopped where it did."""

    RESOLVED = "resolved"  # bracket within the resolution
    MAX_LOAD = "max_load"  # passed the climb's maximum: capacity censored there
    MIN_LOAD = "min_load"  # failed down to the minimum: nothing passed
    INCONSISTENT = "inconsistent"  # a pass above a failure held on re-measurement: bracket widened
    MAX_STEPS = "max_steps"  # the step cap was reached before the bracket closed

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CapacityPlan:
    """The settings of a capacity search, in multiples of the reference load per accelerator."""

    start_factor: float = 1.0
    growth: float = 2.0
    max_factor: float = 16.0
    min_factor: float = 0.25
    resolution: float = 0.10
    noise: float = 0.0
    max_steps: int = 12
    failure_rule: str = "once"  # or "majority": the failure ending the search is measured until 2 of 3 agree
    reference_first: bool = False  # measure the reference load (1x) first, then search from start_factor

    def __post_init__(self) -> None:
        if not (self.growth > 1 and 0 < self.min_factor <= self.start_factor <= self.max_factor):
            raise ValueError(
                "growth > 1 and 0 < min_factor <= start_factor <= max_factor must hold, but got "
                f"growth {self.growth}, min {self.min_factor}, start {self.start_factor}, "
                f"max {self.max_factor}"
            )
        if not (self.resolution > 0 and self.noise >= 0 and self.max_steps >= 1):
            raise ValueError(
                f"resolution > 0, noise >= 0 and max_steps >= 1 must hold, but got "
                f"{self.resolution}, {self.noise}, {self.max_steps}"
            )
        if self.failure_rule not in FAILURE_RULES:
            raise ValueError(f"failure_rule must be one of {', '.join(FAILURE_RULES)}, but got {self.failure_rule!r}")

    @property
    def width(self) -> float:
        """Refinement stops once the bracket's upper end is within this fraction above its lower end."""
        return max(self.resolution, self.noise)

    @property
    def rule_text(self) -> str:
        return rule_text(self.failure_rule)

    def climb_factors(self) -> tuple[float, ...]:
        """The climb's loads: start x growth^k up to the maximum (the maximum itself if it falls between)."""
        factors = [self.start_factor]
        while factors[-1] * self.growth <= self.max_factor * (1 + _SAME):
            factors.append(factors[-1] * self.growth)
        if factors[-1] < self.max_factor * (1 - _SAME):
            factors.append(self.max_factor)
        return tuple(factors)

    def worst_case_steps(self) -> int:
        """An upper bound on the steps one trial runs: the longest climb or descent plus refinement (under
        the majority rule, the step cap)."""
        climb = len(self.climb_factors())
        descend = 1 + max(0, math.floor(math.log(self.start_factor / self.min_factor, self.growth) + _SAME))
        refine = max(0, math.ceil(math.log2(math.log(self.growth) / math.log1p(self.width)) - _SAME))
        if self.failure_rule == "majority":  # an outvoted failure hands the end on: only the cap bounds it
            return self.max_steps
        return min(self.max_steps, max(climb, descend) + refine + 1 + int(self.reference_first))


@dataclass(frozen=True)
class Observation:
    """One measured step: its nominal load, the arrival rate it measured per accelerator, its verdict."""

    factor: float
    rate: float
    passed: bool
    phase: Phase = Phase.CLIMB


@dataclass(frozen=True)
class Bracket:
    """What the observations say about the breaking point, in measured requests/s per accelerator.

    `capacity` is the highest passing rate below the lowest failing one (0 when nothing passed below
    it); `hi` is the lowest failing rate above the capacity (None while nothing failed: `censored`).
    `lo_factor` / `hi_factor` are the same ends as nominal loads, which is what the planner bisects.
    """

    capacity: float
    hi: float | None
    lo_factor: float | None
    hi_factor: float | None
    inconsistent: bool = False

    @property
    def censored(self) -> bool:
        return self.hi is None


@dataclass(frozen=True)
class _Load:
    """All measurements at one nominal load."""

    factor: float
    rate: float  # mean measured rate
    passes: int
    fails: int
    rule: str = "once"

    @property
    def passed(self) -> bool:
        """Once: a load passes only if every measurement of it passed. Majority: if nothing failed there
        or more measurements passed than failed."""
        return self.fails == 0 or (self.rule == "majority" and self.passes > self.fails)

    @property
    def pending(self) -> bool:
        """A failed load the rule measures again before believing it (majority: until 2 of 3 agree)."""
        return self.rule == "majority" and self.fails == 1 and self.passes <= 1


def _loads(observations: Sequence[Observation], rule: str = "once") -> list[_Load]:
    groups: dict[float, list[Observation]] = {}
    for observation in observations:
        key = next((f for f in groups if same_load(f, observation.factor)), observation.factor)
        groups.setdefault(key, []).append(observation)
    loads = [
        _Load(
            factor,
            sum(o.rate for o in group) / len(group),
            sum(o.passed for o in group),
            sum(not o.passed for o in group),
            rule,
        )
        for factor, group in groups.items()
    ]
    return sorted(loads, key=lambda load: load.factor)


def bracket(observations: Sequence[Observation], rule: str = "once") -> Bracket:
    """The bracket around the breaking point that `observations` support (see `Bracket`), a load
    passing or failing by the failure `rule`."""
    loads = _loads(observations, rule)
    failed = [load for load in loads if not load.passed]
    if not failed:
        top = loads[-1] if loads else None
        return Bracket(top.rate if top else 0.0, None, top.factor if top else None, None)
    lowest_fail = min(failed, key=lambda load: load.rate)
    below = [load for load in loads if load.passed and load.rate < lowest_fail.rate]
    above = [load for load in loads if load.passed and load.rate >= lowest_fail.rate]
    lo = max(below, key=lambda load: load.rate) if below else None
    hi = lowest_fail
    inconsistent = any(load.passes >= 2 for load in above)
    if above:
        # The breaking point lies somewhere up to the lowest failure above the highest pass (if any).
        highest_pass = max(above, key=lambda load: load.rate)
        over = [load for load in failed if load.rate > highest_pass.rate]
        if inconsistent:
            hi = min(over, key=lambda load: load.rate) if over else highest_pass
    return Bracket(
        capacity=lo.rate if lo else 0.0,
        hi=hi.rate,
        lo_factor=lo.factor if lo else None,
        hi_factor=hi.factor,
        inconsistent=inconsistent,
    )


def failed_factors(observations: Sequence[Observation], rule: str = "once") -> list[float]:
    """The nominal loads that count as failed under `rule` (under majority, a failure at a load that
    then passed twice does not)."""
    return [load.factor for load in _loads(observations, rule) if not load.passed]


def next_step(plan: CapacityPlan, observations: Sequence[Observation]) -> tuple[float, Phase] | None:
    """The next load to measure and why, or None when the search is over (`limit` says why)."""
    if len(observations) >= plan.max_steps:
        return None
    return _next(plan, observations)


def _next(plan: CapacityPlan, observations: Sequence[Observation]) -> tuple[float, Phase] | None:
    chosen = _planned(plan, observations)
    if chosen is not None or not observations:
        return chosen
    # The search would end here: on a failure the rule wants measured again, measure it again.
    current = bracket(observations, plan.failure_rule)
    if current.hi_factor is None or current.inconsistent:
        return None
    ending = next(load for load in _loads(observations, plan.failure_rule) if load.factor == current.hi_factor)
    return (ending.factor, Phase.REMEASURE) if ending.pending else None


def _planned(plan: CapacityPlan, observations: Sequence[Observation]) -> tuple[float, Phase] | None:
    if not observations:
        return (1.0, Phase.REFERENCE) if plan.reference_first else (plan.start_factor, Phase.CLIMB)
    loads = _loads(observations, plan.failure_rule)
    failed = [load for load in loads if not load.passed]
    if not failed:
        higher = [f for f in plan.climb_factors() if f > loads[-1].factor * (1 + _SAME)]
        return (higher[0], Phase.CLIMB) if higher else None
    lowest_fail = min(failed, key=lambda load: load.rate)
    above = [load for load in loads if load.passed and load.rate >= lowest_fail.rate]
    once = [load for load in above if load.passes == 1]
    if once:  # a pass above a failure: measure it once more before believing it
        return min(once, key=lambda load: load.factor).factor, Phase.REMEASURE
    if above:
        return None  # it passed again: inconsistent, the bracket is widened rather than chased
    current = bracket(observations, plan.failure_rule)
    if current.lo_factor is None:  # nothing passed: step down from the lowest load tried
        lower = loads[0].factor / plan.growth
        return (lower, Phase.DESCEND) if lower >= plan.min_factor * (1 - _SAME) else None
    assert current.hi_factor is not None
    if current.hi_factor <= current.lo_factor * (1 + plan.width) * (1 + _SAME):
        return None
    return math.sqrt(current.lo_factor * current.hi_factor), Phase.REFINE


def limit(plan: CapacityPlan, observations: Sequence[Observation]) -> Limit:
    """Why the search stops (or would stop) after `observations`."""
    if _next(plan, observations) is not None:
        return Limit.MAX_STEPS
    current = bracket(observations, plan.failure_rule)
    if current.inconsistent:
        return Limit.INCONSISTENT
    if current.censored:
        return Limit.MAX_LOAD
    if current.lo_factor is None:
        return Limit.MIN_LOAD
    return Limit.RESOLVED


def describe(current: Bracket, stop: Limit, plan: CapacityPlan, *, reference_rps: float) -> str:
    """One line on the capacity found, e.g. '13.2 rps/accel (bracket 12.6-14.1)' or '>= 85.1 (...)'."""
    if stop == Limit.MIN_LOAD or (current.capacity <= 0 and not current.censored):
        low = plan.min_factor * reference_rps
        return f"fails the SLO at every load tried (down to {plan.min_factor:g}x, {low:.3g} rps/accel)"
    if current.censored:
        why = (
            f"passed the capacity search's maximum load ({plan.max_factor:g}x)"
            if stop == Limit.MAX_LOAD
            else "stopped before any step failed"
        )
        return f">= {current.capacity:.3g} rps/accel ({why})"
    assert current.hi is not None
    text = f"{current.capacity:.3g} rps/accel (bracket {current.capacity:.3g}-{current.hi:.3g})"
    if current.inconsistent:
        text += "; inconsistent: a load above a failure passed twice, the bracket covers both"
    return text
