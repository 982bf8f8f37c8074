"""igemm on channel groups and dilation (a GEMM per group, batched over the groups through the grid;
taps the dilation apart; conv_bwd_data's stride phases with the taps that reach them): conv_bwd_data's
tap phases against a direct enumeration; the default and sampled configs of the three operations
(conv_wgrad's atomic and two_pass) on the odd grouped shapes run by the CPU emulator
(tests/cuda_emulator.py) and verified against float64, every element, in fp32 and a 16-bit
precision; nvcc builds for sm_90 and sm_80 without spills; the space holds tiles to a group's GEMM;
and the operations' defaults (depthwise's kernels first where groups == C)."""
from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import get_operation
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.geometry import stride_phases, tap_phases, tap_steps
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem
from autocnn.kernels.suite import grouped_odd_problems
from tests.cuda_emulator import emulated_failure, emulation_failures, needs_gxx
from tests.formulation_checks import compile_failures

LIMITS = DeviceLimits.for_arch("sm_90")
CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
# The values of "formulation" that select igemm, per operation.
IGEMM = {"conv_fwd": ("igemm",), "conv_bwd_data": ("igemm",), "conv_wgrad": ("atomic", "two_pass")}
# Grouped with dilation and stride (C = 15 in 3 groups of 5, K = 9), dilation alone with stride, and
# a depthwise one with a channel multiplier: the emulated ones (the others go to the GPU tests).
EMULATED = ("odd_g3_d2_s3", "odd_d3x2_s2", "odd_dw_mult")


def _problems(op, names=EMULATED):
    return [(name, problem) for name, problem in grouped_odd_problems(op) if name in names]


def _configs(op, problem, rng, samples):
    """igemm's default, then ``samples`` sampled configs of each value of "formulation" selecting it."""
    operation = get_operation(op)
    configs = [operation.default_config(problem, LIMITS, formulation="igemm")]
    for value in IGEMM[op]:
        space = operation.space(problem, LIMITS).restrict({"formulation": value})
        configs += space.sample(rng, samples, exclude=configs)
    return configs


def test_tap_phases_hold_exactly_the_taps_that_reach_each_output():
    checked = 0
    for sh, dh, r, h, pt in itertools.product((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 5), (7, 12), (0, 1, 2)):
        try:
            p = ConvBwdDataProblem(N=1, C=1, H=h, W=4, K=1, R=r, S=1, stride=(sh, 1), padding=(pt, 0, 1, 0),
                                   dilation=(dh, 1))
        except Exception:   # a padding or filter the geometry refuses
            continue
        steps = tap_steps(p)
        covered = 0
        for ph in tap_phases(p):
            for i in range(ph.Ha):
                row = ph.a - pt + sh * (ph.ilo + i)
                want = sorted((q, t) for t in range(r) for q in range(p.P) if q * sh - pt + t * dh == row)
                got = sorted((ph.ilo + i - (ph.e0 + steps.pstep * j), ph.r0 + steps.rstep * j) for j in range(ph.Ra))
                assert want == [(q, t) for q, t in got if 0 <= q < p.P], (p.shape_string(), ph, i)
                covered += 1
        assert covered == h   # every input row is in one phase
        if dh == 1:   # undilated: the plain stride phases
            assert [(x.a, x.b, x.Ha, x.Wb, x.ilo, x.jlo, x.Ra, x.Sb) for x in tap_phases(p)] == \
                   [(x.a, x.b, x.Ha, x.Wb, x.ilo, x.jlo, x.Ra, x.Sb) for x in stride_phases(p)]
        checked += 1
    assert checked > 100


@needs_gxx
@pytest.mark.parametrize("op", CONV_OPS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_default_and_sampled_configs_verify_under_emulation(op, precision, tmp_path):
    operation = get_operation(op)
    seed = random.randrange(2**31)
    problems = [(name, dataclasses.replace(problem, precision=precision)) for name, problem in _problems(op)]
    failures, checked = emulation_failures(operation, problems, lambda problem, rng: _configs(op, problem, rng, 1),
                                           tmp_path, seed)
    assert checked >= 2 * len(EMULATED)
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)


@needs_gxx
def test_an_fp16_grouped_weight_gradient_split_over_blocks_verifies_under_emulation(tmp_path):
    """Split sums of a 16-bit gradient meet in the FP32 workspace (two_pass), per group."""
    operation = get_operation("conv_wgrad")
    (_, problem), = _problems("conv_wgrad", ("odd_g3_d2_s3",))
    problem = dataclasses.replace(problem, precision="fp16")
    space = operation.space(problem, LIMITS).restrict({"formulation": "two_pass", "SPLITK": 4})
    (config,) = space.sample(random.Random(5), 1)
    assert emulated_failure(operation, problem, config, tmp_path, 9) is None


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch, samples", [("sm_90", 1), ("sm_80", 0)])
def test_defaults_build_without_spills_and_sampled_configs_build(arch, samples, tmp_path):
    """Defaults without spills; sampled configs build (one that spills, as some dense ones do at 128
    registers, is skipped by the tuner on its ptxas report, never handed out)."""
    rng = random.Random(17)
    jobs = []
    for op in CONV_OPS:
        operation = get_operation(op)
        for name, problem in _problems(op, ("odd_g3_d2_s3", "odd_d3x2_s2")[:1 + samples]):
            for precision in ("fp32", "fp16"):
                problem = dataclasses.replace(problem, precision=precision)
                default = operation.default_config(problem, LIMITS, formulation="igemm")
                space = operation.space(problem, LIMITS).restrict({"formulation": IGEMM[op][-1]})
                jobs += [(f"{op} {name} {precision} {c}", operation.plan(problem, c), c is default)
                         for c in [default, *space.sample(rng, samples, exclude=[default])]]
    failures = compile_failures(jobs, arch, tmp_path)
    assert not failures, "\n".join(failures[:10])


def test_tiles_are_held_to_a_groups_gemm():
    grouped = ConvFwdProblem(N=2, C=64, H=9, W=9, K=64, R=3, S=3, padding=1, groups=16)   # 4 filters a group
    operation = get_operation("conv_fwd")
    space = operation.space(grouped, LIMITS)
    default = operation.default_config(grouped, LIMITS, formulation="igemm")
    # A group's GEMM has 4 columns (filters) and a reduction of 4*3*3 = 36 terms.
    assert default["BN"] == 16
    with pytest.raises((InfeasibleConfigError, InvalidConfigError), match="BN"):
        space.validate({**default.as_dict(), "BN": 64, "TN": 4})
    plan = operation.plan(grouped, default)
    (launch,) = plan.launches
    assert launch.grid[1:] == (1, 16)   # one filter tile a group, the groups along z
    wgrad = get_operation("conv_wgrad")
    problem = grouped.with_op("conv_wgrad")
    config = wgrad.space(problem, LIMITS).restrict({"formulation": "two_pass", "SPLITK": 2}).sample(random.Random(1), 1)[0]
    plan = wgrad.plan(problem, config)
    # The workspace holds every group's split sums: K x C/groups x R x S weights (and K biases) a split.
    assert plan.workspace_bytes == 4 * 2 * (64 * 4 * 9 + 64)
    assert plan.launches[0].grid[0] == 16 * -(-4 // config["BM"])


def test_igemm_serves_grouped_and_dilated_problems_and_depthwise_keeps_its_default():
    dense = ConvFwdProblem(N=2, C=12, H=9, W=9, K=12, R=3, S=3, padding=1)
    for op in CONV_OPS:
        operation = get_operation(op)
        for problem in (dataclasses.replace(dense, groups=4), dataclasses.replace(dense, dilation=2, padding=2)):
            problem = problem.with_op(op)
            assert not set(IGEMM[op]) & set(operation.refusals(problem, LIMITS))
            assert operation.default_config(problem, LIMITS)["formulation"] in IGEMM[op]
        depthwise = dataclasses.replace(dense, groups=12).with_op(op)
        assert operation.default_config(depthwise, LIMITS)["formulation"] == "depthwise"
