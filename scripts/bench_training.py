#!/usr/bin/env python3
"""Training-step time of each zoo network: autocnn's cuda backend (tuned kernels) against the same
network, batch and optimizer in PyTorch eager (cuDNN, benchmark on, FP32), and against autocnn's
numpy backend on one CPU thread (the seeds' speed-up over one CPU core).

A step is forward, softmax cross-entropy, backward and an Adam update, with the batch already on
the device for both GPU implementations: PyTorch reads its input tensors, autocnn its input
buffers (``Sequential.input_buffers``). autocnn is also timed with the batch copied into those
buffers from other device arrays every step, and kernel by kernel (``use_graphs = False``).
Writes JSON and prints a table last.

    python scripts/bench_training.py --networks kriz09,lenet5 --tune-trials 6 --out bench_training.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BATCH = {"kriz09": 128, "scherer10": 60, "convnet18": 128, "chellapilla06": 128, "lenet5": 128}


def torch_model(model, device: str = "cuda"):
    """The same layers in PyTorch (asymmetric padding as an explicit zero pad)."""
    import torch
    from torch import nn as tnn

    from autocnn.nn.layers import Activation, AvgPool2d, Conv2d, Dense, Flatten

    acts = {"none": None, "relu": tnn.ReLU, "tanh": tnn.Tanh, "logistic": tnn.Sigmoid}
    mods = []
    for layer in model.layers:
        if isinstance(layer, Conv2d):
            pt, pl, pb, pr = layer.padding
            pad = (pt, pl)
            if pt != pb or pl != pr:
                mods.append(tnn.ZeroPad2d((pl, pr, pt, pb)))
                pad = (0, 0)
            mods.append(tnn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, pad,
                                   bias=layer.use_bias))
        elif isinstance(layer, AvgPool2d):
            pt, pl, pb, pr = layer.padding
            if pt != pb or pl != pr:
                raise ValueError("asymmetric pooling padding has no PyTorch equivalent")
            mods.append(tnn.AvgPool2d(layer.window, layer.stride, (pt, pl), count_include_pad=layer.count_pad))
        elif isinstance(layer, Dense):
            mods.append(tnn.Linear(layer.in_features, layer.out_features, bias=layer.use_bias))
        elif isinstance(layer, Flatten):
            mods.append(tnn.Flatten())
            continue
        elif not isinstance(layer, Activation):
            raise ValueError(f"no PyTorch equivalent for {type(layer).__name__}")
        act = acts[getattr(layer, "activation", "none")]
        if act is not None:
            mods.append(act())
    return tnn.Sequential(*mods).to(device)


def time_torch(model, batch: int, steps: int) -> float:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    net = torch_model(model)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(batch, *model.input_shape, device="cuda")
    y = torch.randint(0, model.num_classes, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(10):
        step()
    return _event_time(step, steps, torch.cuda.synchronize)


def time_autocnn_cuda(model, batch: int, steps: int, graphs: bool = True, staged: bool = False) -> float:
    """Like PyTorch's loop, the step reads a batch already on the device: in the model's input
    buffers (``input_buffers``), or with ``staged``, copied into them from other device arrays
    every step."""
    import cupy as cp

    from autocnn import nn

    model.build(batch)
    model.use_graphs = graphs
    model.compile(nn.Adam(1e-3))
    x = cp.random.standard_normal((batch, *model.input_shape), dtype=cp.float32)
    y = cp.random.randint(0, model.num_classes, batch).astype(cp.int64)
    if not staged:
        x_buf, y_buf = model.input_buffers()
        x_buf[...] = x
        y_buf[...] = y
        x, y = x_buf, y_buf

    def step():
        model.train_step_async(x, y)

    for _ in range(10):
        step()
    return _event_time(step, steps, model.backend.synchronize)


def _event_time(step, steps: int, sync) -> float:
    """Median per-step time (ms) over 5 runs of ``steps`` steps, host and device both counted."""
    runs = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        runs.append((time.perf_counter() - t0) / steps * 1e3)
    return statistics.median(runs)


def time_numpy(name: str, batch: int, steps: int) -> float:
    import numpy as np

    from autocnn import nn

    model = nn.build_network(name, backend=nn.NumpyBackend(blas_threads=1), seed=0)
    model.build(batch)
    model.compile(nn.Adam(1e-3))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, batch)
    model.train_step(x, y)   # warm-up: first-touch allocations
    times: list[float] = []
    # At least ``steps`` steps, more (up to 100) while they add up to less than 2 s: the small
    # networks' steps take milliseconds, and their median needs more than two samples.
    while len(times) < steps or (sum(times) < 2000 and len(times) < 100):
        t0 = time.perf_counter()
        model.train_step(x, y)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--networks", default=",".join(BATCH))
    ap.add_argument("--steps", type=int, default=50, help="timed GPU steps per run")
    ap.add_argument("--cpu-steps", type=int, default=2,
                    help="timed numpy steps at least (more, up to 100, while they take under 2 s)")
    ap.add_argument("--tune-trials", type=int, default=0,
                    help="trials per kernel problem to tune each network first (0: use the database as it is)")
    ap.add_argument("--out", type=Path, default=Path("bench_training.json"))
    args = ap.parse_args(argv)

    from autocnn import nn

    rows = []
    for name in [n.strip() for n in args.networks.split(",") if n.strip()]:
        batch = BATCH.get(name, 128)
        model = nn.build_network(name, backend="cuda", seed=0)
        if args.tune_trials:
            problems = model.problems(batch)
            model.tune(batch, trials=args.tune_trials * len(problems), progress=False)
        ours = time_autocnn_cuda(model, batch, args.steps)
        staged = time_autocnn_cuda(model, batch, args.steps, staged=True)
        eager = time_autocnn_cuda(model, batch, args.steps, graphs=False)
        sources = sorted({d.source for d in model.dispatch})
        torch_ms = time_torch(model, batch, args.steps)
        cpu_ms = time_numpy(name, batch, args.cpu_steps)
        row = {"network": name, "batch": batch, "autocnn_cuda_ms": ours, "autocnn_staged_ms": staged,
               "autocnn_eager_ms": eager,
               "pytorch_ms": torch_ms,
               "numpy_1thread_ms": cpu_ms, "vs_pytorch": torch_ms / ours, "vs_cpu": cpu_ms / ours,
               "kernel_sources": sources, "dispatch": model.dispatch_report()}
        rows.append(row)
        print(f"{name:14s} batch {batch:4d}  autocnn {ours:8.3f} ms (staged {staged:.3f}, eager {eager:.3f})  pytorch {torch_ms:8.3f} ms  "
              f"numpy(1 thread) {cpu_ms:10.1f} ms  x{row['vs_pytorch']:.2f} vs PyTorch  x{row['vs_cpu']:.0f} vs CPU "
              f"({', '.join(sources)})", flush=True)
        args.out.write_text(json.dumps(rows, indent=1))
    print("\n| network | batch | autocnn cuda ms/step | with a staging copy | without graphs | "
          "PyTorch eager ms/step | numpy 1 thread ms/step | speed-up vs PyTorch | speed-up vs 1 CPU core |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['network']} | {r['batch']} | {r['autocnn_cuda_ms']:.3f} | {r['autocnn_staged_ms']:.3f} | "
              f"{r['autocnn_eager_ms']:.3f} | "
              f"{r['pytorch_ms']:.3f} | "
              f"{r['numpy_1thread_ms']:.1f} | {r['vs_pytorch']:.2f} | {r['vs_cpu']:.0f} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    raise SystemExit(main())
