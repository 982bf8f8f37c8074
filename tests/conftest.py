"""Shared fixtures. GPU tests are marked ``gpu`` and skip, with the reason, where no GPU is present."""
from __future__ import annotations

import numpy as np
import pytest


def pytest_collection_modifyitems(config, items):
    from autocnn.gpu import gpu_available

    if any(item.get_closest_marker("gpu") for item in items) and not gpu_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy (run on the GPU host: pytest -m gpu)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    # Fresh data every run: the seed is drawn, and printed on failure by pytest's -ra summary via repr.
    seed = int(np.random.SeedSequence().entropy % (2**32))
    return np.random.default_rng(seed)
