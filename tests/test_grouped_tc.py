"""tc on channel groups and dilation (a GEMM per group on mma.sync; groups of at least one k-step of
channels: 8 for the TF32 mmas, 16 for the 16-bit ones), for the three convolutions: its default
and sampled configs on the odd grouped shapes it serves, run by the CPU emulator (which translates
the mma.sync PTX) and verified against float64, every element; nvcc builds for sm_90 and sm_80
without spills; and what it refuses, with the reason."""
from __future__ import annotations

import dataclasses
import random

import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import get_operation
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem
from autocnn.kernels.suite import grouped_odd_problems
from tests.cuda_emulator import emulated_failure, emulation_failures, needs_gxx
from tests.formulation_checks import compile_failures

LIMITS = DeviceLimits.for_arch("sm_90")
# 48 channels in 3 groups of 16 (dilated along w), and dilation alone with stride.
SHAPES = ("odd_g3_c16", "odd_d3x2_s2")


CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")


def _problems(precision, op="conv_fwd"):
    return [(name, dataclasses.replace(p, precision=precision)) for name, p in grouped_odd_problems(op)
            if name in SHAPES]


def _configs(problem, rng, samples, fixed=None):
    operation = get_operation(problem.op)
    default = operation.default_config(problem, LIMITS, formulation="tc")
    space = operation.space(problem, LIMITS).restrict({"formulation": "tc", **(fixed or {})})
    return [default, *space.sample(rng, samples, exclude=[default])]


@needs_gxx
@pytest.mark.parametrize("op", CONV_OPS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_default_and_sampled_configs_verify_under_emulation(op, precision, tmp_path):
    operation = get_operation(op)
    seed = random.randrange(2**31)
    failures, checked = emulation_failures(operation, _problems(precision, op),
                                           lambda problem, rng: _configs(problem, rng, 1), tmp_path, seed)
    assert checked == 2 * len(SHAPES)
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)


@needs_gxx
def test_a_grouped_fp16_weight_gradient_split_through_the_workspace_verifies_under_emulation(tmp_path):
    operation = get_operation("conv_wgrad")
    problem = dict(_problems("fp16", "conv_wgrad"))["odd_g3_c16"]
    space = operation.space(problem, LIMITS).restrict({"formulation": "tc", "TWO_PASS": 1, "SPLITK": 2})
    (config,) = space.sample(random.Random(6), 1)
    assert emulated_failure(operation, problem, config, tmp_path, 8) is None


@needs_gxx
def test_a_tf32_dilated_layer_staged_as_nhwc_verifies_under_emulation(tmp_path):
    operation = get_operation("conv_fwd")
    problem = dict(_problems("tf32"))["odd_d3x2_s2"]
    (config,) = operation.space(problem, LIMITS).restrict({"formulation": "tc", "NHWC": 1}).sample(random.Random(3), 1)
    assert emulated_failure(operation, problem, config, tmp_path, 4) is None


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_defaults_build_without_spills_and_sampled_configs_build(arch, tmp_path):
    rng = random.Random(23)
    jobs = []
    for op in CONV_OPS:
        for precision in ("fp32", "fp16"):
            for name, problem in _problems(precision, op)[:1 if arch == "sm_80" else None]:
                configs = _configs(problem, rng, 1 if arch == "sm_90" else 0)
                jobs += [(f"{op} {name} {precision} {c}", get_operation(op).plan(problem, c), i == 0)
                         for i, c in enumerate(configs)]
    failures = compile_failures(jobs, arch, tmp_path)
    assert not failures, "\n".join(failures[:10])


def test_tc_refuses_small_groups_and_grouped_nhwc_and_serves_the_rest():
    operation = get_operation("conv_fwd")
    small = ConvFwdProblem(N=2, C=32, H=9, W=9, K=32, R=3, S=3, padding=1, groups=4, precision="bf16")  # 8 a group
    why = operation.refusals(small, LIMITS)["tc"]
    assert why.startswith("tc computes grouped convolutions of at least 16 channels a group, one k-step of its bf16")
    assert "gives 8; igemm serves it" in why
    assert "tc" not in operation.refusals(dataclasses.replace(small, precision="tf32"), LIMITS)   # 8 for TF32
    grouped = dataclasses.replace(small, groups=2)
    assert not operation.space(grouped, LIMITS).restrict({"formulation": "tc", "NHWC": 1}).sample(random.Random(1), 1)
    dilated = ConvBwdDataProblem(N=2, C=32, H=9, W=9, K=32, R=3, S=3, padding=2, dilation=2)
    assert "tc" not in get_operation("conv_bwd_data").refusals(dilated, LIMITS)
    wgrad = get_operation("conv_wgrad")
    small_wgrad = small.with_op("conv_wgrad")
    assert wgrad.refusals(small_wgrad, LIMITS)["tc"].startswith("tc computes grouped convolutions of at least 16")
    # Two groups of 16 channels: their weight gradients are blocks along x, every group's splits in
    # the workspace.
    grouped_wgrad = grouped.with_op("conv_wgrad")
    config = wgrad.space(grouped_wgrad, LIMITS).restrict({"formulation": "tc", "TWO_PASS": 1, "SPLITK": 2}).sample(
        random.Random(2), 1)[0]
    plan = wgrad.plan(grouped_wgrad, config)
    assert plan.launches[0].grid[0] == 2 * -(-16 // config["BM"])
    assert plan.workspace_bytes == 4 * 2 * (32 * 16 * 9 + 32)
    # A 16-bit grouped layer's default runs on the tensor cores, its groups along z.
    default = operation.default_config(grouped, LIMITS)
    assert default["formulation"] == "tc"
    assert operation.plan(grouped, default).launches[-1].grid[2] == 2
