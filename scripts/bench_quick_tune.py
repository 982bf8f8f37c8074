#!/usr/bin/env python3
"""Quick tuning on layer shapes no record covers, against cuDNN.

Draws convolution problems at random (seeded; the seed is printed), keeps those that no shipped
record covers (the lookup borrows a nearest shape's config or falls back to the default), and for
each one: the lookup's config untuned, quick tuning (autocnn.dispatch.quick, the cuda backend's
default, with its budget), the chosen config and the lookup's timed again side by side, and
PyTorch/cuDNN (``cudnn.benchmark`` on, TF32 off). Prints one line per problem and the geometric
means of cuDNN's time over ours (above 1: faster than cuDNN); writes every number as JSON.
Quick records go to a temporary database, so the user's stays as it was.

    python scripts/bench_quick_tune.py --count 24 --seed 1 --out quick.json
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.dispatch.quick import QUICK_BUDGET_S, check_budget  # noqa: E402
from autocnn.benchmark.random_shapes import CONV_OPS  # noqa: E402


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=24, help="problems no record covers (default 24)")
    ap.add_argument("--ops", default=",".join(CONV_OPS), help="comma-separated convolution operations")
    ap.add_argument("--seed", type=int, default=None, help="shape seed (default: drawn and printed)")
    ap.add_argument("--budget", type=float, default=QUICK_BUDGET_S, help="quick tuning's budget per problem, s")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved re-timing rounds of both configs")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_quick_tune.json"))
    args = ap.parse_args(argv)
    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    bad = [o for o in ops if o not in CONV_OPS]
    if bad or not ops:
        ap.error(f"--ops: {', '.join(bad) or 'none given'}; choose among {', '.join(CONV_OPS)}")
    if args.count < 1 or args.rounds < 1:
        ap.error("--count and --rounds must be at least 1")
    try:
        check_budget(args.budget)
    except ValueError as exc:
        ap.error(str(exc))

    from autocnn.gpu import require_cupy
    from autocnn.store import TuningDatabase
    from autocnn.benchmark.baselines import time_cudnn, torch_available
    from autocnn.search.confirm import retime
    from autocnn.measurement.measure import L2Flusher
    from autocnn.dispatch.quick import quick_tune
    from autocnn.benchmark.random_shapes import unseen_problems
    from autocnn.measurement.sources import GpuSource

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    cp = require_cupy()
    cp.cuda.Device(args.device).use()
    if not torch_available():
        print("autocnn: this benchmark compares with cuDNN: install PyTorch with CUDA", file=sys.stderr)
        return 1
    source = GpuSource(args.device)
    device = source.device
    flusher = L2Flusher(device.l2_bytes)
    print(f"# {device.name} ({device.arch}), shape seed {seed}, quick budget {args.budget:g} s", flush=True)
    rows = []
    start = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        db = TuningDatabase(user_dir=Path(scratch))
        try:
            for problem, looked in unseen_problems(db, device, ops, args.count, random.Random(seed)):
                outcome = quick_tune(problem, device, db, source, args.budget, lookup=looked)
                configs = [looked.config] + ([outcome.config] if outcome.config.key() != looked.config.key() else [])
                medians, _ = retime(source, problem.op, problem, configs, args.rounds)
                untuned = medians.get(looked.config.key())
                quick = medians.get(outcome.config.key())
                cudnn = time_cudnn(problem.op, problem, flusher=flusher, budget_s=0.4)
                row = {"op": problem.op, "shape": problem.shape_string(), "problem": problem.to_dict(),
                       "lookup_source": looked.source, "untuned_us": untuned, "quick_us": quick, "cudnn_us": cudnn,
                       "quick_seconds": outcome.seconds, "measured": len(outcome.results),
                       "candidates": len(outcome.candidates), "failed": len(outcome.failed),
                       "chosen": next((c.origin for c in outcome.candidates
                                       if c.config.key() == outcome.config.key()), "lookup")}
                rows.append(row)

                def ratio(ours: float | None) -> str:
                    return f"{cudnn / ours:5.2f}x" if cudnn and ours else "  -  "

                print(f"{problem.op:13s} {row['shape']:60s} {looked.source:13s} untuned {ratio(untuned)} "
                      f"quick {ratio(quick)} ({row['measured']}/{row['candidates']} in {outcome.seconds:.1f} s, "
                      f"{row['chosen']})", flush=True)
                args.out.write_text(json.dumps({"device": device.to_dict(), "seed": seed, "budget_s": args.budget,
                                                "rows": rows}, indent=1))
        finally:
            source.close()
    print(f"\n# {len(rows)} problems in {time.time() - start:.0f} s; every number in {args.out}")
    for label, key in (("untuned (lookup)", "untuned_us"), ("quick-tuned", "quick_us")):
        ratios = [r["cudnn_us"] / r[key] for r in rows if r["cudnn_us"] and r[key]]
        g = geomean(ratios)
        faster = sum(1 for x in ratios if x >= 1.0)
        print(f"{label:17s}: {g:.2f}x cuDNN (geometric mean over {len(ratios)}), {faster} at least as fast"
              if g is not None else f"{label:17s}: nothing timed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
