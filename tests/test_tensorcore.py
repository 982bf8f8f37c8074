"""The tensor-core formulation (mma.sync m16n8k8 TF32; 3xTF32 for fp32): its space, rendering and
nvcc builds on the CPU; verification against float64 in both precisions on the GPU (-m gpu)."""
from __future__ import annotations

import dataclasses
import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError
from autocnn.kernels import OPERATIONS
from autocnn.kernels.compiler import NvccCompiler, nvcc_path
from autocnn.kernels.formulations.tensorcore import FORMULATION_TC, TC_OPS, gemm_for
from autocnn.kernels.suite import odd_problems, seed_problems
from tests.formulation_checks import BUILD_ARCHES

SEED_SHAPES = ("modern_56", "modern_14", "sweep_3x3", "scherer10_l2")
PRECISIONS = ("fp32", "tf32")


class TensorCoreKernels:
    """The tc formulation of one operation, as the operation offers it: its part of the space, its
    default, plans and fingerprint."""

    def __init__(self, op: str):
        self.operation = OPERATIONS[op]

    def space(self, problem, limits):
        return self.operation.space(problem, limits).restrict({"formulation": FORMULATION_TC})

    def default_config(self, problem, limits):
        return self.operation.default_config(problem, limits, formulation=FORMULATION_TC)

    def plan(self, problem, config):
        return self.operation.plan(problem, config)

    def fingerprint(self):
        return self.operation.fingerprint(FORMULATION_TC)


def _problems(op: str, precision: str):
    seed = [(n, p) for n, p in seed_problems(op) if n in SEED_SHAPES]
    return [(n, dataclasses.replace(p, precision=precision)) for n, p in seed + odd_problems(op)]


def test_the_space_needs_tensor_cores_and_caps_fp32_warp_tiles():
    name, problem = odd_problems("conv_fwd")[0]
    kernels = TensorCoreKernels("conv_fwd")
    with pytest.raises(InfeasibleConfigError, match="sm_80 or later"):
        kernels.default_config(problem, DeviceLimits("sm_75"))
    limits = DeviceLimits.for_arch("sm_90")
    big_warp = {"formulation": "tc", "BM": 128, "BN": 128, "BK": 16, "WM": 2, "WN": 2, "STAGES": 2, "CP_ASYNC": 0,
                "PAD_A": 8, "PAD_B": 4, "UNROLL_K": 0, "TABLE_A": 1, "VEC": 1, "NHWC": 0,
                "FRAG": "scalar"}
    big = dataclasses.replace(problem, N=64, H=64, W=64, C=64, K=128)
    with pytest.raises(InfeasibleConfigError, match="mma tiles per warp exceed 16"):
        kernels.space(big, limits).validate({**big_warp, "CROSS": 0})
    # tf32 keeps no second fragment per tile, so the same warp tile fits.
    kernels.space(dataclasses.replace(big, precision="tf32"), limits).validate({**big_warp, "TF32_ROUND": "nearest"})
    with pytest.raises(InfeasibleConfigError, match="register-staged pipeline has 2 stages"):
        kernels.space(big, limits).validate({**big_warp, "CROSS": 0, "BN": 64, "STAGES": 3})


def test_precision_decides_the_kernel_and_the_fingerprint_is_its_own():
    name, problem = odd_problems("conv_fwd")[0]
    kernels = TensorCoreKernels("conv_fwd")
    limits = DeviceLimits.for_arch("sm_90")
    config = kernels.default_config(problem, limits)
    fp32 = kernels.plan(problem, config).source
    tf32 = kernels.plan(dataclasses.replace(problem, precision="tf32"), config).source
    assert "constexpr bool SPLIT3 = true;" in fp32 and "constexpr bool SPLIT3 = false;" in tf32
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in fp32
    assert len({TensorCoreKernels(op).fingerprint() for op in TC_OPS}) == 3


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", BUILD_ARCHES)
def test_defaults_and_samples_build_without_spills(arch, tmp_path):
    """The default of every op, precision and shape builds with no spill (the tuner stores none);
    sampled configs build (ptxas may report spills for them: the tuner then skips them)."""
    limits = DeviceLimits.for_arch(arch)
    compiler = NvccCompiler(arch, cache_dir=tmp_path)
    rng = random.Random()
    jobs = []
    for op in TC_OPS:
        kernels = TensorCoreKernels(op)
        for precision in PRECISIONS:
            for i, (name, problem) in enumerate(_problems(op, precision)):
                default = kernels.default_config(problem, limits)
                jobs.append((f"{op} {name} {precision}", default, kernels.plan(problem, default), True))
                if i < 1:
                    for c in kernels.space(problem, limits).sample(rng, 1, exclude=[default]):
                        jobs.append((f"{op} {name} {precision}", c, kernels.plan(problem, c), False))

    def build(job):
        what, config, plan, is_default = job
        module = compiler.compile(plan.source, config=config)
        report = module.reports[plan.op]
        if is_default and report.spills:
            return f"{what} {config}: the default spills ({report})"
        return None

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        failures = [f for f in pool.map(build, jobs) if f]
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", TC_OPS)
def test_tensor_core_kernels_verify_against_float64(op, precision):
    """The default and four sampled configs of each shape (seed shapes of today's layers and odd
    shapes that divide nothing evenly) pass the bound of their precision, every element checked."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    device = current_device(0)
    limits = device.limits()
    loader = KernelLoader()
    kernels = TensorCoreKernels(op)
    rng = random.Random()
    failures, checked = [], 0
    for name, problem in _problems(op, precision):
        default = kernels.default_config(problem, limits)
        for config in [default, *kernels.space(problem, limits).sample(rng, 4, exclude=[default])]:
            check = check_candidate(loader.load(kernels.plan(problem, config)), problem, time_it=False)
            checked += 1
            if not check.verification.passed:
                failures.append(f"{name} {config}: {check.verification.message}")
    assert checked >= 5 * len(_problems(op, precision)) - 2
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:8])


def _two_pass_configs(limits):
    """(name, problem, config) for conv_wgrad's two-pass combine: the default with its splits
    written to the workspace, on every tested shape and precision where the reduction splits."""
    kernels = TensorCoreKernels("conv_wgrad")
    out = []
    for precision in PRECISIONS:
        for name, problem in _problems("conv_wgrad", precision):
            default = kernels.default_config(problem, limits)
            config = {**default.as_dict(), "TWO_PASS": 1, "SPLITK": max(2, default["SPLITK"])}
            try:
                config = kernels.space(problem, limits).validate(config)
            except InfeasibleConfigError:
                continue   # a reduction of a single BK step cannot split
            out.append((f"{name} {precision}", problem, config))
    return out


def test_two_pass_wgrad_adds_the_second_pass_and_its_workspace():
    limits = DeviceLimits.for_arch("sm_90")
    kernels = TensorCoreKernels("conv_wgrad")
    configs = _two_pass_configs(limits)
    assert len(configs) >= 6
    name, problem, config = configs[0]
    plan = kernels.plan(problem, config)
    assert [launch.kernel for launch in plan.launches] == ["conv_wgrad", "conv_wgrad_reduce"]
    assert "constexpr bool TWO_PASS = true;" in plan.source and "conv_wgrad_reduce(" in plan.source
    with pytest.raises(InfeasibleConfigError, match="second pass needs SPLITK >= 2"):
        kernels.space(problem, limits).validate({**config.as_dict(), "SPLITK": 1})
    atomic = kernels.plan(problem, kernels.space(problem, limits).validate({**config.as_dict(), "TWO_PASS": 0}))
    assert "conv_wgrad_reduce(" not in atomic.source and len(atomic.launches) == 1


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_two_pass_wgrad_builds_without_spills(tmp_path):
    limits = DeviceLimits.for_arch("sm_90")
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    kernels = TensorCoreKernels("conv_wgrad")
    name, problem, config = _two_pass_configs(limits)[0]
    module = compiler.compile(kernels.plan(problem, config).source, config=config)
    assert not module.reports["conv_wgrad"].spills and not module.reports["conv_wgrad_reduce"].spills


def _failures_on_the_gpu(op, configs_for):
    """Verify each (name, problem, config) that ``configs_for(limits)`` gives on GPU 0 against
    float64; the configs checked and the failures."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    configs = configs_for(current_device(0).limits())
    loader = KernelLoader()
    kernels = TensorCoreKernels(op)
    failures = []
    for name, problem, config in configs:
        check = check_candidate(loader.load(kernels.plan(problem, config)), problem, time_it=False)
        if not check.verification.passed:
            failures.append(f"{name} {config}: {check.verification.message}")
    return configs, failures


@pytest.mark.gpu
def test_two_pass_wgrad_verifies_against_float64():
    configs, failures = _failures_on_the_gpu("conv_wgrad", _two_pass_configs)
    assert len(configs) >= 6
    assert not failures, "\n".join(failures)


def _staged_fwd_configs(limits):
    """(name, problem, config) for conv_fwd with X staged as NHWC, with float4 loads where the
    channels allow them and single floats otherwise, cp.async and register pipelines, on every tested
    shape and precision."""
    kernels = TensorCoreKernels("conv_fwd")
    out = []
    for precision in PRECISIONS:
        for name, problem in _problems("conv_fwd", precision):
            default = kernels.default_config(problem, limits).as_dict()
            space = kernels.space(problem, limits)
            for extra in ({"NHWC": 1}, {"NHWC": 1, "CP_ASYNC": 1, "STAGES": 3}, {"NHWC": 0}):
                try:   # float4 loads where the channels and the tile allow them, else single floats
                    config = space.validate({**default, **extra, "VEC": 4})
                except InfeasibleConfigError:
                    config = space.validate({**default, **extra, "VEC": 1})
                out.append((f"{name} {precision} {extra}", problem, config))
    return out


def test_nhwc_staging_adds_its_kernels_and_float4_loads_need_whole_runs():
    limits = DeviceLimits.for_arch("sm_90")
    kernels = TensorCoreKernels("conv_fwd")
    configs = _staged_fwd_configs(limits)
    name, problem, config = next(c for c in configs if c[2]["NHWC"] and c[2]["VEC"] == 4)
    plan = kernels.plan(problem, config)
    assert [launch.kernel for launch in plan.launches] == ["conv_fwd_stage_x", "conv_fwd_stage_w", "conv_fwd"]
    assert dict(plan.workspaces) == {"xt": problem.N * problem.C * problem.H * problem.W,
                                     "wt": problem.K * problem.C * problem.R * problem.S}
    assert "constexpr int VEC_A = 4, VEC_B = 4;" in plan.source and "cp.async.cg.shared.global" in plan.source
    plain = kernels.plan(problem, kernels.space(problem, limits).validate({**config.as_dict(), "NHWC": 0, "VEC": 1}))
    assert len(plain.launches) == 1 and "constexpr int VEC_A = 1, VEC_B = 1;" in plain.source
    odd = next(p for n, p in _problems("conv_fwd", "fp32") if p.C % 4)
    with pytest.raises(InfeasibleConfigError, match="NHWC input need C % 4 == 0"):
        kernels.space(odd, limits).validate({**kernels.default_config(odd, limits).as_dict(), "NHWC": 1, "VEC": 4})


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_nhwc_staging_builds(tmp_path):
    limits = DeviceLimits.for_arch("sm_90")
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    kernels = TensorCoreKernels("conv_fwd")
    built = 0
    for name, problem, config in _staged_fwd_configs(limits)[:6]:
        module = compiler.compile(kernels.plan(problem, config).source, config=config)
        assert {"conv_fwd"} <= set(module.reports), name
        built += 1
    assert built == 6


@pytest.mark.gpu
@pytest.mark.slow   # over 250 s on an H100 (a float64 reference per config and shape)
def test_nhwc_staging_and_float4_loads_verify_against_float64():
    configs, failures = _failures_on_the_gpu("conv_fwd", _staged_fwd_configs)
    assert len(configs) == 3 * len(PRECISIONS) * len(_problems("conv_fwd", "fp32"))
    assert not failures, f"{len(failures)} of {len(configs)} failed:\n" + "\n".join(failures[:8])


def _frag_configs(op, limits):
    """(name, problem, config): each tested shape's default in both precisions with its fragments
    read in k-permuted pairs, and in quads (a reduction step of 16 where the default's is 8) where
    the reduction has more than 8 terms."""
    kernels = TensorCoreKernels(op)
    out = []
    for precision in PRECISIONS:
        for name, problem in _problems(op, precision):
            default = kernels.default_config(problem, limits).as_dict()
            space = kernels.space(problem, limits)
            out.append((f"{name} {precision} pair", problem, space.validate({**default, "FRAG": "pair"})))
            if gemm_for(problem).GK > 8:
                quad = {**default, "FRAG": "quad", "BK": max(16, default["BK"])}
                out.append((f"{name} {precision} quad", problem, space.validate(quad)))
    return out


def _frag_count(op):
    return sum(1 + (gemm_for(p).GK > 8) for precision in PRECISIONS for _, p in _problems(op, precision))


def _tf32_forward():
    """(limits, kernels, problem, space, default) of the first tested tf32 forward shape on sm_90."""
    limits = DeviceLimits.for_arch("sm_90")
    kernels = TensorCoreKernels("conv_fwd")
    name, problem = _problems("conv_fwd", "tf32")[0]
    return limits, kernels, problem, kernels.space(problem, limits), kernels.default_config(problem, limits)


def test_permuted_fragment_reads_are_vector_loads():
    limits, kernels, problem, space, default = _tf32_forward()
    scalar = kernels.plan(problem, space.validate({**default.as_dict(), "FRAG": "scalar"})).source
    assert "cvt.rna.tf32.f32" in scalar and "to_tf32_fast" not in scalar
    quad = kernels.plan(problem, space.validate({**default.as_dict(), "FRAG": "quad", "BK": 16})).source
    assert "constexpr bool FRAG_QUAD = true;" in quad and "split_fast(" in quad
    with pytest.raises(InfeasibleConfigError, match="quad fragment reads need BK % 16 == 0"):
        space.validate({**default.as_dict(), "FRAG": "quad", "BK": 8})
    configs = _frag_configs("conv_fwd", limits)
    assert len(configs) == _frag_count("conv_fwd") and sum(c["FRAG"] == "quad" for _, _, c in configs) >= 8


def _built_on_sm90(tmp_path, configs_for, every):
    """(op, name, config, ptxas report) of every ``every``-th config that ``configs_for(limits)``
    gives for each tc op, built for sm_90 in parallel."""
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    limits = DeviceLimits.for_arch("sm_90")
    jobs = [(op, c) for op in TC_OPS for c in configs_for(op, limits)[::every]]

    def build(job):
        op, (name, problem, config) = job
        report = compiler.compile(TensorCoreKernels(op).plan(problem, config).source, config=config).reports[op]
        return op, name, config, report

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(build, jobs))


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_permuted_fragment_reads_build(tmp_path):
    built = _built_on_sm90(tmp_path, _frag_configs, 3)
    # Every one builds. Holding all fragment elements of a round before rounding them costs
    # registers: some fp32 backward-data tiles spill, which ptxas reports and the tuner skips, but
    # most must not.
    spilled = [f"{op} {name}: spills ({report})" for op, name, _, report in built if report.spills]
    assert len(built) >= 12 and len(spilled) <= len(built) // 4, "\n".join(spilled)


@pytest.mark.gpu
@pytest.mark.parametrize("op", TC_OPS)
def test_permuted_fragment_reads_verify_against_float64(op):
    configs, failures = _failures_on_the_gpu(op, lambda limits: _frag_configs(op, limits))
    assert len(configs) == _frag_count(op)
    assert not failures, f"{len(failures)} of {len(configs)} failed:\n" + "\n".join(failures[:8])


def _rounding_configs(op, limits):
    """(name, problem, config): each tested tf32 shape's default with its operands truncated by the
    tensor cores (TF32_ROUND "zero"), read singly and in k-permuted pairs."""
    kernels = TensorCoreKernels(op)
    out = []
    for name, problem in _problems(op, "tf32"):
        default = kernels.default_config(problem, limits).as_dict()
        space = kernels.space(problem, limits)
        for frag in ("scalar", "pair"):
            out.append((f"{name} tf32 zero {frag}", problem,
                        space.validate({**default, "FRAG": frag, "TF32_ROUND": "zero"})))
    return out


def test_tf32_rounding_is_a_parameter_of_tf32_problems_only():
    limits, kernels, problem, space, default = _tf32_forward()
    assert default["TF32_ROUND"] == "nearest"
    assert "TF32_ROUND" in {p.name for p in space.params}
    assert "TF32_ROUND" not in {p.name for p in kernels.space(dataclasses.replace(problem, precision="fp32"), limits).params}

    def source(**changes):
        return kernels.plan(problem, space.validate({**default.as_dict(), **changes})).source

    # Rounded to nearest by cvt (the NaN-safe conversion) however the fragments are read; truncated
    # by handing the float bits to the mma unchanged.
    assert "big = to_tf32(x);" in source(FRAG="scalar", TF32_ROUND="nearest")
    assert "big = __float_as_uint(x);   // TF32_ROUND" in source(FRAG="scalar", TF32_ROUND="zero")
    assert "unsigned to_tf32_fast(float x) { return to_tf32(x); }" in source(FRAG="pair", TF32_ROUND="nearest")
    assert "unsigned to_tf32_fast(float x) { return __float_as_uint(x); }" in source(FRAG="pair", TF32_ROUND="zero")
    assert "+ 0x1000u" not in source(FRAG="pair", TF32_ROUND="nearest")
    assert len(_rounding_configs("conv_fwd", limits)) == 2 * len(_problems("conv_fwd", "tf32"))


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_truncated_tf32_operands_build_without_spills(tmp_path):
    built = _built_on_sm90(tmp_path, _rounding_configs, 4)
    # Truncation takes no registers: single reads build without spills as with rounding.
    spilled = [f"{op} {name}: spills ({report})" for op, name, config, report in built
               if report.spills and config["FRAG"] == "scalar"]
    assert len(built) >= 6 and not spilled, "\n".join(spilled)


@pytest.mark.gpu
@pytest.mark.parametrize("op", TC_OPS)
def test_truncated_tf32_operands_verify_against_float64(op):
    configs, failures = _failures_on_the_gpu(op, lambda limits: _rounding_configs(op, limits))
    assert len(configs) == 2 * len(_problems(op, "tf32"))
    assert not failures, f"{len(failures)} of {len(configs)} failed:\n" + "\n".join(failures[:8])


@pytest.mark.gpu
@pytest.mark.parametrize("op", TC_OPS)
def test_a_nan_in_an_input_is_a_nan_in_every_output_it_reaches(op):
    """The canonical NaN (0x7fffffff, what CUDA's arithmetic produces) in one input element: every
    output whose reduction includes it is NaN, and no other, in both precisions and every way of
    converting to TF32 (an integer add of 2**12 alone would carry it into a negative zero)."""
    cp = pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import plan_buffers, reference_outputs

    limits = current_device(0).limits()
    kernels = TensorCoreKernels(op)
    loader = KernelLoader()
    name, base = next((n, p) for n, p in _problems(op, "fp32") if n in SEED_SHAPES)
    cases = []
    for precision in PRECISIONS:
        problem = dataclasses.replace(base, N=min(base.N, 4), precision=precision)
        default = kernels.default_config(problem, limits).as_dict()
        space = kernels.space(problem, limits)
        rounds = ("nearest", "zero") if precision == "tf32" else (None,)
        for frag in ("scalar", "pair"):
            for rounding in rounds:
                extra = {"FRAG": frag, **({"TF32_ROUND": rounding} if rounding else {})}
                cases.append((f"{name} {precision} {extra}", problem, space.validate({**default, **extra})))
    checked = []
    for what, problem, config in cases:
        loaded = loader.load(kernels.plan(problem, config))
        inputs, outputs, buffers = plan_buffers(loaded, problem, seed=7)
        flat = inputs["dy" if op == "conv_bwd_data" else "x"].reshape(-1)   # an operand of the mma
        flat.view(cp.uint32)[flat.size // 3] = 0x7FFFFFFF
        loaded(buffers)
        cp.cuda.get_current_stream().synchronize()
        ref = reference_outputs(problem, inputs)
        reached = 0
        for out_name, expected in ref.items():
            want, got = cp.isnan(expected), cp.isnan(outputs[out_name])
            reached += int(want.sum())
            assert bool((want == got).all()), (f"{what}: {out_name} has {int(got.sum())} NaNs where the "
                                               f"reference has {int(want.sum())}")
        assert reached > 0, f"{what}: the NaN reaches no output of the reference (the test is wrong)"
        checked.append(what)
    assert len(checked) == 6
