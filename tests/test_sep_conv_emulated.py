"""The separable kernels' generated CUDA run on the CPU: each plan's source is compiled as C++ (g++)
under a small emulation of the CUDA execution model (one OS thread per CUDA thread of a block,
blocks one after another, __syncthreads a barrier, shared memory one buffer, warp shuffles and
atomics emulated), launched step by step as the plan says, and every output element checked
against the float64 reference within the FP32 bound. Outputs and workspaces start as NaN, so an
element a kernel never wrote fails. This checks the kernels' indexing, tiling, halos, partial
tiles, splits and workspaces without a GPU; it says nothing of speed, of the GPU's rounding
(fmaf is fmaf here too) or of resource limits (tests/test_sep_conv.py's nvcc builds do that)."""
from __future__ import annotations

import ctypes
import hashlib
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import reference
from autocnn.kernels.operation import Launch
from autocnn.tuning.measure import verify_outputs

import autocnn.kernels.sep_conv as sep

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")

LIMITS = DeviceLimits.for_arch("sm_90")
OPERATIONS = {"sep_conv_fwd": sep.SEP_CONV_FWD, "sep_conv_bwd_data": sep.SEP_CONV_BWD_DATA,
              "sep_conv_wgrad": sep.SEP_CONV_WGRAD}

PRELUDE = r"""
#include <math.h>
#include <stddef.h>
#include <atomic>
#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __restrict__
#define __launch_bounds__(...)
alignas(16) float4 emu_smem[1 << 16];          // 1 MiB of "shared memory", one block at a time
static std::barrier<>* emu_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> emu_warp_barriers;
static float emu_exchange[1024];
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline float __shfl_xor_sync(unsigned, float v, int d) {
    auto& warp = *emu_warp_barriers[threadIdx.x / 32];
    emu_exchange[threadIdx.x] = v;
    warp.arrive_and_wait();
    const float other = emu_exchange[threadIdx.x ^ d];
    warp.arrive_and_wait();
    return other;
}
static void emu_run(unsigned grid, unsigned block, const std::function<void()>& kernel) {
    blockDim.x = block;
    gridDim.x = grid;
    std::barrier<> bar(block);
    emu_block_barrier = &bar;
    emu_warp_barriers.clear();
    for (unsigned w = 0; w < (block + 31) / 32; ++w)
        emu_warp_barriers.emplace_back(new std::barrier<>(block - 32 * w < 32 ? block - 32 * w : 32));
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t)
        threads.emplace_back([&, t] {
            threadIdx.x = t;
            for (unsigned b = 0; b < grid; ++b) {
                blockIdx.x = b;
                kernel();
                bar.arrive_and_wait();   // the next block reuses the shared memory
            }
        });
    for (auto& th : threads) th.join();
}
"""


def emulated_source(plan) -> str:
    """The plan's CUDA source as C++ for the emulator, with one extern "C" trampoline per launch."""
    # Dynamic shared memory is the emulator's buffer; a static __shared__ array is one object that
    # all threads of the (one running) block see, as a function-local static is.
    body = plan.source.replace("extern __shared__ float4 smem4[];", "float4* smem4 = emu_smem;")
    body = body.replace("__shared__", "static")
    trampolines = []
    for i, step in enumerate(plan.steps):
        assert isinstance(step, Launch), f"the emulator runs generated kernels only, not {step.kernel}"
        args = [f"(float*)bufs[{a}]" for a in range(len(step.args))]
        args += [f"scalars[{s}]" for s in range(len(step.scalars))]
        trampolines.append(
            f'extern "C" void emu_launch_{i}(unsigned grid, unsigned block, void** bufs, const int* scalars) {{\n'
            f"    emu_run(grid, block, [&] {{ {step.kernel}({', '.join(args)}); }});\n}}\n")
    return PRELUDE + body + "\n" + "".join(trampolines)


def build(plan, cache: Path) -> ctypes.CDLL:
    source = emulated_source(plan)
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    lib = cache / f"{digest}.so"
    if not lib.exists():
        src = cache / f"{digest}.cpp"
        src.write_text(source)
        done = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread", str(src),
                               "-o", str(lib)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"g++ failed on {plan.config}:\n{done.stderr[-4000:]}"
    return ctypes.CDLL(str(lib))


def run_emulated(plan, inputs: dict[str, np.ndarray], cache: Path) -> dict[str, np.ndarray]:
    """Run every step of the plan on NaN-poisoned outputs and workspaces; returns the outputs."""
    lib = build(plan, cache)
    outputs = {name: np.full(shape, np.nan, dtype=np.float32)
               for name, shape in reference.output_shapes(plan.problem).items()}
    buffers = {**inputs, **outputs}
    buffers.update({name: np.full(max(1, n), np.nan, dtype=np.float32) for name, n in plan.workspaces})
    for name in plan.zero_first:
        buffers[name][...] = 0.0
    placeholder = np.zeros(1, dtype=np.float32)
    for i, step in enumerate(plan.steps):
        arrays = [buffers.get(a, placeholder) for a in step.args]
        assert all(a.flags.c_contiguous and a.dtype == np.float32 for a in arrays)
        ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        scalars = (ctypes.c_int * max(1, len(step.scalars)))(*step.scalars)
        assert step.block[1] == step.block[2] == 1 and step.grid[1] == step.grid[2] == 1
        getattr(lib, f"emu_launch_{i}")(ctypes.c_uint(step.grid[0]), ctypes.c_uint(step.block[0]), ptrs, scalars)
    return outputs


def check(op: str, problem, config, cache: Path, seed: int) -> str | None:
    plan = OPERATIONS[op].plan(problem, config)
    gen = np.random.default_rng(seed)
    inputs = {name: gen.standard_normal(shape, dtype=np.float32)
              for name, shape in reference.input_shapes(problem).items()}
    outputs = run_emulated(plan, inputs, cache)
    result = verify_outputs(problem, inputs, outputs)
    return None if result.passed else f"{op} {problem.shape_string()} {config}: {result.message}"


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
def test_kernels_compute_the_reference_under_emulation(op, name, cache):
    """The first and last default candidates and sampled configs of each formulation, on every small
    odd shape, run in the emulator: every element within the FP32 bound of float64."""
    rng = random.Random()
    seed = rng.randrange(2**31)
    failures, checked = [], 0
    for problem in problems(op):
        for config in formulation_configs(op, problem, name, rng, samples=1):
            checked += 1
            why = check(op, problem, config, cache, seed + checked)
            if why:
                failures.append(why)
    assert checked >= 3 * len(problems(op))
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
