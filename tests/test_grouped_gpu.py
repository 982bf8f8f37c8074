"""Grouped and dilated convolutions on the GPU (run on a GPU host: pytest -m gpu): every formulation
that serves such a problem (whichever the operation's space does not refuse: igemm's GEMM per
group, depthwise where groups == C, and any added since), its default and sampled configs of
conv_fwd, conv_bwd_data and conv_wgrad in every precision, on the odd grouped shapes
(suite.GROUPED_ODD_SHAPES: C = 15 in 3 groups of 5 with dilation 2 and stride 3, groups of 3
channels, dilation alone with stride, depthwise ones) and on a sample of the grouped suite
(ResNeXt-50 32x4d's grouped 3x3 layers, batch 64), loaded through NVRTC as the library loads kernels,
on fresh random inputs, verified against the float64 reference at the precision's bound."""
from __future__ import annotations

import dataclasses
import os
import random

import pytest

from autocnn.kernels import get_operation
from autocnn.kernels.suite import grouped_odd_problems, suite_problems

pytestmark = pytest.mark.gpu

SAMPLES = int(os.environ.get("AUTOCNN_GPU_SAMPLES", "1"))
SEED = int(os.environ.get("AUTOCNN_GPU_SEED", random.randrange(2**31)))
CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# ResNeXt-50 32x4d's grouped layers of each kind: the first stage's, a strided one, the last stage's.
SUITE_SAMPLE = ("resnext_128_56", "resnext_512_28_s2", "resnext_1024_7")


def _serving(operation, problem, limits):
    """The values of "formulation" that the operation's space offers for the problem."""
    refused = operation.refusals(problem, limits)
    return [value for value in operation.formulation_names if value not in refused]


def _configs(operation, problem, limits, rng):
    """Each serving formulation's default (where the value is its first name) and SAMPLES sampled configs."""
    configs = []
    for value in _serving(operation, problem, limits):
        formulation = operation.formulation(value)
        mine = []
        if value == formulation.names[0]:
            mine.append(operation.default_config(problem, limits, formulation=formulation.formulation))
        space = operation.space(problem, limits).restrict({"formulation": value})
        configs += mine + space.sample(rng, SAMPLES, exclude=mine)
    return configs


def _verify(op, shapes, precision, device, loader):
    from autocnn.measurement.measure import check_candidate

    operation = get_operation(op)
    limits = device.limits()
    rng = random.Random(f"{SEED}:{op}:{precision}")
    checked, failures, formulations = 0, [], set()
    for name, problem in shapes:
        problem = dataclasses.replace(problem, precision=precision)
        for config in _configs(operation, problem, limits, rng):
            check = check_candidate(loader.load(operation.plan(problem, config)), problem, seed=SEED, time_it=False)
            checked += 1
            formulations.add(config["formulation"])
            if not check.verification.passed:
                failures.append(f"{name} {config}: {check.verification.message}")
    assert checked >= len(shapes)   # at least a default of each shape (AUTOCNN_GPU_SAMPLES=0: defaults alone)
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures[:8])
    return formulations


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", CONV_OPS)
def test_every_serving_formulation_verifies_on_the_odd_grouped_shapes(op, precision, device, loader):
    formulations = _verify(op, grouped_odd_problems(op), precision, device, loader)
    # igemm (conv_wgrad's: atomic or two_pass) on every shape, depthwise on the depthwise ones.
    assert "depthwise" in formulations and formulations & {"igemm", "atomic", "two_pass"}


@pytest.mark.parametrize("precision", ("fp32", "bf16"))
@pytest.mark.parametrize("op", CONV_OPS)
def test_every_serving_formulation_verifies_on_resnext_layers(op, precision, device, loader):
    shapes = [(name, p) for name, p in suite_problems("grouped", op) if name in SUITE_SAMPLE]
    assert len(shapes) == len(SUITE_SAMPLE)
    _verify(op, shapes, precision, device, loader)
