#!/usr/bin/env python3
"""Scherer, Schulz & Behnke (2010) on this GPU: their circular-buffer forward and one-pass backward
(autocnn's "circular" conv_fwd formulation and conv_bwd_fused) on the zoo's scherer10 layers
(1x256x256, three 8x8 stride-2 pad-3 tanh convolutions of 8 maps: 256 -> 128 -> 64 -> 32), at the
paper's 60 patterns and at 128 (--batches).

For each layer and batch, every kernel verified against float64 before it is timed (CUDA events,
L2 flushed, median; autocnn.measurement.measure):
  forward   circular's default and the fastest of --samples sampled circular configs ("searched"),
            every other conv_fwd formulation's default, the tuning database's config for this GPU
            (a record, a borrowed one or the default: the lookup's source is printed), cuDNN;
  backward  conv_bwd_fused's default and the fastest of --samples sampled configs, against
            conv_bwd_data + conv_wgrad (the lookup's config of each, summed) and cuDNN's two
            (torch.ops.aten.convolution_backward for dx, then for dw and db; summed).
cuDNN runs through PyTorch with cudnn.benchmark on and TF32 off (skipped when PyTorch is missing).

The paper's 95-115x is its GPU (GTX 285) against its own serial C implementation on one core of
an Intel Core i7 940, for whole training epochs. Beside it this prints autocnn's speed-up over a
CPU baseline timed here: autocnn's float32 NumPy reference (kernels/reference.py: shift and
accumulate, BLAS matrix products) for the same layers' forward (with bias and tanh) and backward
(conv_bwd_data and conv_wgrad), on one core (OPENBLAS/MKL/OMP threads set to 1 before NumPy
loads; the median of --cpu-reps runs), divided by autocnn's fastest verified forward plus
backward per layer. A BLAS-backed baseline on a current core is much faster than a 2009 serial
loop, so the two ratios answer different questions; both are printed.

    python scripts/bench_scherer.py --out bench_scherer.json
    python scripts/bench_scherer.py --batches 60 --samples 32 --no-cudnn
"""
from __future__ import annotations

import os

# One core for the CPU baseline: set before NumPy (and its BLAS) is first imported.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAPER_SPEEDUP = (95.0, 115.0)   # Table 1: one epoch of 60 patterns, GTX 285 against one core of an i7 940
FWD_FORMULATION = "circular"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="60,128", help="comma-separated batch sizes (default 60,128; the paper: 60)")
    ap.add_argument("--samples", type=int, default=16,
                    help="sampled configs of circular and of conv_bwd_fused timed per layer (default 16)")
    ap.add_argument("--budget", type=float, default=0.3, help="timing budget per kernel, s (default 0.3)")
    ap.add_argument("--cpu-reps", type=int, default=3, help="runs of the one-core CPU baseline per layer (default 3)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU baseline")
    ap.add_argument("--no-cudnn", action="store_true", help="skip cuDNN even where PyTorch is importable")
    ap.add_argument("--seed", type=int, default=None, help="seed of the config samples (default: drawn, printed)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_scherer.json"))
    return ap


def parse_batches(ap: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        batches = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--batches: {text!r} is not a comma-separated list of integers")
    if not batches or any(b < 1 for b in batches):
        ap.error(f"--batches: {text!r}; give batch sizes of at least 1")
    return batches


def scherer10_layers(batch: int) -> list[tuple[str, Any]]:
    """The zoo's scherer10 convolutions as conv_fwd problems, in order."""
    from autocnn.kernels.problem import ConvFwdProblem
    from autocnn.nn import zoo
    from autocnn.nn.conv_layer import Conv2d

    net = zoo.build_network("scherer10")
    shapes = [net.input_shape, *net.layer_output_shapes]
    out = []
    for layer, (c, h, w) in ((l, s) for l, s in zip(net.layers, shapes) if isinstance(l, Conv2d)):
        R, S = layer.kernel_size
        out.append((f"L{len(out) + 1}", ConvFwdProblem(N=batch, C=c, H=h, W=w, K=layer.out_channels, R=R, S=S,
                                                      stride=layer.stride, padding=layer.padding,
                                                      bias=layer.use_bias, activation=layer.activation)))
    return out


class Bench:
    """Compiles with nvcc for the device, verifies every kernel and times the verified ones."""

    def __init__(self, device_id: int, budget_s: float):
        from autocnn.device import current_device
        from autocnn.gpu import require_cupy
        from autocnn.kernels.compiler import NvccCompiler
        from autocnn.kernels.runtime import KernelLoader
        from autocnn.store import TuningDatabase
        from autocnn.measurement.measure import L2Flusher

        require_cupy().cuda.Device(device_id).use()
        self.device = current_device(device_id)
        self.limits = self.device.limits()
        self.compiler = NvccCompiler(self.device.arch)
        self.loader = KernelLoader()
        self.flusher = L2Flusher(self.device.l2_bytes)
        self.db = TuningDatabase()
        self.budget_s = budget_s

    def time(self, operation: Any, problem: Any, config: Any) -> tuple[float | None, str]:
        """(median us, "") of a verified, non-spilling kernel, or (None, why not)."""
        from autocnn.measurement.measure import check_candidate

        try:
            plan = operation.plan(problem, config)
            module = self.compiler.compile(plan.source, config=config)
            spills = [k for k, r in module.reports.items() if r.spills]
            if spills:
                return None, f"spills in {', '.join(spills)}"
            check = check_candidate(self.loader.load(plan, module.cubin_path), problem, flusher=self.flusher,
                                    budget_s=self.budget_s)
        except Exception as exc:   # a failed candidate is a row of the table, not the end of the run
            return None, f"{type(exc).__name__}: {str(exc)[:160]}"
        if not check.verification.passed:
            return None, "wrong result: " + check.verification.message
        return check.timing.median_us, ""

    def best_sampled(self, operation: Any, problem: Any, space: Any, rng: random.Random, count: int,
                     first: Any) -> dict[str, Any]:
        """The fastest verified of ``first`` and ``count`` sampled configs."""
        best: dict[str, Any] = {"us": None, "config": None, "tried": 0, "failed": 0}
        for config in [first, *space.sample(rng, count, exclude=[first])]:
            us, _ = self.time(operation, problem, config)
            best["tried"] += 1
            if us is None:
                best["failed"] += 1
            elif best["us"] is None or us < best["us"]:
                best.update(us=us, config=config.as_dict())
        return best

    def lookup(self, problem: Any) -> tuple[Any, str]:
        from autocnn.kernels import get_operation

        found = self.db.lookup(self.device, problem)
        return get_operation(problem.op), found


def cudnn_us(op: str, problem: Any, bench: Bench, enabled: bool) -> float | None:
    if not enabled:
        return None
    from autocnn.benchmark.baselines import time_cudnn, torch_available

    if not torch_available():
        return None
    return time_cudnn(op, problem, flusher=bench.flusher, budget_s=bench.budget_s)


def cpu_layer_seconds(problem: Any, reps: int) -> dict[str, float]:
    """Median seconds of the float32 NumPy reference on one core: forward, and backward (dx + dw, db)."""
    import numpy as np

    from autocnn.kernels import reference

    rng = np.random.default_rng(0)
    x = rng.standard_normal(problem.x_shape, dtype=np.float32)
    w = rng.standard_normal(problem.w_shape, dtype=np.float32)
    b = rng.standard_normal(problem.K, dtype=np.float32)
    dy = rng.standard_normal(problem.y_shape, dtype=np.float32)
    geo = {"stride": problem.stride, "padding": problem.padding}

    def fwd():
        reference.conv_fwd(x, w, bias=b, activation=problem.activation, **geo)

    def bwd():
        reference.conv_bwd_data(dy, w, input_hw=(problem.H, problem.W), **geo)
        reference.conv_wgrad(x, dy, kernel_hw=(problem.R, problem.S), bias=True, **geo)

    out = {}
    for name, fn in (("fwd", fwd), ("bwd", bwd)):
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def forward_rows(bench: Bench, problem: Any, rng: random.Random, samples: int,
                 cudnn: bool) -> dict[str, Any]:
    from autocnn.kernels import get_operation

    op = get_operation("conv_fwd")
    rows: dict[str, Any] = {}
    for f in op.formulation_names:
        try:
            config = op.default_config(problem, bench.limits, formulation=f)
        except Exception as exc:   # a formulation that does not serve the shape (winograd: 3x3 only)
            rows[f"{f} default"] = {"us": None, "why": str(exc)[:120]}
            continue
        us, why = bench.time(op, problem, config)
        rows[f"{f} default"] = {"us": us, "why": why, "config": config.as_dict()}
    space = op.space(problem, bench.limits).restrict({"formulation": FWD_FORMULATION})
    first = op.default_config(problem, bench.limits, formulation=FWD_FORMULATION)
    rows[f"{FWD_FORMULATION} searched"] = bench.best_sampled(op, problem, space, rng, samples, first)
    _, found = bench.lookup(problem)
    us, why = bench.time(op, problem, found.config)
    rows[f"lookup ({found.source})"] = {"us": us, "why": why, "config": found.config.as_dict()}
    rows["cuDNN"] = {"us": cudnn_us("conv_fwd", problem, bench, cudnn)}
    return rows


def backward_rows(bench: Bench, problem: Any, rng: random.Random, samples: int,
                  cudnn: bool) -> dict[str, Any]:
    from autocnn.kernels import get_operation
    from autocnn.kernels.conv_bwd_fused import ConvBwdFusedProblem

    fused_op = get_operation("conv_bwd_fused")
    fused = ConvBwdFusedProblem(**problem.geometry(), bias=problem.bias)
    rows: dict[str, Any] = {}
    first = fused_op.default_config(fused, bench.limits)
    us, why = bench.time(fused_op, fused, first)
    rows["fused default"] = {"us": us, "why": why, "config": first.as_dict()}
    rows["fused searched"] = bench.best_sampled(fused_op, fused, fused_op.space(fused, bench.limits),
                                                rng, samples, first)
    parts, total = {}, 0.0
    for op_name, extra in (("conv_bwd_data", {}), ("conv_wgrad", {"bias": problem.bias})):
        sub = problem.with_op(op_name, **extra)
        operation, found = bench.lookup(sub)
        us, why = bench.time(operation, sub, found.config)
        parts[op_name] = {"us": us, "why": why, "source": found.source, "config": found.config.as_dict()}
        total = total + us if us is not None and total is not None else None
    rows["bwd_data + wgrad (lookup)"] = {"us": total, "parts": parts}
    dx, dw = (cudnn_us(op_name, problem.with_op(op_name, **extra), bench, cudnn)
              for op_name, extra in (("conv_bwd_data", {}), ("conv_wgrad", {"bias": problem.bias})))
    rows["cuDNN dx + dw"] = {"us": dx + dw if dx is not None and dw is not None else None, "dx_us": dx, "dw_us": dw}
    return rows


def fastest(rows: dict[str, Any], exclude: str = "cuDNN") -> float | None:
    times = [r["us"] for name, r in rows.items() if not name.startswith(exclude) and r.get("us") is not None]
    return min(times) if times else None


def print_table(title: str, rows: dict[str, Any]) -> None:
    ref = rows.get("cuDNN", rows.get("cuDNN dx + dw", {})).get("us")
    print(f"  {title}")
    for name, r in rows.items():
        us = r.get("us")
        if us is None:
            print(f"    {name:34s} {'-':>10s}  {r.get('why', '')}")
            continue
        vs = f"{ref / us:6.2f}x cuDNN" if ref else ""
        print(f"    {name:34s} {us:10.1f} us {vs}")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    batches = parse_batches(ap, args.batches)
    if args.samples < 0 or args.cpu_reps < 1 or args.budget <= 0:
        ap.error("--samples must be >= 0, --cpu-reps >= 1 and --budget > 0")
    from autocnn.gpu import gpu_available

    if not gpu_available():
        print("bench_scherer: needs a CUDA GPU with CuPy (and nvcc); run it on the GPU host", file=sys.stderr)
        return 1
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    bench = Bench(args.device, args.budget)
    print(f"# {bench.device.name} ({bench.device.arch}); config sample seed {seed}; one-core CPU baseline: "
          f"{'off' if args.no_cpu else 'NumPy float32 reference, BLAS on one thread'}", flush=True)
    result: dict[str, Any] = {"device": bench.device.to_dict(), "seed": seed, "paper_speedup": PAPER_SPEEDUP,
                              "batches": {}}
    for batch in batches:
        rng = random.Random(seed + batch)
        layers = {}
        gpu_total: float | None = 0.0   # None once a layer has no verified kernel
        cpu_total = 0.0
        print(f"\n## batch {batch}")
        for label, problem in scherer10_layers(batch):
            print(f"{label} {problem.shape_string()}", flush=True)
            fwd = forward_rows(bench, problem, rng, args.samples, not args.no_cudnn)
            bwd = backward_rows(bench, problem, rng, args.samples, not args.no_cudnn)
            print_table("forward", fwd)
            print_table("backward", bwd)
            layer: dict[str, Any] = {"shape": problem.shape_string(), "forward": fwd, "backward": bwd}
            best = (fastest(fwd), fastest(bwd))
            gpu_total = gpu_total + best[0] + best[1] if gpu_total is not None and None not in best else None
            if not args.no_cpu:
                cpu = cpu_layer_seconds(problem, args.cpu_reps)
                layer["cpu_one_core_s"] = cpu
                cpu_total += cpu["fwd"] + cpu["bwd"]
                if None not in best:
                    ratio = (cpu["fwd"] + cpu["bwd"]) * 1e6 / (best[0] + best[1])
                    layer["speedup_over_one_core"] = ratio
                    print(f"  one core (NumPy) {1e3 * (cpu['fwd'] + cpu['bwd']):.1f} ms, autocnn fastest "
                          f"{(best[0] + best[1]) / 1e3:.3f} ms: {ratio:.0f}x", flush=True)
            layers[label] = layer
        summary: dict[str, Any] = {"layers": layers, "gpu_fastest_us": gpu_total}
        if not args.no_cpu and gpu_total:
            summary["cpu_one_core_s"] = cpu_total
            summary["speedup_over_one_core"] = cpu_total * 1e6 / gpu_total
            print(f"# batch {batch}, three convolutions forward + backward: autocnn {gpu_total / 1e3:.3f} ms, "
                  f"one core {cpu_total:.2f} s -> {summary['speedup_over_one_core']:.0f}x "
                  f"(paper, whole epochs on a GTX 285 against a serial i7 940 core: "
                  f"{PAPER_SPEEDUP[0]:.0f}-{PAPER_SPEEDUP[1]:.0f}x)")
        result["batches"][str(batch)] = summary
        args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"\n# every number in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
