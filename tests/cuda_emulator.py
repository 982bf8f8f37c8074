"""A small emulation of the CUDA execution model on the CPU, for tests of generated kernels.

A plan's CUDA source is compiled as C++ (g++) with one OS thread per CUDA thread of a block, blocks
one after another, __syncthreads a barrier, shared memory one buffer, warp shuffles and atomics
emulated; each launch gets an extern "C" trampoline that walks its grid (3D grids block after block)
and runs the steps in the plan's order on NumPy buffers. Outputs and workspaces start as NaN (zeroed
where the plan zeroes them), so an element a kernel never wrote fails verification. It checks the
kernels' indexing, tiling, barriers and schedules without a GPU; it says nothing of speed, of the
GPU's rounding or resource limits, or of real concurrency (the GPU tests' part).
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
from pathlib import Path
from typing import Callable, Collection, Mapping

import numpy as np

from autocnn.kernels import reference
from autocnn.kernels.operation import Launch
from autocnn.tuning.measure import verify_outputs

PRELUDE = r"""
#include <math.h>
#include <stddef.h>
#include <atomic>
#include <barrier>
#include <cstring>
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
// For kernels that only compile here (run_emulated's host steps): the bit casts and the shared
// window's address that their inline PTX takes, and what stands for each PTX statement (the
// emulator runs none: a kernel that reaches one fails its launch).
static bool emu_ptx_reached = false;
inline void emu_ptx() { emu_ptx_reached = true; }
extern "C" int emu_take_ptx_reached() { const bool r = emu_ptx_reached; emu_ptx_reached = false; return r; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }
inline float __shfl_xor_sync(unsigned, float v, int d) {
    auto& warp = *emu_warp_barriers[threadIdx.x / 32];
    emu_exchange[threadIdx.x] = v;
    warp.arrive_and_wait();
    const float other = emu_exchange[threadIdx.x ^ d];
    warp.arrive_and_wait();
    return other;
}
static unsigned long long emu_exchange_bits[1024];
template <class T> inline T __shfl_sync(unsigned, T v, int src) {   // lane src's v, to every lane of the warp
    static_assert(sizeof(T) <= 8, "a shuffled value is one register or two");
    auto& warp = *emu_warp_barriers[threadIdx.x / 32];
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    emu_exchange_bits[threadIdx.x] = bits;
    warp.arrive_and_wait();
    bits = emu_exchange_bits[threadIdx.x / 32 * 32 + (src & 31)];
    warp.arrive_and_wait();
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
static void emu_run(unsigned grid, unsigned block, const std::function<void()>& kernel) {
    blockDim.x = block;   // gridDim: the launch's trampoline sets it (a 3D grid walks as grid = x*y*z blocks)
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

HOST_MIN = "#include <algorithm>\nusing std::max;\nusing std::min;\n"   # CUDA's integer min() and max() on the host


def without_ptx(source: str) -> str:
    """``source`` with every inline PTX statement (``asm(...)``, ``asm volatile(...)``) replaced by
    a call of emu_ptx(), which marks the launch that reaches it as failed: the host's compiler
    cannot take the PTX (nor more than 30 asm operands), and no emulated kernel may run any."""
    out, pos = [], 0
    for match in re.finditer(r"\basm\b(\s+volatile)?\s*\(", source):
        if match.start() < pos:
            continue
        depth, i, quoted = 1, match.end(), False
        while depth:
            ch = source[i]
            if quoted:
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    quoted = False
            elif ch == '"':
                quoted = True
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            i += 1
        out += [source[pos:match.start()], "emu_ptx()"]
        pos = i
    return "".join(out) + source[pos:]


def emulated_source(plan, host: Collection[str] = ()) -> str:
    """The plan's CUDA source as C++ for the emulator, with one extern "C" trampoline per launch.
    The kernels named in ``host`` (ones whose inline PTX the emulator cannot run: wgmma) are left
    as inline functions that are never emitted, so their PTX never reaches the assembler, and get
    no trampoline: run_emulated runs those steps on the host."""
    # Dynamic shared memory is the emulator's buffer; a static __shared__ array is one object that
    # all threads of the (one running) block see, as a function-local static is.
    body = plan.source.replace("extern __shared__ float4 smem4[];", "float4* smem4 = emu_smem;")
    body = body.replace("__shared__", "static")
    body = without_ptx(body)
    for name in host:
        body, count = re.subn(rf'extern "C"(\s+__global__\s+void\s+__launch_bounds__\([^)]*\)\s+{name}\()',
                              r"inline\1", body)
        assert count == 1, f"no kernel {name} in the plan's source"
    trampolines = []
    for i, step in enumerate(plan.steps):
        if step.kernel in host:
            continue
        assert isinstance(step, Launch), f"the emulator runs generated kernels only, not {step.kernel}"
        assert step.block[1] == step.block[2] == 1, "the emulator runs 1D blocks"
        gx, gy, gz = step.grid
        args = [f"(float*)bufs[{a}]" for a in range(len(step.args))]
        args += [f"scalars[{s}]" for s in range(len(step.scalars))]
        trampolines.append(
            f'extern "C" void emu_launch_{i}(void** bufs, const int* scalars) {{\n'
            f"    gridDim.x = {gx}u; gridDim.y = {gy}u; gridDim.z = {gz}u;\n"
            f"    emu_run({gx * gy * gz}u, {step.block[0]}u, [&] {{\n"
            f"        const unsigned b = blockIdx.x;\n"
            f"        blockIdx.x = b % {gx}u; blockIdx.y = (b / {gx}u) % {gy}u; blockIdx.z = b / {gx * gy}u;\n"
            f"        {step.kernel}({', '.join(args)});\n"
            f"        blockIdx.x = b;\n"
            f"    }});\n}}\n")
    return PRELUDE + HOST_MIN + body + "\n" + "".join(trampolines)


def build(plan, cache: Path, host: Collection[str] = ()) -> ctypes.CDLL:
    """The plan compiled for the emulator (cached in ``cache`` by the source's hash)."""
    source = emulated_source(plan, host)
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    lib = cache / f"{digest}.so"
    if not lib.exists():
        src = cache / f"{digest}.cpp"
        src.write_text(source)
        done = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread", str(src),
                               "-o", str(lib)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"g++ failed on {plan.config}:\n{done.stderr[-4000:]}"
    return ctypes.CDLL(str(lib))


def run_emulated(plan, inputs: dict[str, np.ndarray], cache: Path,
                 host: Mapping[str, Callable[..., None]] | None = None) -> dict[str, np.ndarray]:
    """Run every step of the plan on NaN-poisoned outputs and workspaces; returns the outputs.
    ``host`` maps kernels the emulator cannot run to functions that do their part on the buffers
    (``f(buffers, *scalars)``, NumPy on the same float32 arrays), in the plan's order."""
    host = host or {}
    lib = build(plan, cache, tuple(host))
    outputs = {name: np.full(shape, np.nan, dtype=np.float32)
               for name, shape in reference.output_shapes(plan.problem).items()}
    buffers = {**inputs, **outputs}
    buffers.update({name: np.full(max(1, n), np.nan, dtype=np.float32) for name, n in plan.workspaces})
    for name in plan.zero_first:
        if name in buffers:
            buffers[name][...] = 0.0
    placeholder = np.zeros(1, dtype=np.float32)
    for i, step in enumerate(plan.steps):
        if step.kernel in host:
            host[step.kernel](buffers, *step.scalars)
            continue
        arrays = [buffers.get(a, placeholder) for a in step.args]
        assert all(a.flags.c_contiguous and a.dtype == np.float32 for a in arrays)
        ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        scalars = (ctypes.c_int * max(1, len(step.scalars)))(*step.scalars)
        getattr(lib, f"emu_launch_{i}")(ptrs, scalars)
        assert not lib.emu_take_ptx_reached(), f"{step.kernel} reached inline PTX, which the emulator cannot run"
    return outputs


def emulated_failure(operation, problem, config, cache: Path, seed: int,
                     host: Mapping[str, Callable[..., None]] | None = None) -> str | None:
    """Why the config's plan fails verification under the emulator on fresh random inputs, or None
    (``host``: as run_emulated's)."""
    plan = operation.plan(problem, config)
    gen = np.random.default_rng(seed)
    inputs = {name: gen.standard_normal(shape, dtype=np.float32)
              for name, shape in reference.input_shapes(problem).items()}
    result = verify_outputs(problem, inputs, run_emulated(plan, inputs, cache, host))
    return None if result.passed else f"{problem.op} {problem.shape_string()} {config}: {result.message}"
