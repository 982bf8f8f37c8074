"""Every formulation of every operation, its default config on a shape that divides nothing evenly,
run by the CPU emulator of tests/cuda_emulator.py (generated kernels as C++, library steps in
NumPy) and verified against float64: the CUDA each formulation generates is executed on every CI
run, not only on a GPU host. The Hopper formulations (wgmma, TMA) are the emulator's one gap; they
are named here, and a formulation that is neither checked nor named fails the test."""
from __future__ import annotations

import random
import shutil

import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError
from autocnn.kernels import OPERATIONS
from autocnn.kernels.suite import grouped_odd_problems, odd_problems
from tests.cuda_emulator import emulated_failure
from tests.test_winograd import odd_problems as winograd_problems

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")

LIMITS = DeviceLimits.for_arch("sm_90")
# Formulations whose main kernels are Hopper's wgmma (warpgroup products over TMA or cp.async
# stages), which the emulator does not run; the GPU tests verify them.
HOPPER_ONLY = {"wgmma", "halo", "tma"}


def _shapes(op: str):
    """The odd shapes to find a default on: the suite's, then (for the 3x3 stride-1 formulations)
    the winograd tests' odd 3x3 shapes."""
    shapes = list(odd_problems(op))
    if op in ("conv_fwd", "conv_bwd_data", "conv_wgrad"):
        shapes += winograd_problems(op)
        shapes += grouped_odd_problems(op)[:1]   # depthwise serves only these
    return shapes


@pytest.mark.parametrize("op", tuple(OPERATIONS))
def test_every_formulations_default_verifies_under_emulation(op, tmp_path):
    operation = OPERATIONS[op]
    seed = random.randrange(2**31)
    checked, failures = [], []
    for formulation in operation.formulations:
        name = formulation.formulation
        if name in HOPPER_ONLY:
            continue
        for shape, problem in _shapes(op):
            try:
                config = operation.default_config(problem, LIMITS, formulation=name)
            except InfeasibleConfigError:
                continue        # the formulation does not serve this shape: try the next one
            assert "wgmma." not in operation.plan(problem, config).source, f"{op} {name} runs wgmma"
            why = emulated_failure(operation, problem, config, tmp_path, seed + len(checked))
            checked.append(name)
            if why:
                failures.append(f"{name} on {shape}: {why}")
            break
    served = {f.formulation for f in operation.formulations} - HOPPER_ONLY
    assert set(checked) == served, f"{op}: no odd shape takes {sorted(served - set(checked))}"
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)
