"""Confirmation at equal engine time: does re-measuring the finalists pick better than more trials would?

    .venv/bin/python benchmarks/confirmation.py --workload bundled --rounds 3   # 100 seeds: ~5 min here
    .venv/bin/python benchmarks/confirmation.py --rounds 3                      # on the heldout table

Replays the tool's own search (Optuna's GP sampler from the baseline, the tool's ASHA: `optuna+asha` of
benchmarks/search_cost.py, each trial a recorded repeat of its config drawn at random) on a recorded grid
table, once per seed, and judges two ways of spending the same engine time B against the table:

- **search only**: trials until B is spent; the trial running when B runs out keeps its results up to
  its last step that ended in time (Tune's `time_budget_s` stops the running trial and keeps what it
  reported); the pick is the tool's (`tuner.selection.pick_trial`, max-capacity);
- **search + confirmation** (the static reserve, as the tool had it before its reserve followed the
  trials): the same search until B - C is spent, C the config's reserve for the confirmation ((finalists
  + 1) x rounds x its estimate of one re-measurement, tuner.search.confirm_cost, +
  tuner.confirm.RESERVE_MARGIN), then the tool's confirmation on the trials that ran: its finalists
  (tuner.confirm.finalists), its rotated rounds, its deadline rule (a round starts only if the time left
  holds tuner.confirm.ROUND_START_SHARE of its estimate; one that runs past B is cut there and not
  counted) and its verdict (tuner.verdict.decide: a finalist displaces the baseline only when its
  interval excludes 1). A re-measurement is one of the config's recorded repeats drawn from a stream of
  its own; it costs the drawn repeat's engine start, three of its steps and its teardown (the tool's
  model of a warm-started re-measurement), at most the whole repeat. A budget whose reserve leaves less
  than one trial is one the tool refuses (tuner.search._check_budget): reported as refused.
- **search + confirmation, adaptive reserve** (each setting's second arm; the tool's own): the same,
  with the search ended as the tool's stopper ends it (tuner.confirm.ConfirmReserve, `within_reserve`):
  the reserve re-estimated from the trials' recorded engine starts and step walls as their steps end
  (with the replay's cost model of a re-measurement: no step at the reference load), and the first
  round's deadline check at that estimate.

The budget also sets what the tool's start-up rule sees: `num_samples` = the trials B affords at the
table's mean trial time, so a longer budget gets more random start-up trials, as a user's would.

A pick is **right** when it is in the table's best set (search_cost.Table: the configs whose mean capacity
over repeats is within max(5%, the median spread of repeats) of the best mean); how much is lost when it
is not is the pick's mean capacity over the best mean (0 when nothing is recommended). Per budget: each
arm's rate with Wilson's 95% interval, and confirmation against search only over the same seeds
(McNemar's exact test on the seeds where one arm is right and the other not; a t-interval on the paired
difference of pick quality). The intervals are over seeds replaying one table, not over machines.

Limits (also written into the results): a table has 3 repeats per config, so a re-measurement is one of
those 3 drawn with replacement (possibly the one the search drew) and the best set is judged on the same
repeats' means, which favours neither arm but understates a fresh engine's noise; a warm-started
re-measurement is replayed as a whole trial's bracket. Measurements, not tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from search_cost import (  # noqa: E402
    METRIC,
    OUT,
    WORKLOADS,
    Evaluation,
    Table,
    _display,
    _setup,
    _write,
    evaluations,
    key,
    load_table,
)

from tuner.vocabulary import TrialStatus  # noqa: E402

STRATEGY = "optuna+asha"  # the tool's own search


@dataclasses.dataclass(frozen=True)
class Ran:
    """A trial as far as a budget let it run: the capacity it reported and the step it reported it at."""

    evaluation: Evaluation
    value: float
    cost: float
    step: dict[str, Any]
    whole: bool  # every step the replayed trial ran (a trial ASHA stopped counts as whole)


def within(trials: list[Evaluation], budget: float) -> tuple[list[Ran], float]:
    """What `budget` engine seconds run of `trials`, and the engine seconds spent.

    A time-budgeted Tune run stops the trial running when the time is up and keeps the results it
    reported: here that trial reports its last step that ended in time (none: it reports nothing, but
    its time is spent; its teardown after the budget is not charged).
    """
    ran: list[Ran] = []
    spent = 0.0
    for e in trials:
        if spent >= budget:
            break
        steps = e.entry["steps"][: e.steps]
        if spent + e.cost <= budget:
            ran.append(Ran(e, e.value, e.cost, steps[-1], True))
        else:
            done = [s for s in steps if float(s["t_end_s"]) <= budget - spent]
            if done:
                ran.append(Ran(e, float(done[-1][METRIC]), budget - spent, done[-1], False))
        spent += min(e.cost, budget - spent)
    return ran, spent


def within_reserve(trials: list[Evaluation], reserve: Any) -> tuple[list[Ran], float]:
    """What the tool's `ReserveStopper` lets run of `trials`: each step's result is fed to `reserve` (a
    tuner.confirm.ConfirmReserve on a clock of engine seconds from 0) when the step ends, and the search ends
    at the first moment the reserve says to stop (at once when a step's result moves its line behind that
    step); the trial running then keeps its steps that ended in time (as in `within`), and one stopped in its
    teardown keeps them all."""
    ran: list[Ran] = []
    spent = 0.0
    for e in trials:
        if spent >= reserve.stop_at():
            break
        steps = e.entry["steps"][: e.steps]
        last = len(e.entry["steps"]) - 1
        done: list[dict[str, Any]] = []
        now, cut = spent, None
        for i, s in enumerate(steps):
            if reserve.stop_at() < spent + float(s["t_end_s"]):
                cut = max(reserve.stop_at(), now)
                break
            done.append(s)
            now = spent + float(s["t_end_s"])
            result = {**s, "engine_start_s": e.entry["start_s"], "config": e.params, "done": i == last}
            reserve.observe(f"t{e.number}", result)
        else:
            if reserve.stop_at() < spent + e.cost:  # stopped in its teardown: every result is in
                cut = max(reserve.stop_at(), now)
        if len(done) == len(steps):
            ran.append(Ran(e, e.value, e.cost if cut is None else cut - spent, steps[-1], True))
        elif done:
            ran.append(Ran(e, float(done[-1][METRIC]), cut - spent, done[-1], False))
        spent = spent + e.cost if cut is None else cut
        if cut is not None:
            break
    return ran, spent


def row(r: Ran):
    """The trial as the tool's readers see it (tuner.recorded.TrialRow)."""
    from tuner.recorded import TrialRow

    whole = r.whole and r.evaluation.steps == len(r.evaluation.entry["steps"])
    status = TrialStatus.COMPLETED if whole else TrialStatus.EARLY_STOPPED
    metrics = {
        METRIC: r.value,
        **{k: float(r.step[k]) for k in ("ref_ttft_p95_s", "num_accelerators") if r.step.get(k) is not None},
    }
    if r.step.get("capacity_hi_rps_per_accel") is not None:
        metrics["capacity_hi_rps_per_accel"] = float(r.step["capacity_hi_rps_per_accel"])
    return TrialRow(f"t{r.evaluation.number}", "", str(status), params=r.evaluation.params, metrics=metrics)


def pick_search_only(rows: list) -> Any:
    """The search's own pick (tuner.selection.pick_trial, max-capacity), or None when no trial passed a load."""
    from tuner.errors import ExportError
    from tuner.selection import pick_trial

    try:
        return pick_trial(rows)
    except ExportError:
        return None


def measurement_cost(entry: dict[str, Any]) -> float:
    """Engine seconds of a warm-started re-measurement of a config, from one of its recorded trials: its
    engine start, three of its steps and its teardown (tuner.search.confirm_cost's model), at most the
    whole trial (a config that failed early re-measures as quickly)."""
    walls = [float(s["step_wall_s"]) for s in entry["steps"]]
    warm = float(entry["start_s"]) + float(entry["teardown_s"]) + 3 * statistics.fmean(walls)
    return min(warm, float(entry["wall_s"]))


def confirm(
    table: Table,
    rows: list,
    *,
    finalists: int,
    rounds: int,
    seed: int,
    spent: float,
    budget: float,
    estimate_s: float,
) -> tuple[Any, float, int, bool]:
    """The tool's confirmation phase on the table: (the verdict's pick, engine s, rounds done, distinguishable).

    The tool's finalists (tuner.confirm.finalists) and baseline (the first trial: Optuna's enqueued one),
    its rotated schedule, its deadline rule (tuner.confirm.round_starts: a round starts only if the budget
    left holds ROUND_START_SHARE of its estimate, each measurement at the mean so far, `estimate_s` before
    the first; a round that then runs past the budget is cut at its end and not counted) and its verdict
    (tuner.verdict.decide). A measurement is a recorded repeat of the trial's config, drawn from a stream
    of its own.
    """
    from tuner.confirm import finalists as tool_finalists
    from tuner.confirm import round_starts, schedule
    from tuner.selection import feasible_trials
    from tuner.verdict import Measurement, decide

    baseline = rows[0]
    chosen = tool_finalists(rows, baseline, finalists)
    by_id = {r.trial_id: r for r in [baseline, *chosen]}
    ids = [r.trial_id for r in chosen] + [baseline.trial_id]
    measured: dict[str, list[Measurement]] = {t: [] for t in ids}
    tie_key = {
        t: (r.metrics.get("num_accelerators", 1.0), r.metrics.get("ref_ttft_p95_s", math.inf)) for t, r in by_id.items()
    }
    cost, done, durations = 0.0, 0, []
    if chosen:
        for index, order in enumerate(schedule(ids, rounds)):
            each = statistics.fmean(durations) if durations else estimate_s
            if not round_starts(budget - spent - cost, each * len(order)):
                break
            taken = []  # this round's, counted once the whole round is in
            for trial_id in order:
                name = key(by_id[trial_id].params, table.names)
                repeats = table.configs[name]["repeats"]
                entry = repeats[random.Random(f"confirm|{seed}|{trial_id}|{index}").randrange(len(repeats))]
                hi = entry.get("capacity_hi_rps_per_accel")
                durations.append(measurement_cost(entry))
                if spent + cost + durations[-1] > budget:  # the budget's hard end: the round is not counted
                    cost = budget - spent
                    break
                cost += durations[-1]
                taken.append(
                    Measurement(float(entry[METRIC]), None if hi is None else float(hi), trial_id, round=index + 1)
                )
            if len(taken) < len(order):  # cut at the budget's end
                break
            for measurement in taken:
                measured[measurement.trial_id].append(measurement)
            done += 1
    verdict = decide(measured, baseline.trial_id, tie_key=tie_key, baseline_feasible=bool(feasible_trials([baseline])))
    return by_id[verdict.winner], cost, done, verdict.distinguishable


def wilson(hits: int, n: int) -> list[float]:
    from scipy.stats import binomtest

    interval = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    return [round(float(interval.low), 3), round(float(interval.high), 3)]


def mean_interval(values: list[float]) -> dict[str, float]:
    from scipy import stats

    mean = statistics.fmean(values)
    half = 0.0
    if len(values) > 1 and statistics.stdev(values) > 0:
        half = float(stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": round(mean, 4), "ci_low": round(mean - half, 4), "ci_high": round(mean + half, 4)}


@dataclasses.dataclass
class Outcome:
    """One arm's pick in one seed's search at one budget."""

    pick: str | None  # config key; None: no recommendation
    engine_s: float
    trials: int
    rounds: int = 0
    distinguishable: bool = False
    estimate_s: float | None = None  # one re-measurement as the reserve last estimated it


def _right(table: Table, o: Outcome) -> bool:
    return o.pick is not None and o.pick in table.best_set


def _quality(table: Table, o: Outcome) -> float:
    return table.means[o.pick] / table.best if o.pick is not None else 0.0


def _arm(table: Table, outcomes: list[Outcome], baseline: str) -> dict[str, Any]:
    hits = sum(_right(table, o) for o in outcomes)
    return {
        "right": hits,
        "seeds": len(outcomes),
        "right_rate": round(hits / len(outcomes), 3),
        "right_rate_ci95": wilson(hits, len(outcomes)),
        "pick_mean_over_best": mean_interval([_quality(table, o) for o in outcomes]),
        "baseline_picked": sum(o.pick == baseline for o in outcomes),
        "no_pick": sum(o.pick is None for o in outcomes),
        "engine_s_mean": round(statistics.fmean(o.engine_s for o in outcomes), 1),
        "engine_s_max": round(max(o.engine_s for o in outcomes), 1),
        "trials_mean": round(statistics.fmean(o.trials for o in outcomes), 2),
        "rounds_mean": round(statistics.fmean(o.rounds for o in outcomes), 2),
        "distinguishable": sum(o.distinguishable for o in outcomes),
        **(
            {"measurement_estimate_s_mean": round(statistics.fmean(estimates), 1)}
            if (estimates := [o.estimate_s for o in outcomes if o.estimate_s is not None])
            else {}
        ),
    }


def _paired(table: Table, confirmed: list[Outcome], alone: list[Outcome]) -> dict[str, Any]:
    """Confirmation against search only over the same seeds: McNemar's exact test on the seeds where one
    arm is right and the other not, and a t-interval on the per-seed difference of pick quality."""
    from scipy.stats import binomtest

    gained = sum(_right(table, c) and not _right(table, a) for c, a in zip(confirmed, alone, strict=True))
    lost = sum(_right(table, a) and not _right(table, c) for c, a in zip(confirmed, alone, strict=True))
    diff = [_quality(table, c) - _quality(table, a) for c, a in zip(confirmed, alone, strict=True)]
    return {
        "right_only_with_confirmation": gained,
        "right_only_without": lost,
        "mcnemar_exact_p": round(binomtest(gained, gained + lost).pvalue, 4) if gained + lost else 1.0,
        "pick_quality_difference": mean_interval(diff),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tuner.confirm import REPEATABILITY_CV, ConfirmCost, ConfirmReserve
    from tuner.search import _TEARDOWN_S, startup_trials
    from tuner.verdict import rounds_for

    setup = _setup()
    config = setup.config
    table = load_table(args.grid_dir, args.workload, setup)
    resolution = config.confirm.resolution or config.capacity.resolution
    budgets = [b * 60 for b in sorted(set(args.budgets_min))]
    trial_s = statistics.fmean(e["wall_s"] for c in table.configs.values() for e in c["repeats"])
    estimate_s = args.measurement_s or _tool_measurement_s(args.workload)
    # The start-up rule's input: the trials each budget affords at the table's mean trial time.
    samples = {b: max(1, round(b / trial_s)) for b in budgets}
    startups = {b: startup_trials(samples[b]) for b in budgets}
    settings = []
    for count in args.finalists:
        rule = rounds_for(cv=REPEATABILITY_CV, resolution=resolution, finalists=count)
        for rounds in sorted({rule, *(args.rounds or ())}):
            reserve = ConfirmCost(estimate_s, (count + 1) * rounds).reserve_s
            for adaptive in (False, True):
                name = f"{count} finalist(s) x {rounds} rounds" + (", adaptive reserve" if adaptive else "")
                settings.append((name, count, rounds, reserve, adaptive))
    print(
        f"{table.meta['workload']}: {len(table.configs)} configs, best mean {METRIC} {table.best:.2f}, "
        f"{len(table.best_set)} in the best set (tolerance {table.tolerance:.1%}); mean trial {trial_s:.0f} "
        f"engine-s, a re-measurement estimated at {estimate_s:.0f}; {args.seeds} seeds; budgets "
        f"{[b / 60 for b in budgets]} engine-min",
        flush=True,
    )
    arms = ["search only"] + [name for name, *_ in settings]
    outcomes: dict[str, dict[float, list[Outcome]]] = {a: {b: [] for b in budgets} for a in arms}
    refused = {name: [b for b in budgets if b - reserve < trial_s] for name, _, _, reserve, _ in settings}
    baseline = ""
    began = time.monotonic()
    for seed in range(args.seeds):
        searches: dict[int, list[Evaluation]] = {}
        for startup in sorted(set(startups.values())):
            horizon = max(b for b in budgets if startups[b] == startup)
            run_trials, total = [], 0.0
            for e in evaluations(table, setup, STRATEGY, seed, startup=startup, max_trials=args.max_trials):
                run_trials.append(e)
                total += e.cost
                if total >= horizon:
                    break
            searches[startup] = run_trials
        for budget in budgets:
            run_trials = searches[startups[budget]]
            baseline = key(run_trials[0].params, table.names)
            ran, used = within(run_trials, budget)
            rows = [row(r) for r in ran]
            picked = pick_search_only(rows)
            pick = key(picked.params, table.names) if picked is not None else None
            outcomes["search only"][budget].append(Outcome(pick, used, len(ran)))
            for name, count, rounds, reserve, adaptive in settings:
                if budget in refused[name]:
                    continue
                estimate = estimate_s
                if adaptive:  # the tool's ReserveStopper; the estimate with the replay's own cost model
                    # (`measurement_cost`: no step at the reference load)
                    follow = ConfirmReserve(
                        ConfirmCost(estimate_s, (count + 1) * rounds),
                        rounds=rounds,
                        deadline=budget,
                        finalists=count,
                        baseline=run_trials[0].params,
                        reference_step=False,
                        teardown_s=_TEARDOWN_S,
                        progress=lambda line: None,
                    )
                    ran, used = within_reserve(run_trials, follow)
                    estimate = follow.cost().measurement_s
                else:
                    ran, used = within(run_trials, budget - reserve)
                rows = [row(r) for r in ran]
                if not rows:
                    outcomes[name][budget].append(Outcome(None, used, 0))
                    continue
                winner, cost, done, sure = confirm(
                    table,
                    rows,
                    finalists=count,
                    rounds=rounds,
                    seed=seed,
                    spent=used,
                    budget=budget,
                    estimate_s=estimate,
                )
                outcomes[name][budget].append(
                    Outcome(
                        key(winner.params, table.names),
                        used + cost,
                        len(ran),
                        done,
                        sure,
                        estimate if adaptive else None,
                    )
                )
        if (seed + 1) % 10 == 0:
            print(f"  {seed + 1}/{args.seeds} seeds, {time.monotonic() - began:.0f}s", flush=True)
    results: dict[str, Any] = {}
    for budget in budgets:
        label = f"{budget / 60:g}"
        cell: dict[str, Any] = {"num_samples": samples[budget], "n_startup_trials": startups[budget]}
        print(f"budget {label} engine-min ({samples[budget]} trials' worth, {startups[budget]} start-up):", flush=True)
        for arm in arms:
            if not outcomes[arm][budget]:
                cell[arm] = {
                    "refused": "the tool refuses this budget: after the confirmation's reserve it leaves "
                    "less than one trial (tuner.search._check_budget)"
                }
                print(f"  {arm:28s} refused (the reserve leaves less than one trial)", flush=True)
                continue
            r = cell[arm] = _arm(table, outcomes[arm][budget], baseline)
            if arm != "search only":
                r["against_search_only"] = _paired(table, outcomes[arm][budget], outcomes["search only"][budget])
            print(
                f"  {arm:28s} right {r['right']}/{r['seeds']} ({r['right_rate']:.0%}, CI {r['right_rate_ci95']}), "
                f"pick/best {r['pick_mean_over_best']['mean']:.3f}, baseline picked {r['baseline_picked']}, "
                f"{r['trials_mean']:.1f} trials + {r['rounds_mean']:.1f} rounds, {r['engine_s_mean'] / 60:.1f} "
                f"engine-min (max {r['engine_s_max'] / 60:.1f})"
                + (
                    f", a re-measurement re-estimated at {r['measurement_estimate_s_mean']:.0f}s"
                    if "measurement_estimate_s_mean" in r
                    else ""
                )
                + (
                    f"; vs search only: right only here {r['against_search_only']['right_only_with_confirmation']}, "
                    f"only there {r['against_search_only']['right_only_without']} "
                    f"(McNemar p {r['against_search_only']['mcnemar_exact_p']})"
                    if "against_search_only" in r
                    else ""
                ),
                flush=True,
            )
        results[label] = cell
    return {
        "command": "benchmarks/confirmation.py " + " ".join(sys.argv[1:]),
        "workload": args.workload,
        "grid": table.summary(),
        "baseline": baseline,
        "baseline_in_best_set": baseline in table.best_set,
        "baseline_mean_over_best": round(table.means[baseline] / table.best, 4),
        "strategy": STRATEGY,
        "trial_engine_s_mean": round(trial_s, 1),
        "measurement_estimate_s": round(estimate_s, 1),
        "settings": [
            {
                "arm": name,
                "finalists": n,
                "rounds": r,
                "reserved_engine_s": "re-estimated from the trials as they report (tuner.confirm.ConfirmReserve)"
                if adaptive
                else round(c, 1),
                "resolution": resolution,
            }
            for name, n, r, c, adaptive in settings
        ],
        "seeds": args.seeds,
        "definition": "right = the pick is in the table's best set (search_cost.Table); pick_mean_over_best = "
        "the pick's mean capacity over the best config's (0 when nothing is recommended); each budget's "
        "search and confirmation together end within it (engine_s_mean, engine_s_max say how much each arm "
        "really spent); intervals are over seeds replaying this one table, not over machines or tables",
        "limits": "3 recorded repeats per config: a confirmation measurement is one of them drawn with "
        "replacement, possibly the one the search drew, and the best set is judged on the means of the same "
        "repeats; a warm-started re-measurement is replayed as a whole trial's bracket at a warm one's cost",
        "budgets_engine_min": results,
    }


def _tool_measurement_s(workload: str) -> float:
    """The tool's own estimate of one re-measurement (tuner.search.confirm_cost) for this config."""
    from search_cost import _prepared

    from tuner.search import confirm_cost

    return confirm_cost(_prepared(workload)).measurement_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="heldout", help="table to replay on")
    parser.add_argument("--grid-dir", type=Path, default=OUT, help="folder of the grid tables (reports/benchmarks)")
    parser.add_argument("--out-dir", type=Path, default=OUT, help="folder of confirmation_<workload>.json")
    parser.add_argument("--seeds", type=int, default=100, help="searches replayed (default 100)")
    parser.add_argument(
        "--budgets-min",
        type=float,
        nargs="+",
        default=[10, 15, 20, 30, 45],
        help="engine-time budgets in minutes (default 10 15 20 30 45; the embedded demo's search and "
        "confirmation get about 10)",
    )
    parser.add_argument("--finalists", type=int, nargs="+", default=[1, 2], help="finalist counts (default 1 2)")
    parser.add_argument(
        "--rounds",
        type=int,
        nargs="+",
        help="confirmation rounds to replay besides the tool's rule for each finalist count (the demo's: 3)",
    )
    parser.add_argument("--max-trials", type=int, default=96, help="trials a search may run at most (default 96)")
    parser.add_argument(
        "--measurement-s",
        type=float,
        help="engine seconds one re-measurement is estimated at, for the reserve and the first round's deadline "
        "check (default: the tool's own estimate, tuner.search.confirm_cost)",
    )
    args = parser.parse_args()
    if args.seeds < 1 or any(b <= 0 for b in args.budgets_min) or any(r < 2 for r in args.rounds or ()):
        parser.error("--seeds must be >= 1, --budgets-min > 0 and --rounds >= 2")
    out = run(args)
    path = args.out_dir / f"confirmation_{args.workload}.json"
    _write(path, out)
    print(f"wrote {_display(path)}", flush=True)


if __name__ == "__main__":
    main()
