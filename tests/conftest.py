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


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server for the whole test run (tests/postgres_server.py); skipped with the
    reason where the server binaries or the driver are missing."""
    from tests.postgres_server import PostgresServer, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server, request):
    """The URL of a fresh database on the test run's PostgreSQL server, one per test."""
    import re

    name = "t_" + re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:50]
    return postgres_server.create_database(f"{name}_{id(request) % 100000}")


class SourceOpened(Exception):
    """Raised by the ``no_gpu_source`` fixture where a command would open a measurement source."""


@pytest.fixture
def no_gpu_source(monkeypatch):
    """Fails `autocnn tune` the moment it would open a measurement source (a GPU), so a test can show
    that a mistake was reported before any device was touched."""
    from autocnn.cli import tune

    def opened(choice):
        raise SourceOpened()
    monkeypatch.setattr(tune, "open_sources", opened)
    return SourceOpened


@pytest.fixture
def device_untouched(monkeypatch):
    """Fails the test the moment a script asks for CuPy (the device), so that it shows a mistake was
    refused before any device work."""
    import autocnn.gpu

    def no_device():
        raise AssertionError("the device was touched")
    monkeypatch.setattr(autocnn.gpu, "require_cupy", no_device)


@pytest.fixture(autouse=True)
def _gpu_tests_run_the_kernels_the_lookup_hands_out(request, monkeypatch):
    """GPU tests check the kernels a lookup hands out (records, borrowed configs, defaults): they do
    not quick-tune unseen shapes (the cuda backend's default, which measures and writes records into
    the user's database) unless they ask for it with an argument or by unsetting the variable."""
    import os

    if request.node.get_closest_marker("gpu") and "AUTOCNN_AUTOTUNE" not in os.environ:
        monkeypatch.setenv("AUTOCNN_AUTOTUNE", "off")


@pytest.fixture(autouse=True)
def _the_rule_without_a_cost_model(monkeypatch):
    """The lookup's, quick tuning's and the tuner's tests assert what the rule without a cost model
    answers (the nearest shape's config, the heuristic default, the order of first trials), which
    is also what runs wherever the model file is refused; tests/test_cost_model.py names a model
    file where it tests the model. ``$AUTOCNN_COST_MODEL`` set for the run keeps its value."""
    import os

    if "AUTOCNN_COST_MODEL" not in os.environ:
        monkeypatch.setenv("AUTOCNN_COST_MODEL", "off")


# The GPU tests' device and kernel loader, one of each for the session (imported on first use, so
# that the CPU run never imports CuPy).
@pytest.fixture(scope="session")
def device():
    from autocnn.device import current_device

    return current_device(0)


@pytest.fixture(scope="session")
def loader():
    from autocnn.kernels.runtime import KernelLoader

    return KernelLoader()
