#!/usr/bin/env python3
"""Benchmark every kernel family on the seed shapes next to cuDNN (same as ``autocnn bench``).

    python scripts/bench_kernels.py --samples 64 --out bench.json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.tuning.benchmark import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
