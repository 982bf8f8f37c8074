"""The tc_rows formulation (conv_wgrad on tensor cores over staged rows): its space on the CPU, nvcc
builds of its defaults and sampled configs, its kernels run by the CPU emulator (mma.sync, cp.async)
against float64 in both precisions, and on the GPU (-m gpu) every element against float64."""
from __future__ import annotations

import dataclasses
import random
import shutil

import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.formulations.tc_rows import NAME, TC_ROWS, slab_geometry, smem_bytes
from autocnn.kernels.problem import PROBLEM_TYPES
from autocnn.kernels.suite import odd_problems, seed_problems
from tests.formulation_checks import (BUILD_ARCHES, EMULATIONS, assert_verifies_on_gpu, build_failures, build_sample,
                                      operations_with)

LIMITS = DeviceLimits.for_arch("sm_90")
OPERATION = operations_with(TC_ROWS)["conv_wgrad"]
PRECISIONS = ("fp32", "tf32")
# Seed rows with small images or few channels, where staging the input once per block matters.
SEED_ROWS = ("convnet18_c1", "convnet18_c2", "convnet18_c3", "kriz09", "chellapilla06_c2", "scherer10_l2")


def wgrad(**geometry):
    return PROBLEM_TYPES["conv_wgrad"](**geometry)


def small_problems() -> list[tuple[str, object]]:
    """The odd shapes, and two that need several filter tiles, several channel tiles and ragged
    8-column tiles: a 5x5 like convnet18's with 33 filters and 35 channels, and a strided 4x3
    filter with asymmetric padding and no bias."""
    return [*odd_problems("conv_wgrad"),
            ("k33_c35_5x5", wgrad(N=2, C=35, H=16, W=13, K=33, R=5, S=5, stride=(1, 1), padding=(2, 2, 2, 2))),
            ("s2_4x3", wgrad(N=2, C=6, H=21, W=19, K=18, R=4, S=3, stride=(2, 2), padding=(1, 0, 2, 1), bias=False))]


def space(problem):
    return OPERATION.space(problem, LIMITS).restrict({"formulation": NAME})


def test_the_space_needs_tensor_cores_and_keeps_within_registers_and_shared_memory():
    name, problem = odd_problems("conv_wgrad")[0]
    with pytest.raises(InfeasibleConfigError, match="sm_80 or later"):
        OPERATION.default_config(problem, DeviceLimits("sm_75"), formulation=NAME)
    c2 = dict(seed_problems("conv_wgrad"))["convnet18_c2"]
    wide = {"formulation": NAME, "KB": 32, "CB": 32, "WM": 2, "WN": 8, "ROWS": 8, "BLOCKS": 128, "PAD_X": 0, "KUNROLL": 1, "ROUNDING": "nearest", "SPLIT_X": "registers"}
    with pytest.raises(InfeasibleConfigError, match="registers a thread"):
        space(c2).validate(wide)
    # tf32 keeps no partial sums and one part of each operand: the same block fits.
    space(dataclasses.replace(c2, precision="tf32")).validate(wide)
    with pytest.raises(InfeasibleConfigError, match="16-row mma tiles"):
        space(c2).validate({**wide, "KB": 16, "WM": 2, "WN": 4, "CB": 8})
    # A slab's staging, twice, is what the launch asks for.
    config = OPERATION.default_config(c2, LIMITS, formulation=NAME)
    (launch,) = OPERATION.plan(c2, config).launches
    assert launch.shared_bytes == smem_bytes(c2, config["KB"], config["CB"], config["ROWS"], config["PAD_X"])
    q8, bandh, ldx, ldy = slab_geometry(c2, config["ROWS"], config["PAD_X"])
    assert (q8, bandh) == (16, config["ROWS"] + 4) and ldy % 8 == 4
    assert launch.grid[1:] == (-(-c2.C // config["CB"]), -(-c2.K // config["KB"]))


def test_registering_tc_rows_leaves_other_formulations_and_defaults_as_they_were():
    """Fingerprints (what shipped records are keyed by) and heuristic defaults of the weight gradient
    are the same with and without tc_rows registered (it comes last)."""
    from autocnn.kernels.conv_wgrad import ConvWgrad
    from autocnn.kernels.formulations import REGISTRY

    # After every formulation of the dense weight gradient: of those added since, only depthwise
    # serves conv_wgrad, and only problems with channel groups, which tc_rows refuses.
    assert [f.name for f in REGISTRY[REGISTRY.index(TC_ROWS) + 1:] if f.serves("conv_wgrad")] == ["depthwise"]
    before = tuple(f for f in REGISTRY if f is not TC_ROWS)
    old, new = ConvWgrad(before), ConvWgrad(REGISTRY)
    for f in old.formulations:
        assert old.fingerprint(f.names[0]) == new.fingerprint(f.names[0]), f.formulation
    for precision in PRECISIONS:
        for name, problem in seed_problems("conv_wgrad") + odd_problems("conv_wgrad"):
            problem = dataclasses.replace(problem, precision=precision)
            assert old.default_config(problem, LIMITS) == new.default_config(problem, LIMITS), name
    assert NAME in new.formulation_names and NAME not in old.formulation_names


def test_defaults_fit_every_seed_and_odd_shape_and_precision():
    for precision in PRECISIONS:
        for name, problem in [*seed_problems("conv_wgrad"), *small_problems()]:
            problem = dataclasses.replace(problem, precision=precision)
            config = OPERATION.default_config(problem, LIMITS, formulation=NAME)
            assert config["formulation"] == NAME, name


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", BUILD_ARCHES)
def test_defaults_and_samples_build_without_spills(arch, tmp_path):
    problems = {"conv_wgrad": [(f"{n} {precision}", dataclasses.replace(p, precision=precision))
                               for precision in PRECISIONS
                               for n, p in [*seed_problems("conv_wgrad"), *small_problems()]
                               if n in SEED_ROWS or n.startswith(("odd", "k33"))]}
    failures = build_failures({"conv_wgrad": OPERATION}, NAME, problems, arch, tmp_path, samples=1)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("cases", EMULATIONS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_kernels_verify_under_emulation(precision, cases, tmp_path):
    """The default and a sampled config of each small shape run by the CPU emulator (the mma.sync
    fragments, the cp.async zero-fill of the padding), every element against float64; the default
    run emulates three of these cases at random, `-m slow` all."""
    from tests.cuda_emulator import emulated_failure

    rng = random.Random()
    seed = rng.randrange(2**31)
    failures, checked, runs = [], 0, []
    for name, problem in small_problems():
        problem = dataclasses.replace(problem, precision=precision)
        default = OPERATION.default_config(problem, LIMITS, formulation=NAME)
        runs += [(name, problem, config) for config in [default, *space(problem).sample(rng, 1, exclude=[default])]]
    assert len(runs) >= len(small_problems()) * 2 - 2
    for name, problem, config in build_sample(runs, cases):
        why = emulated_failure(OPERATION, problem, config, tmp_path, seed + checked)
        checked += 1
        if why:
            failures.append(f"{name}: {why}")
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)


def _gpu_problems(precision: str):
    rows = [(n, p) for n, p in seed_problems("conv_wgrad") if n in SEED_ROWS]
    return [(f"{n} {precision}", dataclasses.replace(p, precision=precision)) for n, p in rows + small_problems()]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRECISIONS)
def test_kernels_verify_against_float64_on_the_gpu(precision):
    pytest.importorskip("cupy")
    assert_verifies_on_gpu(OPERATION, NAME, _gpu_problems(precision), 3, WORKSPACE_LIMIT_BYTES)
