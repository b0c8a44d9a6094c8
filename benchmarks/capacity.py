"""Trustworthy capacity: is a trial's capacity repeatable, does the peer agree, and does bursty traffic
get the load it is offered?

    .venv/bin/python benchmarks/capacity.py repeatability   # the baseline 5 times, fresh engines: ~25 min
    .venv/bin/python benchmarks/capacity.py fidelity        # two configs, tool vs vLLM bench serve: ~45 min
    .venv/bin/python benchmarks/capacity.py bursty          # BurstGPT and a Gamma CV 4 trace: ~10 min
    .venv/bin/python benchmarks/capacity.py engines         # 5 engines x 3 searches each: ~50 min
    .venv/bin/python benchmarks/capacity.py rules           # each failure rule once on 5 engines: ~40 min
    .venv/bin/python benchmarks/capacity.py placement       # scheduler apart/beside its worker: ~40 min
    .venv/bin/python benchmarks/capacity.py settings --arm 'capacity.min_window_s=20' \
        --arm 'capacity.min_window_s=40'                    # 20 s against 40 s steps on 5 engines: ~40 min
    .venv/bin/python benchmarks/capacity.py analyse         # where recorded spreads live; tool/peer pooled

- `repeatability` runs the capacity search of vLLM's defaults (the search's baseline) `--repeats` times,
  a fresh engine each time, with the full measurement settings (`--settings full`: 200 measured requests
  and 20 s per step, 10% resolution) or the embedded demo's (`--settings demo`), and reports the
  coefficient of variation of the capacity (`--label KIND` records it as a section of its own,
  `repeatability_SETTINGS_KIND`, beside another machine's). Before each run it times a fixed Python loop
  (`host_probe_s`: the host's speed of the moment); each run also records its TPOT p50 at the reference
  load (`ref_tpot_p50_ms`: the engine's decode speed far below saturation).
- `engines` asks whether that spread comes with each fresh engine or with each search: it runs the same
  capacity search `--searches` times on each of `--engines` fresh pools (same steps, seeds and samples:
  only the engine and the moment differ), splits the log capacities' variance into within an engine and
  between engines (one-way random effects, scipy's F test of one common level), and tabulates how often
  each load passed over all searches (the pass probability around the breaking point). Each step records
  the host's CPU steal while it ran (`host_steal`, from /proc/stat: a shared host's noise).
- `rules` compares the capacity search's failure rules (`capacity.failure_rule`: `once`, `majority`) side
  by side: on each of `--engines` fresh pools, one search under each rule, the order alternating from
  pool to pool; per rule, the CV of the capacity over the pools (the repeatability goal's figure), its
  SD(log), and the steps and seconds a search took (the rule's cost). benchmarks/capacity_rules.py is
  the same question replayed on recorded pass rates, without engines.
- `placement` compares how a replica's processes are placed (`--arms WHERE/NICE,...`): vLLM's scheduler
  process (engine core) `beside` its model worker on the claimed core (the tool's placement) or `apart`
  on the API server's cores (where vLLM's own CPU binding reserves a core for it), and the niceness of
  the server's processes (15, inherited from Ray's workers, as the tool runs them; 0, as a deployment
  does). On each fresh pool one search per arm, the order rotating; per arm the capacity's CV and what
  the worker's and the scheduler's threads ran (schedstat). Needs root to raise a priority back.
- `settings` compares measurement settings the same way (`--arm 'capacity.KEY=VALUE;...'`, two or
  more, each on top of `--settings`; capacity settings only, so every arm measures the same engine): for
  example 20 s against 40 s steps, per arm the capacity's CV and what a search cost.
- `analyse` reads every recorded repeatability series and says where its spread lives: the CV of an
  interpolated crossing (where headroom crosses 1 inside the bracket: the runs without the bracket's
  quantisation), the rank correlation of capacity with the host probe, the reference TPOT and the engine
  start time, and the spread left within back-to-back pairs of runs (as the confirmation pairs configs);
  and every `engines` series' split and pass table; and every `fidelity` series' repeats pooled by
  settings and serving, over all machines and then per machine kind: the geometric-mean ratio tool/peer
  with its 95% t-interval (is the tool biased against the peer, and is that known within 10%?) and each
  side's spread with the ratio of the two and its 95% interval, from the F distribution and, as a check
  that assumes no normal spread, from the repeats resampled in pairs within each series (does the tool
  repeat worse than the peer?). Written to capacity_repeatability_spread.json.
- `fidelity` measures two configs both ways, interleaved: the tool's trial (each serving given by
  `--servings`: vLLM's OpenAI server driven over HTTP by the tool's replay client, the default, and an
  in-process `AsyncLLM` in a Ray actor), and the peer: vLLM's OpenAI server started from the
  `vllm-serve.yaml` the exporter writes for the same config, driven by `vllm bench serve --dataset-name timed_trace
  --self-timed`, replaying the same step samples at the same rates, judged with the same SLO rule and
  searched with the same capacity planner. Goal: brackets overlap and midpoints agree within 10%.
  The server's own /metrics histograms (TTFT, end-to-end) separate server time from client time.
  `--configs` picks the configs, `--label` names the results section (`fidelity_SETTINGS_LABEL`). With
  `--repeats` of 2 or more it also gives each side's repeatability: the peer has no Ray and nothing of
  this tool in its path, so a peer that spreads as much as the tool puts the spread in the host and
  vLLM, not in the tool's measurement; the log ratio tool/peer of each repeat shows a shared drift.
- `bursty` runs one capacity search on the first 400 rows of BurstGPT (../shared/traces) and one on a
  synthetic Gamma trace with burstiness CV 4, and checks every step offered the load it was asked for
  (measured arrival rate within 5% of the target) with no empty step.

Results go to reports/benchmarks/capacity.json (one section per command) and capacity.png. Measurements,
not tests: run them on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, run_trial, start_local_ray, step_line, stop_ray  # noqa: E402

from tuner.vocabulary import STATUS_REASON_TAG  # noqa: E402

OUT = ROOT / "reports" / "benchmarks"
RESULTS = OUT / "capacity.json"
ANALYSIS = OUT / "capacity_repeatability_spread.json"
SHARED = ROOT.parent / "shared" / "traces"
# The measurement settings a careful user runs (the README's "full settings"), and the demo's.
FULL = {
    "capacity.tail_requests": 10,
    "capacity.min_window_s": 20,
    "capacity.resolution": 0.1,
    "capacity.warmup_requests": 20,
    "capacity.deadline_s": 15,
}
FIDELITY_CONFIGS = {
    "vllm-defaults": None,  # the search's baseline, resolved by `prepare`
    "small-batch": {
        "max_num_seqs": 16,
        "max_num_batched_tokens": 256,
        "gpu_memory_utilization": 0.9,
        "num_replicas": 1,
    },
}


def _prepared(overrides: dict[str, Any] | None = None, config: Path | None = None):
    from tuner.config import load_config
    from tuner.search import prepare

    # These commands run single trials, not a search: no confirmation phase, so the embedded time budget
    # need not hold its reserve (with the full settings it could not: 145 s left, less than one trial).
    return prepare(load_config(config, {"confirm.rounds": 0, **(overrides or {})}), device_has_gpu=False)


def _settings(name: str) -> dict[str, Any]:
    return dict(FULL) if name == "full" else {}


def _save(section: str, payload: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[section] = {**payload, "machine": machine(), "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    RESULTS.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"wrote {RESULTS} [{section}]", flush=True)


def _save_series(kind: str, args: argparse.Namespace, payload: dict[str, Any]) -> None:
    """A command's results as the section KIND_SETTINGS[_LABEL], with the measurement settings it ran."""
    label = getattr(args, "label", "")
    _save(
        f"{kind}_{args.settings}" + (f"_{label}" if label else ""),
        {"settings": args.settings, "overrides": _settings(args.settings), **payload},
    )


def _host_probe() -> float:
    """Seconds a fixed pure-Python loop (10^7 additions) takes now: the host's speed at that moment, taken
    between trials when nothing of ours runs (0.18-0.26 s on the AVX-512 host here, 2026-12-04)."""
    started = time.perf_counter()
    total = 0
    for i in range(10**7):
        total += i
    return time.perf_counter() - started


def crossing(capacity: float | None, loads: list[Any]) -> float | None:
    """Where the SLO headroom crosses 1 inside the capacity's bracket, interpolated linearly in headroom
    and geometrically in load between the highest pass below the lowest fail and that fail, in the
    capacity's unit. A diagnostic, not a capacity: a continuous estimate, so that its spread over repeats
    shows how much of the capacity's spread is the bracket's steps (quantisation) and how much the runs
    themselves. None when no step failed (censored) or no step passed below the lowest fail. `loads` are
    `_trial_summary`'s (load factor, arrival rps, passed, headroom, TTFT growth) rows; a fail whose
    headroom is still >= 1 (failed on sustainability or attainment) puts the crossing mid-bracket."""
    fails = [row for row in loads if not row[2]]
    if capacity is None or not fails:
        return None
    lowest_fail = min(fails, key=lambda row: row[0])
    passes = [row for row in loads if row[2] and row[0] < lowest_fail[0]]
    if not passes:
        return None
    top = max(passes, key=lambda row: row[0])
    h_pass, h_fail = top[3], max(lowest_fail[3], 0.0)
    fraction = (h_pass - 1) / (h_pass - h_fail) if h_pass > 1 > h_fail else 0.5
    return capacity * (lowest_fail[1] / top[1]) ** fraction


def _spearman(xs: list[float], ys: list[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return float(spearmanr(xs, ys).statistic)


def _cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def _trial_summary(entry: dict[str, Any]) -> dict[str, Any]:
    reference = next((s for s in entry["steps"] if abs(s["load_factor"] - 1.0) < 1e-9), None)
    return {
        "capacity": entry.get("capacity_rps_per_accel"),
        # TPOT p50 at the reference load (far below saturation): how fast this run's engine decodes.
        "ref_tpot_p50_ms": round(reference["tpot_p50_s"] * 1000, 2)
        if reference and reference.get("tpot_p50_s") is not None
        else None,
        "hi": entry.get("capacity_hi_rps_per_accel"),
        "censored": entry.get("capacity_censored"),
        "steps": len(entry["steps"]),
        "wall_s": entry["wall_s"],
        "start_s": entry["start_s"],
        "reason": entry["status_reason"],
        "loads": [
            (
                round(s["load_factor"], 4),
                round(s["arrival_rps"], 3),
                bool(s["slo_pass"]),
                round(s["slo_headroom"], 3),
                round(s.get("ttft_growth", float("nan")), 4),
            )
            for s in entry["steps"]
        ],
        **(
            {"host_steal": [None if s.get("host_steal") is None else round(s["host_steal"], 4) for s in entry["steps"]]}
            if any("host_steal" in s for s in entry["steps"])
            else {}
        ),
    }


# ------------------------------------------------------------------------------------ repeatability


def repeatability(args: argparse.Namespace) -> None:
    from tuner.search import trial_context

    prepared = _prepared(_settings(args.settings))
    context = trial_context(prepared)
    params = dict(prepared.baseline)
    print(f"baseline {params}, {args.repeats} repeats, settings {args.settings}", flush=True)
    runs = []
    start_local_ray()
    try:
        for repeat in range(args.repeats):
            probe = _host_probe()
            entry = run_trial(context, params, f"repeat{repeat}", on_step=lambda r: print(step_line(r), flush=True))
            runs.append({**_trial_summary(entry), "host_probe_s": round(probe, 3)})
            print(
                f"repeat {repeat + 1}: {entry['status_reason']} ({entry['wall_s']:.0f}s; host probe {probe:.2f}s)",
                flush=True,
            )
    finally:
        stop_ray()
    capacities = [r["capacity"] for r in runs]
    his = [r["hi"] for r in runs if r["hi"]]
    spread = _spread(runs)  # the CV among the rest
    print(f"capacity {capacities}: mean {statistics.fmean(capacities):.2f}", flush=True)
    print(_spread_line(spread), flush=True)
    _save_series(
        "repeatability",
        args,
        {
            "params": params,
            "plan": dataclasses.asdict(context.plan),
            "repeats": args.repeats,
            "capacities": capacities,
            "mean": statistics.fmean(capacities),
            "goal_cv": 0.05,
            "met": spread["cv"] <= 0.05,
            "bracket_width_mean": statistics.fmean(h / c - 1 for h, c in zip(his, capacities, strict=False) if c)
            if his
            else None,
            "mean_trial_wall_s": statistics.fmean(r["wall_s"] for r in runs),
            **spread,
            "runs": runs,
        },
    )


def _spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a repeatability series' spread lives: the CV of the interpolated crossing (`crossing`: the
    same runs without the bracket's quantisation) and the rank correlation of capacity with what says how
    fast each run's host and engine were (Spearman; None where a series lacks the figure or is constant)."""
    capacities = [r["capacity"] for r in runs]
    crossings = [crossing(r["capacity"], r["loads"]) for r in runs]
    known = [c for c in crossings if c is not None]
    correlations = {}
    for key in ("host_probe_s", "ref_tpot_p50_ms", "start_s"):
        values = [r.get(key) for r in runs]
        known_all = len(runs) > 2 and all(v is not None for v in values)
        correlations[key] = _spearman(capacities, values) if known_all else None
    # Back-to-back runs as pairs (1st/2nd, 3rd/4th, ...), as the confirmation's paired rounds compare
    # configs: if the host's speed drifts slowly, a pair shares most of it and its ratio spreads less
    # than the capacities do. Both runs of a pair measure one config, so a log ratio's expectation is 0:
    # the per-run noise left after pairing is the ratios' root mean square / sqrt(2), beside SD(log).
    logs = [math.log(c) for c in capacities]
    ratios = [logs[i + 1] - logs[i] for i in range(0, len(logs) - 1, 2)]
    return {
        "crossings": [round(c, 3) if c is not None else None for c in crossings],
        "crossing_cv": _cv(known) if len(known) == len(runs) else None,
        "spearman_capacity_vs": correlations,
        "cv": _cv(capacities),
        "sd_log": statistics.stdev(logs) if len(logs) > 1 else None,
        "paired_sd_log": math.sqrt(statistics.fmean(r * r for r in ratios) / 2) if ratios else None,
        "pairs": len(ratios),
    }


def _spread_line(spread: dict[str, Any]) -> str:
    rho = ", ".join(f"{k} {v:+.2f}" for k, v in spread["spearman_capacity_vs"].items() if v is not None)
    crossing_cv = spread["crossing_cv"]
    return (
        f"CV {spread['cv']:.1%}; interpolated crossing CV "
        + (f"{crossing_cv:.1%}" if crossing_cv is not None else "n/a (a censored run)")
        + (f"; Spearman of capacity with {rho}" if rho else "")
        + (
            f"; SD(log) {spread['sd_log']:.3f}, within back-to-back pairs {spread['paired_sd_log']:.3f} "
            f"({spread['pairs']} pair{'s' if spread['pairs'] != 1 else ''})"
            if spread["paired_sd_log"] is not None
            else ""
        )
    )


def analyse(args: argparse.Namespace) -> None:
    """Every recorded repeatability series' spread (`_spread`) and every `engines` series' split
    (`_engines_summary`), from the recorded runs: no engine."""
    results = json.loads(RESULTS.read_text())
    rows = {}
    for section, payload in results.items():
        if section.startswith("repeatability"):
            rows[section] = _spread(payload["runs"])
            print(f"{section} ({len(payload['runs'])} runs): {_spread_line(rows[section])}", flush=True)
        elif section.startswith("engines"):
            rows[section] = {k: v for k, v in _engines_summary(payload["runs"]).items() if k != "capacities"}
            print(
                f"{section} ({payload['engines']} engines x {payload['searches']}): {_engines_line(rows[section])}",
                flush=True,
            )
    rows["fidelity_pooled"] = pooled_fidelity(results)
    rows["fidelity_pooled_by_kind"] = pooled_fidelity(results, by_kind=True)
    for key, row in [*rows["fidelity_pooled"].items(), *rows["fidelity_pooled_by_kind"].items()]:
        print(f"fidelity, {_pooled_line(key, row)}", flush=True)
    ANALYSIS.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {ANALYSIS}", flush=True)


# ----------------------------------------------------------------------------- engine vs run spread


def _cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat, or None off Linux. Steal is the time this
    virtual machine's vCPUs were ready to run but the hypervisor ran someone else: a shared host's noise
    that no process of ours can see otherwise."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is inside user already.
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def _steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen by the hypervisor between two `_cpu_times` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _search_on(runner: Any, on_step: Any) -> dict[str, Any]:
    """One more capacity search on `runner`'s pool, already started and warm: the same steps, seeds and
    samples as a search on a fresh pool (the step's seed is its number), its own trial time limit. Each
    step also records the host's steal while it ran (`host_steal`, None off Linux)."""
    runner.steps, runner.ref_records, runner._began = [], None, time.perf_counter()
    runner._faults_left = list(runner.context.faults)
    began, steps = time.perf_counter(), []
    times = _cpu_times()
    while True:
        result = runner.next_step()
        now = _cpu_times()
        steal = _steal_fraction(times, now)
        times = now
        steps.append({**{k: v for k, v in result.items() if k != "done"}, "host_steal": steal})
        on_step(result)
        if result["done"]:
            break
    return {
        "steps": steps,
        "wall_s": round(time.perf_counter() - began, 3),
        "start_s": round(runner.start_s, 3),
        "status_reason": steps[-1][STATUS_REASON_TAG],
        **{k: steps[-1].get(k) for k in ("capacity_rps_per_accel", "capacity_hi_rps_per_accel", "capacity_censored")},
    }


def _fresh_pools(context: Any, params: dict[str, Any], count: int) -> Iterator[tuple[int, Any, float]]:
    """Local Ray, then `count` fresh pools of `params`, one at a time: yields (index, the started runner,
    the host probe taken before it); each pool is closed after its turn and Ray stopped at the end (use it
    under contextlib.closing, so that an error or Ctrl-C in the loop closes them at once)."""
    from trainables.trial import TrialRunner, driver_pool_factory

    start_local_ray()
    try:
        for engine in range(count):
            probe = _host_probe()
            runner = TrialRunner(context, params, driver_pool_factory(context), trial_id=f"engine{engine}")
            try:
                runner.start()
                if runner.failure is not None:
                    raise SystemExit(f"engine {engine} failed to start: {runner.failure}")
                yield engine, runner, probe
            finally:
                runner.close()
    finally:
        stop_ray()


def pass_by_load(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Over many searches of one config: at each nominal load, how often a step there passed, and the
    headroom of its passes and fails (the pass probability around the breaking point, from the
    `_trial_summary` rows). Loads keyed to 3 decimals of the load factor, in increasing order."""
    by_load: dict[float, list[tuple[bool, float]]] = {}
    for run in runs:
        for row in run["loads"]:
            by_load.setdefault(round(row[0], 3), []).append((bool(row[2]), row[3]))
    return [
        {
            "load_factor": factor,
            "steps": len(rows),
            "passed": sum(ok for ok, _ in rows),
            "pass_headroom": sorted(h for ok, h in rows if ok),
            "fail_headroom": sorted(h for ok, h in rows if not ok),
        }
        for factor, rows in sorted(by_load.items())
    ]


def _variance_components(groups: list[list[float]]) -> dict[str, Any]:
    """One-way random-effects split of log capacity: the spread between searches on one engine (within)
    and the spread of engines' own levels (between, the part a fresh engine adds), with the F test of
    "every engine has the same level" (scipy's f_oneway)."""
    from scipy.stats import f_oneway

    logs = [[math.log(c) for c in group] for group in groups]
    n = statistics.fmean(len(g) for g in logs)
    ms_within = statistics.fmean(statistics.variance(g) for g in logs)
    ms_between = n * statistics.variance([statistics.fmean(g) for g in logs])
    test = f_oneway(*logs)
    return {
        "sd_log_within_engine": math.sqrt(ms_within),
        "sd_log_between_engines": math.sqrt(max(0.0, (ms_between - ms_within) / n)),
        "sd_log_all": statistics.stdev([x for g in logs for x in g]),
        "f": float(test.statistic),
        "p_same_level": float(test.pvalue),
    }


def engines(args: argparse.Namespace) -> None:
    """The baseline's capacity searched `--searches` times on each of `--engines` fresh pools: is the
    repeatability spread a property of each engine's start (between) or of each search (within)?"""
    from tuner.search import trial_context

    prepared = _prepared(_settings(args.settings))
    context = trial_context(prepared)
    params = dict(prepared.baseline)
    print(f"baseline {params}: {args.engines} engines x {args.searches} searches, settings {args.settings}", flush=True)
    rows: list[list[dict[str, Any]]] = []
    with contextlib.closing(_fresh_pools(context, params, args.engines)) as pools:
        for engine, runner, probe in pools:
            runs = []
            for search in range(args.searches):
                entry = _search_on(runner, lambda r: print(step_line(r), flush=True))
                runs.append({**_trial_summary(entry), "host_probe_s": round(probe, 3)})
                print(f"engine {engine + 1} search {search + 1}: {entry['status_reason']}", flush=True)
            rows.append(runs)
    summary = _engines_summary(rows)
    print(f"capacities by engine {summary['capacities']}", flush=True)
    print(_engines_line(summary), flush=True)
    _save_series(
        "engines",
        args,
        {
            "params": params,
            "engines": args.engines,
            "searches": args.searches,
            **summary,
            "runs": rows,
        },
    )


def _arms_on_pools(
    context: Any, params: dict[str, Any], engines: int, arms: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """Arms side by side on `engines` fresh pools of `params`: on each pool one search per arm (its trial
    context: `arms` maps a name to it), the order rotating from pool to pool so that neither arm always
    runs first; each search's `_trial_summary` with its pool, position and host probe, by arm."""
    names = list(arms)
    by_arm: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with contextlib.closing(_fresh_pools(context, params, engines)) as pools:
        for engine, runner, probe in pools:
            order = names[engine % len(names) :] + names[: engine % len(names)]
            for position, name in enumerate(order):
                runner.context = arms[name]
                entry = _search_on(runner, lambda r: print(step_line(r), flush=True))
                by_arm[name].append(
                    {**_trial_summary(entry), "engine": engine, "position": position, "host_probe_s": round(probe, 3)}
                )
                print(f"engine {engine + 1} {name}: {entry['status_reason']}", flush=True)
    return by_arm


def _overrides(args: argparse.Namespace, items: list[str]) -> dict[str, Any]:
    """The `--settings` overrides with KEY=VALUE items on top (values read as YAML, the SLO as text)."""
    import yaml

    overrides = {**_settings(args.settings)}
    for item in items:
        key, value = item.split("=", 1)
        overrides[key.strip()] = yaml.safe_load(value) if key.strip() != "slo" else value
    return overrides


def rules(args: argparse.Namespace) -> None:
    """The baseline's capacity under each failure rule, one search each on every fresh pool, side by side."""
    from tuner.search import trial_context

    names = [name.strip() for name in args.rules.split(",")]
    overrides = _overrides(args, args.set)
    prepared = _prepared(overrides)
    context = trial_context(prepared)
    params = dict(prepared.baseline)
    print(f"SLO {prepared.config.slo}, overrides {overrides}", flush=True)
    print(
        f"baseline {params}: rules {', '.join(names)} on {args.engines} engines, settings {args.settings}", flush=True
    )
    arms = {
        name: dataclasses.replace(context, plan=dataclasses.replace(context.plan, failure_rule=name)) for name in names
    }
    by_rule = _arms_on_pools(context, params, args.engines, arms)
    _save_arms("rules", args, prepared, by_rule, summary_key="rules", set=args.set)


def _save_arms(
    kind: str,
    args: argparse.Namespace,
    prepared: Any,
    by_arm: dict[str, list[dict[str, Any]]],
    *,
    summary_key: str,
    **extra: Any,
) -> None:
    """Print and save a side-by-side series (`rules`, `settings`, `placement`): per arm the capacity's
    spread and cost (`_rule_summary`), with every search's rows."""
    summary = {arm: _rule_summary(runs) for arm, runs in by_arm.items()}
    for arm, row in summary.items():
        print(f"{arm}: {_rule_line(row)}", flush=True)
    _save_series(
        kind,
        args,
        {
            "params": dict(prepared.baseline),
            "slo": prepared.config.slo,
            **extra,
            "engines": args.engines,
            summary_key: summary,
            "runs": by_arm,
        },
    )


def settings(args: argparse.Namespace) -> None:
    """The baseline's capacity under measurement settings side by side (each arm `KEY=VALUE;...` of
    `capacity.*` overrides on top of `--settings`), one search per arm on every fresh pool: for example
    whether longer steps (`capacity.min_window_s`) repeat better, and what they cost."""
    from tuner.errors import ConfigError
    from tuner.search import trial_context

    arms, plans = {}, {}
    for arm in args.arms:
        try:
            prepared = _prepared(_overrides(args, [item for item in arm.split(";") if item.strip()]))
        except ConfigError as error:  # bad input: one line and exit code 2, as argparse's own errors
            print(f"capacity.py: error: settings: --arm {arm!r}: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        arms[arm] = trial_context(prepared)
        plans[arm] = {
            "plan": dataclasses.asdict(arms[arm].plan),
            "window_s": arms[arm].sample.window_s(arms[arm].reference_rps),
        }
    params = dict(prepared.baseline)
    print(f"baseline {params}: arms {' | '.join(arms)} on {args.engines} engines, settings {args.settings}", flush=True)
    by_arm = _arms_on_pools(next(iter(arms.values())), params, args.engines, arms)
    _save_arms("settings", args, prepared, by_arm, summary_key="arms", plans=plans)


def _schedstat(pids: list[int]) -> tuple[float, float]:
    """Seconds the threads of `pids` ran and waited runnable on a run queue (/proc/PID/task/*/schedstat)."""
    ran = waited = 0.0
    for pid in pids:
        for thread in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
            try:
                with open(f"/proc/{pid}/task/{thread}/schedstat") as stat:
                    run_ns, wait_ns, _ = stat.read().split()
            except (OSError, ValueError):
                continue
            ran, waited = ran + int(run_ns) / 1e9, waited + int(wait_ns) / 1e9
    return ran, waited


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (children of any of its threads, and theirs)."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop(0)
        for thread in os.listdir(f"/proc/{parent}/task") if os.path.isdir(f"/proc/{parent}/task") else []:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as children:
                    kids = [int(c) for c in children.read().split()]
            except OSError:
                continue
            found.extend(kids)
            queue.extend(kids)
    return found


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def _renice(pids: list[int], nice: int) -> None:
    """Every thread of `pids` at niceness `nice` (raising priority needs root)."""
    for pid in pids:
        for thread in os.listdir(f"/proc/{pid}/task"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(thread), nice)
            except ProcessLookupError:
                continue
            except PermissionError:
                raise SystemExit(
                    f"placement: niceness {nice} needs root (a server's priority is raised back)"
                ) from None


def placement(args: argparse.Namespace) -> None:
    """How a replica's processes are placed, arm against arm, one search per arm on every fresh pool (the
    order rotating): an arm is `WHERE/NICE`, WHERE the core of vLLM's scheduler process (engine core):
    `beside` its model worker on the claimed core (where the tool's placement leaves it) or `apart` on
    the API server's cores (where vLLM's own CPU binding reserves a core for it); NICE the niceness of
    the server's every process (15: what they inherit from Ray's workers; 0: normal priority, as a
    deployment runs). Per arm: the capacity, its spread, and where the worker's and the scheduler's
    threads' time went (schedstat: ran, and waited runnable)."""
    from trainables.vllm_engine import set_process_affinity
    from tuner.search import trial_context

    arms = [arm.strip() for arm in args.arms.split(",")]
    prepared = _prepared(_settings(args.settings))
    context = trial_context(prepared)
    params = dict(prepared.baseline)
    print(f"baseline {params}: arms {', '.join(arms)} on {args.engines} engines, settings {args.settings}", flush=True)
    by_arm: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    with contextlib.closing(_fresh_pools(context, params, args.engines)) as pools:
        for engine, runner, probe in pools:
            info = runner.pool.info[0]
            tree = [info["server_pid"], *_descendants(info["server_pid"])]
            # vLLM names them VLLM::EngineCore and VLLM::Worker...; the kernel keeps 15 characters
            schedulers = [pid for pid in tree if _comm(pid).startswith("VLLM::EngineCor")]
            workers = [pid for pid in tree if _comm(pid).startswith("VLLM::Worker")]
            if not (schedulers and workers):
                raise SystemExit(f"engine {engine}: no vLLM scheduler and worker found to place ({info})")
            apart = os.sched_getaffinity(info["server_pid"])
            order = arms[engine % len(arms) :] + arms[: engine % len(arms)]
            for position, arm in enumerate(order):
                where, nice = arm.split("/")
                for pid in schedulers:
                    set_process_affinity(pid, info["cores"] if where == "beside" else apart)
                _renice(tree, int(nice))
                placed = sorted(os.sched_getaffinity(schedulers[0]))
                before = _schedstat(workers), _schedstat(schedulers)
                entry = _search_on(runner, lambda r: print(step_line(r), flush=True))
                after = _schedstat(workers), _schedstat(schedulers)
                wall = entry["wall_s"]
                by_arm[arm].append(
                    {
                        **_trial_summary(entry),
                        "engine": engine,
                        "position": position,
                        "host_probe_s": round(probe, 3),
                        "scheduler_cores": placed,
                        "worker_cores": sorted(os.sched_getaffinity(workers[0])),
                        "nice": os.getpriority(os.PRIO_PROCESS, workers[0]),
                        "worker_run_share": round((after[0][0] - before[0][0]) / wall, 3),
                        "worker_wait_share": round((after[0][1] - before[0][1]) / wall, 3),
                        "scheduler_run_share": round((after[1][0] - before[1][0]) / wall, 3),
                    }
                )
                row = by_arm[arm][-1]
                print(
                    f"engine {engine + 1} {arm} (scheduler on {placed}, nice {row['nice']}): "
                    f"{entry['status_reason']}; the worker ran {row['worker_run_share']:.0%} and waited "
                    f"{row['worker_wait_share']:.0%} of the search, the scheduler ran "
                    f"{row['scheduler_run_share']:.0%}",
                    flush=True,
                )
    _save_arms("placement", args, prepared, by_arm, summary_key="arms")


def _rule_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Capacity's spread over the pools under one rule, and what a search cost."""
    capacities = [r["capacity"] or 0.0 for r in runs]
    positive = [c for c in capacities if c > 0]
    return {
        "capacities": capacities,
        "cv": _cv(capacities),
        "sd_log": statistics.stdev(math.log(c) for c in positive) if len(positive) > 1 else None,
        "median": statistics.median(capacities),
        "steps_mean": statistics.fmean(r["steps"] for r in runs),
        "wall_s_mean": statistics.fmean(r["wall_s"] for r in runs),
    }


def _rule_line(row: dict[str, Any]) -> str:
    sd_log = "n/a" if row["sd_log"] is None else f"{row['sd_log']:.3f}"
    return (
        f"capacities {', '.join(f'{c:.3g}' for c in row['capacities'])} rps/accel: CV {row['cv']:.1%}, SD(log) "
        f"{sd_log}, median {row['median']:.3g}; {row['steps_mean']:.1f} steps, {row['wall_s_mean']:.0f} s per search"
    )


def _engines_summary(rows: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """What an `engines` series says: its variance split, the CV of each engine's first search (what
    `repeatability` measures) and of every search, the mean by search order, and the pass probability
    by load over all its searches."""
    capacities = [[r["capacity"] for r in runs] for runs in rows]
    every = [c for group in capacities for c in group]
    searches = min(len(group) for group in capacities)
    return {
        "capacities": capacities,
        **_variance_components(capacities),
        "first_search_cv": _cv([group[0] for group in capacities]),
        "cv_all": _cv(every),
        "median": statistics.median(every),
        "mean_by_order": [statistics.fmean(group[i] for group in capacities) for i in range(searches)],
        "pass_by_load": pass_by_load([run for runs in rows for run in runs]),
    }


def _engines_line(summary: dict[str, Any]) -> str:
    loads = ", ".join(f"{row['load_factor']:g}x {row['passed']}/{row['steps']}" for row in summary["pass_by_load"])
    return (
        f"SD(log) within an engine {summary['sd_log_within_engine']:.3f}, between engines "
        f"{summary['sd_log_between_engines']:.3f} (p same level {summary['p_same_level']:.3f}); first search "
        f"on each engine CV {summary['first_search_cv']:.1%}, all CV {summary['cv_all']:.1%}; passed by load: " + loads
    )


# ----------------------------------------------------------------------------------------- fidelity


def _server_metrics(url: str) -> dict[str, float]:
    """Sums and counts of the server's own latency histograms (seconds)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
    ):
        for part in ("sum", "count"):
            values = [
                float(m.group(1))
                for m in re.finditer(rf"^{re.escape(name)}_{part}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
            ]
            out[f"{name.split(':')[1]}_{part}"] = sum(values)
    return out


def peer_capacity(prepared, params: dict[str, Any], work: Path, *, seed: int) -> dict[str, Any]:
    """The capacity search of `params` through vLLM's OpenAI server and `bench serve`."""
    import peer

    from tuner import capacity
    from tuner.metrics import observations, summarize_step, trial_metrics
    from tuner.search import trial_context
    from tuner.slo import parse_slo

    context = trial_context(prepared)
    slo = parse_slo(context.slo)
    port = peer.free_port()
    steps, lines, server_side = [], [], []
    began = time.perf_counter()
    text = peer.serve_yaml(prepared, params, port, "written by benchmarks/capacity.py")
    with peer.vllm_server(text, work, port) as url:
        start_s = time.perf_counter() - began
        while (chosen := capacity.next_step(context.plan, observations(steps, 1))) is not None:
            factor, phase = chosen
            number = len(steps) + 1
            rate = factor * context.reference_rps
            trace = work / f"step-{number}.jsonl"
            offsets, warmup = peer.write_timed_trace(context.sample, rate, trace, step=number + 1000 * seed)
            requests, _ = context.sample.layout(rate)
            before = _server_metrics(url)
            step_began = time.perf_counter()
            raw = peer.bench(
                url,
                trace,
                len(offsets),
                model_path=prepared.model_path,
                served_name="peer",
                work=work,
                name=f"bench-{number}.json",
                seed=seed,
            )
            after = _server_metrics(url)
            recs = peer.records(raw, offsets, warmup, [r.output_tokens for r in requests])
            summary = summarize_step(
                recs,
                slo,
                load_step=number,
                load_factor=factor,
                offered_rps=rate,
                window_s=context.sample.window_s(rate),
                horizon_s=context.sustain_horizon_s,
                phase=phase,
            )
            steps.append(summary)
            delta = {k: after[k] - before[k] for k in after}
            server = {
                "server_ttft_mean_s": delta["time_to_first_token_seconds_sum"]
                / max(delta["time_to_first_token_seconds_count"], 1),
                "server_e2e_mean_s": delta["e2e_request_latency_seconds_sum"]
                / max(delta["e2e_request_latency_seconds_count"], 1),
            }
            ttfts = [r.ttft_s for r in recs if r.ttft_s is not None]
            e2es = [r.e2e_s for r in recs if r.e2e_s is not None]
            server.update(
                client_ttft_mean_s=statistics.fmean(ttfts) if ttfts else None,
                client_e2e_mean_s=statistics.fmean(e2es) if e2es else None,
            )
            server_side.append(server)
            result = {**summary.metrics, "phase": str(phase), "step_wall_s": round(time.perf_counter() - step_began, 2)}
            lines.append(result)
            print(
                "  peer" + step_line(result)[1:] + f" | server ttft mean {server['server_ttft_mean_s']:.3f}s "
                f"client {server['client_ttft_mean_s'] or float('nan'):.3f}s",
                flush=True,
            )
    seen = observations(steps, 1)
    found = capacity.bracket(seen, context.plan.failure_rule)
    carried = trial_metrics(
        steps,
        num_accelerators=1,
        penalty_latency_s=context.penalty_latency_s,
        ref_records=None,
        failure_rule=context.plan.failure_rule,
    )
    return {
        "capacity": found.capacity,
        "hi": found.hi,
        "censored": found.censored,
        "reason": capacity.describe(
            found, capacity.limit(context.plan, seen), context.plan, reference_rps=context.reference_rps
        ),
        "steps": len(steps),
        "start_s": round(start_s, 2),
        "wall_s": round(time.perf_counter() - began, 2),
        "capacity_metrics": carried,
        "loads": [
            (
                round(s.load_factor, 4),
                round(s.arrival_rps, 3),
                s.passed,
                round(s.metrics["slo_headroom"], 3),
                round(s.metrics.get("ttft_growth", float("nan")), 4),
            )
            for s in steps
        ],
        "server_side": server_side,
    }


def side_by_side(tool: list[float], peer: list[float]) -> dict[str, Any]:
    """Each side's repeatability (CV of its capacities over the repeats, each on a fresh engine) and how
    the two move together: the log ratio tool/peer of each repeat (taken minutes apart, so drift of the
    host hits both) and its SD. If the peer, with no Ray and no tool of ours in its path, spreads as much
    as the tool, the spread is the host's and vLLM's, not the tool's measurement; a paired SD well below
    the unpaired ones says the two follow a common drift."""
    if len(tool) != len(peer) or len(tool) < 2 or min(tool + peer) <= 0:
        return {}
    ratios = [math.log(t / p) for t, p in zip(tool, peer, strict=True)]
    return {
        "tool_cv": _cv(tool),
        "peer_cv": _cv(peer),
        "tool_sd_log": statistics.stdev(math.log(v) for v in tool),
        "peer_sd_log": statistics.stdev(math.log(v) for v in peer),
        "log_ratios": [round(r, 4) for r in ratios],
        "paired_sd_log": statistics.stdev(ratios),
    }


def _side_by_side_line(row: dict[str, Any]) -> str:
    if "tool_cv" not in row:
        return "repeatability needs 2 or more repeats"
    return (
        f"CV tool {row['tool_cv']:.1%}, peer {row['peer_cv']:.1%}; SD(log) tool {row['tool_sd_log']:.3f}, "
        f"peer {row['peer_sd_log']:.3f}, of the paired ratio {row['paired_sd_log']:.3f}"
    )


def paired_ratio(log_ratios: list[float]) -> dict[str, Any]:
    """The geometric-mean ratio tool/peer over paired repeats and its 95% t-interval (scipy's one-sample
    t-test of the log ratios against 0): does the tool read high or low against the peer, and is that
    known to within the fidelity goal's 10%? Pairs whose ratios are all equal get a point interval."""
    from scipy.stats import ttest_1samp

    n = len(log_ratios)
    if n < 2:
        return {"pairs": n}
    mean = statistics.fmean(log_ratios)
    if statistics.stdev(log_ratios) == 0:
        low = high = mean
        p = 1.0 if mean == 0 else 0.0
    else:
        test = ttest_1samp(log_ratios, 0.0)
        interval = test.confidence_interval(0.95)
        low, high, p = float(interval.low), float(interval.high), float(test.pvalue)
    return {
        "pairs": n,
        "ratio": math.exp(mean),
        "ci95": [math.exp(low), math.exp(high)],
        "p": p,
        "within_10pct": 0.9 <= math.exp(low) and math.exp(high) <= 1.1,
    }


def spread_ratio(tool: list[list[float]], peer: list[list[float]]) -> dict[str, Any]:
    """Does the tool spread more than the peer? Each side's SD of log capacity pooled over its series
    (each series one config's repeats, so the configs' levels do not count as spread) and the ratio
    tool/peer with its 95% interval from the F distribution of the variance ratio: the check of "the
    tool's repeatability no worse than the peer's", and how many repeats it would take to settle it."""
    from scipy.stats import f

    def pooled(series: list[list[float]]) -> tuple[float, int]:
        kept = [[math.log(v) for v in s if v > 0] for s in series]
        kept = [s for s in kept if len(s) > 1]
        df = sum(len(s) - 1 for s in kept)
        if df == 0:
            return 0.0, 0
        return sum((len(s) - 1) * statistics.variance(s) for s in kept) / df, df

    (tool_var, tool_df), (peer_var, peer_df) = pooled(tool), pooled(peer)
    if not tool_df or not peer_df:
        return {}
    spreads = {"tool_sd_log": math.sqrt(tool_var), "peer_sd_log": math.sqrt(peer_var), "df": [tool_df, peer_df]}
    if spreads["peer_sd_log"] < 0.001:
        return spreads  # the peer repeats its capacity (to 0.1%): a ratio to that would be a ratio to jitter
    ratio = tool_var / peer_var
    return {
        **spreads,
        "sd_ratio": math.sqrt(ratio),
        "sd_ratio_ci95": [
            math.sqrt(ratio / f.ppf(0.975, tool_df, peer_df)),
            math.sqrt(ratio / f.ppf(0.025, tool_df, peer_df)),
        ],
        "sd_ratio_bootstrap_ci95": bootstrap_sd_ratio(tool, peer),
    }


def bootstrap_sd_ratio(
    tool: list[list[float]], peer: list[list[float]], *, resamples: int = 4000, seed: int = 0
) -> list[float] | None:
    """The SD ratio's 95% percentile interval with each series' repeats resampled (the tool's and the
    peer's capacity of one repeat kept together: they were measured minutes apart). A check on the F
    interval, which assumes normal log capacities where the recorded ones are quantised to the bracket's
    steps and heavy-tailed (rare deep failures). scipy's `bootstrap` resamples the pooled sample, not
    within each series, hence this loop. Resamples with no spread on either side say nothing and are
    dropped; a tool spread over none of the peer's counts as an unbounded ratio. None where no series has
    2 paired repeats."""
    import numpy as np

    pairs = [
        np.log([(t, p) for t, p in zip(ts, ps, strict=True) if t > 0 < p])
        for ts, ps in zip(tool, peer, strict=True)
        if len(ts) == len(ps)
    ]
    pairs = [s for s in pairs if len(s) > 1]
    if not pairs:
        return None
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(resamples):
        squares = np.zeros(2)
        for s in pairs:
            draw = s[rng.integers(0, len(s), len(s))]
            squares += ((draw - draw.mean(axis=0)) ** 2).sum(axis=0)
        if squares.any():
            ratios.append(math.sqrt(squares[0] / squares[1]) if squares[1] > 0 else math.inf)
    if not ratios:
        return None
    low, high = np.quantile(ratios, [0.025, 0.975], method="inverted_cdf")
    return [float(low), float(high)]


def pooled_fidelity(results: dict[str, Any], *, by_kind: bool = False) -> dict[str, Any]:
    """Every recorded fidelity series' repeats, pooled by settings and serving over configs and sections
    (with `by_kind`, also by the machine kind each section was recorded on: `kind_label`): each repeat's
    log ratio of the tool's capacity to the peer's (measured minutes apart), then `paired_ratio`; and each
    side's spread over its repeats, then `spread_ratio`. A repeat with a capacity of 0 on either side has
    no ratio and is left out."""
    groups: dict[str, list[float]] = {}
    series: dict[str, tuple[list[list[float]], list[list[float]]]] = {}
    for section, payload in results.items():
        if not section.startswith("fidelity"):
            continue
        for row in payload["configs"].values():
            peer = [r["capacity"] for r in row["peer"]]
            for side, runs in row.items():
                if not side.startswith("tool:"):
                    continue
                key = f"{payload['settings']} settings, {side.removeprefix('tool:')} serving"
                if by_kind:
                    key += f", {kind_label(payload.get('machine', {}))}"
                groups.setdefault(key, []).extend(
                    math.log(r["capacity"] / p) for r, p in zip(runs, peer, strict=True) if r["capacity"] > 0 < p
                )
                tool_series, peer_series = series.setdefault(key, ([], []))
                tool_series.append([r["capacity"] for r in runs])
                peer_series.append(peer)
    return {key: {**paired_ratio(ratios), **spread_ratio(*series[key])} for key, ratios in groups.items()}


def kind_label(machine: dict[str, Any]) -> str:
    """The machine kind a section was recorded on, as `common.cpu_kind` tells kinds apart (the CPU model
    and whether it computes bfloat16 natively): capacities differ several-fold between kinds, so a spread or
    ratio pooled over kinds can hide one kind's. Sections from before the kind was recorded say so."""
    if "cpu_model" not in machine:
        return "machine kind not recorded"
    bf16 = "native bfloat16" if machine.get("bf16_native") else "no native bfloat16"
    return f"{machine['cpu_model']} ({bf16})"


def _pooled_line(key: str, row: dict[str, Any]) -> str:
    if "ratio" not in row:
        return f"{key}: {row['pairs']} pair(s), too few for an interval"
    low, high = row["ci95"]
    return (
        f"{key}: tool/peer {row['ratio']:.3f} over {row['pairs']} paired repeats "
        f"(95% interval {low:.3f}-{high:.3f}, p {row['p']:.2f}; within 10%: {row['within_10pct']})"
        + _spread_ratio_line(row)
    )


def _spread_ratio_line(row: dict[str, Any]) -> str:
    if "tool_sd_log" not in row:
        return ""
    line = f"; SD(log) tool {row['tool_sd_log']:.3f}, peer {row['peer_sd_log']:.3f}"
    if "sd_ratio" not in row:
        return line + " (no ratio: the peer repeats its capacity)"
    low, high = row["sd_ratio_ci95"]
    line += (
        f", ratio {row['sd_ratio']:.2f} (95% interval {low:.2f}-{high:.2f}, "
        f"{row['df'][0]} and {row['df'][1]} degrees of freedom"
    )
    if row.get("sd_ratio_bootstrap_ci95"):
        low, high = row["sd_ratio_bootstrap_ci95"]
        line += f"; resampling the repeats {low:.2f}-{high:.2f}"
    return line + ")"


def _midpoint(run: dict[str, Any]) -> float:
    return (run["capacity"] * run["hi"]) ** 0.5 if run["hi"] else run["capacity"]


def fidelity(args: argparse.Namespace) -> None:
    from tuner.search import trial_context

    servings = [s.strip() for s in args.servings.split(",") if s.strip()]
    sides = [f"tool:{s}" for s in servings] + ["peer"]
    prepared = _prepared(_settings(args.settings))
    chosen = [c.strip() for c in args.configs.split(",") if c.strip()]
    configs = {name: dict(FIDELITY_CONFIGS[name] or prepared.baseline) for name in chosen}
    rows: dict[str, dict[str, Any]] = {
        name: {"params": p, **{side: [] for side in sides}} for name, p in configs.items()
    }
    with tempfile.TemporaryDirectory(prefix="vllm-tuner-capacity-") as tmp:
        for repeat in range(args.repeats):
            for name, params in configs.items():
                # Interleaved: every side of a config in turn, so drift on the machine hits all alike.
                for serving in servings:
                    print(f"[{repeat + 1}/{args.repeats}] {name}: tool, serving {serving}", flush=True)
                    context = trial_context(prepared)
                    context = dataclasses.replace(context, serving=serving)
                    start_local_ray()
                    try:
                        entry = run_trial(
                            context,
                            params,
                            f"fid-{name}-{serving}-{repeat}",
                            on_step=lambda r: print(step_line(r), flush=True),
                        )
                    finally:
                        stop_ray()
                    rows[name][f"tool:{serving}"].append(_trial_summary(entry))
                    print(f"  tool ({serving}): {entry['status_reason']}", flush=True)
                    time.sleep(5)  # let the engine processes exit before the next side starts
                print(f"[{repeat + 1}/{args.repeats}] {name}: vLLM server + bench serve", flush=True)
                run = peer_capacity(prepared, params, Path(tmp), seed=repeat + 1)
                rows[name]["peer"].append(run)
                print(f"  peer: {run['reason']}", flush=True)
                time.sleep(5)
    verdicts: dict[str, dict[str, Any]] = {}
    for name, row in rows.items():
        peer_mid = statistics.fmean(_midpoint(r) for r in row["peer"])
        peer_lo, peer_hi = min(r["capacity"] for r in row["peer"]), max(r["hi"] or r["capacity"] for r in row["peer"])
        for serving in servings:
            runs = row[f"tool:{serving}"]
            tool_mid = statistics.fmean(_midpoint(r) for r in runs)
            tool_lo, tool_hi = min(r["capacity"] for r in runs), max(r["hi"] or r["capacity"] for r in runs)
            overlap = tool_lo <= peer_hi and peer_lo <= tool_hi
            verdicts.setdefault(name, {})[serving] = {
                "tool_midpoint": tool_mid,
                "peer_midpoint": peer_mid,
                "ratio": tool_mid / peer_mid,
                "tool_range": [tool_lo, tool_hi],
                "peer_range": [peer_lo, peer_hi],
                "brackets_overlap": overlap,
                "midpoints_within_10pct": abs(tool_mid / peer_mid - 1) <= 0.10,
                **side_by_side([r["capacity"] for r in runs], [r["capacity"] for r in row["peer"]]),
            }
            print(
                f"{name} ({serving}): tool {tool_mid:.2f} [{tool_lo:.2f}-{tool_hi:.2f}], peer {peer_mid:.2f} "
                f"[{peer_lo:.2f}-{peer_hi:.2f}]: ratio {tool_mid / peer_mid:.3f}, overlap {overlap}; "
                + _side_by_side_line(verdicts[name][serving]),
                flush=True,
            )
    _save_series(
        "fidelity",
        args,
        {
            "plan": dataclasses.asdict(trial_context(prepared).plan),
            "slo": prepared.config.slo,
            "repeats": args.repeats,
            "servings": servings,
            "configs": rows,
            "verdicts": verdicts,
        },
    )
    _plot_fidelity(
        rows, sides, "capacity.png" if not args.label else f"capacity_fidelity_{args.settings}_{args.label}.png"
    )


def _plot_fidelity(rows: dict[str, Any], sides: list[str], filename: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    y = 0
    labels = []
    for name, row in rows.items():
        for side, color in zip(sides, ("tab:blue", "tab:green", "tab:orange")[-len(sides) :], strict=False):
            for run in row[side]:
                hi = run["hi"] or run["capacity"]
                ax.plot([run["capacity"], hi], [y, y], color=color, linewidth=4, solid_capstyle="butt")
                y += 1
                labels.append(f"{name} {side if side != 'peer' else 'vLLM server + bench serve'}")
        y += 1
        labels.append("")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("capacity bracket: highest pass .. lowest failure (requests/s per accelerator)")
    ax.set_title("Capacity: the tool and vLLM's server + bench serve\n(same samples, SLO and planner)", fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / filename, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------- bursty


def _gamma_trace(path: Path) -> None:
    from click.testing import CliRunner

    from tuner.config import BUNDLED_WORKLOAD
    from tuner.workload.cli import workload as cli  # the tool's own `workload synth`

    result = CliRunner().invoke(
        cli,
        [
            "synth",
            "--from",
            str(BUNDLED_WORKLOAD),
            "--arrivals",
            "gamma",
            "--cv",
            "4",
            "--rate",
            "5",
            "--count",
            "600",
            "--seed",
            "3",
            "--out",
            str(path),
        ],
    )
    if result.exit_code != 0:
        raise SystemExit(f"workload synth failed: {result.output}")


def bursty(args: argparse.Namespace) -> None:
    from tuner.search import trial_context

    rows = {}
    with tempfile.TemporaryDirectory(prefix="vllm-tuner-bursty-") as tmp:
        gamma = Path(tmp) / "gamma-cv4.jsonl"
        _gamma_trace(gamma)
        traces = {
            "burstgpt": {
                "workload.path": str(SHARED / "BurstGPT_1.first400.csv"),
                "workload.format": "burstgpt",
                "workload.transforms": {
                    "target_rate_rps": 5.0,
                    "max_model_len": 2048,
                    "prompt_scale": 0.25,
                    "output_scale": 0.25,
                },
            },
            "gamma_cv4": {"workload.path": str(gamma)},
        }
        start_local_ray()
        try:
            for name, overrides in traces.items():
                prepared = _prepared(overrides)
                context = trial_context(prepared)
                entry = run_trial(
                    context,
                    dict(prepared.baseline),
                    f"bursty-{name}",
                    on_step=lambda r: print(step_line(r), flush=True),
                )
                steps = entry["steps"]
                errors = [abs(s["arrival_rps"] / s["offered_rps"] - 1) for s in steps]
                rows[name] = {
                    "trace": str(overrides["workload.path"]).replace(str(ROOT.parent), ".."),
                    "reference_rps": prepared.reference_rps,
                    "sample": prepared.sample.describe(),
                    "steps": [
                        {
                            "load_factor": s["load_factor"],
                            "offered_rps": s["offered_rps"],
                            "arrival_rps": s["arrival_rps"],
                            "measured_requests": s["measured_requests"],
                            "slo_pass": s["slo_pass"],
                        }
                        for s in steps
                    ],
                    "max_arrival_error": max(errors),
                    "empty_steps": sum(1 for s in steps if s["measured_requests"] == 0),
                    "met": max(errors) <= 0.05 and all(s["measured_requests"] > 0 for s in steps),
                    "capacity": _trial_summary(entry),
                }
                print(
                    f"{name}: max |arrival/offered - 1| = {max(errors):.2%} over {len(steps)} steps; "
                    f"{entry['status_reason']}",
                    flush=True,
                )
        finally:
            stop_ray()
    _save("bursty", {"goal": "every step's arrival_rps within 5% of offered_rps, no empty step", "traces": rows})


def _series_parser(commands: Any, name: str, help: str, *, pools: bool = False) -> argparse.ArgumentParser:
    """A command that records a series: its --settings and --label (the results section
    NAME_SETTINGS_LABEL), and with `pools` the --engines it runs on."""
    sub = commands.add_parser(name, help=help)
    if pools:
        sub.add_argument("--engines", type=int, default=5, help="fresh pools, at least 2 (default 5)")
    sub.add_argument("--settings", choices=("full", "demo"), default="full")
    sub.add_argument("--label", default="", help=f"suffix of the results section ({name}_SETTINGS_LABEL)")
    return sub


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_bench":
        import peer

        peer._bench(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rep = commands.add_parser("repeatability", help="the baseline's capacity, measured several times")
    rep.add_argument("--repeats", type=int, default=5)
    rep.add_argument("--settings", choices=("full", "demo"), default="full")
    rep.add_argument(
        "--label",
        default="",
        help="suffix of the results section (repeatability_SETTINGS_LABEL), e.g. the CPU kind, so that a "
        "measurement on another machine does not replace the recorded one",
    )
    fid = _series_parser(commands, "fidelity", "tool vs vLLM's server + bench serve, two configs")
    fid.add_argument("--repeats", type=int, default=2)
    fid.add_argument(
        "--configs",
        default=",".join(FIDELITY_CONFIGS),
        help=f"which configs, comma-separated, from {', '.join(FIDELITY_CONFIGS)} (default: both)",
    )
    fid.add_argument(
        "--servings",
        default="openai-server,in-process",
        help="how the tool serves its replicas, comma-separated (default: both)",
    )
    eng = _series_parser(
        commands, "engines", "the baseline searched several times on each of several engines", pools=True
    )
    eng.add_argument("--searches", type=int, default=3, help="searches on each pool, at least 2 (default 3)")
    rul = _series_parser(
        commands, "rules", "the capacity search's failure rules side by side, fresh engines", pools=True
    )
    rul.add_argument("--rules", default="once,majority", help="failure rules, comma-separated (default: both)")
    rul.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override on top of the settings, e.g. slo='ttft:p95<2s; tpot:p95<100ms' (repeatable)",
    )
    sett = _series_parser(commands, "settings", "measurement settings side by side, fresh engines", pools=True)
    sett.add_argument(
        "--arm",
        dest="arms",
        action="append",
        default=[],
        metavar="KEY=VALUE;...",
        help="one arm: capacity.* overrides on top of --settings, e.g. 'capacity.min_window_s=40' (at least 2; "
        "an empty string for --settings as they are)",
    )
    pla = _series_parser(
        commands, "placement", "vLLM's scheduler beside its worker or apart, and the niceness", pools=True
    )
    pla.add_argument(
        "--arms",
        default="apart/0,beside/15",
        help="WHERE/NICE, comma-separated: vLLM's scheduler apart from or beside its worker, the server's "
        "niceness (default: vLLM's own reserve at normal priority against the tool's placement)",
    )
    commands.add_parser("bursty", help="bursty traces offer the load asked for")
    commands.add_parser(
        "analyse", help="where each recorded series' spread lives; the tool/peer ratio pooled over fidelity (no engine)"
    )
    args = parser.parse_args()
    if args.command == "engines" and min(args.engines, args.searches) < 2:
        parser.error("engines: --engines and --searches must each be at least 2 (a spread needs two of each)")
    if args.command == "rules":
        from tuner.capacity import FAILURE_RULES

        unknown = [name for name in args.rules.split(",") if name.strip() not in FAILURE_RULES]
        if unknown or args.engines < 2:
            parser.error(f"rules: --rules from {', '.join(FAILURE_RULES)} and --engines at least 2")
        if any("=" not in item for item in args.set):
            parser.error("rules: --set takes KEY=VALUE")
    if args.command == "settings":
        items = [item.strip() for arm in args.arms for item in arm.split(";") if item.strip()]
        if (
            len(args.arms) < 2
            or len(set(args.arms)) < len(args.arms)
            or args.engines < 2
            or any("=" not in item or not item.startswith("capacity.") for item in items)
        ):
            parser.error(
                "settings: at least 2 different --arm 'capacity.KEY=VALUE;...' (capacity settings only: the "
                "engine must be the same in every arm), --engines at least 2"
            )
    if args.command == "fidelity":
        from typing import get_args

        from tuner.config import SearchConfig

        servings = get_args(SearchConfig.model_fields["serving"].annotation)
        configs = [c.strip() for c in args.configs.split(",")]
        given = [s.strip() for s in args.servings.split(",")]
        if args.repeats < 1 or not all(configs) or set(configs) - set(FIDELITY_CONFIGS) or set(given) - set(servings):
            parser.error(
                f"fidelity: --configs from {', '.join(FIDELITY_CONFIGS)}, --servings from {', '.join(servings)}, "
                "--repeats at least 1"
            )
    if args.command == "placement":
        arms = [arm.strip().split("/") for arm in args.arms.split(",")]
        if args.engines < 2 or any(
            len(a) != 2 or a[0] not in ("apart", "beside") or not a[1].isdigit() or int(a[1]) > 19 for a in arms
        ):
            parser.error("placement: --arms WHERE/NICE,... (WHERE apart or beside, NICE 0-19), --engines at least 2")
    {
        "repeatability": repeatability,
        "engines": engines,
        "rules": rules,
        "placement": placement,
        "settings": settings,
        "fidelity": fidelity,
        "bursty": bursty,
        "analyse": analyse,
    }[args.command](args)


if __name__ == "__main__":
    main()
