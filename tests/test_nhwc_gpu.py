"""The NHWC kernels on the GPU (run on a GPU host: pytest -m gpu): every formulation that serves NHWC
(window_gather, direct, depthwise) x each operation it serves x every precision, its default and
sampled configs on the suite's channels-last odd shapes (C=5 and K=7 beside whole vector runs,
stride 2, asymmetric padding, batch 3, depthwise 7x7 at dilation 2 and with a channel multiplier)
and on channels-last network layers, loaded through NVRTC as the library loads kernels and verified
against the float64 reference on fresh random data, every element, at the precision's bound."""
from __future__ import annotations

import dataclasses
import os
import random

import pytest

from autocnn.kernels import get_operation
from autocnn.kernels.problem import PROBLEM_TYPES
from autocnn.kernels.suite import nhwc_odd_problems

pytestmark = pytest.mark.gpu

SAMPLES = int(os.environ.get("AUTOCNN_GPU_SAMPLES", "3"))
SEED = int(os.environ.get("AUTOCNN_GPU_SEED", random.randrange(2**31)))
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
NHWC_FORMULATIONS = (
    ("window_gather", "avgpool_fwd"), ("window_gather", "avgpool_bwd"),
    ("direct", "conv_fwd"), ("direct", "conv_bwd_data"),
    ("depthwise", "conv_fwd"), ("depthwise", "conv_bwd_data"), ("depthwise", "conv_wgrad"),
)


def network_problems(op: str) -> list[tuple[str, object]]:
    """Channels-last layers of today's networks, batch 4: a ResNet 3x3 and a strided 1x1, a
    MobileNet depthwise 3x3 and a ConvNeXt depthwise 7x7, and a 3x3 stride-2 pooling."""
    if op.startswith("avgpool"):
        return [("pool_64_56", PROBLEM_TYPES[op](N=4, C=64, H=56, W=56, window=3, stride=2, padding=1,
                                                 layout="nhwc"))]
    conv = PROBLEM_TYPES[op]
    return [
        ("resnet_64_56_3x3", conv(N=4, C=64, H=56, W=56, K=64, R=3, S=3, padding=1, layout="nhwc")),
        ("resnet_256_28_1x1_s2", conv(N=4, C=256, H=28, W=28, K=128, R=1, S=1, stride=2, layout="nhwc")),
        ("mobilenet_144_56_dw", conv(N=4, C=144, H=56, W=56, K=144, R=3, S=3, padding=1, groups=144, layout="nhwc")),
        ("convnext_96_56_dw", conv(N=4, C=96, H=56, W=56, K=96, R=7, S=7, padding=3, groups=96, layout="nhwc")),
    ]


def _at(problem, precision):
    # Pooling forms no products: tf32 is fp32 there.
    return dataclasses.replace(problem, precision="fp32" if precision == "tf32" and problem.op.startswith("avgpool")
                               else precision)


def _verify(formulation, op, shapes, precision, device, loader, samples):
    from autocnn.measurement.measure import check_candidate

    operation = get_operation(op)
    limits = device.limits()
    rng = random.Random(f"{SEED}:{formulation}:{op}:{precision}")
    checked, failures = 0, []
    for name, problem in shapes:
        problem = _at(problem, precision)
        if formulation in operation.refusals(problem, limits):
            continue
        default = operation.default_config(problem, limits, formulation=formulation)
        space = operation.space(problem, limits)
        if "formulation" in {p.name for p in space.params}:
            space = space.restrict({"formulation": formulation})
        for config in [default, *space.sample(rng, samples, exclude=[default])]:
            check = check_candidate(loader.load(operation.plan(problem, config)), problem, seed=SEED + checked,
                                    time_it=False)
            checked += 1
            if not check.verification.passed:
                failures.append(f"{name} {config}: {check.verification.message}")
    assert checked, f"{formulation} served no NHWC {op} shape in {precision}"
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures[:8])


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("formulation,op", NHWC_FORMULATIONS)
def test_nhwc_kernels_verify_on_the_odd_nhwc_shapes(formulation, op, precision, device, loader):
    _verify(formulation, op, nhwc_odd_problems(op), precision, device, loader, SAMPLES)


@pytest.mark.parametrize("precision", ("fp32", "bf16"))
@pytest.mark.parametrize("formulation,op", NHWC_FORMULATIONS)
def test_nhwc_kernels_verify_on_network_layers(formulation, op, precision, device, loader):
    _verify(formulation, op, network_problems(op), precision, device, loader, 1)


@pytest.mark.parametrize("op", ("conv_fwd", "avgpool_fwd"))
def test_a_nan_in_an_nhwc_input_reaches_the_outputs_it_touches(op, device, loader):
    """A NaN planted in x reaches every output whose window holds it, and no other."""
    import numpy as np

    from autocnn.kernels import reference
    from autocnn.measurement.measure import output_buffers, random_inputs, tensor_values

    import cupy as cp

    operation = get_operation(op)
    problem = nhwc_odd_problems(op)[0][1]
    loaded = loader.load(operation.plan(problem, operation.default_config(problem, device.limits())))
    inputs = random_inputs(problem, np, seed=SEED)
    inputs["x"][1, 4, 4, 2] = np.nan   # image 1, row 4, column 4, channel 2 (NHWC)
    outputs = output_buffers(problem, cp)
    workspaces = loaded.workspaces()
    for buffer in workspaces.values():
        buffer.fill(cp.nan)
    loaded({**{k: cp.asarray(v) for k, v in inputs.items()}, **outputs, **workspaces})
    cp.cuda.get_current_stream().synchronize()
    got = tensor_values(problem, "y", cp.asnumpy(outputs["y"]))
    want = reference.run_problem(problem, {k: v.astype(np.float64) for k, v in inputs.items()})["y"]
    assert np.isnan(want).any() and not np.isnan(want).all()
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_the_cudnn_baseline_runs_nhwc_problems_on_channels_last_tensors(device, monkeypatch):
    """autocnn bench --layout nhwc compares with cuDNN in the same layout: its tensors channels_last."""
    from autocnn.benchmark.baselines import time_baseline, torch_available

    if not torch_available():
        pytest.skip("PyTorch with CUDA is not installed")
    import torch

    seen = []
    conv2d = torch.nn.functional.conv2d

    def recording(x, w, *args, **kwargs):
        seen.append(x.is_contiguous(memory_format=torch.channels_last) and w.is_contiguous(
            memory_format=torch.channels_last) and x.dim() == 4 and not x.is_contiguous())
        return conv2d(x, w, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "conv2d", recording)
    for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad", "avgpool_fwd", "avgpool_bwd"):
        problem = network_problems(op)[0][1]
        timed = time_baseline(op, problem, budget_s=0.05)
        assert timed.us is not None and timed.us > 0, f"{op}: {timed.reason}"
    assert seen and all(seen)
