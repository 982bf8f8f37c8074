"""The scripts under scripts/ as modules, for the tests of what they compute and check (the training
benchmark's PyTorch twins, CUDA-graph capture and attribution of device time; the other scripts'
argument checks and tables)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
BENCH = SCRIPTS / "bench_training.py"


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py, loaded fresh as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # Registered first, as an import would: a dataclass with string annotations looks its module up there.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_bench() -> ModuleType:
    return load_script("bench_training")
