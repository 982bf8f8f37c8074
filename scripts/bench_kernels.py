#!/usr/bin/env python3
"""Benchmark every kernel family on the seed shapes next to cuDNN (same as ``autocnn bench``):
convolutions in fp32 against cuDNN FP32 and in tf32 against cuDNN TF32, side by side, with the
achieved TFLOP/s as shares of the SGEMM and TF32 GEMM rates measured in the same run.

    python scripts/bench_kernels.py --samples 64 --out bench.json
    python scripts/bench_kernels.py --precision fp32 --ops conv_fwd,conv_wgrad
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.cli.bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
