"""The separable kernels' generated CUDA run on the CPU under tests/cuda_emulator.py (g++, one OS
thread per CUDA thread, blocks one after another, __syncthreads a barrier, warp shuffles and atomics
emulated), launched step by step as the plan says, and every output element checked against the
float64 reference within the FP32 bound. Outputs and workspaces start as NaN, so an
element a kernel never wrote fails. This checks the kernels' indexing, tiling, halos, partial
tiles, splits and workspaces without a GPU; it says nothing of speed, of the GPU's rounding
(fmaf is fmaf here too) or of resource limits (tests/test_sep_conv.py's nvcc builds do that)."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import get_operation

import autocnn.kernels.sep_conv as sep
from tests.cuda_emulator import emulated_failure
from tests.formulation_checks import EMULATIONS, build_sample

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")

LIMITS = DeviceLimits.for_arch("sm_90")
OPERATIONS = {op: get_operation(op) for op in sep.SEP_OPS}

def check(op: str, problem, config, cache: Path, seed: int) -> str | None:
    return emulated_failure(OPERATIONS[op], problem, config, cache, seed)


# Small shapes that divide no tile: batch 1 and 3, odd maps, asymmetric padding, non-square filters,
# ranks up to 3, a filter as large as the padded map.
SHAPES = (
    dict(N=2, C=3, H=7, W=9, K=5, R=3, S=3, padding=1, rank=1),
    dict(N=3, C=5, H=6, W=11, K=3, R=3, S=5, padding=(1, 2, 0, 1), rank=2),
    dict(N=1, C=2, H=9, W=5, K=4, R=5, S=2, padding=(2, 0, 1, 1), rank=2),
    dict(N=2, C=1, H=5, W=6, K=2, R=4, S=4, padding=(3, 2, 0, 1), rank=3),
)


def problems(op: str) -> list:
    cls = sep.PROBLEM_TYPES[op]
    out = [cls(**geo) for geo in SHAPES]
    if op == "sep_conv_fwd":
        out.append(cls(**SHAPES[1], bias=True, activation="tanh"))
    if op == "sep_conv_wgrad":
        out.append(cls(**SHAPES[0] | {"bias": False}))
    return out


def formulation_configs(op: str, problem, name: str | None, rng: random.Random, samples: int) -> list:
    operation = OPERATIONS[op]
    space = operation.space(problem, LIMITS)
    if name is not None:
        space = space.restrict({"formulation": name})
        defaults = list(operation.default_configs(problem, LIMITS, formulation=name))
    else:
        defaults = list(operation.default_configs(problem, LIMITS))
    picked = [defaults[0], defaults[-1]] if len(defaults) > 1 else defaults
    return picked + space.sample(rng, samples, exclude=picked)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sep_emulated")


@pytest.mark.parametrize("op,name", [("sep_conv_fwd", "sep_register"), ("sep_conv_fwd", "sep_onepass"),
                                     ("sep_conv_fwd", "sep_twopass"), ("sep_conv_bwd_data", "sep_register"),
                                     ("sep_conv_bwd_data", "sep_onepass"), ("sep_conv_bwd_data", "sep_twopass"),
                                     ("sep_conv_wgrad", None)])
@pytest.mark.parametrize("emulations", EMULATIONS)
def test_kernels_compute_the_reference_under_emulation(op, name, emulations, cache):
    """The first default candidate of each formulation on every small odd shape, and its last default
    candidate and a sampled config on each (all of those under -m slow, a fresh random sample of
    them otherwise), run in the emulator: every element within the FP32 bound of float64."""
    rng = random.Random()
    seed = rng.randrange(2**31)
    firsts, others = [], []
    for problem in problems(op):
        first, *rest = formulation_configs(op, problem, name, rng, samples=1)
        firsts.append((problem, first))
        others += [(problem, config) for config in rest]
    failures, checked = [], 0
    for problem, config in firsts + build_sample(others, emulations):
        checked += 1
        why = check(op, problem, config, cache, seed + checked)
        if why:
            failures.append(why)
    assert len(others) >= 2 * len(problems(op)) and checked >= len(problems(op)) + min(len(others), emulations or 0)
    assert not failures, f"seed {seed}: {len(failures)} of {checked} failed:\n" + "\n".join(failures[:6])


def test_splits_and_their_combines_under_emulation(cache):
    """sep_tiles's reduction split over several blocks, combined by atomics and in a fixed order,
    with the rows of a tile split over lanes."""
    op = "sep_conv_wgrad"
    problem = sep.PROBLEM_TYPES[op](**SHAPES[1])
    space = OPERATIONS[op].space(problem, LIMITS)
    base = {"KB": 2, "CB": 4, "TP": 4, "TQ": 4, "RSPLIT": 2, "PAD": 1, "UNROLL_ROWS": 2}
    failures = [check(op, problem, space.validate({**base, "SPLIT": s, "COMBINE": comb}), cache, s)
                for s, comb in ((1, "atomic"), (4, "atomic"), (2, "ordered"), (8, "ordered"))]
    assert not [f for f in failures if f], failures


def test_twopass_blocks_of_images_under_emulation(cache):
    """Two-pass plans with one, two and all three images per pair of launches: the workspace is
    reused by each block of images, the last block partial."""
    op = "sep_conv_bwd_data"
    problem = sep.PROBLEM_TYPES[op](**SHAPES[1])
    space = OPERATIONS[op].space(problem, LIMITS).restrict({"formulation": "sep_twopass"})
    default = OPERATIONS[op].default_config(problem, LIMITS, formulation="sep_twopass").as_dict()
    failures = []
    for nb in (1, 2, 4):
        config = space.validate({**default, "NB": nb})
        plan = OPERATIONS[op].plan(problem, config)
        assert len(plan.steps) == 2 * -(-problem.N // min(nb, problem.N))
        failures.append(check(op, problem, config, cache, nb))
    assert not [f for f in failures if f], failures
