"""The first-use hook prepares a model's kernels inside its first forward; nothing that preparation
leaves behind may keep that forward's frames alive. If it did, the step's output and its autograd
graph would outlive the step, and with them the parameters' AccumulateGrad nodes, made on the first
step's stream: a later CUDA-graph capture of the model then fails (cudaErrorStreamCaptureImplicit).
The preparation's first imports are what kept them (Optuna keeps the ImportError of each optional
module it tries, traceback and all), so the step runs in a fresh interpreter, where those imports
happen inside the forward. The GPU kernels are stood in for; the layers compute on the CPU, through
PyTorch's operators."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = r'''
import gc, types
import torch
from torch import nn
import autocnn.torch as at
from autocnn.torch import first_use

assert "optuna" not in __import__("sys").modules, "optuna imported before the step: the scenario proves nothing"


class StandInKernels:
    """A device's kernels for prepare_on: every problem prepared, nothing compiled."""
    index = 0
    kernels = types.SimpleNamespace(clock=__import__("time").perf_counter)

    def prepare(self, problems, **_):
        return types.SimpleNamespace(problems=[types.SimpleNamespace(problem=p) for p in problems])


first_use.kernels_for = lambda device: StandInKernels()
first_use._cuda_step = lambda args, kwargs: torch.device("cpu")   # the hook prepares for a CPU step
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AvgPool2d(2),
                      nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
at.convert(model, verbose=False)
x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
torch.nn.functional.cross_entropy(model(x), y).backward()
assert "optuna" in __import__("sys").modules, "the preparation imported no Optuna: the scenario proves nothing"
gc.collect()
live = [tuple(t.shape) for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.grad_fn is not None]
print("tensors with an autograd graph alive after the step:", live)
'''


def test_no_autograd_graph_outlives_the_first_step_of_a_converted_model():
    run = subprocess.run([sys.executable, "-c", SCENARIO], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-4000:]
    assert "alive after the step: []" in run.stdout, run.stdout[-2000:]
