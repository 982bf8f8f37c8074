"""A small emulation of the CUDA execution model on the CPU, for tests of generated kernels.

A plan's CUDA source is compiled as C++ (g++) with one OS thread per CUDA thread of a block, blocks
one after another, __syncthreads a barrier, shared memory one buffer, warp shuffles and atomics
emulated; each launch gets an extern "C" trampoline that walks its grid (3D grids block after block)
and runs the steps in the plan's order on NumPy buffers. Outputs and workspaces start as NaN (zeroed
where the plan zeroes them), so an element a kernel never wrote fails verification; threads that do
not all reach a barrier end the launch as deadlocked instead of hanging. It checks the
kernels' indexing, tiling, barriers and schedules without a GPU; it says nothing of speed, of the
GPU's rounding or resource limits, or of real concurrency (the GPU tests' part).

The inline PTX of the mma.sync formulations runs too (translate_ptx): the warp-collective
``mma.sync.m16n8k8`` on TF32 operands (each lane's fragments gathered through the warp's barrier,
the operands cut to their top 19 bits as the tensor cores read them) and ``m16n8k16`` on BF16 and
FP16 ones (exact products, summed in double and rounded once to FP32),
``cvt.rna.tf32.f32`` and ``cvt.rn.bf16x2.f32``,
``cp.async`` (a copy done at once, zero-filled past its source size; commit and wait do nothing)
and the vector shared-memory loads and stores, with shared addresses as 32-bit offsets the way the
kernels compute them. The Hopper statements (wgmma, TMA, the async proxy's fences) do not: a
kernel that reaches one fails its launch, and run_emulated can run such a step in NumPy instead.

Kernels of 16-bit tensors (bf16, fp16) run on host definitions of ``__nv_bfloat16`` and ``__half``
(a 16-bit pattern each) and of the conversions they call, bit for bit as the GPU's (round to nearest
even, NaN kept, float16 overflowing to Inf); their buffers are NumPy arrays of the storage
measurement.element_arrays gives (float16, and uint16 bit patterns for bfloat16).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Mapping

import numpy as np
import pytest

from autocnn.kernels.steps import Launch
from autocnn.measurement.measure import output_buffers, random_inputs, verify_outputs
from tests.plan_numpy import LIBRARY_STEPS, run_library_step

# The mark of a test that emulates kernels: the emulator compiles each plan's kernels with g++.
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")

PRELUDE = r"""
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __restrict__
#define __launch_bounds__(...)
alignas(16) float4 emu_smem[1 << 16];          // 1 MiB of "shared memory", one block at a time
// A barrier whose waits give up: threads that never all arrive (a lane that returned before a
// __syncthreads or a warp-collective the others reach) would hang the test run; instead a wait of
// more than EMU_WAIT_S marks the launch deadlocked, and every waiting thread leaves its kernel by
// an exception, so that the launch ends and reports it.
struct EmuDeadlock {};
static std::atomic<bool> emu_deadlocked{false};
constexpr int EMU_WAIT_S = 120;
struct EmuBarrier {
    explicit EmuBarrier(unsigned n) : count(n) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(mutex);
        const unsigned long long mine = phase;
        if (++waiting == count) {
            waiting = 0;
            ++phase;
            cv.notify_all();
            return;
        }
        while (phase == mine && !emu_deadlocked)
            if (cv.wait_for(lock, std::chrono::seconds(EMU_WAIT_S)) == std::cv_status::timeout && phase == mine)
                emu_deadlocked = true;
        if (phase == mine) throw EmuDeadlock{};
    }
    std::mutex mutex;
    std::condition_variable cv;
    const unsigned count;
    unsigned waiting = 0;
    unsigned long long phase = 0;
};
extern "C" int emu_take_deadlocked() { return emu_deadlocked.exchange(false); }
static EmuBarrier* emu_block_barrier;
static std::vector<std::unique_ptr<EmuBarrier>> emu_warp_barriers;
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
// A shared address is a 32-bit offset, as the kernels keep it ("r" operands): here the offset from
// emu_smem, which also reaches the blocks' static arrays (function-local statics of this library).
inline size_t __cvta_generic_to_shared(const void* p) {
    const long long d = static_cast<const char*>(p) - reinterpret_cast<const char*>(emu_smem);
    if (d != static_cast<int>(d)) { fprintf(stderr, "emulator: a shared object beyond 32-bit offsets\n"); abort(); }
    return static_cast<unsigned>(static_cast<int>(d));
}
inline char* emu_shared(unsigned a) { return reinterpret_cast<char*>(emu_smem) + static_cast<int>(a); }
// cvt.rna.tf32.f32: round to the nearest TF32 value, ties away from zero; Inf and NaN pass (the
// NaN canonical, as the instruction gives it).
inline unsigned emu_cvt_rna_tf32(float x) {
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return (u & 0x007fffffu) ? 0x7fffffffu : u;
    return (u + 0x1000u) & 0xffffe000u;
}
// cp.async: src_bytes of bytes copied at once, the rest zero-filled.
inline void emu_cp_async(unsigned dst, const void* src, int bytes, int src_bytes) {
    const int n = src_bytes < 0 ? 0 : src_bytes < bytes ? src_bytes : bytes;
    std::memcpy(emu_shared(dst), src, n);
    std::memset(emu_shared(dst) + n, 0, bytes - n);
}
template <class T> inline void emu_ld_shared_v4(unsigned a, T& x, T& y, T& z, T& w) {
    T v[4];
    std::memcpy(v, emu_shared(a), sizeof v);
    x = v[0], y = v[1], z = v[2], w = v[3];
}
template <class T> inline void emu_st_shared_v4(unsigned a, T x, T y, T z, T w) {
    const T v[4] = {x, y, z, w};
    std::memcpy(emu_shared(a), v, sizeof v);
}
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
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, D = A B + C for the warp: each lane posts its
// fragments, every lane computes its own four elements of D from all of them, then the warp waits
// again so that no lane's next mma overwrites fragments still being read. The fragment layouts are
// PTX's (group g = lane / 4, q = lane % 4): A's a0..a3 at (g, q), (g + 8, q), (g, q + 4),
// (g + 8, q + 4); B's b0, b1 at (k = q, n = g), (q + 4, g); C's and D's c0..c3 at (g, 2q), (g, 2q + 1),
// (g + 8, 2q), (g + 8, 2q + 1). The products of TF32 values are exact in double; the sum is rounded
// once to FP32 (the tensor cores' own rounding of the sum differs in its last bits).
static unsigned emu_mma_a[1024][4], emu_mma_b[1024][2];
// What both mmas share: each lane posts its registers, then computes its D elements c0..c3 (rows
// g, g, g + 8, g + 8; columns 2q, 2q + 1) as sum(base, r, n, c) over the warp's posted registers
// (base: the warp's first thread), then waits again.
template <class Sum>
inline void emu_mma_warp(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned a2,
                         unsigned a3, unsigned b0, unsigned b1, float c0, float c1, float c2, float c3, Sum sum) {
    auto& warp = *emu_warp_barriers[threadIdx.x / 32];
    const unsigned t = threadIdx.x, base = t / 32 * 32, g = t % 32 / 4, q = t % 4;
    emu_mma_a[t][0] = a0, emu_mma_a[t][1] = a1, emu_mma_a[t][2] = a2, emu_mma_a[t][3] = a3;
    emu_mma_b[t][0] = b0, emu_mma_b[t][1] = b1;
    warp.arrive_and_wait();
    const float c[4] = {c0, c1, c2, c3};
    float d[4];
    for (int i = 0; i < 4; ++i) d[i] = (float)sum(base, g + 8 * (i >> 1), 2 * q + (i & 1), (double)c[i]);
    warp.arrive_and_wait();
    d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3];
}
inline float emu_tf32_operand(unsigned r) { return __uint_as_float(r & 0xffffe000u); }
inline void emu_mma_m16n8k8_tf32(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned a2,
                                 unsigned a3, unsigned b0, unsigned b1, float c0, float c1, float c2, float c3) {
    emu_mma_warp(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3,
                 [](unsigned base, unsigned r, unsigned n, double sum) {
                     for (unsigned k = 0; k < 8; ++k)
                         sum += (double)emu_tf32_operand(emu_mma_a[base + r % 8 * 4 + k % 4][(r >= 8) + 2 * (k >= 4)])
                              * (double)emu_tf32_operand(emu_mma_b[base + n * 4 + k % 4][k >= 4]);
                     return sum;
                 });
}
// cvt.rn.bf16x2.f32 d, a, b: a to BF16 in the high half, b in the low, each rounded to nearest even
// (a NaN becomes the canonical BF16 NaN, as the instruction gives it).
inline unsigned emu_bf16_rn(float x) {
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return 0x7fffu;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
inline unsigned emu_cvt_rn_bf16x2(float hi, float lo) { return emu_bf16_rn(hi) << 16 | emu_bf16_rn(lo); }
inline float emu_bf16_value(unsigned h) { return __uint_as_float((h & 0xffffu) << 16); }
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: as the TF32 one, with two 16-bit values a
// register (the lower k in the low half), read by Value. A's registers a0..a3 hold (g, 2q..2q+1),
// (g + 8, 2q..), (g, 2q + 8..), (g + 8, 2q + 8..); B's b0, b1 hold (k = 2q..2q+1, n = g), (2q + 8.., g).
// The products of BF16 or FP16 values are exact in double; the sum is rounded once to FP32.
template <float (*Value)(unsigned)>
inline void emu_mma_m16n8k16(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned a2,
                             unsigned a3, unsigned b0, unsigned b1, float c0, float c1, float c2, float c3) {
    emu_mma_warp(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3,
                 [](unsigned base, unsigned r, unsigned n, double sum) {
                     for (unsigned k = 0; k < 16; ++k) {
                         const unsigned lane = k % 8 / 2, half = 16 * (k & 1);
                         const unsigned a = emu_mma_a[base + r % 8 * 4 + lane][(r >= 8) + 2 * (k >= 8)] >> half;
                         const unsigned b = emu_mma_b[base + n * 4 + lane][k >= 8] >> half;
                         sum += (double)Value(a) * (double)Value(b);
                     }
                     return sum;
                 });
}
// emu_half_value is defined with __half2float below.
inline float emu_half_value(unsigned h);
// 16-bit storage types and the conversions of cuda_bf16.h and cuda_fp16.h the kernels call, as the
// GPU computes them: float to 16 bits rounds to nearest even, keeps NaN a NaN and takes float16 past
// its largest finite value (65504, from 65520 on) to Inf; 16 bits to float is exact.
struct __nv_bfloat16 { unsigned short __x; };
struct __half { unsigned short __x; };
inline float __bfloat162float(__nv_bfloat16 v) { return emu_bf16_value(v.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {static_cast<unsigned short>(emu_bf16_rn(f))}; }
inline float __half2float(__half v) {
    const unsigned sign = (v.__x & 0x8000u) << 16, e = (v.__x >> 10) & 0x1fu, m = v.__x & 0x3ffu;
    if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) return (sign ? -1.0f : 1.0f) * static_cast<float>(m) * 5.9604644775390625e-8f;   // m * 2^-24
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
inline float emu_half_value(unsigned h) { return __half2float(__half{static_cast<unsigned short>(h & 0xffffu)}); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return {bits}; }
inline __half __ushort_as_half(unsigned short bits) { return {bits}; }
inline __half __float2half_rn(float f) {
    const unsigned u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return {static_cast<unsigned short>(sign | 0x7e00u)};          // NaN
    if (a >= 0x477ff000u) return {static_cast<unsigned short>(sign | 0x7c00u)};         // 65520 and up: Inf
    if (a < 0x38800000u)   // below 2^-14: a multiple of 2^-24, rounded to nearest even (exact scaling)
        return {static_cast<unsigned short>(sign | static_cast<unsigned>(nearbyintf(__uint_as_float(a) * 16777216.0f)))};
    const unsigned r = a - 0x38000000u;   // the exponent's bias from 127 to 15
    return {static_cast<unsigned short>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13))};
}
// A buffer's address as whatever pointer type the kernel takes for it.
struct EmuPtr {
    void* p;
    template <class T> operator T*() const { return static_cast<T*>(p); }
};
static void emu_run(unsigned grid, unsigned block, const std::function<void()>& kernel) {
    blockDim.x = block;   // gridDim: the launch's trampoline sets it (a 3D grid walks as grid = x*y*z blocks)
    EmuBarrier bar(block);
    emu_block_barrier = &bar;
    emu_warp_barriers.clear();
    for (unsigned w = 0; w < (block + 31) / 32; ++w)
        emu_warp_barriers.emplace_back(new EmuBarrier(block - 32 * w < 32 ? block - 32 * w : 32));
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t)
        threads.emplace_back([&, t] {
            threadIdx.x = t;
            try {
                for (unsigned b = 0; b < grid; ++b) {
                    blockIdx.x = b;
                    kernel();
                    bar.arrive_and_wait();   // the next block reuses the shared memory
                }
            } catch (const EmuDeadlock&) {   // the launch is reported deadlocked (emu_take_deadlocked)
            }
        });
    for (auto& th : threads) th.join();
}
"""

HOST_MIN = "#include <algorithm>\nusing std::max;\nusing std::min;\n"   # CUDA's integer min() and max() on the host


def _unquoted(text: str, start: int = 0):
    """(index, character, depth) of each character of text from start that lies outside its string
    literals; depth counts the (, [ and { open before it (a closing one counts as outside)."""
    depth, quoted, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if quoted:
            quoted, escaped = (escaped or ch != '"'), (not escaped and ch == "\\")
            continue
        if ch == '"':
            quoted = True
            continue
        depth -= ch in ")]}"
        yield i, ch, depth
        depth += ch in "([{"


def _asm_extent(source: str, start: int) -> int:
    """The index just past the parenthesis that closes the asm statement whose "(" ends at start."""
    return next(i for i, ch, depth in _unquoted(source, start) if depth < 0) + 1


def _split_top(text: str, sep: str) -> list[str]:
    """text split at each (one-character) sep outside strings, parentheses, brackets and braces."""
    cuts = [i for i, ch, depth in _unquoted(text) if depth == 0 and ch == sep]
    return [text[a + 1:b] for a, b in zip([-1] + cuts, cuts + [len(text)])]


def _asm_parts(inner: str) -> tuple[str, list[str]]:
    """(the PTX text, the operand expressions in %-number order) of an asm statement's inside."""
    sections = _split_top(inner, ":")
    text = "".join(bytes(lit, "utf-8").decode("unicode_escape")
                   for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', sections[0]))
    operands = []
    for section in sections[1:3]:
        for operand in _split_top(section, ","):
            match = re.fullmatch(r'\s*"[^"]*"\s*\((.*)\)\s*', operand, re.S)
            if match:
                operands.append(f"({match.group(1)})")
    return text, operands


def _ptx_call(text: str, operands: list[str]) -> str:
    """The C++ that does what one PTX statement does (the prelude's emu_* functions), or emu_ptx()
    for one the emulator cannot run."""
    statement = text.strip().rstrip(";").strip()
    opcode, _, rest = statement.partition(" ")

    def value(token: str) -> str:
        token = token.strip()
        return operands[int(token[1:])] if token.startswith("%") else token

    args = [a.strip() for a in _split_top(rest, ",")] if rest.strip() else []
    group = lambda a: [value(t) for t in a.strip("{}[] ").split(",")]            # noqa: E731
    if not statement:
        return "(void)0"       # asm volatile("" ::: "memory"): a compiler barrier, no instruction
    if opcode == "cvt.rna.tf32.f32":
        return f"({value(args[0])} = emu_cvt_rna_tf32({value(args[1])}))"
    if opcode == "cvt.rn.bf16x2.f32":
        return f"({value(args[0])} = emu_cvt_rn_bf16x2({value(args[1])}, {value(args[2])}))"
    if opcode == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32":
        d, a, b, c = (group(x) for x in args)
        return f"emu_mma_m16n8k16<emu_bf16_value>({', '.join(d + a + b + c)})"
    if opcode == "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32":
        d, a, b, c = (group(x) for x in args)
        return f"emu_mma_m16n8k16<emu_half_value>({', '.join(d + a + b + c)})"
    if opcode == "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32":
        d, a, b, c = (group(x) for x in args)
        # C is read into the call's parameters before D is written, as mma reads before it writes.
        return f"emu_mma_m16n8k8_tf32({', '.join(d + a + b + c)})"
    if opcode in ("cp.async.ca.shared.global", "cp.async.cg.shared.global"):
        dst, src, size = group(args[0])[0], group(args[1])[0], value(args[2])
        return f"emu_cp_async({dst}, {src}, {size}, {value(args[3]) if len(args) > 3 else size})"
    if opcode in ("cp.async.commit_group", "cp.async.wait_group", "cp.async.wait_all"):
        return "(void)0"       # every copy is done when it is issued
    if opcode == "ld.shared.v4.f32":
        return f"emu_ld_shared_v4({group(args[1])[0]}, {', '.join(group(args[0]))})"
    if opcode in ("st.shared.v4.b32", "st.shared.v4.f32"):
        return f"emu_st_shared_v4({group(args[0])[0]}, {', '.join(group(args[1]))})"
    return "emu_ptx()"


def translate_ptx(source: str) -> str:
    """``source`` with each inline PTX statement (``asm(...)``, ``asm volatile(...)``) replaced by
    the C++ that does its work (_ptx_call), or by a call of emu_ptx(), which marks the launch that
    reaches it as failed, for one the emulator cannot run (the host's compiler cannot take PTX)."""
    out, pos = [], 0
    for match in re.finditer(r"\basm\b(\s+volatile)?\s*\(", source):
        if match.start() < pos:
            continue
        end = _asm_extent(source, match.end())
        out += [source[pos:match.start()], _ptx_call(*_asm_parts(source[match.end():end - 1]))]
        pos = end
    return "".join(out) + source[pos:]


def emulated_source(plan, host: Collection[str] = ()) -> str:
    """The plan's CUDA source as C++ for the emulator, with one extern "C" trampoline per launch.
    The kernels named in ``host`` (ones whose inline PTX the emulator cannot run: wgmma) are left
    as inline functions that are never emitted, so their PTX never reaches the assembler, and get
    no trampoline: run_emulated runs those steps on the host."""
    # Dynamic shared memory is the emulator's buffer; a static __shared__ array is one object that
    # all threads of the (one running) block see, as a function-local static is.
    body = re.sub(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w+)\s+(\w+)\[\];",
                  r"\1* \2 = reinterpret_cast<\1*>(emu_smem);", plan.source)
    body = body.replace("__shared__", "static")
    # The prelude defines what the CUDA headers of 16-bit types would (the host compiler has neither).
    body = re.sub(r"#include <cuda_(?:bf16|fp16)\.h>\n", "", body)
    body = translate_ptx(body)
    for name in host:
        body, count = re.subn(rf'extern "C"(\s+__global__\s+void\s+__launch_bounds__\([^)]*\)\s+{name}\()',
                              r"inline\1", body)
        assert count == 1, f"no kernel {name} in the plan's source"
    trampolines = []
    for i, step in enumerate(plan.steps):
        if step.kernel in host or isinstance(step, LIBRARY_STEPS):
            continue
        assert isinstance(step, Launch), f"the emulator runs generated kernels only, not {step.kernel}"
        assert step.block[1] == step.block[2] == 1, "the emulator runs 1D blocks"
        gx, gy, gz = step.grid
        args = [f"EmuPtr{{bufs[{a}]}}" for a in range(len(step.args))]
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


# g++'s options for every emulated library. The prelude's headers (<thread>, <functional>, ...) are
# most of a library's compile time, so where a source starts with PRELUDE it is compiled once per
# machine as a precompiled header, under these same options (a header compiled otherwise is refused).
GXX_OPTIONS = ("-std=c++20", "-O1", "-w", "-fPIC", "-pthread")


@functools.cache
def _precompiled_prelude() -> Path | None:
    """PRELUDE as a header with its precompiled form beside it (g++ reads prelude.h.gch for
    ``-include prelude.h``), in a temporary folder named by the prelude, the options and the
    compiler; None where g++ cannot make one (each library then compiles the prelude itself)."""
    version = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join((PRELUDE, *GXX_OPTIONS, version)).encode()).hexdigest()[:20]
    folder = Path(tempfile.gettempdir()) / f"autocnn-emulator-{os.getuid()}-{key}"
    header = folder / "prelude.h"
    if (folder / "prelude.h.gch").exists():
        return header
    folder.mkdir(parents=True, exist_ok=True)
    # Written under names of this process's, then renamed: another process may be making them too.
    part = folder / f"prelude.{os.getpid()}.h"
    part.write_text(PRELUDE)
    os.replace(part, header)
    gch = folder / f"prelude.h.{os.getpid()}.gch"
    done = subprocess.run(["g++", *GXX_OPTIONS, "-x", "c++-header", str(header), "-o", str(gch)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return None
    os.replace(gch, folder / "prelude.h.gch")
    return header


def compile_library(source: str, cache: Path, what: object = "") -> ctypes.CDLL:
    """C++ for the emulator (the prelude included by the caller) as a loaded shared library,
    cached in ``cache`` by the source's hash; ``what`` names it if g++ fails."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    lib = cache / f"{digest}.so"
    if not lib.exists():
        src = cache / f"{digest}.cpp"
        header = _precompiled_prelude() if source.startswith(PRELUDE) else None
        if header is None:
            src.write_text(source)
            include = []
        else:   # the same translation unit: the prelude first, then the rest
            src.write_text(source[len(PRELUDE):])
            include = ["-include", str(header)]
        done = subprocess.run(["g++", *GXX_OPTIONS, "-shared", *include, str(src), "-o", str(lib)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"g++ failed on {what}:\n{done.stderr[-4000:]}"
    return ctypes.CDLL(str(lib))


def build(plan, cache: Path, host: Collection[str] = ()) -> ctypes.CDLL:
    """The plan compiled for the emulator (cached in ``cache`` by the source's hash)."""
    return compile_library(emulated_source(plan, host), cache, plan.config)


def run_emulated(plan, inputs: dict[str, np.ndarray], cache: Path,
                 host: Mapping[str, Callable[..., None]] | None = None) -> dict[str, np.ndarray]:
    """Run every step of the plan on NaN-poisoned outputs and workspaces; returns the outputs.
    ``host`` maps kernels the emulator cannot run to functions that do their part on the buffers
    (``f(buffers, *scalars)``, NumPy on the same arrays), in the plan's order. The library steps
    (cuBLAS's GEMMs, cuFFT's transforms) run in NumPy on the float32 buffers they name
    (tests/plan_numpy.py): the generated kernels around them are what is emulated. Inputs and
    outputs are of the problem's element types (measure.random_inputs and output_buffers)."""
    host = host or {}
    lib = build(plan, cache, tuple(host))
    outputs = output_buffers(plan.problem, np)
    buffers = {**inputs, **outputs}
    buffers.update({name: np.full(max(1, n), np.nan, dtype=np.float32) for name, n in plan.workspaces})
    for name in plan.zero_first:
        if name in buffers:
            buffers[name][...] = 0.0
    placeholder = np.zeros(1, dtype=np.float32)
    flat = {name: a.reshape(-1) for name, a in buffers.items()}   # views: the library steps' offsets are flat
    for i, step in enumerate(plan.steps):
        if step.kernel in host:
            host[step.kernel](buffers, *step.scalars)
            continue
        if isinstance(step, LIBRARY_STEPS):
            run_library_step(step, flat)
            continue
        arrays = [buffers.get(a, placeholder) for a in step.args]
        assert all(a.flags.c_contiguous for a in arrays)
        ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        scalars = (ctypes.c_int * max(1, len(step.scalars)))(*step.scalars)
        getattr(lib, f"emu_launch_{i}")(ptrs, scalars)
        assert not lib.emu_take_ptx_reached(), f"{step.kernel} reached inline PTX, which the emulator cannot run"
        assert not lib.emu_take_deadlocked(), (
            f"{step.kernel} deadlocked: the threads of a block or a warp did not all reach a barrier "
            f"(__syncthreads, a shuffle or an mma) within the emulator's wait")
    return outputs


def emulated_failure(operation, problem, config, cache: Path, seed: int,
                     host: Mapping[str, Callable[..., None]] | None = None) -> str | None:
    """Why the config's plan fails verification under the emulator on fresh random inputs, or None
    (``host``: as run_emulated's)."""
    plan = operation.plan(problem, config)
    inputs = random_inputs(problem, np, seed)
    result = verify_outputs(problem, inputs, run_emulated(plan, inputs, cache, host))
    return None if result.passed else f"{problem.op} {problem.shape_string()} {config}: {result.message}"


def emulation_failures(operation, problems: Iterable[tuple[str, Any]],
                       configs: Callable[[Any, random.Random], list], cache: Path, seed: int) -> tuple[list[str], int]:
    """``configs(problem, rng)`` of each (name, problem) run under the emulator, the i-th case on
    inputs of seed + i and its configs drawn from random.Random(seed + i) (i counts the cases
    before it): the failures, each named by its problem, and how many cases ran."""
    failures, checked = [], 0
    for name, problem in problems:
        for config in configs(problem, random.Random(seed + checked)):
            why = emulated_failure(operation, problem, config, cache, seed + checked)
            checked += 1
            if why:
                failures.append(f"{name}: {why}")
    return failures, checked
