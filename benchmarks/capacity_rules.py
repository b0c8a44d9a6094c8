"""What another capacity rule would do to capacity's repeatability, replayed on recorded pass rates.

    .venv/bin/python benchmarks/capacity_rules.py   # the AVX-512 engines series: ~1 min, no engine

The `engines` series of benchmarks/capacity.py searched one config's capacity 30 times with the same
steps, seeds and samples, so each load's pass rate is measured (`pass_by_load`). From those rates
(`--sections`, pooled; made non-increasing in load with scipy's isotonic regression and interpolated
in log load between the measured loads) this replays whole capacity searches: the tool's own planner
(`tuner.capacity.next_step` and `bracket`, the plan of the full settings) chooses each load, and each
measurement at a load is an independent draw at that load's pass rate. Rules:

- `once`: today's rule: a failing step counts at once (a pass above a failure is measured again, as
  the planner already does);
- `two_strikes`: once the planner stops, the lowest failure (the end of the bracket) is measured
  again, and fails only if it fails again (load testers' rule; biased up: a load passing half the time
  counts as passed three times in four); if it passes, the search goes on above it;
- `majority`: the same, but where the second measurement passes, a third decides (two of three: a load
  passing half the time counts as passed five times in eight, the first pass being believed as it is).
  This is the planner's own `capacity.failure_rule: majority` (tuner/capacity.py), replayed as a trial
  runs it.

Only the failure that ends the search is measured again: measuring every failure again (tried in a
first replay) took 10.7 measurements per search, against about 9 for these rules and 6.6 for today's.

For each rule: the capacity's CV and SD(log), the share of searches ending below 80% of the median
(deep failures), the chance that 5 searches (the repeatability benchmark) show a CV <= 5%, and the
measurements per search (the cost; one planner step can be 1-3 measurements). The `once` row is
checked against the recorded searches' own figures: where it reproduces them, steps are close enough
to independent for the other rows to mean something. Each figure comes with a 95% interval over
`--tables` bootstrap resamples of the recorded searches (each resample's own pass table). Written to
reports/benchmarks/capacity_rules.json. A what-if for choosing the rule, not a measurement of it: a rule
chosen here still has to be measured on engines. Each run is saved under its sections and resolution
(`--resolution 0.05`: a finer bracket, the loads between the measured ones interpolated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from tuner.capacity import CapacityPlan, Observation, bracket, next_step  # noqa: E402

CAPACITY = ROOT / "reports" / "benchmarks" / "capacity.json"
RESULTS = ROOT / "reports" / "benchmarks" / "capacity_rules.json"
RULES = ("once", "two_strikes", "majority")
SECTIONS = "engines_full_avx512_bf16,engines_full_avx512_bf16_steal"
DEEP = 0.8  # a capacity below this fraction of the median is a deep failure


def pass_rate(table: Sequence[dict[str, Any]]) -> Callable[[float], float]:
    """The pass probability at any load from a pass table (`capacity.pass_by_load` rows): the measured
    rates made non-increasing in load (isotonic regression weighted by the steps), linear in log load
    between measured loads and constant beyond them."""
    factors = np.log([row["load_factor"] for row in table])
    raw = np.array([row["passed"] / row["steps"] for row in table], dtype=float)
    fitted = isotonic_regression(raw, weights=[row["steps"] for row in table], increasing=False).x
    return lambda factor: float(np.interp(math.log(factor), factors, fitted))


def _decided(rule: str, tries: Sequence[bool]) -> bool | None:
    """The verdict of a load measured `tries` times under `rule`, or None while it needs another try."""
    passes = sum(tries)
    fails = len(tries) - passes
    if rule == "once" or fails == 0:
        return fails == 0  # today's rule: a load passes only if every measurement there passed
    if fails >= 2:
        return False
    if rule == "two_strikes":
        return True if passes else None  # one failure: it fails only if it fails again
    return True if passes >= 2 else None  # majority: two of three


def search(plan: CapacityPlan, rule: str, p: Callable[[float], float], rng: Any) -> tuple[float, int]:
    """One replayed capacity search: its capacity (as a load factor) and its measurements.

    The planner runs as in a trial. Once it stops on a failure, that lowest failure is measured again
    until `rule` decides it; if it then passes, every measurement there counts as a pass and the search
    goes on above it."""
    observations: list[Observation] = []
    measurements = 0
    if rule == "majority":  # the planner's own rule
        plan = dataclasses.replace(plan, failure_rule="majority")
        while (step := next_step(plan, observations)) is not None:
            observations.append(Observation(step[0], step[0], bool(rng.random() < p(step[0])), step[1]))
        return bracket(observations, "majority").capacity, len(observations)
    while True:
        while (step := next_step(plan, observations)) is not None:
            factor, phase = step
            observations.append(Observation(factor, factor, bool(rng.random() < p(factor)), phase))
            measurements += 1
        current = bracket(observations)
        if rule == "once" or current.hi_factor is None or current.inconsistent:
            break
        lowest = current.hi_factor
        tries = [o.passed for o in observations if math.isclose(o.factor, lowest, rel_tol=1e-6)]
        while (verdict := _decided(rule, tries)) is None:
            tries.append(bool(rng.random() < p(lowest)))
            measurements += 1
        if not verdict:
            break
        observations = [
            Observation(o.factor, o.rate, True, o.phase) if math.isclose(o.factor, lowest, rel_tol=1e-6) else o
            for o in observations
        ]
    return bracket(observations).capacity, measurements


def figures(capacities: Sequence[float], measurements: Sequence[float], *, groups_of: int = 5) -> dict[str, float]:
    """CV, SD(log), deep-failure share and mean measurements of one set of searches, and the share of
    consecutive groups of `groups_of` searches whose CV is at most 5%."""
    positive = [c for c in capacities if c > 0]
    middle = statistics.median(capacities)
    groups = [capacities[i : i + groups_of] for i in range(0, len(capacities) - groups_of + 1, groups_of)]
    return {
        "cv": statistics.stdev(capacities) / statistics.fmean(capacities),
        "sd_log": statistics.stdev(math.log(c) for c in positive) if len(positive) > 1 else 0.0,
        "deep": sum(c < DEEP * middle for c in capacities) / len(capacities),
        "cv5_within_5pct": (
            sum(statistics.stdev(g) / statistics.fmean(g) <= 0.05 for g in groups) / len(groups) if groups else math.nan
        ),
        "measurements": statistics.fmean(measurements),
    }


def recorded(sections: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The recorded searches of `sections` (each engine's searches, flattened) and their pass table."""
    from capacity import pass_by_load

    results = json.loads(CAPACITY.read_text())
    runs: list[dict[str, Any]] = []
    for section in sections:
        if section not in results:
            raise ValueError(f"--sections: no section {section!r} in {CAPACITY} (have: {', '.join(results)})")
        for group in results[section]["runs"]:
            runs += group if isinstance(group, list) else [group]
    return runs, pass_by_load(runs)


def _interval(values: Sequence[float]) -> list[float]:
    return [float(v) for v in np.nanpercentile(values, [2.5, 97.5])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=SECTIONS, help=f"capacity.json engines sections (default {SECTIONS})")
    parser.add_argument("--searches", type=int, default=300, help="replayed searches per rule and table")
    parser.add_argument("--tables", type=int, default=50, help="pass-rate tables drawn for the intervals")
    parser.add_argument("--resolution", type=float, default=0.10, help="the plan's resolution (full settings 0.1)")
    parser.add_argument("--min-steps", type=int, default=5, help="loads measured fewer times are interpolated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.searches < 10 or args.tables < 2:
        parser.error("--searches must be at least 10 and --tables at least 2")
    try:
        runs, table = recorded(args.sections.split(","))
    except ValueError as error:
        parser.error(str(error))
    table = [row for row in table if row["steps"] >= args.min_steps]
    plan = CapacityPlan(resolution=args.resolution)
    reference = statistics.median(row[1] / row[0] for run in runs for row in run["loads"])
    print(
        f"{len(runs)} recorded searches, reference {reference:.3g} rps/accel; pass rates at the loads measured "
        f"at least {args.min_steps} times: "
        + ", ".join(f"{row['load_factor']:g}x {row['passed']}/{row['steps']}" for row in table),
        flush=True,
    )
    capacities = [run["capacity"] / reference for run in runs]
    seen = figures(capacities, [len(run["loads"]) for run in runs], groups_of=5)
    print(
        f"recorded: CV {seen['cv']:.1%}, SD(log) {seen['sd_log']:.3f}, deep {seen['deep']:.1%}, "
        f"5-search CV <= 5% in {seen['cv5_within_5pct']:.0%} of groups, {seen['measurements']:.2f} steps",
        flush=True,
    )
    rng = np.random.default_rng(args.seed)
    # The intervals: the recorded searches resampled with replacement, each resample's own pass table.
    from capacity import pass_by_load

    resampled = []
    for _ in range(args.tables):
        picked = [runs[i] for i in rng.integers(len(runs), size=len(runs))]
        resampled.append([row for row in pass_by_load(picked) if row["steps"] >= args.min_steps])
    rows: dict[str, Any] = {}
    for rule in RULES:
        point_p = pass_rate(table)
        caps, costs = zip(*(search(plan, rule, point_p, rng) for _ in range(args.searches * 5)), strict=True)
        point = figures(list(caps), list(costs))
        spread: dict[str, list[float]] = {key: [] for key in point}
        for sample in resampled:
            p = pass_rate(sample)
            caps, costs = zip(*(search(plan, rule, p, rng) for _ in range(args.searches)), strict=True)
            for key, value in figures(list(caps), list(costs)).items():
                spread[key].append(value)
        rows[rule] = {key: {"value": point[key], "interval": _interval(spread[key])} for key in point}
        r = rows[rule]
        print(
            f"{rule}: CV {r['cv']['value']:.1%} ({r['cv']['interval'][0]:.1%}-{r['cv']['interval'][1]:.1%}), "
            f"SD(log) {r['sd_log']['value']:.3f}, deep {r['deep']['value']:.1%} "
            f"({r['deep']['interval'][0]:.1%}-{r['deep']['interval'][1]:.1%}), 5-search CV <= 5% in "
            f"{r['cv5_within_5pct']['value']:.0%} ({r['cv5_within_5pct']['interval'][0]:.0%}-"
            f"{r['cv5_within_5pct']['interval'][1]:.0%}), {r['measurements']['value']:.2f} measurements per search",
            flush=True,
        )
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[f"{args.sections}@resolution_{args.resolution:g}"] = {
        "sections": args.sections.split(","),
        "reference_rps": reference,
        "plan": {"resolution": plan.resolution, "growth": plan.growth, "max_factor": plan.max_factor},
        "pass_table": [{k: row[k] for k in ("load_factor", "steps", "passed")} for row in table],
        "recorded": seen,
        "searches": args.searches,
        "tables": args.tables,
        "rules": rows,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS}", flush=True)


if __name__ == "__main__":
    main()
