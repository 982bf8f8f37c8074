"""The depthwise formulation on the GPU (run on a GPU host: pytest -m gpu): its default and sampled
configs of conv_fwd, conv_bwd_data and conv_wgrad on the odd grouped shapes (a channel multiplier,
dilation with stride, a 31x31 filter on a 20x20 map) and on MobileNet- and ConvNeXt-like layers
(C = K = 96..384, 3x3 and 7x7, 56x56 to 14x14), in every precision, loaded through NVRTC as the
library loads kernels and verified against the float64 reference, every element."""
from __future__ import annotations

import dataclasses
import os
import random

import pytest

from autocnn.kernels import get_operation
from autocnn.kernels.problem import PROBLEM_TYPES
from autocnn.kernels.suite import grouped_odd_problems

pytestmark = pytest.mark.gpu

SAMPLES = int(os.environ.get("AUTOCNN_GPU_SAMPLES", "3"))
SEED = int(os.environ.get("AUTOCNN_GPU_SEED", random.randrange(2**31)))
CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# (name, C, H, R, stride): MobileNetV2's 3x3 depthwise layers and ConvNeXt's 7x7 ones, batch 8.
NETWORK_LAYERS = (
    ("mobilenet_96_56_s2", 96, 112, 3, 2),
    ("mobilenet_144_56", 144, 56, 3, 1),
    ("mobilenet_192_28", 192, 28, 3, 1),
    ("mobilenet_384_14", 384, 14, 3, 1),
    ("convnext_96_56", 96, 56, 7, 1),
    ("convnext_192_28", 192, 28, 7, 1),
    ("convnext_384_14", 384, 14, 7, 1),
)


def network_problems(op: str) -> list[tuple[str, object]]:
    return [(name, PROBLEM_TYPES[op](N=8, C=c, H=h, W=h, K=c, R=r, S=r, stride=s, padding=r // 2, groups=c))
            for name, c, h, r, s in NETWORK_LAYERS]


def _configs(operation, problem, limits, rng):
    default = operation.default_config(problem, limits, formulation="depthwise")
    space = operation.space(problem, limits).restrict({"formulation": "depthwise"})
    return [default, *space.sample(rng, SAMPLES, exclude=[default])]


def _verify(op, shapes, precision, device, loader):
    from autocnn.measurement.measure import check_candidate

    operation = get_operation(op)
    limits = device.limits()
    rng = random.Random(f"{SEED}:{op}:{precision}")
    checked, failures = 0, []
    for name, problem in shapes:
        problem = dataclasses.replace(problem, precision=precision)
        for config in _configs(operation, problem, limits, rng):
            check = check_candidate(loader.load(operation.plan(problem, config)), problem, seed=SEED, time_it=False)
            checked += 1
            if not check.verification.passed:
                failures.append(f"{name} {config}: {check.verification.message}")
    assert checked >= len(shapes)
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures[:8])


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", CONV_OPS)
def test_depthwise_verifies_on_the_odd_grouped_shapes(op, precision, device, loader):
    _verify(op, [(name, p) for name, p in grouped_odd_problems(op) if p.depthwise], precision, device, loader)


@pytest.mark.parametrize("precision", ("fp32", "bf16"))
@pytest.mark.parametrize("op", CONV_OPS)
def test_depthwise_verifies_on_mobilenet_and_convnext_layers(op, precision, device, loader):
    _verify(op, network_problems(op), precision, device, loader)
