"""``autocnn bench``: its own parser (the arguments are handed over before the top-level parser
sees them), read once into a BenchSettings, then autocnn.benchmark.kernels plans and runs it."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autocnn.benchmark import kernels as benchmark
from autocnn.benchmark.kernels import PRECISION_CHOICES, BenchSettings
from autocnn.kernels.suite import SUITES
from autocnn.cli.problems import LAYOUT_HELP
from autocnn.layout import LAYOUT_NAMES


def add_parser(sub: Any) -> None:
    """``bench`` in the top-level help (its arguments never reach the top-level parser)."""
    b = sub.add_parser("bench", help="benchmark the kernel families on the seed shapes against cuDNN, fp32 and "
                                     "tf32 side by side (--precision fp32|tf32|bf16|fp16|both), with TFLOP/s and "
                                     "shares of the measured SGEMM and tensor-core GEMM rates")
    b.add_argument("args", nargs=argparse.REMAINDER, help="arguments of scripts/bench_kernels.py")
    b.set_defaults(func=lambda args: main(args.args))


def build_parser() -> argparse.ArgumentParser:
    defaults = BenchSettings()
    ap = argparse.ArgumentParser(prog="autocnn bench", description=benchmark.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=defaults.samples, help="random valid configs per family and shape")
    ap.add_argument("--ops", default=defaults.ops, help="comma-separated operations")
    ap.add_argument("--shapes", default=defaults.shapes,
                    help="comma-separated shape names: the seed suite's, or pointwise_s1 / pointwise_s2 "
                         "(today's 1x1 layers, 256->512 channels on 28x28, batch 64; default: the seed suite)")
    ap.add_argument("--suite", choices=SUITES, default=defaults.suite,
                    help="the shapes run when --shapes names none: seed (default), grouped (ResNeXt-50 32x4d's "
                         "grouped 3x3 layers) or depthwise (MobileNetV2's, ConvNeXt-T's and RepLKNet-31B's)")
    ap.add_argument("--precision", choices=tuple(PRECISION_CHOICES), default=defaults.precision,
                    help="the convolutions' precision: fp32 (against cuDNN FP32), tf32 (against cuDNN TF32), "
                         "bf16 or fp16 (against cuDNN on bfloat16 or float16 tensors; pooling too), or both "
                         "fp32 and tf32, side by side (default)")
    ap.add_argument("--layout", choices=LAYOUT_NAMES, default=defaults.layout,
                    help=LAYOUT_HELP + "; cuDNN runs in the same layout (channels_last for nhwc)")
    ap.add_argument("--budget", type=float, default=defaults.budget, help="seconds of timed repetitions per variant")
    ap.add_argument("--seed", type=int, default=defaults.seed, help="sampling seed (default: random, printed)")
    ap.add_argument("--out", type=Path, default=defaults.out, help="JSON results")
    ap.add_argument("--device", type=int, default=defaults.device)
    ap.add_argument("--cudnn-processes", type=int, default=defaults.cudnn_processes, metavar="N",
                    help="time cuDNN in N processes and compare with its fastest (default 1: the run's own)")
    ap.add_argument("--workspace-limit", default=defaults.workspace_limit, metavar="SIZE",
                    help="the most scratch memory one kernel may use, e.g. 64MiB (default: "
                         "$AUTOCNN_WORKSPACE_LIMIT, else 256MiB); sampled and looked-up configs stay within it")
    return ap


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    return BenchSettings(ops=args.ops, shapes=args.shapes, suite=args.suite, precision=args.precision,
                         layout=args.layout,
                         samples=args.samples,
                         budget=args.budget, seed=args.seed, out=args.out, device=args.device,
                         cudnn_processes=args.cudnn_processes, workspace_limit=args.workspace_limit)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    settings = bench_settings(ap.parse_args(argv))
    try:
        work = benchmark.plan(settings)   # every input checked before the GPU starts
    except ValueError as exc:
        ap.error(str(exc))
    return benchmark.run(settings, work)
