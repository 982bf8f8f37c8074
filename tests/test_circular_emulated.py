"""The circular forward's and the one-pass backward's generated CUDA run on the CPU, under the small
emulation of the CUDA execution model in tests/cuda_emulator.py (g++, one OS
thread per CUDA thread, __syncthreads a barrier, atomics emulated), each launch's 3D grid walked
block after block: every element of y, or of dx, dw and db, checked against the float64
reference within the FP32 bound, outputs and workspaces poisoned with NaN (zeroed where the plan
zeroes them). It checks the kernels' own indexing, barriers and schedule on uneven shapes without a
GPU; speed, the GPU's resource limits and real concurrency are the GPU tests' part."""
from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import get_operation
from autocnn.kernels.formulations.circular import NAME
from autocnn.kernels.formulations.circular_bwd import ATOMIC, TWO_PASS
from autocnn.kernels.problem import ConvFwdProblem
from tests.test_circular import FWD, uneven_problems
from tests.test_circular_bwd import fused
from tests.cuda_emulator import emulated_failure
from tests.formulation_checks import EMULATIONS, build_sample

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")

LIMITS = DeviceLimits.for_arch("sm_90")
CONV_BWD_FUSED = get_operation("conv_bwd_fused")
MAX_THREADS = 256      # the emulator runs an OS thread per CUDA thread: larger blocks only cost time here
def small(threads_of, configs: list) -> list:
    return [c for c in configs if threads_of(c) <= MAX_THREADS]


PROBLEMS = [*(p for _, p in uneven_problems()),
            ConvFwdProblem(N=1, C=3, H=24, W=20, K=9, R=8, S=8, stride=2, padding=3, bias=True, activation="tanh")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("circular_emulated")


@pytest.mark.parametrize("emulations", EMULATIONS)
def test_the_forward_computes_the_reference_under_emulation(emulations, cache):
    """The default of every uneven shape, and sampled configs (buffer sizes, tiles, channel groups):
    two of each shape under -m slow, a random sample of those otherwise."""
    rng = random.Random()
    seed = rng.randrange(2**31)
    defaults, sampled = [], []
    for problem in PROBLEMS:
        space = FWD.space(problem, LIMITS).restrict({"formulation": NAME})
        default = FWD.default_config(problem, LIMITS, formulation=NAME)
        configs = small(lambda c: FWD.plan(problem, c).launches[0].threads,
                        [default, *space.sample(rng, 6, exclude=[default])])[:3]
        defaults.append((problem, configs[0]))
        sampled += [(problem, c) for c in configs[1:]]
    failures, checked = [], 0
    for problem, config in defaults + build_sample(sampled, emulations):
        checked += 1
        why = emulated_failure(FWD, problem, config, cache, seed + checked)
        if why:
            failures.append(why)
    assert checked >= len(PROBLEMS) + min(len(sampled), emulations or len(sampled)) and len(sampled) >= len(PROBLEMS)
    assert not failures, f"seed {seed}: {len(failures)} of {checked} failed:\n" + "\n".join(failures[:6])


@pytest.mark.parametrize("emulations", EMULATIONS)
@pytest.mark.parametrize("combine", (ATOMIC, TWO_PASS))
def test_the_fused_backward_computes_the_reference_under_emulation(combine, emulations, cache):
    """dx, dw and db of each way of combining: its default on every uneven shape, and sampled configs,
    two of each shape under -m slow, a random sample of those otherwise."""
    rng = random.Random()
    seed = rng.randrange(2**31)
    defaults, sampled = [], []
    for problem in (fused(p) for p in PROBLEMS):
        space = CONV_BWD_FUSED.space(problem, LIMITS)
        default = space.validate({**CONV_BWD_FUSED.default_config(problem, LIMITS).as_dict(), "COMBINE": combine})
        configs = small(lambda c: CONV_BWD_FUSED.plan(problem, c).launches[0].threads,
                        [default, *space.restrict({"COMBINE": combine}).sample(rng, 6, exclude=[default])])[:3]
        defaults.append((problem, configs[0]))
        sampled += [(problem, c) for c in configs[1:]]
    failures, checked = [], 0
    for problem, config in defaults + build_sample(sampled, emulations):
        checked += 1
        why = emulated_failure(CONV_BWD_FUSED, problem, config, cache, seed + checked)
        if why:
            failures.append(why)
    no_bias = dataclasses.replace(fused(PROBLEMS[1]), bias=False)
    checked += 1
    why = emulated_failure(CONV_BWD_FUSED, no_bias, CONV_BWD_FUSED.space(no_bias, LIMITS).validate(
        {**CONV_BWD_FUSED.default_config(no_bias, LIMITS).as_dict(), "COMBINE": combine}), cache, seed)
    failures += [why] if why else []
    assert checked >= len(PROBLEMS) + 1 + min(len(sampled), emulations or len(sampled)) and len(sampled) >= len(PROBLEMS)
    assert not failures, f"seed {seed}: {len(failures)} of {checked} failed:\n" + "\n".join(failures[:6])
