"""Why would a trial read lower than its config's re-measurements in the same run? Three side-by-side tests.

    .venv/bin/python benchmarks/trial_gap.py placement --pairs 3        # ~12 min here
    .venv/bin/python benchmarks/trial_gap.py plan --pairs 4             # ~15 min
    .venv/bin/python benchmarks/trial_gap.py repeat-step --engines 4 --repeats 6   # ~9 min

Each measures vLLM's defaults at the demo's settings (the embedded config), a fresh engine per search, the
arms' order alternating from pair to pair, and writes every step to reports/benchmarks/trial_gap/:

- **placement**: the same capacity search (a climb from the reference load, as a trial runs it) with the
  replay client in this process at normal priority (where a confirmation measurement runs it) or in a Ray
  worker at Ray's nice 15 (where a Tune trainable runs it);
- **plan**: from this process, a trial's plan (climb from the reference load) against a confirmation's
  round-1 plan (tuner.confirm.warm_plan from the bracket --bracket, the trials' usual reading here);
- **repeat-step**: on each fresh engine, the warm plan's first step (the bracket's lower end) --repeats
  times in a row: is an engine's first step slower than its later ones?

Measurements, not tests; nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

OUT = ROOT / "reports" / "benchmarks" / "trial_gap"
KEYS = (
    "load_step",
    "offered_rps",
    "slo_pass",
    "ttft_p95_s",
    "ttft_p50_s",
    "tpot_p95_s",
    "tpot_p50_s",
    "ttft_growth",
    "step_wall_s",
    "capacity_rps_per_accel",
    "capacity_hi_rps_per_accel",
)


def search_steps(context: Any, params: dict[str, Any], trial_id: str) -> dict[str, Any]:
    """One capacity search on a fresh pool started from the calling process (common.run_trial): every
    step's figures, and where the client ran (pid, niceness)."""
    if str(ROOT / "benchmarks") not in sys.path:  # a Ray worker starts without it
        sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import run_trial

    began = time.time()
    trial = run_trial(context, params, trial_id)
    return {
        "began": round(began, 1),
        "pid": os.getpid(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "steps": [{k: step.get(k) for k in KEYS} for step in trial["steps"]],
        "reason": trial["status_reason"],
    }


def _line(label: str, run: dict[str, Any]) -> str:
    last = run["steps"][-1]
    steps = " | ".join(
        f"{s['offered_rps']:.2f}:{'P' if s['slo_pass'] else 'F'} ttft {s['ttft_p95_s']:.2f} "
        f"tpot {1000 * s['tpot_p95_s']:.1f}"
        for s in run["steps"]
    )
    return f"{label}: capacity {last['capacity_rps_per_accel']:.2f} (nice {run['nice']}) {steps}"


def _setup(bracket: tuple[float, float]) -> tuple[Any, Any, dict[str, Any]]:
    """(the demo's trial context, the confirmation's round-1 context from `bracket`, vLLM's defaults)."""
    from capacity import _prepared

    from tuner.confirm import warm_plan
    from tuner.search import trial_context

    prepared = _prepared()
    context = trial_context(prepared)
    metrics = {"capacity_rps_per_accel": bracket[0], "capacity_hi_rps_per_accel": bracket[1]}
    plan = warm_plan(context.plan, metrics, context.reference_rps, prepared.config.confirm_resolution())
    return context, dataclasses.replace(context, plan=plan), dict(prepared.baseline)


def _save(name: str, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    from common import machine

    OUT.mkdir(parents=True, exist_ok=True)
    payload = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "machine": machine(), "runs": rows}
    path = OUT / f"{name}{'_' + args.label if args.label else ''}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {path}", flush=True)


def _pairs(args: argparse.Namespace, arms: dict[str, Any], name: str) -> None:
    from common import start_local_ray, stop_ray

    rows: list[dict[str, Any]] = []
    start_local_ray()
    try:
        names = list(arms)
        for pair in range(args.pairs):
            for arm in names if pair % 2 == 0 else names[::-1]:
                run = {**arms[arm](f"{arm}{pair}"), "arm": arm, "pair": pair}
                rows.append(run)
                print(_line(f"pair {pair} {arm}", run), flush=True)
    finally:
        stop_ray()
        _save(name, args, rows)


def placement(args: argparse.Namespace) -> None:
    import ray

    context, _, params = _setup(args.bracket)
    in_worker = ray.remote(num_cpus=0)(search_steps)
    arms = {
        "driver": lambda tid: search_steps(context, params, tid),
        "ray-worker": lambda tid: ray.get(in_worker.remote(context, params, tid)),
    }
    _pairs(args, arms, "placement")


def plan(args: argparse.Namespace) -> None:
    context, warm, params = _setup(args.bracket)
    print(f"warm plan: {warm.plan}", flush=True)
    arms = {
        "climb": lambda tid: search_steps(context, params, tid),
        "warm": lambda tid: search_steps(warm, params, tid),
    }
    _pairs(args, arms, "plan")


def repeat_step(args: argparse.Namespace) -> None:
    from capacity import _fresh_pools

    _, warm, params = _setup(args.bracket)
    rows: list[dict[str, Any]] = []
    try:
        with contextlib.closing(_fresh_pools(warm, params, args.engines)) as pools:
            for engine, runner, _probe in pools:
                ready = time.time()
                for repeat in range(args.repeats):
                    # the plan from its first step again, on the same engine (as capacity._search_on resets it)
                    runner.steps, runner.ref_records, runner._began = [], None, time.perf_counter()
                    runner._faults_left = list(runner.context.faults)
                    result = runner.next_step()
                    row = {"engine": engine, "repeat": repeat, "since_ready_s": round(time.time() - ready, 1)}
                    row.update({k: result.get(k) for k in KEYS})
                    rows.append(row)
                    print(
                        f"engine {engine} repeat {repeat} t+{row['since_ready_s']:.0f}s "
                        f"{result['offered_rps']:.2f} rps "
                        f"{'pass' if result['slo_pass'] else 'FAIL'} ttft p95 {result['ttft_p95_s']:.2f}s "
                        f"tpot p50 {1000 * result['tpot_p50_s']:.1f} p95 {1000 * result['tpot_p95_s']:.1f} ms",
                        flush=True,
                    )
    finally:
        _save("repeat_step", args, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bracket",
        type=float,
        nargs=2,
        default=(8.94, 10.63),
        metavar=("LO", "HI"),
        help="the trial bracket a confirmation's round 1 starts from (rps/accel; default: 8.94 10.63)",
    )
    parser.add_argument("--label", default="", help="added to the results file's name")
    commands = parser.add_subparsers(required=True)
    for name, func, help in (
        ("placement", placement, "the replay client in this process or in a Ray worker"),
        ("plan", plan, "a trial's climb or a confirmation's warm start"),
        ("repeat-step", repeat_step, "one step repeated on each fresh engine"),
    ):
        command = commands.add_parser(name, help=help)
        command.set_defaults(func=func)
        if name == "repeat-step":
            command.add_argument("--engines", type=int, default=4)
            command.add_argument("--repeats", type=int, default=6)
        else:
            command.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
