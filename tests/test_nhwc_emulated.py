"""The NHWC kernels (window_gather, depthwise, direct) on channels-last shapes that divide nothing
evenly (kernels.suite.NHWC_ODD_SHAPES: C=5 and K=7 beside whole vector runs, stride 2, asymmetric
padding, batch 3, depthwise 7x7 at dilation 2 and with a channel multiplier): each formulation's
default and sampled configs of each operation it serves, in every precision, run by the CPU
emulator (tests/cuda_emulator.py) and verified against the float64 reference, every element; the
defaults (and a sampled fp32 config each) compiled by nvcc for sm_90 without errors or spills."""
from __future__ import annotations

import dataclasses
import os
import random
import shutil

import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import get_operation
from autocnn.kernels.compiler import NvccCompiler, nvcc_path
from autocnn.kernels.suite import nhwc_odd_problems
from tests.cuda_emulator import emulated_failure

LIMITS = DeviceLimits.for_arch("sm_90")
# Every formulation that serves NHWC, with the operations it serves.
NHWC_FORMULATIONS = (
    ("window_gather", "avgpool_fwd"), ("window_gather", "avgpool_bwd"),
    ("direct", "conv_fwd"), ("direct", "conv_bwd_data"),
    ("depthwise", "conv_fwd"), ("depthwise", "conv_bwd_data"), ("depthwise", "conv_wgrad"),
)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# tf32 renders these SIMT kernels as fp32 does (FP32 products): emulated once, in fp32.
EMULATED_PRECISIONS = ("fp32", "bf16", "fp16")
# Sampled configs per problem beside the default (each emulation runs a thread per CUDA thread on
# the host; AUTOCNN_EMULATED_SAMPLES asks for more).
SAMPLED = int(os.environ.get("AUTOCNN_EMULATED_SAMPLES", "1"))
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")


def served(formulation: str, op: str, precision: str):
    """The NHWC odd problems of ``op`` at ``precision`` that ``formulation`` serves."""
    operation = get_operation(op)
    out = []
    for name, problem in nhwc_odd_problems(op):
        problem = dataclasses.replace(problem, precision="fp32" if precision == "tf32" and op.startswith("avgpool")
                                      else precision)
        if formulation not in operation.refusals(problem, LIMITS):
            out.append((name, problem))
    return out


def test_every_formulation_that_serves_nhwc_is_tested_here():
    from autocnn.kernels import OPERATIONS

    serving = set()
    for op, operation in OPERATIONS.items():
        for f in operation.formulations:
            for _name, problem in nhwc_odd_problems(op):
                if f.layout_refusal(problem) is None:
                    serving.add((f.formulation, op))
    assert serving == set(NHWC_FORMULATIONS)


@pytest.mark.parametrize("formulation,op", NHWC_FORMULATIONS)
def test_it_serves_some_odd_nhwc_shape_in_every_precision(formulation, op):
    for precision in PRECISIONS:
        assert served(formulation, op, precision), f"{formulation} serves no NHWC {op} shape in {precision}"


@needs_gxx
@pytest.mark.parametrize("precision", EMULATED_PRECISIONS)
@pytest.mark.parametrize("formulation,op", NHWC_FORMULATIONS)
def test_default_and_sampled_configs_verify_under_emulation(formulation, op, precision, tmp_path):
    operation = get_operation(op)
    seed = random.randrange(2**31)
    failures, checked = [], 0
    for name, problem in served(formulation, op, precision):
        space = operation.space(problem, LIMITS)
        if "formulation" in {p.name for p in space.params}:
            space = space.restrict({"formulation": formulation})
        default = operation.default_config(problem, LIMITS, formulation=formulation)
        # Sampled configs where the emulation stays quick: fp32 and bf16 (the others share their code
        # paths but for the element type).
        sampled = space.sample(random.Random(seed + checked), SAMPLED, exclude=[default]) if precision in ("fp32", "bf16") else []
        for config in [default, *sampled]:
            why = emulated_failure(operation, problem, config, tmp_path, seed + checked)
            checked += 1
            if why is not None:
                failures.append(f"{name}: {why}")
    assert checked, f"{formulation} serves no NHWC {op} problem in {precision}"
    assert not failures, f"seed {seed}:\n" + "\n".join(failures[:5])


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("formulation,op", NHWC_FORMULATIONS)
def test_defaults_compile_for_sm90_without_spills(formulation, op, tmp_path):
    operation = get_operation(op)
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    failures = []
    rng = random.Random(17)
    for precision in ("fp32", "bf16", "fp16"):
        for name, problem in served(formulation, op, precision):
            default = operation.default_config(problem, LIMITS, formulation=formulation)
            space = operation.space(problem, LIMITS)
            if "formulation" in {p.name for p in space.params}:
                space = space.restrict({"formulation": formulation})
            # A sampled config beside each fp32 default: the parameters' other code paths build too.
            sampled = space.sample(rng, 1, exclude=[default]) if precision == "fp32" else []
            for config in [default, *sampled]:
                plan = operation.plan(problem, config)
                module = compiler.compile(plan.source, config=config)
                missing = set(plan.kernel_names) - set(module.reports)
                spills = [str(r) for r in module.reports.values() if r.spills]
                if missing or spills:
                    failures.append(f"{name} {precision} {config}: missing {missing}, spills {spills}")
    assert not failures, "\n".join(failures[:10])
