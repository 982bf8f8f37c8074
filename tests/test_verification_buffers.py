"""Verification's buffers (autocnn/measurement/measure.py, plan_buffers): outputs and workspaces are
filled with NaN before a plan runs. The runtime hands workspaces out uninitialized, so a plan that
reads a workspace element it never wrote is wrong even where a fresh allocation happens to hold
zeros; poisoned, it fails verification. NumPy stands in for CuPy (no GPU needed)."""
import numpy as np
import pytest

from autocnn.kernels import reference
from autocnn.kernels.problem import parse_shape
from autocnn.measurement import measure

PROBLEM = parse_shape("conv_fwd", "N=2,C=3,H=7,W=5,K=4,R=3,S=3,stride=1,pad=1")


class ScratchReadingPlan:
    """Writes the reference's outputs plus one element of its workspace, which it reads without
    writing (counting on zeros) unless ``clears``. Its workspace comes as zeros, as a fresh
    allocation's often does."""

    def __init__(self, clears: bool):
        self.clears = clears

    def workspaces(self):
        return {"scratch": np.zeros(16, dtype=np.float32)}

    def __call__(self, buffers):
        if self.clears:
            buffers["scratch"][:] = 0.0
        inputs = {name: buffers[name] for name in reference.input_shapes(PROBLEM)}
        for name, out in measure.reference_outputs(PROBLEM, inputs).items():
            buffers[name][...] = out + buffers["scratch"][3]


@pytest.fixture
def numpy_for_cupy(monkeypatch):
    monkeypatch.setattr(measure, "require_cupy", lambda: np)


def test_workspaces_come_poisoned(numpy_for_cupy):
    inputs, outputs, buffers = measure.plan_buffers(ScratchReadingPlan(clears=False), PROBLEM, seed=0)
    assert np.isnan(buffers["scratch"]).all()
    assert all(np.isnan(out).all() for out in outputs.values())
    assert all(np.isfinite(x).all() for x in inputs.values())


@pytest.mark.parametrize("clears", [False, True])
def test_a_plan_reading_a_workspace_element_it_never_wrote_fails(numpy_for_cupy, clears):
    plan = ScratchReadingPlan(clears)
    inputs, outputs, buffers = measure.plan_buffers(plan, PROBLEM, seed=0)
    plan(buffers)
    assert measure.verify_outputs(PROBLEM, inputs, outputs).passed == clears
