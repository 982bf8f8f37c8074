#!/usr/bin/env python3
"""Where a training step's GPU time goes: every operation of one cuda step timed with CUDA events.

Records every backend operation of one training step (the five kernel families, the Dense GEMMs
and epilogues, the activation gradients, the loss and the optimizer update), captures each alone
as a CUDA graph and times its replays with CUDA events, so that the host's launch latency does
not count; then adds the times up per operation. Also times the whole step replayed as one graph,
for comparison with the sum. Replaying an operation changes the model's buffers and weights: the
model is thrown away afterwards. Prints a table per network.

    python scripts/profile_step.py --networks lenet5,chellapilla06 --out profile_step.json

With --timeline, also traces replays of the whole step with PyTorch's profiler (CUPTI) and prints
each kernel of one replay with its start and duration: the critical path, side-stream overlap and
the gaps between kernels, which per-operation timing cannot show.
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

# Backend operations timed one by one ("dense_loss_step": the last layer with the loss, fused on a
# GPU; "activation_grad_bias": a Dense layer's activation and bias gradients in one pass).
WRAPPED = ("conv_fwd", "conv_bwd_data", "conv_wgrad", "avgpool_fwd", "avgpool_bwd", "matmul",
           "bias_activation", "activation", "activation_grad", "activation_grad_bias", "dense_loss_step")


def step_timeline(model, name: str, trace_dir: Path, replays: int = 5) -> list[dict]:
    """Kernels of one replayed step graph, from a CUPTI trace: name, stream, start offset, duration (us)."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    be = model.backend
    be.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            model._graph.replay()
        be.synchronize()
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / f"{name}_trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "dur" in e]
    events.sort(key=lambda e: e["ts"])
    per_replay = len(events) // replays
    last = events[-per_replay:] if per_replay else []
    if not last:
        return []
    t0 = last[0]["ts"]
    return [{"name": e["name"], "stream": e.get("args", {}).get("stream"), "start_us": e["ts"] - t0,
             "dur_us": e["dur"]} for e in last]


def profile(name: str, batch: int, repeats: int, trace_dir: Path | None = None) -> dict:
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
    # The graph alone (no staging, no host bookkeeping), and the host's own time per step: the
    # step costs the larger of the two when the host keeps ahead.
    replay_only = []
    for _ in range(5):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(50):
            model._graph.replay()
        stop.record()
        stop.synchronize()
        replay_only.append(cp.cuda.get_elapsed_time(start, stop) / 50 * 1e3)
    host = []
    for _ in range(5):
        be.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            model.train_step(x, y)
        host.append((time.perf_counter() - t0) / 50 * 1e6)
    be.synchronize()

    # Every operation of one step recorded, then each captured alone as a graph and replayed:
    # its GPU time without the host's launch latency (which event pairs around eager calls measure).
    model.use_graphs = False
    calls: list[tuple[str, object, tuple, dict]] = []
    originals = {}

    depth = [0]

    def recorded(op: str, fn):
        # Only outermost calls: an operation made of others (dense_loss_step on the composed
        # path) is timed as a whole, not once more in its parts.
        def run(*args, **kwargs):
            if depth[0] == 0:
                calls.append((op, fn, args, kwargs))
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
        return run

    for op in WRAPPED:
        originals[op] = getattr(be, op)
        setattr(be, op, recorded(op, originals[op]))
    loss_fn = model.loss.loss_grad_accuracy
    model.loss.loss_grad_accuracy = recorded("loss", loss_fn)
    opt = model.optimizer
    apply = opt.apply
    opt.apply = recorded("optimizer", apply)
    be.synchronize()
    t0 = time.perf_counter()
    model.train_step(x, y)
    be.synchronize()
    eager_wall = (time.perf_counter() - t0) * 1e6
    for op, fn in originals.items():
        setattr(be, op, fn)
    model.loss.loss_grad_accuracy = loss_fn
    opt.apply = apply
    model.use_graphs = True

    totals: dict[str, list[float]] = collections.defaultdict(list)
    counts: collections.Counter[str] = collections.Counter()
    for op, fn, args, kwargs in calls:
        graph = be.capture(lambda fn=fn, args=args, kwargs=kwargs: fn(*args, **kwargs))
        for _ in range(3):
            graph.replay()
        samples = []
        for _ in range(repeats):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            for _ in range(20):
                graph.replay()
            b.record()
            b.synchronize()
            samples.append(cp.cuda.get_elapsed_time(a, b) / 20 * 1e3)
        totals[op].append(statistics.median(samples))
        counts[op] += 1
    totals = {op: [sum(v)] for op, v in totals.items()}
    walls = [eager_wall]
    ops = {op: {"us": statistics.median(v), "launches": counts[op]} for op, v in totals.items()}
    kernels = step_timeline(model, name, trace_dir) if trace_dir is not None else None
    return {"timeline": kernels, "network": name, "batch": batch, "graphed_step_us": graphed_us,
            "graph_replay_only_us": statistics.median(replay_only), "host_us_per_step": statistics.median(host),
            "eager_step_wall_us": statistics.median(walls), "sum_of_ops_us": sum(o["us"] for o in ops.values()),
            "ops": ops, "dispatch": model.dispatch_report()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--networks", default=",".join(BATCH))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("profile_step.json"))
    ap.add_argument("--timeline", type=Path, default=None, metavar="DIR",
                    help="also trace one replayed step with PyTorch's profiler; Chrome traces go to DIR")
    args = ap.parse_args(argv)
    results = []
    for name in [n.strip() for n in args.networks.split(",") if n.strip()]:
        r = profile(name, BATCH.get(name, 128), args.repeats, args.timeline)
        results.append(r)
        args.out.write_text(json.dumps(results, indent=1))
        print(f"\n{name} batch {r['batch']}: graphed step {r['graphed_step_us']:.1f} us (the graph alone "
              f"{r['graph_replay_only_us']:.1f} us of GPU time, the host {r['host_us_per_step']:.1f} us per step), "
              f"sum of operations "
              f"{r['sum_of_ops_us']:.1f} us (each operation a graph of its own), one step kernel by kernel "
              f"{r['eager_step_wall_us']:.1f} us of wall time")
        print("| operation | launches | GPU us | share |")
        print("|---|---|---|---|")
        for op, o in sorted(r["ops"].items(), key=lambda kv: -kv[1]["us"]):
            print(f"| {op} | {o['launches']} | {o['us']:.1f} | {o['us'] / r['sum_of_ops_us']:.0%} |")
        if r["timeline"]:
            print("| start us | end us | dur us | stream | kernel |")
            print("|---|---|---|---|---|")
            for k in r["timeline"]:
                print(f"| {k['start_us']:.1f} | {k['start_us'] + k['dur_us']:.1f} | {k['dur_us']:.1f} | "
                      f"{k['stream']} | {k['name'][:70]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
