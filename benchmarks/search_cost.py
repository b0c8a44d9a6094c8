"""Search cost: how much engine time each search strategy needs to find a config near the best.

    .venv/bin/python benchmarks/search_cost.py record    # the 32-config grid, once: about 45 min here
    .venv/bin/python benchmarks/search_cost.py compare   # strategies replayed on it: about 5 min
    .venv/bin/python benchmarks/search_cost.py live      # one live Optuna + ASHA search: about 20 min

`record` runs every config of `benchmarks/search-cost-space.yaml` through the same trial code a search
uses (real vLLM engines as Ray actors, the ladder of `benchmarks/search-cost.yaml`) and caches every
step's metrics and wall times in reports/benchmarks/search_cost_grid.json (a tabular benchmark; it
resumes where it stopped). `compare` replays grid order, random search, Optuna (TPE, and the tool's GP)
alone and Optuna + ASHA (Ray's own ASHA bracket) on that table over many seeds and writes search_cost.json and
search_cost.png. `live` runs `python -m tuner search` on the same config and checks the table's
prediction. Measurements, not tests.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "benchmarks" / "search-cost.yaml"
OUT = ROOT / "reports" / "benchmarks"
GRID = OUT / "search_cost_grid.json"
RESULTS = OUT / "search_cost.json"
TARGET = 0.05  # within 5% of the grid's best capacity
METRIC = "capacity_rps_per_accel"


def _prepared():
    from tuner.config import load_config
    from tuner.search import prepare

    return prepare(load_config(CONFIG), device_has_gpu=False)


def grid_points(space) -> list[dict[str, Any]]:
    """Every combination of the space's categorical choices that meets its constraints, in grid order."""
    names = list(space.tunable)
    choices = [space.tunable[n].choices for n in names]
    points = [dict(zip(names, values, strict=True)) for values in itertools.product(*choices)]
    fixed = space.fixed
    return [{**p, **fixed} for p in points if all(_holds(p, c) for c in space.parsed_constraints())]


def _holds(point: dict[str, Any], constraint: tuple[str, str, Any]) -> bool:
    left, op, right = constraint
    a = point.get(left)
    b = point.get(right, right) if isinstance(right, str) else right
    if a is None or b is None or isinstance(b, str):
        return True
    return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "==": a == b, "!=": a != b}[op]


def key(params: dict[str, Any], names: list[str]) -> str:
    return ",".join(f"{n}={params[n]}" for n in names)


# ---------------------------------------------------------------------------------------------- record


def record(args: argparse.Namespace) -> None:
    from trainables.pool import start_ray_pool
    from trainables.trial import TrialRunner
    from tuner.search import _vllm_version, start_ray, trial_context

    prepared = _prepared()
    context = trial_context(prepared)
    names = list(prepared.space.tunable)
    points = grid_points(prepared.space)
    table = json.loads(GRID.read_text()) if GRID.exists() else None
    if table is None or table["meta"]["config"] != CONFIG.read_text():
        table = {"meta": {"config": CONFIG.read_text(),
                          "space": (ROOT / "benchmarks" / "search-cost-space.yaml").read_text(),
                          "tunable": names, "reference_rps": prepared.reference_rps,
                          "ladder": list(context.load_factors), "machine": _machine(),
                          "vllm": _vllm_version(), "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S")},
                 "configs": {}}
    todo = [p for p in points if key(p, names) not in table["configs"]]
    # Recorded in a shuffled order so that drift over the hour does not line up with grid order.
    random.Random(7).shuffle(todo)
    print(f"grid of {len(points)} configs, {len(points) - len(todo)} already recorded in {GRID}", flush=True)
    if not todo:
        return
    start_ray(None)

    async def factory(spec, replicas, health):
        return await start_ray_pool(spec, replicas, placement_group=None, first_bundle=0,
                                    start_timeout_s=context.start_timeout_s, health=health, replace=True)

    began_all = time.monotonic()
    try:
        for done, params in enumerate(todo, 1):
            runner = TrialRunner(context, params, factory, trial_id=f"grid{done}")
            began = time.perf_counter()
            steps: list[dict[str, Any]] = []
            try:
                runner.start()
                while True:
                    result = runner.next_step()
                    result["t_end_s"] = round(time.perf_counter() - began, 3)
                    steps.append({k: v for k, v in result.items() if k != "done"})
                    if result["done"]:
                        break
            finally:
                closing = time.perf_counter()
                runner.close()
                teardown_s = time.perf_counter() - closing
            entry = {"params": params, "start_s": round(runner.start_s, 3), "steps": steps,
                     "teardown_s": round(teardown_s, 3), "wall_s": round(time.perf_counter() - began, 3),
                     "status": steps[-1]["trial_status"], "status_reason": steps[-1]["status_reason"],
                     METRIC: steps[-1][METRIC]}
            table["configs"][key(params, names)] = entry
            _write(GRID, table)
            elapsed = time.monotonic() - began_all
            eta = elapsed / done * (len(todo) - done)
            print(f"[{done}/{len(todo)}] {key(params, names)}: {METRIC} {entry[METRIC]:.2f} after "
                  f"{len(steps)} step(s), {entry['wall_s']:.0f}s ({entry['status_reason']}); "
                  f"about {eta / 60:.0f} min left", flush=True)
    finally:
        import ray

        ray.shutdown()


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


# --------------------------------------------------------------------------------------------- compare


class Table:
    """The recorded grid: what a trial of any config reports after each step, and when."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.names: list[str] = data["meta"]["tunable"]
        self.configs: dict[str, dict[str, Any]] = data["configs"]
        self.best = max(c[METRIC] for c in self.configs.values())
        self.threshold = (1 - TARGET) * self.best
        self.grid_engine_s = sum(c["wall_s"] for c in self.configs.values())

    def entry(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.configs[key(params, self.names)]

    def hit(self, params: dict[str, Any]) -> bool:
        return self.entry(params)[METRIC] >= self.threshold


def run_trial(entry: dict[str, Any], bracket, trial_id: str, metric: str = "slo_headroom",
              sign: float = 1.0) -> tuple[float, float, int]:
    """Replay one trial under ASHA (or none): (reported metric, engine seconds, steps run).

    As Ray's ASHAScheduler: every result but a trial's last goes through `on_trial_result` (a done
    trial is not scheduled), the last one through `on_trial_complete` (recorded in its rung too); a
    trial it stops reports the metric it had then, a capacity that is a lower bound. `sign` is +1 to
    maximise the ASHA metric, -1 to minimise it.
    """
    from ray.tune.schedulers import TrialScheduler

    steps = entry["steps"]
    for step in steps[:-1]:
        if bracket is not None:
            action = bracket.on_result(_Trial(trial_id), int(step["load_step"]), sign * float(step[metric]))
            if action == TrialScheduler.STOP:
                return float(step[METRIC]), step["t_end_s"] + entry["teardown_s"], int(step["load_step"])
    last = steps[-1]
    if bracket is not None and metric in last:
        bracket.on_result(_Trial(trial_id), int(last["load_step"]), sign * float(last[metric]))
    return float(last[METRIC]), entry["wall_s"], len(steps)


class _Trial:
    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def _bracket(config, grace: int):
    from ray.tune.schedulers.async_hyperband import _Bracket

    # The search's own settings (tuner.search._new_tuner): one bracket, last trials never stopped.
    return _Bracket(min_t=grace, max_t=len(config.ladder.factors), reduction_factor=config.asha.reduction_factor,
                    s=0, stop_last_trials=False)


# name -> (sampler, ASHA first rung: "tool" = the search's default, "reference" = the reference step)
STRATEGIES: dict[str, tuple[str, str | None]] = {
    "grid": ("grid", None),
    "random": ("random", None),
    "optuna-tpe": ("tpe", None),
    "optuna": ("gp", None),
    "optuna+asha": ("gp", "tool"),
    "optuna+asha@reference-step": ("gp", "reference"),
}
TUNED = ("optuna-tpe", "optuna", "optuna+asha", "optuna+asha@reference-step")


def simulate(table: Table, prepared, strategy: str, seed: int, *, startup: int = 2,
             max_trials: int = 96) -> dict[str, Any]:
    """One search on the table: engine seconds and trials until the incumbent is within 5% of the best.

    Every strategy but grid order starts, as the tool does, with the space's baseline. "optuna" is the
    tool's sampler (tuner.search.make_sampler's GP), "optuna-tpe" the multivariate TPE it used before.
    """
    import optuna

    from tuner.search import asha_grace_period

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    kind, rung = STRATEGIES[strategy]
    config = prepared.config
    if kind == "grid":
        proposals = iter(grid_points(prepared.space))
        study = None
    else:
        sampler = {"random": lambda: optuna.samplers.RandomSampler(seed=seed),
                   "tpe": lambda: optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True),
                   "gp": lambda: optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup,
                                                           warn_independent_sampling=False)}[kind]()
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.enqueue_trial(prepared.baseline)
        define = prepared.space.define_by_run()
    bracket = None
    if rung is not None:
        ladder = config.ladder
        grace = asha_grace_period(config) if rung == "tool" else ladder.factors.index(ladder.reference_factor) + 1
        bracket = _bracket(config, grace)
    spent, incumbent, curve = 0.0, (-1.0, None), []
    for number in range(max_trials):
        if study is None:
            params = next(proposals, None)
            if params is None:
                break
        else:
            trial = study.ask()
            params = {**trial.params, **define(trial)}  # as Ray's OptunaSearch builds the config
        value, cost, _ = run_trial(table.entry(params), bracket, f"t{number}", config.asha.metric,
                                   1.0 if config.asha.mode == "max" else -1.0)
        if study is not None:
            study.tell(trial, value)
        spent += cost
        if value > incumbent[0]:
            incumbent = (value, params)
        true = table.entry(incumbent[1])[METRIC]
        curve.append((round(spent, 1), true))
        if table.hit(incumbent[1]):
            return {"engine_s": spent, "trials": number + 1, "reached": True, "curve": curve}
    return {"engine_s": spent, "trials": len(curve), "reached": False, "curve": curve}


def _summary(runs: list[dict[str, Any]], grid_engine_s: float) -> dict[str, Any]:
    costs = sorted(r["engine_s"] if r["reached"] else math.inf for r in runs)
    quart = statistics.quantiles(costs, n=4, method="inclusive") if len(costs) > 1 else [costs[0]] * 3
    median = statistics.median(costs)

    def num(x: float) -> float | None:
        return round(x, 1) if math.isfinite(x) else None

    return {"seeds": len(runs), "reached": sum(r["reached"] for r in runs),
            "median_engine_s": num(median), "p25_engine_s": num(quart[0]), "p75_engine_s": num(quart[2]),
            "min_engine_s": num(costs[0]), "max_engine_s": num(costs[-1]),
            "median_ratio_to_grid": round(median / grid_engine_s, 3) if math.isfinite(median) else None,
            "median_trials": statistics.median(r["trials"] for r in runs)}


def compare(args: argparse.Namespace) -> None:
    from tuner.search import asha_grace_period, startup_trials

    if not GRID.exists():
        raise SystemExit(f"{GRID} does not exist: run `benchmarks/search_cost.py record` first")
    table = Table(json.loads(GRID.read_text()))
    prepared = _prepared()
    missing = [p for p in grid_points(prepared.space) if key(p, table.names) not in table.configs]
    if missing:
        raise SystemExit(f"{GRID}: {len(missing)} of the grid's configs not recorded yet: run `record` again")
    seeds = range(args.seeds)
    print(f"grid: {len(table.configs)} configs, {table.grid_engine_s / 60:.1f} engine-min; best {METRIC} "
          f"{table.best:.2f}, target >= {table.threshold:.2f}: "
          f"{sum(table.hit(c['params']) for c in table.configs.values())} config(s) qualify", flush=True)
    # Start-up trials for budgets this small: the samplers' knob that matters here.
    sweep: dict[str, dict[int, Any]] = {name: {} for name in TUNED}
    runs_at: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for strategy in TUNED:
        for startup in args.startup:
            runs = [simulate(table, prepared, strategy, seed, startup=startup) for seed in seeds]
            runs_at[strategy, startup] = runs
            sweep[strategy][startup] = _summary(runs, table.grid_engine_s)
            print(f"  {strategy:27s} n_startup_trials={startup:2d}: median "
                  f"{sweep[strategy][startup]['median_engine_s']} engine-s", flush=True)
    # The table reports every sampler at the tool's own rule for this budget, not at the sweep's best
    # (which would be tuned on the very seeds it is scored on).
    rule = startup_trials(prepared.config.budget.num_samples)
    chosen = {s: rule for s in sweep}
    results: dict[str, Any] = {}
    runs_by: dict[str, list[dict[str, Any]]] = {}
    for strategy in STRATEGIES:
        if strategy in chosen:
            runs = runs_at.get((strategy, rule)) or [simulate(table, prepared, strategy, seed, startup=rule)
                                                     for seed in seeds]
        else:
            runs = [simulate(table, prepared, strategy, seed) for seed in (seeds if strategy != "grid" else range(1))]
        runs_by[strategy] = runs
        results[strategy] = {**_summary(runs, table.grid_engine_s),
                             **({"n_startup_trials": chosen[strategy]} if strategy in chosen else {})}
    asha, rand = results["optuna+asha"], results["random"]
    goal = {"optuna+asha_median_ratio": asha["median_ratio_to_grid"], "target_ratio": 0.25,
            "met_ratio": asha["median_ratio_to_grid"] is not None and asha["median_ratio_to_grid"] <= 0.25,
            "ahead_of_random": (asha["median_engine_s"] or math.inf) < (rand["median_engine_s"] or math.inf)}
    best = [c["params"] for c in table.configs.values() if table.hit(c["params"])]
    ladder = prepared.config.ladder
    out = {"command": "benchmarks/search_cost.py compare", "grid_file": os.path.relpath(GRID, ROOT),
           "grid": {"configs": len(table.configs), "engine_s": round(table.grid_engine_s, 1),
                    "best_" + METRIC: table.best, "target": round(table.threshold, 3), "qualifying": best,
                    "recorded_at": table.data["meta"]["recorded_at"], "machine": table.data["meta"]["machine"]},
           "asha": {"first_rung_tool": asha_grace_period(prepared.config),
                    "first_rung_reference_step": ladder.factors.index(ladder.reference_factor) + 1,
                    "reduction_factor": prepared.config.asha.reduction_factor, "metric": prepared.config.asha.metric},
           "tool_startup_rule": {n: startup_trials(n) for n in (8, 12, 20, 50)},
           "strategies": results, "startup_sweep": sweep, "goal": goal,
           "definition": "engine-seconds = sum of trial wall times (engine start, every step run, teardown) "
                         "until the best-reported config so far is within 5% of the grid's best capacity; "
                         "a seed that never gets there within 96 trials counts as infinite"}
    if RESULTS.exists():  # keep the latest live check next to the table's prediction
        previous = json.loads(RESULTS.read_text())
        if "live" in previous:
            out["live"] = previous["live"]
    _write(RESULTS, out)
    _plot(table, runs_by, results)
    for strategy, r in results.items():
        print(f"{strategy:27s} median {r['median_engine_s']} engine-s (IQR {r['p25_engine_s']}-{r['p75_engine_s']},"
              f" {r['reached']}/{r['seeds']} reached) = {r['median_ratio_to_grid']} of the grid", flush=True)
    print(f"goal (Optuna + ASHA <= 25% of the grid, ahead of random): {goal}; wrote {RESULTS}", flush=True)


def _plot(table: Table, runs_by: dict[str, list[dict[str, Any]]], results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    names = list(runs_by)
    data = [[r["engine_s"] / 60 for r in runs_by[n] if r["reached"]] or [math.nan] for n in names]
    left.boxplot(data, showfliers=True)
    left.set_xticks(range(1, len(names) + 1), names, rotation=25, ha="right")
    left.axhline(table.grid_engine_s / 60, color="grey", linestyle="--", label="whole grid")
    left.axhline(0.25 * table.grid_engine_s / 60, color="tab:red", linestyle=":", label="25% of the grid")
    left.set_ylabel("engine-minutes to a config within 5% of the best")
    left.legend(loc="upper right")
    for name in names:
        horizon = table.grid_engine_s
        grid_x = [x / 60 for x in range(0, int(horizon) + 1, 30)]
        fractions = [sum(1 for r in runs_by[name] if r["reached"] and r["engine_s"] / 60 <= x) / len(runs_by[name])
                     for x in grid_x]
        right.plot(grid_x, fractions, label=name)
    right.set_xlabel("engine-minutes spent")
    right.set_ylabel("fraction of seeds that found it")
    right.legend(loc="lower right")
    fig.suptitle(f"Search cost on a {len(table.configs)}-config grid "
                 f"({METRIC}: best {table.best:.2f}, target {table.threshold:.2f})")
    fig.tight_layout()
    fig.savefig(OUT / "search_cost.png", dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ live


def live(args: argparse.Namespace) -> None:
    """One real Optuna + ASHA search (the tool itself) on the same config, judged against the table."""
    from tuner.config import load_config
    from tuner.search import run_search
    from tuner.tracking import client_for, default_tracking_uri

    if not RESULTS.exists():
        raise SystemExit(f"{RESULTS} does not exist: run `benchmarks/search_cost.py compare` first")
    results = json.loads(RESULTS.read_text())
    table = Table(json.loads(GRID.read_text()))
    name = args.experiment or f"search-cost-live-{time.strftime('%Y%m%d-%H%M%S')}"
    if not args.experiment:
        config = load_config(CONFIG, overrides={"name": name, "budget.num_samples": args.trials})
        run_search(config)
    client = client_for(default_tracking_uri(ROOT))
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        raise SystemExit(f"no MLflow experiment {name!r} in {default_tracking_uri(ROOT)}")
    rows = []
    for run in client.search_runs([experiment.experiment_id], max_results=1000):
        if "trial_id" not in run.data.tags:
            continue
        params = {k: run.data.params[k] for k in table.names}
        # The trial's run opens once its engines have started: add their start-up, as the table counts it
        # (an infeasible trial reports none).
        wall_s = ((run.info.end_time or run.info.start_time) - run.info.start_time) / 1000
        wall_s += run.data.metrics.get("engine_start_s", 0.0)
        # Teardown is not in the run either: the table's, for the same config (about 5 s).
        wall_s += table.entry(params)["teardown_s"]
        rows.append({"params": params, "status": run.data.tags.get("trial_status"),
                     "reason": run.data.tags.get("status_reason"), "started": run.info.start_time,
                     "engine_s": round(wall_s, 1), "live_" + METRIC: run.data.metrics.get(METRIC, 0.0),
                     "table_" + METRIC: table.entry(params)[METRIC]})
    rows.sort(key=lambda r: r["started"])
    spent, incumbent, reached_at = 0.0, None, None
    for number, row in enumerate(rows, 1):
        spent += row["engine_s"]
        if incumbent is None or row["live_" + METRIC] > incumbent["live_" + METRIC]:
            incumbent = row
        if reached_at is None and incumbent["table_" + METRIC] >= table.threshold:
            reached_at = {"engine_s": round(spent, 1), "trials": number,
                          "ratio_to_grid": round(spent / table.grid_engine_s, 3)}
    predicted = results["strategies"]["optuna+asha"]
    complete = [r for r in rows if r["status"] == "completed"]
    agree = sum(1 for r in complete if abs(r["live_" + METRIC] - r["table_" + METRIC]) < 1e-6)
    out = {"command": "benchmarks/search_cost.py live", "experiment": name,
           "trials": rows, "engine_s": round(spent, 1), "reached": reached_at,
           "winner": incumbent and {"params": incumbent["params"], "live_" + METRIC: incumbent["live_" + METRIC],
                                    "table_" + METRIC: incumbent["table_" + METRIC]},
           "table_prediction": {k: predicted[k] for k in ("median_engine_s", "p25_engine_s", "p75_engine_s",
                                                          "median_trials", "n_startup_trials")},
           "completed_trials_with_same_capacity_as_table": f"{agree}/{len(complete)}"}
    results["live"] = out
    _write(RESULTS, results)
    print(json.dumps({k: v for k, v in out.items() if k != "trials"}, indent=1), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("record", help="run and cache the whole grid (resumes where it stopped)")
    cmp = sub.add_parser("compare", help="replay the strategies on the recorded grid")
    cmp.add_argument("--seeds", type=int, default=30, help="seeds per strategy (default 30)")
    cmp.add_argument("--startup", type=int, nargs="+", default=[1, 2, 3, 4, 6],
                     help="sampler start-up trial counts to try (default 1 2 3 4 6)")
    one = sub.add_parser("live", help="one real Optuna + ASHA search, judged against the table")
    one.add_argument("--trials", type=int, default=12, help="trials of the live search (default 12)")
    one.add_argument("--experiment", help="judge this finished live search again instead of running one")
    args = parser.parse_args()
    {"record": record, "compare": compare, "live": live}[args.command](args)


if __name__ == "__main__":
    main()
