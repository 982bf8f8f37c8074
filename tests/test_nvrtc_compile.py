"""The CUDA sources the GPU compiles at run time go through NVRTC there, so they are compiled with
NVRTC here too (no GPU needed): NVRTC lacks the host headers nvcc puts in every translation unit
(math.h's INFINITY, for one), so a source that nvcc accepts can still fail on the GPU host.

NVRTC comes from the nvidia-cuda-nvrtc wheel (the dev extra installs it on Linux x86-64) or from
a CUDA toolkit on the library path.
"""
from __future__ import annotations

import ctypes
import dataclasses
import ctypes.util
import glob
import importlib.util
import os

import pytest

from autocnn.kernels.compiler import nvrtc_options
from autocnn.device import DeviceLimits
from autocnn.kernels import OPERATIONS, operation_for
from autocnn.kernels.suite import odd_problems, seed_problems


def _nvrtc() -> ctypes.CDLL | None:
    candidates = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.*")))
        candidates += sorted(glob.glob(os.path.join(root, "cuda_nvrtc", "lib", "libnvrtc.so.*")))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for path in candidates:
        if "builtins" in os.path.basename(path) or ".alt." in os.path.basename(path):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


NVRTC = _nvrtc()
pytestmark = pytest.mark.skipif(NVRTC is None, reason="NVRTC is not installed (pip install nvidia-cuda-nvrtc)")


def nvrtc_compile(source: str, arch: str = "compute_90") -> tuple[int, str]:
    """(NVRTC's result code, its log) for ``source`` with the options autocnn uses at run time."""
    lib = NVRTC
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"autocnn.cu", 0, None, None) == 0
    try:
        options = [o.encode() for o in nvrtc_options(source, f"-arch={arch}")]
        rc = lib.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(max(1, size.value))
        lib.nvrtcGetProgramLog(prog, log)
        return rc, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def test_nvrtc_reports_an_error_for_a_host_only_identifier():
    # The check itself can fail: INFINITY comes from math.h, which NVRTC does not include.
    rc, log = nvrtc_compile('extern "C" __global__ void k(float* x) { x[0] = INFINITY; }')
    assert rc != 0 and "INFINITY" in log


def test_the_training_library_kernels_compile_with_nvrtc():
    from autocnn.nn import fused

    rc, log = nvrtc_compile(fused.render_source())
    assert rc == 0, log
    assert "warning" not in log.lower(), log


def test_the_mixed_precision_kernels_compile_with_nvrtc():
    from autocnn.nn import fused_sixteen_bit

    rc, log = nvrtc_compile(fused_sixteen_bit.render_source())
    assert rc == 0, log
    assert "warning" not in log.lower(), log


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_default_kernels_compile_with_nvrtc(op):
    # The training library loads its tuned kernels through NVRTC: the default config of a seed
    # shape and of an odd shape of every family.
    limits = DeviceLimits.for_arch("sm_90")
    problems = [problem for _, problem in seed_problems(op)[:1] + odd_problems(op)[:1]]
    assert len(problems) == 2
    for problem in problems:
        operation = operation_for(problem)
        plan = operation.plan(problem, operation.default_config(problem, limits))
        rc, log = nvrtc_compile(plan.source)
        assert rc == 0, f"{problem.shape_string()}:\n{log}"


SIXTEEN_BIT = {"conv_fwd": ("direct", "igemm"), "conv_bwd_data": ("direct", "igemm"), "conv_wgrad": ("igemm",),
               "avgpool_fwd": ("window_gather",), "avgpool_bwd": ("window_gather",)}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("op", sorted(SIXTEEN_BIT))
def test_sixteen_bit_kernels_compile_with_nvrtc(op, precision):
    # NVRTC carries no CUDA headers: the kernels of 16-bit tensors include cuda_bf16.h and
    # cuda_fp16.h, which nvrtc_options finds (an error naming them where it cannot).
    limits = DeviceLimits.for_arch("sm_90")
    operation = OPERATIONS[op]
    problem = dataclasses.replace(odd_problems(op)[0][1], precision=precision)
    for formulation in SIXTEEN_BIT[op]:
        plan = operation.plan(problem, operation.default_config(problem, limits, formulation=formulation))
        assert "#include <cuda_bf16.h>" in plan.source and any(o.startswith("-I") for o in nvrtc_options(plan.source))
        rc, log = nvrtc_compile(plan.source)
        assert rc == 0, f"{formulation} {problem.shape_string()}:\n{log}"


def test_sixteen_bit_types_are_storage_only_in_the_generated_kernels():
    # The kernels define __CUDA_NO_*_CONVERSIONS__ / _OPERATORS__ before the headers, so a 16-bit
    # product or an implicit float-to-half assignment is a compile error, not a silent 16-bit sum.
    limits = DeviceLimits.for_arch("sm_90")
    problem = dataclasses.replace(odd_problems("conv_fwd")[0][1], precision="bf16")
    operation = OPERATIONS["conv_fwd"]
    source = operation.plan(problem, operation.default_config(problem, limits, formulation="igemm")).source
    assert nvrtc_compile(source)[0] == 0
    planted = source.replace("acnn::ldg_acc(w + a.base + b.k)", "(w[a.base + b.k] * w[a.base + b.k])", 1)
    assert planted != source
    rc, log = nvrtc_compile(planted)
    assert rc != 0 and "operator" in log, log


@pytest.mark.slow
def test_every_sampled_sixteen_bit_config_compiles_with_nvrtc():
    # The bf16 and fp16 cases of tests/data/render_digests.json: each serving formulation's default
    # and sampled configs (vector widths, unrolling, splits), whose code paths the defaults do not all take.
    import json
    from pathlib import Path

    from autocnn.kernels import problem_from_dict

    document = json.loads((Path(__file__).parent / "data" / "render_digests.json").read_text())
    limits = DeviceLimits.for_arch(document["arch"])
    cases = [c for c in document["cases"] if c["group"].rsplit("/", 1)[1] in ("bf16", "fp16")]
    assert len(cases) >= 100
    failures = []
    for case in cases:
        problem = problem_from_dict(document["problems"][case["problem"]])
        operation = operation_for(problem)
        plan = operation.plan(problem, operation.space(problem, limits).validate(case["config"]))
        rc, log = nvrtc_compile(plan.source)
        if rc:
            failures.append(f"{case['group']} {case['config']}:\n{log[:400]}")
    assert not failures, "\n".join(failures[:5])
