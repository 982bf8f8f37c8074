#!/usr/bin/env python3
"""Convolution fused with averaging against the unfused pair and cuDNN.

On the conv -> activation -> AvgPool2d pairs of the zoo (kriz09, convnet18, lenet5, vgg_cifar;
kernels.conv_pool_problems.zoo_pairs) at one batch size, each timed as a chain of launches on one set of
buffers, under the timing protocol (L2 flushed before each repetition, median of events):

  forward   pair:   conv_fwd (bias, activation) then avgpool_fwd, autocnn's looked-up configs
                    (tuned records where the database has them, else the heuristic default)
            fused:  conv_pool_fwd without the full-size output (inference) and with it
                    (keep_activation, what training needs), the looked-up config or, with
                    --search N, the fastest verified of the defaults and N sampled configs
            torch:  F.conv2d + activation + F.avg_pool2d (cuDNN, benchmark mode, TF32 off)
  backward  pair:   avgpool_bwd, the activation gradient (the training library's element-wise
                    kernel), conv_bwd_data, conv_wgrad
            split:  conv_pool_dz (supersampling and activation gradient in one pass), then the
                    same conv_bwd_data and conv_wgrad
            torch:  avg_pool2d_backward, the activation's backward, convolution_backward

Every autocnn kernel is verified against float64 before it is timed. Prints a table; writes every
number (and each part's time) as JSON to --out/bench_conv_pool.json.

    python scripts/bench_conv_pool.py --out results/ --search 16
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.kernels.conv_pool_problems import zoo_pairs  # noqa: E402


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


class Bench:
    """Kernels of one device: configs looked up (or searched), verified, loaded; chains timed."""

    def __init__(self, device_id: int, budget_s: float, search: int, seed: int):
        from autocnn.device import current_device
        from autocnn.gpu import require_cupy
        from autocnn.kernels.runtime import KernelLoader
        from autocnn.store import TuningDatabase
        from autocnn.measurement.measure import L2Flusher

        self.cp = require_cupy()
        self.cp.cuda.Device(device_id).use()
        self.device = current_device(device_id)
        self.db = TuningDatabase()
        self.loader = KernelLoader()
        self.flusher = L2Flusher(self.device.l2_bytes)
        self.budget_s, self.search, self.rng = budget_s, search, random.Random(seed)
        self.gen = self.cp.random.RandomState(seed)

    def kernel(self, problem: Any, *, searched: bool = False) -> tuple[Any, dict[str, Any]]:
        """The loaded plan for ``problem`` and what it is: the lookup's config, or with ``searched``
        the fastest verified of the lookup's, the defaults and --search sampled configs."""
        from autocnn.kernels import operation_for
        from autocnn.measurement.measure import check_candidate

        operation = operation_for(problem)
        looked = self.db.lookup(self.device, problem)
        configs = [looked.config]
        if searched and self.search:
            limits = self.device.limits()
            configs += [c for c in operation.default_configs(problem, limits) if c not in configs]
            configs += operation.space(problem, limits).sample(self.rng, self.search, exclude=configs)
        best = None
        for config in configs:
            loaded = self.loader.load(operation.plan(problem, config))
            check = check_candidate(loaded, problem, time_it=len(configs) > 1, flusher=self.flusher,
                                    budget_s=self.budget_s / 2)
            if not check.verification.passed:
                raise RuntimeError(f"{problem.op} {problem.shape_string()} {config}: {check.verification.message}")
            time_us = check.timing.median_us if check.timing else 0.0
            if best is None or time_us < best[2]:
                best = (loaded, config, time_us)
        loaded, config, _ = best
        return loaded, {"config": config.as_dict(), "source": looked.source if config == looked.config else "search",
                        "tried": len(configs)}

    def randn(self, shape: tuple[int, ...]) -> Any:
        return self.gen.standard_normal(shape, dtype=self.cp.float32)

    def buffers(self, loaded: Any, **arrays: Any) -> dict[str, Any]:
        return {**loaded.workspaces(), **arrays}

    def time(self, steps: list[Callable[[], None]]) -> float:
        from autocnn.measurement.measure import time_callable

        def run() -> None:
            for step in steps:
                step()
        return time_callable(run, flusher=self.flusher, budget_s=self.budget_s).median_us


def bench_pair(b: Bench, name: str, fused_train: Any, torch_ok: bool) -> dict[str, Any]:
    from autocnn.nn import fused as nn_fused

    p = fused_train
    infer = dataclasses.replace(p, keep_activation=False)
    conv, pool = p.conv, p.pool
    bwd_data, wgrad = p.conv.with_op("conv_bwd_data"), p.conv.with_op("conv_wgrad", bias=p.bias)
    x, w, bias = b.randn(p.x_shape), b.randn(p.w_shape), b.randn((p.K,))
    a, pooled, dyp = b.randn(p.y_shape), b.randn(pool.y_shape), b.randn(pool.y_shape)
    g, dz, dx = b.randn(p.y_shape), b.randn(p.y_shape), b.randn(p.x_shape)
    dw, db = b.randn(p.w_shape), b.randn((p.K,))
    row: dict[str, Any] = {"pair": name, "problem": p.to_dict(), "kernels": {}, "parts_us": {}}

    def load(label: str, problem: Any, searched: bool = False) -> Any:
        loaded, info = b.kernel(problem, searched=searched)
        row["kernels"][label] = info
        return loaded

    k = {label: load(label, prob, label.startswith("conv_pool"))
         for label, prob in (("conv_fwd", conv), ("avgpool_fwd", pool), ("avgpool_bwd", pool.with_op("avgpool_bwd")),
                             ("conv_bwd_data", bwd_data), ("conv_wgrad", wgrad), ("conv_pool_fwd", infer),
                             ("conv_pool_fwd_keep", p), ("conv_pool_dz", p.dz))}
    bufs = {
        "conv_fwd": b.buffers(k["conv_fwd"], x=x, w=w, bias=bias, y=a),
        "avgpool_fwd": b.buffers(k["avgpool_fwd"], x=a, y=pooled),
        "conv_pool_fwd": b.buffers(k["conv_pool_fwd"], x=x, w=w, bias=bias, y=pooled),
        "conv_pool_fwd_keep": b.buffers(k["conv_pool_fwd_keep"], x=x, w=w, bias=bias, y=pooled, a=a),
        "avgpool_bwd": b.buffers(k["avgpool_bwd"], dy=dyp, dx=g),
        "conv_pool_dz": b.buffers(k["conv_pool_dz"], dy=dyp, a=a, dz=dz),
        "conv_bwd_data": b.buffers(k["conv_bwd_data"], dy=dz, w=w, dx=dx),
        "conv_wgrad": b.buffers(k["conv_wgrad"], x=x, dy=dz, dw=dw, db=db),
    }
    step = {label: (lambda label=label: k[label](bufs[label])) for label in k}
    step["activation_grad"] = lambda: nn_fused.activation_grad(p.activation, a, g, dz)
    for label in step:
        row["parts_us"][label] = b.time([step[label]])
    convs_bwd = [step["conv_bwd_data"], step["conv_wgrad"]]
    row["fwd_us"] = {"pair": b.time([step["conv_fwd"], step["avgpool_fwd"]]),
                     "fused": row["parts_us"]["conv_pool_fwd"], "fused_keep": row["parts_us"]["conv_pool_fwd_keep"]}
    row["bwd_us"] = {"pair": b.time([step["avgpool_bwd"], step["activation_grad"], *convs_bwd]),
                     "split": b.time([step["conv_pool_dz"], *convs_bwd])}
    if torch_ok:
        fwd, bwd = torch_runners(p)
        row["fwd_us"]["torch"], row["bwd_us"]["torch"] = b.time([fwd]), b.time([bwd])
    return row


def torch_runners(p: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    """PyTorch's forward and backward of the pair (cuDNN; asymmetric convolution padding applied to
    the input beforehand, outside the timed region, as autocnn.benchmark.baselines does)."""
    from autocnn.benchmark.baselines import _torch

    torch = _torch("fp32")
    F = torch.nn.functional
    g = torch.Generator(device="cuda")
    g.manual_seed(1234)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float32, generator=g)

    pt, pl, pb, pr = p.padding
    x = randn(*p.x_shape)
    if (pt, pl) != (pb, pr):
        x = F.pad(x, (pl, pr, pt, pb))
    pad = [pt, pl] if (pt, pl) == (pb, pr) else [0, 0]
    w, bias = randn(*p.w_shape), randn(p.K) if p.bias else None
    qt, ql, qb, qr = p.pool_padding
    if (qt, ql) != (qb, qr):
        raise ValueError(f"{p.shape_string()}: PyTorch pools pad symmetrically")
    window, stride, ppad = list(p.pool_window), list(p.pool_stride), [qt, ql]
    act = {"none": lambda v: v, "relu": torch.relu, "tanh": torch.tanh, "logistic": torch.sigmoid}[p.activation]
    a = act(F.conv2d(x, w, bias, list(p.stride), pad))
    dyp = randn(*F.avg_pool2d(a, window, stride, ppad, False, p.count_pad).shape)

    def act_backward(grad):
        if p.activation == "relu":
            return torch.ops.aten.threshold_backward(grad, a, 0)
        if p.activation == "tanh":
            return torch.ops.aten.tanh_backward(grad, a)
        if p.activation == "logistic":
            return torch.ops.aten.sigmoid_backward(grad, a)
        return grad

    def fwd() -> None:
        F.avg_pool2d(act(F.conv2d(x, w, bias, list(p.stride), pad)), window, stride, ppad, False, p.count_pad)

    def bwd() -> None:
        grad = torch.ops.aten.avg_pool2d_backward(dyp, a, window, stride, ppad, False, p.count_pad, None)
        torch.ops.aten.convolution_backward(act_backward(grad), x, w, [p.K] if p.bias else None, list(p.stride),
                                            pad, [1, 1], False, [0, 0], 1, [True, True, p.bias])
    return fwd, bwd


def table(rows: list[dict[str, Any]]) -> str:
    def us(v: float | None) -> str:
        return f"{v:9.1f}" if v else "        -"

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:6.2f}x" if a and b else "      -"

    lines = [f"{'pair':13s} | {'fwd pair':>9s} {'fused':>9s} {'keep':>9s} {'torch':>9s} {'pair/keep':>9s} "
             f"{'torch/keep':>10s} | {'bwd pair':>9s} {'split':>9s} {'torch':>9s} {'pair/split':>10s} {'torch/split':>11s}"]
    for r in rows:
        f, bw = r["fwd_us"], r["bwd_us"]
        lines.append(f"{r['pair']:13s} | {us(f['pair'])} {us(f['fused'])} {us(f['fused_keep'])} {us(f.get('torch'))} "
                     f"{ratio(f['pair'], f['fused_keep']):>9s} {ratio(f.get('torch'), f['fused_keep']):>10s} | "
                     f"{us(bw['pair'])} {us(bw['split'])} {us(bw.get('torch'))} {ratio(bw['pair'], bw['split']):>10s} "
                     f"{ratio(bw.get('torch'), bw['split']):>11s}")
    for key, label in (("fwd_us", "forward, pair over fused (keep)"), ("bwd_us", "backward, pair over split")):
        theirs, ours = ("pair", "fused_keep") if key == "fwd_us" else ("pair", "split")
        mean = geomean([r[key][theirs] / r[key][ours] for r in rows])
        lines.append(f"geometric mean {label}: {mean:.2f}x" if mean else f"geometric mean {label}: -")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    names = [name for name, _ in zoo_pairs()]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default=",".join(names), help=f"comma-separated, among {', '.join(names)}")
    ap.add_argument("--batch", type=int, default=128, help="images per batch (default 128)")
    ap.add_argument("--search", type=int, default=0,
                    help="also time the defaults and this many sampled configs of each fused operation, "
                         "keeping the fastest verified one (default 0: the lookup's config)")
    ap.add_argument("--budget", type=float, default=0.25, help="timing budget per measurement, s (default 0.25)")
    ap.add_argument("--seed", type=int, default=0, help="seed of inputs and sampled configs")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch/cuDNN")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for bench_conv_pool.json")
    args = ap.parse_args(argv)
    chosen = [n.strip() for n in args.pairs.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in names]
    if unknown or not chosen:
        ap.error(f"--pairs: {', '.join(unknown) or 'none given'}; choose among {', '.join(names)}")
    if args.batch < 1 or args.search < 0 or args.budget <= 0:
        ap.error("--batch must be >= 1, --search >= 0 and --budget > 0")
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; give a folder")

    from autocnn.gpu import gpu_available
    from autocnn.benchmark.baselines import torch_available

    if not gpu_available():
        print("autocnn: this benchmark needs a CUDA GPU with CuPy", file=sys.stderr)
        return 1
    torch_ok = not args.no_torch and torch_available()
    bench = Bench(args.device, args.budget, args.search, args.seed)
    print(f"# {bench.device.name} ({bench.device.arch}), batch {args.batch}, search {args.search}, "
          f"cuDNN {'on' if torch_ok else 'off'}", flush=True)
    pairs = dict(zoo_pairs(args.batch, keep_activation=True))
    rows, start = [], time.time()
    for name in chosen:
        rows.append(bench_pair(bench, name, pairs[name], torch_ok))
        print(f"  {name}: fwd {rows[-1]['fwd_us']}, bwd {rows[-1]['bwd_us']}", flush=True)
    print(table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench_conv_pool.json"
    path.write_text(json.dumps({"device": bench.device.name, "arch": bench.device.arch, "batch": args.batch,
                                "search": args.search, "seconds": round(time.time() - start, 1), "rows": rows},
                               indent=1))
    print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
