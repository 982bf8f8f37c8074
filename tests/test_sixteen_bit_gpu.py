"""bf16 and fp16 on the GPU (run on a GPU host: pytest -m gpu): every formulation of every operation
that serves them, its default and sampled configs on an odd shape and a seed shape, loaded through
NVRTC as the library loads kernels (cuda_bf16.h and cuda_fp16.h from compiler.cuda_include_dir) and
verified against the float64 reference of the 16-bit inputs, every element; and fp16's overflow to
Inf, as cuDNN's FP16 output, on the device's own conversion."""
from __future__ import annotations

import dataclasses
import os
import random

import pytest

from autocnn.kernels import get_operation
from autocnn.kernels.suite import odd_problems, seed_problems

pytestmark = pytest.mark.gpu

SAMPLES = int(os.environ.get("AUTOCNN_GPU_SAMPLES", "4"))
SEED = int(os.environ.get("AUTOCNN_GPU_SEED", random.randrange(2**31)))
SERVING = {"conv_fwd": ("direct", "igemm", "tc"), "conv_bwd_data": ("direct", "igemm", "tc"),
           "conv_wgrad": ("atomic", "two_pass", "tc"),
           "avgpool_fwd": ("window_gather",), "avgpool_bwd": ("window_gather",)}
CASES = [(op, value, precision) for op, values in SERVING.items() for value in values for precision in ("bf16", "fp16")]


def _configs(operation, problem, value, limits, rng):
    space = operation.space(problem, limits)
    if "formulation" in {p.name for p in space.params}:
        space = space.restrict({"formulation": value})
    configs = []
    try:
        default = operation.default_config(problem, limits, formulation=operation.formulation(value).formulation)
        configs = [default] if default.get("formulation", value) == value else []
    except Exception:   # noqa: BLE001  no default of this value on the shape: the sample alone
        pass
    return configs + space.sample(rng, SAMPLES, exclude=configs)


@pytest.mark.parametrize("op,value,precision", CASES, ids=[f"{op}-{v}-{p}" for op, v, p in CASES])
def test_sixteen_bit_formulations_verify_on_odd_and_seed_shapes(op, value, precision, device, loader):
    from autocnn.measurement.measure import check_candidate

    operation = get_operation(op)
    limits = device.limits()
    rng = random.Random(f"{SEED}:{op}:{value}:{precision}")
    checked, failures = 0, []
    for name, problem in [odd_problems(op)[0], odd_problems(op)[1], seed_problems(op)[0]]:
        problem = dataclasses.replace(problem, precision=precision)
        for config in _configs(operation, problem, value, limits, rng):
            check = check_candidate(loader.load(operation.plan(problem, config)), problem, seed=SEED, time_it=False)
            checked += 1
            if not check.verification.passed:
                failures.append(f"{name} {config}: {check.verification.message}")
    # Sampled configs on each of the three shapes; with AUTOCNN_GPU_SAMPLES=0 the defaults alone, which
    # some shapes lack for this formulation value.
    assert checked >= (3 if SAMPLES else 1)
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures[:8])


def test_fp16_overflows_to_inf_and_nan_propagates_on_the_gpu(device, loader):
    import cupy as cp
    import numpy as np

    from autocnn.kernels.problem import ConvFwdProblem
    from autocnn.measurement import element_arrays

    problem = ConvFwdProblem(N=1, C=3, H=12, W=12, K=3, R=3, S=3, precision="fp16")
    operation = get_operation("conv_fwd")
    w = np.empty(problem.w_shape, dtype=np.float32)
    w[0], w[1], w[2] = 100.0, 3000.0, -3000.0
    x = np.ones(problem.x_shape, np.float32)
    x[0, 1, 0, 0] = np.nan
    element = problem.precision.x
    for value in ("direct", "igemm", "tc"):
        plan = operation.plan(problem, operation.default_config(problem, device.limits(), formulation=value))
        buffers = {"x": cp.asarray(element_arrays.rounded(x, element, np)),
                   "w": cp.asarray(element_arrays.rounded(w, element, np)),
                   "y": element_arrays.nans(problem.y_shape, element, cp)}
        loader.load(plan)(buffers)
        y = element_arrays.values(cp.asnumpy(buffers["y"]), element, np)
        assert np.isnan(y[0, :, 0, 0]).all()                       # the NaN's one output position
        rest = np.ones(y.shape[2:], dtype=bool)
        rest[0, 0] = False
        assert (y[0, 0][rest] == 2700.0).all(), value
        assert np.isposinf(y[0, 1][rest]).all() and np.isneginf(y[0, 2][rest]).all(), value
