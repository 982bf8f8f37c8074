#!/usr/bin/env python3
"""How many measured trials each search strategy needs, on recorded GPU measurements.

For every replay file (an exhaustively measured space), each sampler is run several times with
different seeds; the figure is the number of measured trials until the best time found is within
5% of the exhaustive best. Medians over repeats, then over files, are printed as a table.

    python scripts/replay_search_study.py --repeats 5 --max-trials 200
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def trials_to_reach(keys, results, target):
    best = float("inf")
    for i, key in enumerate(keys, start=1):
        r = results.get(key)
        if r is not None and r.ok and r.time_us < best:
            best = r.time_us
        if best <= target:
            return i
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", type=Path, default=Path("tests/data/replay"))
    ap.add_argument("--samplers", default="tpe,random")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-trials", type=int, default=200)
    ap.add_argument("--within", type=float, default=0.05, help="relative distance to the exhaustive best")
    ap.add_argument("--out", type=Path, default=None, help="JSON results")
    args = ap.parse_args(argv)

    import optuna

    from autocnn.measurement.sources import ReplayFile, ReplaySource
    from autocnn.search.tuner import TuneSettings, Tuner

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    rows = []
    for path in sorted(args.replay.glob("*.json*")):
        rf = ReplayFile.load(path)
        target = rf.best().time_us * (1 + args.within)
        size = len(rf.results)
        row = {"file": path.name, "configs": size, "best_us": rf.best().time_us}
        for sampler in samplers:
            needed = []
            for seed in range(args.repeats):
                source = ReplaySource([rf])
                settings = TuneSettings(trials=min(args.max_trials, size), sampler=sampler, seed=seed,
                                        storage="memory", fixed=rf.space_filter, batch=8, confirm_rounds=1,
                                        warm_start=True)
                outcome = Tuner(source, None, settings, progress=False).tune(rf.op, rf.problem)
                n = trials_to_reach(source.measured_keys[:outcome.measured], rf.results, target)
                needed.append(n if n is not None else float("inf"))
            row[sampler] = statistics.median(needed)
        rows.append(row)
        print(f"{path.name:40s} {size:4d} configs  " +
              "  ".join(f"{s}: {row[s]:>5}" for s in samplers), flush=True)
    print(f"\ntrials until within {args.within:.0%} of the exhaustive best (median of {args.repeats} seeds; "
          f"inf: not within {args.max_trials} trials)\n")
    print("| replay file | configs | " + " | ".join(samplers) + " |")
    print("|---|---|" + "---|" * len(samplers))
    for r in rows:
        print(f"| {r['file']} | {r['configs']} | " + " | ".join(str(r[s]) for s in samplers) + " |")
    print("| **median over files** | | " + " | ".join(str(statistics.median(r[s] for r in rows)) for s in samplers) + " |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
