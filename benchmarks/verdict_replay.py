"""The confirmation's error rates at another capacity noise than the one its default rounds are sized on.

    .venv/bin/python benchmarks/verdict_replay.py --cv 0.069   # this AVX-512 host's 16-run CV: ~1 min

Replays the whole search-then-confirm exactly as tests/unit/test_verdict.py does (its `_declared`: each
measurement's breaking point is the true capacity x lognormal(0, CV), the real capacity planner chooses
the loads, `tuner.confirm.run_confirmation` and `tuner.verdict` decide), with the measured CV of a host
instead of `tuner.confirm.REPEATABILITY_CV`, 400 seeds per cell: how often a config 30% better is
declared the winner, and how often one identical to the baseline is declared different, beside the
computed power (`tuner.verdict.detection_power`). No engine is started. Results are added to
reports/benchmarks/verdict_replay.json under the CV.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "unit")]

RESULTS = ROOT / "reports" / "benchmarks" / "verdict_replay.json"
CELLS = ((0.1, (3, 4, 5, 6)), (0.2, (4, 5, 6)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cv", type=float, required=True, help="capacity noise of one measurement (e.g. 0.069)")
    parser.add_argument("--seeds", type=int, default=400)
    args = parser.parse_args()

    import test_verdict

    from tuner.verdict import detection_power

    rows = []
    for resolution, rounds_list in CELLS:
        for rounds in rounds_list:
            wins = sum(
                test_verdict._declared(seed, [1.3], rounds, resolution, args.cv) == (True, "f0")
                for seed in range(args.seeds)
            )
            false = sum(
                test_verdict._declared(10_000 + seed, [1.0], rounds, resolution, args.cv)[0]
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
    results[f"cv_{args.cv:g}"] = {
        "cv": args.cv,
        "seeds": args.seeds,
        "cells": rows,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS}", flush=True)


if __name__ == "__main__":
    main()
