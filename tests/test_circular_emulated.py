"""The circular forward's and the one-pass backward's generated CUDA run on the CPU, under the small
emulation of the CUDA execution model that tests/test_sep_conv_emulated.py builds (g++, one OS
thread per CUDA thread, __syncthreads a barrier, atomics emulated), each launch's 3D grid walked
block after block: every element of y, or of dx, dw and db, checked against the float64
reference within the FP32 bound, outputs and workspaces poisoned with NaN (zeroed where the plan
zeroes them). It checks the kernels' own indexing, barriers and schedule on uneven shapes without a
GPU; speed, the GPU's resource limits and real concurrency are the GPU tests' part."""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import reference
from autocnn.kernels.conv_bwd_fused import CONV_BWD_FUSED
from autocnn.kernels.formulations.circular import NAME
from autocnn.kernels.formulations.circular_bwd import ATOMIC, TWO_PASS
from autocnn.kernels.problem import ConvFwdProblem
from autocnn.tuning.measure import verify_outputs
from tests.test_circular import FWD, uneven_problems
from tests.test_circular_bwd import fused
from tests.test_sep_conv_emulated import PRELUDE

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")

LIMITS = DeviceLimits.for_arch("sm_90")
MAX_THREADS = 256      # the emulator runs an OS thread per CUDA thread: larger blocks only cost time here
HOST_MIN = "#include <algorithm>\nusing std::min;\n"   # CUDA's integer min() on the host


def emulated_source(plan) -> str:
    """The plan's source for the emulator, with a trampoline per launch that walks its 3D grid."""
    body = plan.source.replace("extern __shared__ float4 smem4[];", "float4* smem4 = emu_smem;")
    trampolines = []
    for i, step in enumerate(plan.steps):
        gx, gy, gz = step.grid
        args = ", ".join(f"(float*)bufs[{a}]" for a in range(len(step.args)))
        trampolines.append(
            f'extern "C" void emu_launch_{i}(void** bufs) {{\n'
            f"    emu_run({gx * gy * gz}u, {step.block[0]}u, [&] {{\n"
            f"        const unsigned b = blockIdx.x;\n"
            f"        blockIdx.x = b % {gx}u; blockIdx.y = (b / {gx}u) % {gy}u; blockIdx.z = b / {gx * gy}u;\n"
            f"        {step.kernel}({args});\n"
            f"        blockIdx.x = b;\n"
            f"    }});\n}}\n")
    return PRELUDE + HOST_MIN + body + "\n" + "".join(trampolines)


def run_emulated(plan, inputs: dict[str, np.ndarray], cache: Path) -> dict[str, np.ndarray]:
    source = emulated_source(plan)
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    lib_path = cache / f"{digest}.so"
    if not lib_path.exists():
        src = cache / f"{digest}.cpp"
        src.write_text(source)
        done = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread", str(src),
                               "-o", str(lib_path)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"g++ failed on {plan.config}:\n{done.stderr[-4000:]}"
    lib = ctypes.CDLL(str(lib_path))
    outputs = {name: np.full(shape, np.nan, dtype=np.float32)
               for name, shape in reference.output_shapes(plan.problem).items()}
    buffers = {**inputs, **outputs}
    buffers.update({name: np.full(max(1, n), np.nan, dtype=np.float32) for name, n in plan.workspaces})
    for name in plan.zero_first:
        if name in buffers:
            buffers[name][...] = 0.0
    placeholder = np.zeros(1, dtype=np.float32)
    for i, step in enumerate(plan.steps):
        arrays = [buffers.get(a, placeholder) for a in step.args]
        assert step.block[1] == step.block[2] == 1
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        getattr(lib, f"emu_launch_{i}")(ptrs)
    return outputs


def failure(operation, problem, config, cache: Path, seed: int) -> str | None:
    plan = operation.plan(problem, config)
    gen = np.random.default_rng(seed)
    inputs = {name: gen.standard_normal(shape, dtype=np.float32)
              for name, shape in reference.input_shapes(problem).items()}
    result = verify_outputs(problem, inputs, run_emulated(plan, inputs, cache))
    return None if result.passed else f"{problem.shape_string()} {config}: {result.message}"


def small(threads_of, configs: list) -> list:
    return [c for c in configs if threads_of(c) <= MAX_THREADS]


PROBLEMS = [*(p for _, p in uneven_problems()),
            ConvFwdProblem(N=1, C=3, H=24, W=20, K=9, R=8, S=8, stride=2, padding=3, bias=True, activation="tanh")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("circular_emulated")


def test_the_forward_computes_the_reference_under_emulation(cache):
    """The default and sampled configs (buffer sizes, tiles, channel groups) of every uneven shape."""
    rng = random.Random()
    seed = rng.randrange(2**31)
    failures, checked = [], 0
    for problem in PROBLEMS:
        space = FWD.space(problem, LIMITS).restrict({"formulation": NAME})
        default = FWD.default_config(problem, LIMITS, formulation=NAME)
        configs = small(lambda c: FWD.plan(problem, c).launches[0].threads,
                        [default, *space.sample(rng, 6, exclude=[default])])[:3]
        for config in configs:
            checked += 1
            why = failure(FWD, problem, config, cache, seed + checked)
            if why:
                failures.append(why)
    assert checked >= 2 * len(PROBLEMS)
    assert not failures, f"seed {seed}: {len(failures)} of {checked} failed:\n" + "\n".join(failures[:6])


@pytest.mark.parametrize("combine", (ATOMIC, TWO_PASS))
def test_the_fused_backward_computes_the_reference_under_emulation(combine, cache):
    """dx, dw and db of the default and sampled configs of each way of combining, every uneven shape."""
    rng = random.Random()
    seed = rng.randrange(2**31)
    failures, checked = [], 0
    for problem in (fused(p) for p in PROBLEMS):
        space = CONV_BWD_FUSED.space(problem, LIMITS)
        default = space.validate({**CONV_BWD_FUSED.default_config(problem, LIMITS).as_dict(), "COMBINE": combine})
        configs = small(lambda c: CONV_BWD_FUSED.plan(problem, c).launches[0].threads,
                        [default, *space.restrict({"COMBINE": combine}).sample(rng, 6, exclude=[default])])[:3]
        for config in configs:
            checked += 1
            why = failure(CONV_BWD_FUSED, problem, config, cache, seed + checked)
            if why:
                failures.append(why)
    no_bias = dataclasses.replace(fused(PROBLEMS[1]), bias=False)
    checked += 1
    why = failure(CONV_BWD_FUSED, no_bias, CONV_BWD_FUSED.space(no_bias, LIMITS).validate(
        {**CONV_BWD_FUSED.default_config(no_bias, LIMITS).as_dict(), "COMBINE": combine}), cache, seed)
    failures += [why] if why else []
    assert checked >= 2 * len(PROBLEMS)
    assert not failures, f"seed {seed}: {len(failures)} of {checked} failed:\n" + "\n".join(failures[:6])
