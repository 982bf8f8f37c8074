"""scripts/bench_training.py as a module, for the tests of what the benchmark computes (its PyTorch
twins of the zoo networks, its CUDA-graph capture, its attribution of device time)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_training.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_training", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
