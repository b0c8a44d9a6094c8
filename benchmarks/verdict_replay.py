"""The confirmation's error rates at another capacity noise than the one its default rounds are sized on.

    .venv/bin/python benchmarks/verdict_replay.py --cv 0.069   # this AVX-512 host's 16-run CV: ~1 min
    .venv/bin/python benchmarks/verdict_replay.py --noise engines_full_avx512_bf16   # its recorded spread

Replays the whole search-then-confirm exactly as tests/unit/test_verdict.py does (its `_declared`: each
measurement's breaking point is the true capacity x lognormal(0, CV), the real capacity planner chooses
the loads, `tuner.confirm.run_confirmation` and `tuner.verdict` decide), with the measured CV of a host
instead of `tuner.confirm.REPEATABILITY_CV`, 400 seeds per cell: how often a config 30% better is
declared the winner, and how often one identical to the baseline is declared different, beside the
computed power (`tuner.verdict.detection_power`). No engine is started. Results are added to
reports/benchmarks/verdict_replay.json under the CV.

`--noise SECTION[,SECTION...]` draws each measurement's noise from recorded capacity series instead
(sections of reports/benchmarks/capacity.json): a recorded run's interpolated crossing over its series'
median (the capacity where a run has no crossing), so rare deep failures count as often as they were
measured, where a lognormal of the same CV would spread them evenly. Saved under `noise_SECTIONS`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "unit")]

RESULTS = ROOT / "reports" / "benchmarks" / "verdict_replay.json"
CAPACITY = ROOT / "reports" / "benchmarks" / "capacity.json"
CELLS = ((0.1, (3, 4, 5, 6)), (0.2, (4, 5, 6)))


def recorded_factors(sections: list[str]) -> list[float]:
    """Each recorded run's breaking point over its series' median: its interpolated crossing where it
    has one (the capacity otherwise), from `capacity.py`'s repeatability and engines sections."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from capacity import crossing

    recorded = json.loads(CAPACITY.read_text())
    factors = []
    for section in sections:
        if section not in recorded:
            raise ValueError(f"--noise: no section {section!r} in {CAPACITY} (have: {', '.join(recorded)})")
        runs = recorded[section]["runs"]
        runs = [run for group in runs for run in group] if runs and isinstance(runs[0], list) else runs
        points = [crossing(run["capacity"], run["loads"]) or run["capacity"] for run in runs]
        middle = statistics.median(points)
        factors += [point / middle for point in points]
    return factors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--cv", type=float, help="capacity noise of one measurement, lognormal (e.g. 0.069)")
    how.add_argument("--noise", help="recorded capacity.json sections to draw the noise from, comma-separated")
    parser.add_argument("--seeds", type=int, default=400)
    args = parser.parse_args()

    import test_verdict

    from tuner.verdict import detection_power

    noise, factors = None, []
    if args.noise:
        try:
            factors = recorded_factors(args.noise.split(","))
        except ValueError as error:
            parser.error(str(error))
        noise = lambda rng: factors[rng.integers(len(factors))]  # noqa: E731
        args.cv = statistics.stdev(factors) / statistics.fmean(factors)
        print(
            f"{len(factors)} recorded runs: factors {min(factors):.2f}-{max(factors):.2f} of the median, CV "
            f"{args.cv:.1%}, SD(log) {statistics.stdev(math.log(f) for f in factors):.3f}",
            flush=True,
        )
    rows = []
    for resolution, rounds_list in CELLS:
        for rounds in rounds_list:
            wins = sum(
                test_verdict._declared(seed, [1.3], rounds, resolution, args.cv, noise) == (True, "f0")
                for seed in range(args.seeds)
            )
            false = sum(
                test_verdict._declared(10_000 + seed, [1.0], rounds, resolution, args.cv, noise)[0]
                for seed in range(args.seeds)
            )
            row = {
                "resolution": resolution,
                "rounds": rounds,
                "detected_30pct": wins / args.seeds,
                "false_declarations": false / args.seeds,
                "computed_power": detection_power(rounds, cv=args.cv, resolution=resolution),
            }
            rows.append(row)
            print(
                f"CV {args.cv:.1%}, resolution {resolution:.0%}, {rounds} rounds: 30% better declared the winner "
                f"{row['detected_30pct']:.1%} (computed {row['computed_power']:.1%}), identical declared "
                f"different {row['false_declarations']:.2%}",
                flush=True,
            )
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[f"noise_{args.noise}" if args.noise else f"cv_{args.cv:g}"] = {
        "cv": args.cv,
        **({"noise": args.noise, "factors": [round(f, 4) for f in factors]} if args.noise else {}),
        "seeds": args.seeds,
        "cells": rows,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS}", flush=True)


if __name__ == "__main__":
    main()
