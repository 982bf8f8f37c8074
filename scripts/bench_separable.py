#!/usr/bin/env python3
"""Separable filters (seed 002): the batched SVD and the separable convolutions.

1. The batched power-method SVD (autocnn.separable.svd_cuda) on --filters random filters (default
   1,024, the seed's; a layer has K*C: 4,096 for 64->64, 65,536 for 256->256) of each size
   (3, 5, 7, 9, 11 by default) at each --ranks rank: a cold start against a warm start from the
   vectors of filters one small step away (--step: the relative size of the change, as after an
   optimizer update). Both time the kernel under the timing protocol (each repetition first puts
   the start vectors back, a small copy or fill in both), and one call of each reports the mean
   iterations per rank and the share of filters that hit the cap. The seed: warm starts cut the
   time 27-77%; under 20% of filters reached the cap of 100.
2. Separable forward and backward on 64->64 maps (--hw, --batch) for the same filter sizes, 'same'
   padding, at each rank: sep_conv_fwd against autocnn's 2D conv_fwd and cuDNN; backward
   (sep_conv_bwd_data + sep_conv_wgrad, and the layer's tangent projection) against conv_bwd_data
   + conv_wgrad and cuDNN's two. autocnn's kernels are the tuning database's configs for the
   shape (or the heuristic default), each verified against float64 before it is timed. The seed:
   up to 2.66x forward and 2.35x backward over cuda-convnet's 2D kernels.

Prints a table; writes every number as JSON to --out/bench_separable.json.

    python scripts/bench_separable.py --out results/ --ranks 1,2
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZES = (3, 5, 7, 9, 11)
SVD_FILTERS = (1024,)   # the seed's batch


def parse_ints(ap: argparse.ArgumentParser, flag: str, text: str, lowest: int) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        values = []
    if not values or any(v < lowest for v in values):
        ap.error(f"{flag} takes comma-separated integers >= {lowest}, got {text!r}")
    return values


def bench_svd(cp: Any, size: int, rank: int, step: float, budget_s: float, seed: int,
              filters: int = SVD_FILTERS[0]) -> dict[str, Any]:
    """Cold and warm batched SVD of ``filters`` random size x size filters at ``rank``."""
    from autocnn.separable.svd import SvdSettings, report_from
    from autocnn.separable.svd_cuda import shared
    from autocnn.measurement.measure import time_callable

    svd, settings = shared(), SvdSettings()
    choice = svd.prepare(filters, size, size, rank, settings)
    gen = cp.random.RandomState(seed)
    before = gen.standard_normal((filters, size, size), dtype=cp.float32)
    after = before + step * float(cp.sqrt(cp.mean(before * before))) * gen.standard_normal(before.shape,
                                                                                            dtype=cp.float32)
    u = cp.empty((filters, rank, size), dtype=cp.float32)
    v = cp.zeros((filters, rank, size), dtype=cp.float32)
    its = cp.empty((filters, rank), dtype=cp.int32)
    status = cp.empty((filters, rank), dtype=cp.int32)
    svd.decompose(before, u, v, its, status, settings, warm_start=False)
    previous = v.copy()

    # Both put the previous vectors back first (the same small copy), so that the difference is
    # the SVD's alone; the cold start then ignores them.
    def cold() -> None:
        cp.copyto(v, previous)
        svd.decompose(after, u, v, its, status, settings, warm_start=False)

    def warm() -> None:
        cp.copyto(v, previous)
        svd.decompose(after, u, v, its, status, settings)

    row: dict[str, Any] = {"size": size, "rank": rank, "filters": filters, "step": step,
                           "variant": {"threads_per_filter": choice.variant.threads_per_filter,
                                       "filters_per_block": choice.variant.filters_per_block}}
    for label, run in (("cold", cold), ("warm", warm)):
        run()   # once for the counts: iterations and status hold this call's
        report = report_from(cp.asnumpy(its), cp.asnumpy(status), settings)
        row[label] = {"us": time_callable(run, budget_s=budget_s).median_us,
                      "mean_iterations": list(report.mean_iterations), "max_iterations": list(report.max_iterations),
                      "capped_share": report.capped_share}
    row["warm_saving"] = 1 - row["warm"]["us"] / row["cold"]["us"]
    return row


def bench_conv(bench: Any, size: int, rank: int, batch: int, hw: int, torch_ok: bool) -> dict[str, Any]:
    """Separable against 2D (autocnn) and cuDNN, forward and backward, 64 -> 64 maps."""
    from autocnn.kernels.problem import ConvFwdProblem
    from autocnn.kernels.sep_conv import SepConvFwdProblem
    from autocnn.separable.projection_cuda import tangent_projection
    from autocnn.benchmark.baselines import time_cudnn

    geo = dict(N=batch, C=64, H=hw, W=hw, K=64, R=size, S=size, padding=size // 2)
    conv = ConvFwdProblem(**geo, bias=True, activation="relu")
    sep = SepConvFwdProblem(**geo, bias=True, activation="relu", rank=rank)
    problems = {"conv_fwd": conv, "conv_bwd_data": conv.with_op("conv_bwd_data"),
                "conv_wgrad": conv.with_op("conv_wgrad", bias=True), "sep_conv_fwd": sep,
                "sep_conv_bwd_data": sep.with_op("sep_conv_bwd_data"),
                "sep_conv_wgrad": sep.with_op("sep_conv_wgrad", bias=True)}
    row: dict[str, Any] = {"size": size, "rank": rank, "problem": sep.to_dict(), "kernels": {}, "us": {}}
    x, y, w = bench.randn(conv.x_shape), bench.randn(conv.y_shape), bench.randn(conv.w_shape)
    dx, dw, bias, db = bench.randn(conv.x_shape), bench.randn(conv.w_shape), bench.randn((64,)), bench.randn((64,))
    u, v = bench.randn((64, 64, rank, size)), bench.randn((64, 64, rank, size))
    gu, gv = bench.randn(u.shape), bench.randn(v.shape)
    arrays = {"conv_fwd": dict(x=x, w=w, bias=bias, y=y), "conv_bwd_data": dict(dy=y, w=w, dx=dx),
              "conv_wgrad": dict(x=x, dy=y, dw=dw, db=db), "sep_conv_fwd": dict(x=x, u=u, v=v, bias=bias, y=y),
              "sep_conv_bwd_data": dict(dy=y, u=u, v=v, dx=dx),
              "sep_conv_wgrad": dict(x=x, dy=y, u=u, v=v, gu=gu, gv=gv, db=db)}
    steps = {}
    for label, problem in problems.items():
        loaded, info = bench.kernel(problem)
        row["kernels"][label] = info
        buffers = bench.buffers(loaded, **arrays[label])
        steps[label] = (lambda loaded=loaded, buffers=buffers: loaded(buffers))
        row["us"][label] = bench.time([steps[label]])
    row["us"]["projection"] = bench.time([lambda: tangent_projection(gu, gv, u, v, dw)])
    us = row["us"]
    row["fwd_us"] = {"sep": us["sep_conv_fwd"], "2d": us["conv_fwd"]}
    row["bwd_us"] = {"sep": us["sep_conv_bwd_data"] + us["sep_conv_wgrad"],
                     "sep_with_projection": us["sep_conv_bwd_data"] + us["sep_conv_wgrad"] + us["projection"],
                     "2d": us["conv_bwd_data"] + us["conv_wgrad"]}
    if torch_ok:
        timed = {op: time_cudnn(op, problems[op], flusher=bench.flusher, budget_s=bench.budget_s)
                 for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad")}
        row["fwd_us"]["cudnn"] = timed["conv_fwd"]
        if timed["conv_bwd_data"] and timed["conv_wgrad"]:
            row["bwd_us"]["cudnn"] = timed["conv_bwd_data"] + timed["conv_wgrad"]
    return row


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}x" if a and b else "      -"


def tables(svd_rows: list[dict[str, Any]], conv_rows: list[dict[str, Any]]) -> str:
    lines = ["batched SVD: time (us), mean iterations of rank 1, share capped",
             f"{'filters':>7s} {'size':>4s} {'rank':>4s} | {'cold':>9s} {'its':>6s} {'capped':>7s} | {'warm':>9s} {'its':>6s} "
             f"{'capped':>7s} | {'saving':>7s}"]
    for r in svd_rows:
        c, w = r["cold"], r["warm"]
        lines.append(f"{r['filters']:7d} {r['size']:4d} {r['rank']:4d} | {c['us']:9.1f} {c['mean_iterations'][0]:6.1f} "
                     f"{100 * c['capped_share']:6.1f}% | {w['us']:9.1f} {w['mean_iterations'][0]:6.1f} "
                     f"{100 * w['capped_share']:6.1f}% | {100 * r['warm_saving']:6.1f}%")
    if conv_rows:
        lines += ["", "64->64 maps, time (us); speed-up of separable over 2D and cuDNN",
                  f"{'size':>4s} {'rank':>4s} | {'fwd sep':>9s} {'2d':>9s} {'cudnn':>9s} {'/2d':>7s} {'/cudnn':>7s} | "
                  f"{'bwd sep':>9s} {'+proj':>9s} {'2d':>9s} {'cudnn':>9s} {'/2d':>7s} {'/cudnn':>7s}"]
        for r in conv_rows:
            f, b = r["fwd_us"], r["bwd_us"]

            def us(v: float | None) -> str:
                return f"{v:9.1f}" if v else "        -"
            lines.append(f"{r['size']:4d} {r['rank']:4d} | {us(f['sep'])} {us(f['2d'])} {us(f.get('cudnn'))} "
                         f"{ratio(f['2d'], f['sep'])} {ratio(f.get('cudnn'), f['sep'])} | {us(b['sep'])} "
                         f"{us(b['sep_with_projection'])} {us(b['2d'])} {us(b.get('cudnn'))} "
                         f"{ratio(b['2d'], b['sep_with_projection'])} {ratio(b.get('cudnn'), b['sep_with_projection'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="filter sizes (default 3,5,7,9,11)")
    ap.add_argument("--ranks", default="1", help="ranks, comma-separated (default 1, the seed's)")
    ap.add_argument("--filters", default=",".join(map(str, SVD_FILTERS)),
                    help="filter counts of the SVD runs, comma-separated (default 1024, the seed's)")
    ap.add_argument("--batch", type=int, default=64,
                    help="images per batch of the convolutions (default 64: the largest power of two at which an "
                         "11x11 64->64 layer on 64x64 maps keeps every index in 32 bits)")
    ap.add_argument("--hw", type=int, default=64,
                    help="map height and width (default 64: the seed's 16 tiles of 16x16 per map)")
    ap.add_argument("--step", type=float, default=0.01,
                    help="relative change of the filters between the warm start's two calls (default 0.01)")
    ap.add_argument("--budget", type=float, default=0.25, help="timing budget per measurement, s (default 0.25)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random filters and inputs")
    ap.add_argument("--svd-only", action="store_true", help="skip the convolutions")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch/cuDNN")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for bench_separable.json")
    args = ap.parse_args(argv)
    sizes = parse_ints(ap, "--sizes", args.sizes, 2)
    ranks = parse_ints(ap, "--ranks", args.ranks, 1)
    filter_counts = parse_ints(ap, "--filters", args.filters, 1)
    if any(r > min(sizes) for r in ranks):
        ap.error(f"--ranks: a rank is at most the smallest filter size ({min(sizes)})")
    if args.batch < 1 or args.hw < max(sizes) or args.budget <= 0 or not 0 < args.step < 1:
        ap.error("--batch must be >= 1, --hw at least the largest filter size, --budget > 0, 0 < --step < 1")
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; give a folder")
    from autocnn.errors import InvalidProblemError
    from autocnn.kernels.problem import ConvFwdProblem

    for size in sizes:   # every layer must be a valid problem before any device work starts
        try:
            ConvFwdProblem(N=args.batch, C=64, H=args.hw, W=args.hw, K=64, R=size, S=size, padding=size // 2)
        except InvalidProblemError as exc:
            ap.error(f"--batch {args.batch} --hw {args.hw} with {size}x{size} filters: {exc}")

    from autocnn.gpu import gpu_available
    from autocnn.benchmark.baselines import torch_available

    if not gpu_available():
        print("autocnn: this benchmark needs a CUDA GPU with CuPy", file=sys.stderr)
        return 1
    from scripts.bench_conv_pool import Bench

    bench = Bench(args.device, args.budget, 0, args.seed)
    torch_ok = not args.no_torch and torch_available()
    print(f"# {bench.device.name} ({bench.device.arch}), batch {args.batch}, maps {args.hw}x{args.hw}, "
          f"cuDNN {'on' if torch_ok else 'off'}", flush=True)
    start = time.time()
    svd_rows, conv_rows = [], []
    for size in sizes:
        for rank in ranks:
            for filters in filter_counts:
                svd_rows.append(bench_svd(bench.cp, size, rank, args.step, args.budget, args.seed, filters))
                print(f"  svd {filters} filters {size}x{size} rank {rank}: cold {svd_rows[-1]['cold']['us']:.1f} us, "
                      f"warm {svd_rows[-1]['warm']['us']:.1f} us", flush=True)
            if not args.svd_only:
                conv_rows.append(bench_conv(bench, size, rank, args.batch, args.hw, torch_ok))
                print(f"  conv {size}x{size} rank {rank}: fwd {conv_rows[-1]['fwd_us']}, "
                      f"bwd {conv_rows[-1]['bwd_us']}", flush=True)
    print(tables(svd_rows, conv_rows))
    best = {key: max((r[key]["2d"] / r[key]["sep" if key == "fwd_us" else "sep_with_projection"]
                      for r in conv_rows), default=None) for key in ("fwd_us", "bwd_us")}
    if conv_rows:
        print(f"# best speed-up over autocnn's 2D kernels: forward {best['fwd_us']:.2f}x, backward "
              f"{best['bwd_us']:.2f}x (seed: 2.66x and 2.35x over cuda-convnet)")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench_separable.json"
    path.write_text(json.dumps({"device": bench.device.name, "arch": bench.device.arch, "batch": args.batch,
                                "hw": args.hw, "seconds": round(time.time() - start, 1), "svd": svd_rows,
                                "conv": conv_rows, "best_speedup_over_2d": best,
                                "geomean_svd_warm_saving": _geomean([1 - r["warm_saving"] for r in svd_rows])},
                               indent=1))
    print(f"# wrote {path}")
    return 0


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


if __name__ == "__main__":
    sys.exit(main())
