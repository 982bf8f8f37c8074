"""autocnn.torch's kernels of one GPU without a GPU, for the CPU tests of preparing and quick tuning.

``fake_kernels`` is a real DeviceKernels over a real GpuKernels (lookup, quick tuning, planning,
workspaces, the tuning database in a directory), whose compiled kernels are stand-ins (nothing is
loaded) and whose measurements come from ``RecordedSource``: recorded H200 measurements
(tests/data/replay) where a file holds the problem, a fixed table of times otherwise, each result
advancing a clock that the kernels' times and budgets are read from. ``main`` prepares the test
model in a process of its own (the database is what two processes share).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from autocnn.dispatch.kernels import GpuKernels
from autocnn.measurement.sources import ReplayFile, ReplaySource, TrialResult
from autocnn.store import TuningDatabase, approve_all

REPO = Path(__file__).resolve().parents[1]
REPLAY = REPO / "tests" / "data" / "replay"
RECORDED = [ReplayFile.load(REPLAY / name) for name in
            ("conv_wgrad__convnet18_c1.json.gz", "avgpool_fwd__convnet18_pool.json.gz",
             "avgpool_bwd__convnet18_pool.json.gz")]
DEVICE = RECORDED[0].device      # an H200
INPUT_SHAPE = (128, 3, 32, 32)   # convnet18's: its first layer's weight gradient and its pooling are recorded


def model() -> Any:
    """convnet18's first layers (3 -> 32 filters of 5x5, 3x3 average pooling of stride 2) and one more
    convolution: seven problems in a training step, three of them recorded."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(),
                         nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
                         nn.Conv2d(32, 16, 3, padding=1))


class RecordedSource:
    """A MeasurementSource: the replay files' answers where they hold the problem, else a time drawn
    from the config's key (50-250 us); ``seconds_each`` on the clock per result."""

    replayed = False

    def __init__(self, seconds_each: float = 0.25):
        self.device = DEVICE
        self.replay = ReplaySource(RECORDED)
        self.seconds_each = seconds_each
        self.now = 0.0
        self.measured: list[tuple[Any, str]] = []     # (problem, config key) of every result
        self.opened = 0

    def clock(self) -> float:
        return self.now

    def measure(self, op: str, problem: Any, configs: Any) -> Any:
        recorded = self.replay.find(op, problem) is not None
        answers = self.replay.measure(op, problem, configs) if recorded else (self._scripted(c) for c in configs)
        for config, result in zip(configs, answers):
            self.now += self.seconds_each
            self.measured.append((problem, config.key()))
            yield result

    @staticmethod
    def _scripted(config: Any) -> TrialResult:
        time_us = 50.0 + int(hashlib.sha256(config.key().encode()).hexdigest()[:6], 16) % 200
        return TrialResult(config, True, time_us, timing={"median_us": time_us, "spread": 0.01})

    def factory(self) -> "RecordedSource":
        self.opened += 1
        return self

    def close(self) -> None:
        pass


class _NoKernel:
    """Stands in for the runtime's KernelLoader: the plan is kept, nothing is compiled or loaded."""

    def load(self, plan: Any) -> Any:
        return SimpleNamespace(plan=plan)


# What a GpuKernels asks of CuPy while preparing: a device scope, and workspace buffers.
FAKE_CUPY = SimpleNamespace(cuda=SimpleNamespace(Device=lambda index: _Scope()), empty=np.empty, float32=np.float32)


class _Scope:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def database(db_dir: Path) -> TuningDatabase:
    """The user's database in ``db_dir``, no shipped records, every borrowed config runnable (no ptxas here)."""
    return TuningDatabase(user_dir=db_dir, shipped_dir=db_dir.parent / "shipped", resource_check=approve_all)


def fake_kernels(db_dir: Path, source: RecordedSource, autotune: str | None = None) -> Any:
    """A DeviceKernels of device 0 on ``source``, its database in ``db_dir``."""
    from autocnn.kernels import runtime
    from autocnn.torch.launch import DeviceKernels

    loader, runtime.KernelLoader = runtime.KernelLoader, _NoKernel
    try:
        kernels = GpuKernels(FAKE_CUPY, 0, DEVICE, database(db_dir), autotune)
    finally:
        runtime.KernelLoader = loader
    kernels.measurement_source = source.factory
    kernels.clock = source.clock
    return DeviceKernels(0, kernels)


def main(job: dict[str, Any]) -> None:
    """Prepare ``model()`` on fake kernels over the database ``job["db"]``; print the report as JSON."""
    import torch

    from autocnn.torch.first_use import PrepareSettings, prepare_on

    source = RecordedSource()
    kernels = fake_kernels(Path(job["db"]), source)
    settings = PrepareSettings.resolve(budget_s=job.get("budget_s"), verbose=False)
    report = prepare_on(kernels, model(), (torch.empty(INPUT_SHAPE),), settings)
    print(json.dumps({**report.to_dict(), "measured": len(source.measured), "opened": source.opened}))


def run_in_new_process(job: dict[str, Any]) -> dict[str, Any]:
    """``main(job)`` in a process of its own; what it printed."""
    code = "import json, sys; from tests.torch_fake_gpu import main; main(json.loads(sys.argv[1]))"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "AUTOCNN_COST_MODEL": "off"}
    env.pop("AUTOCNN_AUTOTUNE", None)
    done = subprocess.run([sys.executable, "-c", code, json.dumps(job)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
