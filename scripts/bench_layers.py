#!/usr/bin/env python3
"""Where a model's training step loses to cuDNN: each of its convolution kernels, side by side.

Collects the training-step problems of a PyTorch model (``package.module:factory``, as ``autocnn
tune --torch-model`` does: traced on meta tensors, so a bad spec costs no GPU time), and for each
times what autocnn runs for it (the tuning database's lookup, verified against float64 first) and
PyTorch's cuDNN at the same precision, in one run on one GPU. Prints a table sorted by what each
problem costs a step against cuDNN (the difference times how often a step runs it), with the
totals last; every measurement goes to --out as JSON.

    python scripts/bench_layers.py --torch-model bench_training:resnet18 --input-shape 3,224,224 \\
        --batch 64 --precision tf32 --out resnet_layers.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch-model", required=True, help="package.module:factory building the model")
    ap.add_argument("--input-shape", required=True, help="C,H,W of one input")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--precision", choices=("fp32", "tf32"), default="fp32")
    ap.add_argument("--ops", default="conv_fwd,conv_bwd_data,conv_wgrad", help="operations to time")
    ap.add_argument("--budget", type=float, default=0.1, help="seconds of timed repetitions per kernel")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_layers.json"))
    args = ap.parse_args(argv)

    from autocnn.kernels import OPERATIONS
    from autocnn.torch.tuning import factory_problems

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPERATIONS]
    if unknown:
        ap.error(f"--ops: unknown operation(s) {unknown}; choose from {', '.join(OPERATIONS)}")
    try:   # every input checked before the GPU starts
        uses = [u for u in factory_problems(args.torch_model, args.input_shape, args.batch, args.precision)
                if u.problem.op in ops]
    except (ValueError, TypeError, RuntimeError) as exc:
        ap.error(str(exc))
    if not uses:
        ap.error(f"{args.torch_model} runs none of {', '.join(ops)} on autocnn's kernels")

    from autocnn.gpu import require_cupy
    from autocnn.store import TuningDatabase
    from autocnn.benchmark.baselines import time_cudnn
    from autocnn.measurement.measure import L2Flusher
    from autocnn.measurement.sources import GpuSource

    require_cupy().cuda.Device(args.device).use()
    source = GpuSource(args.device, budget_s=args.budget)
    flusher = L2Flusher(source.device.l2_bytes)
    database = TuningDatabase()
    rows = []
    start = time.time()
    try:
        # Every kernel compiled at once in the pool (cached on disk), before they run one by one.
        from autocnn.kernels import operation_for
        lookups = [database.lookup(source.device, u.problem) for u in uses]
        compiling = [source.pool.submit(source.plan_for(operation_for(u.problem), u.problem, looked.config))
                     for u, looked in zip(uses, lookups)]
        for fut in compiling:
            fut.exception()   # a failure shows in the measurement below
        for i, (use, looked) in enumerate(zip(uses, lookups)):
            p = use.problem
            result = next(iter(source.measure(p.op, p, [looked.config])))
            cudnn_us = time_cudnn(p.op, p, flusher=flusher, budget_s=args.budget * 2)
            rows.append({"op": p.op, "problem": p.to_dict(), "label": p.shape_string(),
                         "count": use.count, "modules": list(use.modules), "source": looked.source,
                         "config": looked.config.as_dict(), "ok": result.ok,
                         "failure": result.failure.value if result.failure else None,
                         "us": result.time_us if result.ok else None, "cudnn_us": cudnn_us})
            r = rows[-1]
            print(f"[{i + 1}/{len(uses)}] {p.op} {r['label']} x{use.count}: "
                  f"{r['us'] if r['ok'] else r['failure']} us against cuDNN {cudnn_us}", flush=True)
            args.out.write_text(json.dumps({"device": source.device.to_dict(), "precision": args.precision,
                                            "model": args.torch_model, "batch": args.batch, "rows": rows}, indent=1))
    finally:
        source.close()

    def cost(r):   # microseconds a step loses (positive) or gains against cuDNN
        return (r["us"] - r["cudnn_us"]) * r["count"] if r["us"] and r["cudnn_us"] else 0.0

    print(f"\n# {source.device.name}, {args.torch_model} batch {args.batch}, {args.precision}; "
          f"{len(rows)} problems in {time.time() - start:.0f} s; full results in {args.out}")
    print("| op | problem | count | formulation | autocnn us | cuDNN us | vs cuDNN | step cost us |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for r in sorted(rows, key=cost, reverse=True):
        vs = f"{r['cudnn_us'] / r['us']:.2f}x" if r["us"] and r["cudnn_us"] else "-"
        us = f"{r['us']:.1f}" if r["us"] else r["failure"]
        cu = f"{r['cudnn_us']:.1f}" if r["cudnn_us"] else "-"
        print(f"| {r['op']} | {r['label']} | {r['count']} | {r['config'].get('formulation', '-')} ({r['source']}) "
              f"| {us} | {cu} | {vs} | {cost(r):+.1f} |")
    ours = sum(r["us"] * r["count"] for r in rows if r["us"] and r["cudnn_us"])
    theirs = sum(r["cudnn_us"] * r["count"] for r in rows if r["us"] and r["cudnn_us"])
    print(f"\nper step, problems timed by both: autocnn {ours / 1000:.3f} ms, cuDNN {theirs / 1000:.3f} ms "
          f"({theirs / ours if ours else float('nan'):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
