"""The winograd_fused formulation (Winograd F(2x2) transforms and tensor-core products in one
kernel, conv_fwd and conv_bwd_data at 3x3 stride 1): its space on the CPU, nvcc builds of its defaults
and sampled configs, its kernels run by the CPU emulator (mma.sync, cp.async) against float64 in both
precisions, and on the GPU (-m gpu) every element against float64."""
from __future__ import annotations

import dataclasses
import random
import shutil

import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.formulations.cores.winograd_transforms import view
from autocnn.kernels.formulations.winograd_fused import (NAME, WINOGRAD_FUSED, all_tiles, padded, registers_needed,
                                                         smem_bytes, u_elements)
from autocnn.kernels.geometry import next_pow2
from autocnn.kernels.problem import PROBLEM_TYPES
from autocnn.kernels.suite import seed_problems
from tests.formulation_checks import BUILD_ARCHES, assert_verifies_on_gpu, build_failures, operations_with

LIMITS = DeviceLimits.for_arch("sm_90")
OPERATIONS = operations_with(WINOGRAD_FUSED)
OPS = ("conv_fwd", "conv_bwd_data")
PRECISIONS = ("fp32", "tf32")
SEED_ROWS = ("sweep_3x3", "modern_56", "modern_14")


def small_problems(op: str) -> list[tuple[str, object]]:
    """3x3 stride-1 shapes that divide nothing evenly: channels not a multiple of 8, odd filters,
    images not whole 2x2 or 4x4 tiles, asymmetric padding, one image, several blocks of channels."""
    cls = PROBLEM_TYPES[op]
    fwd = op == "conv_fwd"
    return [("c13_k19", cls(N=3, C=13, H=9, W=11, K=19, R=3, S=3, stride=(1, 1), padding=(1, 1, 1, 1),
                            **({"bias": True, "activation": "relu"} if fwd else {}))),
            ("n1_asym", cls(N=1, C=5, H=7, W=13, K=7, R=3, S=3, stride=(1, 1), padding=(0, 2, 1, 0),
                            **({"bias": False} if fwd else {}))),
            ("c20_k33", cls(N=2, C=20, H=6, W=5, K=33, R=3, S=3, stride=(1, 1), padding=(2, 0, 0, 1)))]


def seed_rows(op: str) -> list[tuple[str, object]]:
    return [(n, p) for n, p in seed_problems(op) if n in SEED_ROWS]


def space(op: str, problem):
    return OPERATIONS[op].space(problem, LIMITS).restrict({"formulation": NAME})


def test_the_space_serves_3x3_stride_1_on_tensor_cores_within_registers_and_shared_memory():
    op = "conv_fwd"
    operation = OPERATIONS[op]
    modern = dict(seed_problems(op))["modern_56"]
    with pytest.raises(InfeasibleConfigError, match="sm_80 or later"):
        operation.default_config(modern, DeviceLimits("sm_75"), formulation=NAME)
    with pytest.raises(InfeasibleConfigError, match="3x3 stride-1"):
        operation.default_config(dict(seed_problems(op))["sweep_7x7"], LIMITS, formulation=NAME)
    big = {"formulation": NAME, "WF_TB": 64, "WF_MT": 1, "WF_WARPS": 4, "WF_CROSS": 0, "WF_ACCUM": "fresh"}
    with pytest.raises(InfeasibleConfigError, match="registers a thread"):
        space(op, modern).validate(big)
    assert registers_needed(modern, 2, 64, 1, 4) > 255
    # 64 output channels a block: each input tile transformed once.
    assert operation.default_config(modern, LIMITS, formulation=NAME)["WF_MT"] == 4
    # 16 points a block of 8 warps' filters and tiles, both stages: what the launch asks for.
    config = operation.default_config(modern, LIMITS, formulation=NAME)
    filt, main = operation.plan(modern, config).launches
    assert main.shared_bytes == smem_bytes(modern, 2, config["WF_TB"], config["WF_MT"], config["WF_WARPS"])
    coutp, cinp = padded(view(modern), config["WF_MT"])
    assert (coutp, cinp) == (64, 64) and filt.grid[0] * filt.block[0] >= coutp * cinp
    assert main.grid[:2] == (coutp // (16 * config["WF_MT"]), -(-all_tiles(view(modern), 2) // config["WF_TB"]))
    assert main.block[0] == 32 * config["WF_WARPS"]
    # The filters' transform is the only workspace: both TF32 parts in fp32, one in tf32.
    assert operation.workspace_bytes(modern, config) == 4 * u_elements(modern, 2, config["WF_MT"])
    tf32 = dataclasses.replace(modern, precision="tf32")
    assert u_elements(tf32, 2, 1) * 2 == u_elements(modern, 2, 1) == 2 * 16 * 64 * 64
    # conv_bwd_data reads dY as its input: the transposed view (K in, C out).
    bwd = dict(seed_problems("conv_bwd_data"))["modern_14"]
    assert padded(view(bwd), 1) == (256, 256)


@pytest.mark.parametrize("op", OPS)
def test_registering_winograd_fused_leaves_other_formulations_and_defaults_as_they_were(op):
    """Fingerprints (what shipped records are keyed by) and heuristic defaults of the operations it
    serves are the same with and without it registered (it comes last)."""
    from autocnn.kernels.conv_bwd_data import ConvBwdData
    from autocnn.kernels.conv_fwd import ConvFwd
    from autocnn.kernels.formulations import REGISTRY

    assert WINOGRAD_FUSED in REGISTRY
    cls = {"conv_fwd": ConvFwd, "conv_bwd_data": ConvBwdData}[op]
    old = cls(tuple(f for f in REGISTRY if f is not WINOGRAD_FUSED))
    new = cls(REGISTRY)
    for f in old.formulations:
        assert old.fingerprint(f.names[0]) == new.fingerprint(f.names[0]), f.formulation
    for precision in PRECISIONS:
        for name, problem in seed_problems(op) + small_problems(op):
            problem = dataclasses.replace(problem, precision=precision)
            assert old.default_config(problem, LIMITS) == new.default_config(problem, LIMITS), name
    assert NAME in new.formulation_names and NAME not in old.formulation_names


@pytest.mark.parametrize("op", OPS)
def test_defaults_fit_every_3x3_seed_and_small_shape_and_precision(op):
    for precision in PRECISIONS:
        for name, problem in seed_rows(op) + small_problems(op):
            problem = dataclasses.replace(problem, precision=precision)
            config = OPERATIONS[op].default_config(problem, LIMITS, formulation=NAME)
            # As many output channels a block as the layer has, up to 64.
            assert config["formulation"] == NAME, name
            assert config["WF_MT"] == min(4, next_pow2(-(-view(problem).COUT // 16))), name
            assert OPERATIONS[op].workspace_bytes(problem, config) <= WORKSPACE_LIMIT_BYTES, name


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", BUILD_ARCHES)
def test_defaults_and_samples_build_without_spills(arch, tmp_path):
    problems = {op: [(f"{n} {precision}", dataclasses.replace(p, precision=precision))
                     for precision in PRECISIONS for n, p in seed_rows(op) + small_problems(op)[:1]]
                for op in OPS}
    failures = build_failures(OPERATIONS, NAME, problems, arch, tmp_path, samples=1)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", OPS)
def test_kernels_verify_under_emulation(op, precision, tmp_path):
    """The default and a sampled config of each small shape run by the CPU emulator (the mma.sync
    fragments, the cp.async staging, the transforms), every element against float64."""
    from tests.cuda_emulator import emulated_failure

    rng = random.Random()
    seed = rng.randrange(2**31)
    failures, checked = [], 0
    for name, problem in small_problems(op):
        problem = dataclasses.replace(problem, precision=precision)
        default = OPERATIONS[op].default_config(problem, LIMITS, formulation=NAME)
        for config in [default, *space(op, problem).sample(rng, 1, exclude=[default])]:
            why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, seed + checked)
            checked += 1
            if why:
                failures.append(f"{name}: {why}")
    assert checked == 2 * len(small_problems(op))
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
def test_blocks_of_output_channels_verify_in_fp32_under_emulation(tmp_path):
    """Several blocks of output channels (MT 1: 33 forward, 20 backward, the filters' fragment-ordered
    layout read at block offsets) and one block padded with zeros (the largest MT), both ops, fp32,
    every element."""
    from tests.cuda_emulator import emulated_failure

    failures = []
    for op in OPS:
        name, problem = small_problems(op)[2]
        for mt in (1, max(space(op, problem).param("WF_MT").choices)):
            config = space(op, problem).validate({"formulation": NAME, "WF_TB": 32, "WF_MT": mt, "WF_WARPS": 8,
                                                  "WF_CROSS": 0, "WF_ACCUM": "fresh"})
            why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, 17 + mt)
            if why:
                failures.append(f"{op} {name} MT {mt}: {why}")
    assert not failures, "\n".join(failures)


def test_cross_products_are_an_fp32_choice_whose_first_value_is_the_three_mmas():
    """WF_CROSS (3xTF32's cross products as one BF16 mma) and WF_ACCUM (where a k-step's products
    are summed) exist in fp32 only, their first values the code of the records tuned before them, and
    the defaults keep those."""
    for op in OPS:
        modern = dict(seed_problems(op))["modern_56"]
        assert space(op, modern).param("WF_CROSS").choices == (0, 1)
        assert OPERATIONS[op].default_config(modern, LIMITS, formulation=NAME)["WF_CROSS"] == 0
        tf32 = dataclasses.replace(modern, precision="tf32")
        assert "WF_CROSS" not in {p.name for p in space(op, tf32).params}
        with pytest.raises(InvalidConfigError, match="WF_CROSS"):
            space(op, tf32).validate({"formulation": NAME, "WF_TB": 32, "WF_MT": 4, "WF_WARPS": 8, "WF_CROSS": 1})
        assert space(op, modern).param("WF_ACCUM").choices[0] == "fresh"
        assert OPERATIONS[op].default_config(modern, LIMITS, formulation=NAME)["WF_ACCUM"] == "fresh"
        assert "WF_ACCUM" not in {p.name for p in space(op, tf32).params}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
def test_cross_products_verify_in_fp32_under_emulation(tmp_path):
    """WF_CROSS=1 run by the CPU emulator (the BF16 registers packed by both transforms, shuffles in
    the filters' kernel, 16-bit stores in the input's, the m16n8k16 BF16 mma) on every small shape
    of both ops, one and several blocks of output channels (the mmas accumulating into the totals
    in one, fresh registers in the other): every element within the FP32 bound (a register packed
    in the wrong half or slot misses it by 60 times)."""
    from tests.cuda_emulator import emulated_failure

    failures, checked = [], 0
    for op in OPS:
        for name, problem in small_problems(op):
            for mt, accum in zip(sorted({1, max(space(op, problem).param("WF_MT").choices)}), ("tensor", "fresh")):
                config = space(op, problem).validate({"formulation": NAME, "WF_TB": 32, "WF_MT": mt, "WF_WARPS": 8,
                                                      "WF_CROSS": 1, "WF_ACCUM": accum})
                why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, 31 + checked)
                checked += 1
                if why:
                    failures.append(f"{op} {name} MT {mt}: {why}")
    assert checked >= 2 * len(small_problems("conv_fwd"))
    assert not failures, "\n".join(failures)


def _gpu_problems(op: str, precision: str):
    return [(f"{n} {precision}", dataclasses.replace(p, precision=precision)) for n, p in seed_rows(op) + small_problems(op)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", OPS)
def test_kernels_verify_against_float64_on_the_gpu(op, precision):
    pytest.importorskip("cupy")
    # tf32: F(2x2) only (see test_kernels_verify_under_emulation); the default is among them.
    assert_verifies_on_gpu(OPERATIONS[op], NAME, _gpu_problems(op, precision), 2, WORKSPACE_LIMIT_BYTES, None)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_cross_products_verify_against_float64_on_the_gpu(op):
    """fp32 with WF_CROSS=1: three sampled configs of each seed row and small shape, every element
    within the one FP32 bound."""
    pytest.importorskip("cupy")
    assert_verifies_on_gpu(OPERATIONS[op], NAME, _gpu_problems(op, "fp32"), 3, WORKSPACE_LIMIT_BYTES, {"WF_CROSS": 1})


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_accumulation_by_the_mmas_verifies_against_float64_on_the_gpu(op):
    """fp32 with WF_ACCUM=tensor (the tensor cores' truncating accumulation into the totals), both
    ways of the cross products: two sampled configs of each seed row and small shape, every element
    within the one FP32 bound."""
    pytest.importorskip("cupy")
    for cross in (0, 1):
        assert_verifies_on_gpu(OPERATIONS[op], NAME, _gpu_problems(op, "fp32"), 2, WORKSPACE_LIMIT_BYTES,
                               {"WF_ACCUM": "tensor", "WF_CROSS": cross})


def test_the_filters_transform_keeps_within_the_workspace_limit():
    """Its one workspace, U (both TF32 parts in fp32), counts against --workspace-limit."""
    import dataclasses as dc

    modern = dict(seed_problems("conv_fwd"))["modern_56"]
    need = 4 * u_elements(modern, 2, 1)          # 2 parts x 16 points x 64 x 64 floats: 512 KiB
    tight = dc.replace(LIMITS, workspace_bytes=need - 1)
    config = {"formulation": NAME, "WF_TB": 32, "WF_MT": 1, "WF_WARPS": 8, "WF_CROSS": 0, "WF_ACCUM": "fresh"}
    with pytest.raises(InfeasibleConfigError, match="workspace"):
        OPERATIONS["conv_fwd"].space(modern, tight).validate(config)
    OPERATIONS["conv_fwd"].space(modern, dc.replace(LIMITS, workspace_bytes=need)).validate(config)
