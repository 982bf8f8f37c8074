#!/usr/bin/env python3
"""Where a training step's GPU time goes: every operation of one cuda step timed with CUDA events.

Runs a zoo network's training step kernel by kernel, with an event pair around each backend
operation (the five kernel families, the Dense GEMMs and epilogues, the activation gradients) and
around the loss and the optimizer update, then adds the times up per operation. Also times the
whole step replayed as a CUDA graph, for comparison with the sum. Prints a table per network.

    python scripts/profile_step.py --networks lenet5,chellapilla06 --out profile_step.json
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_training import BATCH  # noqa: E402

WRAPPED = ("conv_fwd", "conv_bwd_data", "conv_wgrad", "avgpool_fwd", "avgpool_bwd", "matmul",
           "bias_activation", "activation", "activation_grad")


def profile(name: str, batch: int, repeats: int) -> dict:
    import cupy as cp
    import numpy as np

    from autocnn import nn

    model = nn.build_network(name, backend="cuda", seed=0).build(batch).compile(nn.Adam(1e-3))
    be = model.backend
    x = cp.random.standard_normal((batch, *model.input_shape), dtype=cp.float32)
    y = cp.random.randint(0, model.num_classes, batch).astype(cp.int64)
    for _ in range(3):
        model.train_step(x, y)
    be.synchronize()

    # The whole step as a graph: median over runs of 50 replays.
    per_step = []
    for _ in range(5):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(50):
            model.train_step(x, y)
        stop.record()
        stop.synchronize()
        per_step.append(cp.cuda.get_elapsed_time(start, stop) / 50 * 1e3)
    graphed_us = statistics.median(per_step)

    # Kernel by kernel, an event pair around every operation.
    model.use_graphs = False
    records: list[tuple[str, object, object]] = []
    originals = {}

    def timed(op: str, fn):
        def run(*args, **kwargs):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            out = fn(*args, **kwargs)
            b.record()
            records.append((op, a, b))
            return out
        return run

    for op in WRAPPED:
        originals[op] = getattr(be, op)
        setattr(be, op, timed(op, originals[op]))
    loss_fn = model.loss.loss_grad_accuracy
    model.loss.loss_grad_accuracy = timed("loss", loss_fn)
    opt = model.optimizer
    apply = opt.apply
    opt.apply = timed("optimizer", apply)
    totals: dict[str, list[float]] = collections.defaultdict(list)
    counts: collections.Counter[str] = collections.Counter()
    walls = []
    for _ in range(repeats):
        records.clear()
        be.synchronize()
        t0 = time.perf_counter()
        model.train_step(x, y)
        be.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
        step_totals: dict[str, float] = collections.defaultdict(float)
        counts.clear()
        for op, a, b in records:
            step_totals[op] += cp.cuda.get_elapsed_time(a, b) * 1e3
            counts[op] += 1
        for op, v in step_totals.items():
            totals[op].append(v)
    for op, fn in originals.items():
        setattr(be, op, fn)
    model.loss.loss_grad_accuracy = loss_fn
    opt.apply = apply
    model.use_graphs = True
    ops = {op: {"us": statistics.median(v), "launches": counts[op]} for op, v in totals.items()}
    return {"network": name, "batch": batch, "graphed_step_us": graphed_us,
            "eager_step_wall_us": statistics.median(walls), "sum_of_ops_us": sum(o["us"] for o in ops.values()),
            "ops": ops, "dispatch": model.dispatch_report()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--networks", default=",".join(BATCH))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("profile_step.json"))
    args = ap.parse_args(argv)
    results = []
    for name in [n.strip() for n in args.networks.split(",") if n.strip()]:
        r = profile(name, BATCH.get(name, 128), args.repeats)
        results.append(r)
        args.out.write_text(json.dumps(results, indent=1))
        print(f"\n{name} batch {r['batch']}: graphed step {r['graphed_step_us']:.1f} us, sum of operations "
              f"{r['sum_of_ops_us']:.1f} us (each timed alone), kernel-by-kernel wall {r['eager_step_wall_us']:.1f} us")
        print("| operation | launches | GPU us | share |")
        print("|---|---|---|---|")
        for op, o in sorted(r["ops"].items(), key=lambda kv: -kv[1]["us"]):
            print(f"| {op} | {o['launches']} | {o['us']:.1f} | {o['us'] / r['sum_of_ops_us']:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
