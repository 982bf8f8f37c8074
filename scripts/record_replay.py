#!/usr/bin/env python3
"""Record replay files: every config of a (restricted) search space measured on this GPU.

The files let the search, the database and the command line run on the CPU with real data
(autocnn.measurement.sources.ReplaySource). Each file covers one problem; with --fix, parameters are held at
one value so that the rest of the space can be measured exhaustively.

    python scripts/record_replay.py --op conv_wgrad --shapes kriz09,convnet18_c1 \
        --fix formulation=atomic,PAD_A=1,PAD_B=1,UNROLL_K=0,BK=16 --out tests/data/replay
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_fixed(text: str) -> dict:
    fixed = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = item.partition("=")
        fixed[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return fixed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", required=True)
    ap.add_argument("--shapes", required=True, help="comma-separated seed shape names")
    ap.add_argument("--fix", default="", help="parameters held fixed, e.g. formulation=atomic,BK=16")
    ap.add_argument("--budget", type=float, default=0.03, help="seconds of timed repetitions per config")
    ap.add_argument("--out", type=Path, default=Path("tests/data/replay"))
    ap.add_argument("--max-configs", type=int, default=5000, help="refuse larger spaces (use --fix)")
    args = ap.parse_args(argv)

    from autocnn.kernels import get_operation
    from autocnn.measurement.sources import GpuSource, ReplayFile
    from autocnn.kernels.suite import seed_shape

    fixed = parse_fixed(args.fix)
    operation = get_operation(args.op)
    source = GpuSource(budget_s=args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in filter(None, (s.strip() for s in args.shapes.split(","))):
        problem = seed_shape(name).problem(args.op)
        space = operation.space(problem, source.device.limits())
        if fixed:
            space = space.restrict(fixed)
        configs = space.feasible_configs()
        if len(configs) > args.max_configs:
            print(f"{name}: {len(configs)} configs exceed --max-configs; hold more parameters fixed", file=sys.stderr)
            return 2
        start = time.time()
        results = {}
        for r in source.measure(args.op, problem, configs):
            results[r.config.key()] = r
        replay = ReplayFile(source.device, args.op, problem, operation.fingerprint(), fixed, True, results)
        path = args.out / f"{args.op}__{name}.json.gz"
        with gzip.open(path, "wt") as fh:
            json.dump(replay.to_dict(), fh, sort_keys=True)
        ok = [r for r in results.values() if r.ok]
        best = min(ok, key=lambda r: r.time_us) if ok else None
        print(f"{args.op} {name}: {len(configs)} configs, {len(ok)} verified, best "
              f"{best.time_us if best else float('nan'):.1f} us, {time.time() - start:.0f} s -> {path}", flush=True)
    source.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
