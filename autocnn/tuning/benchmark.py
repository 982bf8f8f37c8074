"""Benchmark every kernel family on the seed shapes, next to cuDNN, in one run on one GPU.

For each family and shape: the default config and the best of a random sample of valid configs
(every one verified against the float64 reference before it is timed), and PyTorch/cuDNN for the same
operation. Writes every measurement as JSON and prints a table last.

    autocnn bench --samples 64 --out bench.json      (or python scripts/bench_kernels.py ...)
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from autocnn.kernels import OPERATIONS, operation_for
from autocnn.kernels.suite import CONV_OPS, POOL_OPS, seed_problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=64, help="random valid configs per family and shape")
    ap.add_argument("--ops", default=",".join(CONV_OPS + POOL_OPS), help="comma-separated operations")
    ap.add_argument("--shapes", default="", help="comma-separated seed shape names (default: all)")
    ap.add_argument("--budget", type=float, default=0.08, help="seconds of timed repetitions per variant")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed (default: random, printed)")
    ap.add_argument("--out", type=Path, default=Path("bench_kernels.json"), help="JSON results")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)

    from autocnn.tuning.baselines import cudnn_runner, measure_ceilings, torch_available
    from autocnn.gpu import require_cupy
    from autocnn.tuning.measure import L2Flusher, time_callable
    from autocnn.tuning.sources import GpuSource

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPERATIONS]
    if unknown:
        ap.error(f"unknown operation(s) {unknown}; choose from {sorted(OPERATIONS)}")
    wanted = {s.strip() for s in args.shapes.split(",") if s.strip()}
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    rng = random.Random(seed)

    cp = require_cupy()
    cp.cuda.Device(args.device).use()
    source = GpuSource(args.device, budget_s=args.budget)
    device = source.device
    flusher = L2Flusher(device.l2_bytes)
    have_torch = torch_available()
    ceilings = measure_ceilings() if have_torch else None
    print(f"# {device.name} ({device.arch}, {device.sm_count} SMs), sampling seed {seed}", flush=True)
    if ceilings:
        print(f"# measured ceilings: copy {ceilings.copy_gbps:.0f} GB/s, SGEMM {ceilings.sgemm_tflops:.1f} TFLOP/s",
              flush=True)

    rows, records = [], []
    start = time.time()
    for op in ops:
        for name, problem in seed_problems(op):
            if wanted and name not in wanted:
                continue
            operation = operation_for(problem)
            limits = device.limits()
            default = operation.default_config(problem, limits)
            configs = [default, *operation.space(problem, limits).sample(rng, args.samples, exclude=[default])]
            results = list(source.measure(op, problem, configs))
            ok = [r for r in results if r.ok]
            best = min(ok, key=lambda r: r.time_us) if ok else None
            d = results[0]
            cudnn_us = None
            if have_torch:
                runner = cudnn_runner(op, problem)
                if runner is not None:
                    cudnn_us = time_callable(runner, flusher=flusher, budget_s=args.budget * 2).median_us
            failures: dict[str, int] = {}
            for r in results:
                if not r.ok:
                    failures[r.failure.value] = failures.get(r.failure.value, 0) + 1
            rate_kind = "GFLOP/s" if op in CONV_OPS else "GB/s"
            amount = operation.flops(problem) if op in CONV_OPS else operation.min_bytes(problem)
            rate = (amount / (best.time_us * 1e-6) / 1e9) if best else None
            row = {"op": op, "shape": name, "default_us": d.time_us if d.ok else None,
                   "default_failure": None if d.ok else f"{d.failure.value}: {d.message[:200]}",
                   "best_us": best.time_us if best else None, "best_config": best.config.as_dict() if best else None,
                   "cudnn_us": cudnn_us, "rate": rate, "rate_kind": rate_kind,
                   "vs_cudnn": (cudnn_us / best.time_us) if (best and cudnn_us) else None,
                   "measured": len(ok), "failures": failures}
            rows.append(row)
            records.append({"op": op, "shape": name, "problem": problem.to_dict(),
                            "fingerprint": operation.fingerprint(), "results": [r.to_dict() for r in results]})
            print(_row_text(row), flush=True)
            args.out.write_text(json.dumps({"device": device.to_dict(), "seed": seed, "samples": args.samples,
                                            "ceilings": ceilings.to_dict() if ceilings else None,
                                            "rows": rows, "records": records}, indent=1))
    source.close()
    print(f"\n# {len(rows)} problems in {time.time() - start:.0f} s; full results in {args.out}")
    print(_table(rows, ceilings))
    return 0


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def _row_text(r) -> str:
    return (f"{r['op']:14s} {r['shape']:17s} default {_fmt(r['default_us']):>9s} us  best {_fmt(r['best_us']):>9s} us"
            f"  cudnn {_fmt(r['cudnn_us']):>9s} us  x{_fmt(r['vs_cudnn'], '.2f')}  ({r['measured']} ok, "
            f"failures {r['failures']})")


def _table(rows, ceilings) -> str:
    head = "| op | shape | default us | best us | cuDNN us | best/cuDNN speed-up | rate | of ceiling |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        frac = "-"
        if ceilings and r["rate"]:
            peak = ceilings.sgemm_tflops * 1000 if r["rate_kind"] == "GFLOP/s" else ceilings.copy_gbps
            frac = f"{100 * r['rate'] / peak:.0f}%"
        lines.append(f"| {r['op']} | {r['shape']} | {_fmt(r['default_us'])} | {_fmt(r['best_us'])} | "
                     f"{_fmt(r['cudnn_us'])} | {_fmt(r['vs_cudnn'], '.2f')} | {_fmt(r['rate'], '.0f')} {r['rate_kind']} | {frac} |")
    return "\n".join(lines)


