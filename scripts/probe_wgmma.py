#!/usr/bin/env python3
"""Which shared-memory layouts Hopper's wgmma reads TF32 operands from, checked on the GPU.

The groundwork of a wgmma formulation (sm_90a): one warpgroup computes a 64 x 128 tile of
C = A * B^T with ``wgmma.mma_async.m64n128k8.f32.tf32.tf32``, both operands K-major in shared
memory (the only layout wgmma takes for 32-bit operands), K staged 32 floats at a time, and each
accumulator register stored where the PTX fragment layout puts it (warp w of the group: rows
16w + g and 16w + g + 8; register 4j + e: column 8j + 2*tig + e % 2). Each layout below is checked
against float64 on fresh random data (TF32 products: a relative error under 2e-3 passes):

* ``swizzle128``: rows of 128 bytes, the 16-byte chunk c of row r stored at c ^ (r % 8); descriptor
  with 128-byte swizzling, stride 1024 bytes between 8-row groups (leading offset unused, tried at
  0 and 16 bytes); a k-step of 8 floats advances the start address by 32 bytes.
* ``interleave``: no swizzling; 8-row x 16-byte core matrices stored whole, [rows/8][K/4][8][4];
  leading byte offset = the step between core matrices along K (128), stride byte offset = the
  step between 8-row groups ((K/4) * 128); a k-step advances by two core matrices (256 bytes).
* ``interleave-swapped``: the two offsets the other way round, which must fail (it shows the check
  can fail).

Measured on an H100: swizzle128 (both leading offsets) and interleave pass with
7e-4..1e-3 relative error; interleave-swapped fails (1.4). Needs nvcc (for sm_90a) and CuPy on a
Hopper GPU:

    python scripts/probe_wgmma.py
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

N = 128
BK = 32
LAYOUTS = (("swizzle128", 0, 0), ("swizzle128", 0, 16), ("interleave", 1, 0), ("interleave-swapped", 2, 0))


def source() -> str:
    """The probe kernel (CUDA C++ for sm_90a)."""
    regs = N // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    operands = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return f"""
#include <cstdint>
constexpr int N = {N}, BK = {BK};
// A wgmma matrix descriptor: start address, leading and stride byte offsets (all >> 4), swizzle mode.
__device__ __forceinline__ uint64_t descriptor(uint32_t addr, uint32_t lbo, uint32_t sbo, uint32_t swizzle) {{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16
         | (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | (uint64_t)swizzle << 62;
}}
__device__ __forceinline__ void mma(float (&d)[{regs}], uint64_t da, uint64_t db) {{
    asm volatile("wgmma.mma_async.sync.aligned.m64n{N}k8.f32.tf32.tf32 {{{outs}}}, %{regs}, %{regs + 1}, 1, 1, 1;\\n"
                 : {operands} : "l"(da), "l"(db));
}}
// Where element (r, k) of a rows x BK tile lives (floats from the tile's start).
__device__ __forceinline__ int place(int layout, int r, int k) {{
    if (layout == 0) return r * BK + (((k >> 2) ^ (r & 7)) << 2) + (k & 3);
    return ((r >> 3) * (BK / 4) + (k >> 2)) * 32 + (r & 7) * 4 + (k & 3);
}}
extern "C" __global__ void __launch_bounds__(128)
probe(const float* A, const float* B, float* C, int K, int layout, int lbo) {{
    extern __shared__ __align__(1024) float smem[];
    float* As = smem;            // 64 x BK
    float* Bs = smem + 64 * BK;  // N x BK
    float d[{regs}];
    for (int i = 0; i < {regs}; ++i) d[i] = 0.0f;
    const int t = threadIdx.x;
    for (int k0 = 0; k0 < K; k0 += BK) {{
        for (int e = t; e < 64 * BK; e += 128) As[place(layout, e / BK, e % BK)] = A[(e / BK) * K + k0 + e % BK];
        for (int e = t; e < N * BK; e += 128) Bs[place(layout, e / BK, e % BK)] = B[(e / BK) * K + k0 + e % BK];
        // Ordinary stores are seen by the tensor cores' (async proxy) reads only after this fence.
        asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
        __syncthreads();
        asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
        const uint32_t a0 = (uint32_t)__cvta_generic_to_shared(As), b0 = (uint32_t)__cvta_generic_to_shared(Bs);
        for (int ks = 0; ks < BK / 8; ++ks) {{
            if (layout == 0)
                mma(d, descriptor(a0 + ks * 32, lbo, 1024, 1), descriptor(b0 + ks * 32, lbo, 1024, 1));
            else if (layout == 1)
                mma(d, descriptor(a0 + ks * 256, 128, (BK / 4) * 128, 0), descriptor(b0 + ks * 256, 128, (BK / 4) * 128, 0));
            else
                mma(d, descriptor(a0 + ks * 256, (BK / 4) * 128, 128, 0), descriptor(b0 + ks * 256, (BK / 4) * 128, 128, 0));
        }}
        asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
        __syncthreads();
    }}
    const int warp = t >> 5, g = (t & 31) >> 2, tig = t & 3;
    for (int j = 0; j < N / 8; ++j) {{
        const int r = warp * 16 + g, c = j * 8 + 2 * tig;
        C[r * N + c] = d[4 * j];            C[r * N + c + 1] = d[4 * j + 1];
        C[(r + 8) * N + c] = d[4 * j + 2];  C[(r + 8) * N + c + 1] = d[4 * j + 3];
    }}
}}
"""


def build(workdir: Path) -> Path:
    src, cubin = workdir / "probe_wgmma.cu", workdir / "probe_wgmma.cubin"
    src.write_text(source())
    done = subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-o", str(cubin), str(src)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"nvcc failed for sm_90a:\n{done.stderr}")
    return cubin


def main() -> int:
    import cupy as cp
    import numpy as np

    major = cp.cuda.Device().compute_capability[:1]
    if major != "9":
        raise SystemExit(f"wgmma needs a Hopper GPU (compute capability 9.x); this one is "
                         f"{cp.cuda.Device().compute_capability}")
    with tempfile.TemporaryDirectory() as tmp:
        kernel = cp.RawModule(path=str(build(Path(tmp)))).get_function("probe")
        rng = np.random.default_rng()
        failed = []
        for K in (BK, 8 * BK):
            a = rng.standard_normal((64, K)).astype(np.float32)
            b = rng.standard_normal((N, K)).astype(np.float32)
            ref = a.astype(np.float64) @ b.astype(np.float64).T
            for name, layout, lbo in LAYOUTS:
                c = cp.full((64, N), np.nan, dtype=cp.float32)   # every element must be written
                kernel((1,), (128,), (cp.asarray(a), cp.asarray(b), c, np.int32(K), np.int32(layout), np.int32(lbo)),
                       shared_mem=(64 + N) * BK * 4)
                err = float(np.nanmax(np.abs(c.get() - ref)) / np.abs(ref).max()) if not np.isnan(c.get()).any() else float("nan")
                ok = err < 2e-3
                if not ok:
                    failed.append(name)
                print(f"K={K:4d} {name:20s} leading offset {lbo:3d}: max relative error {err:.2e} {'pass' if ok else 'FAIL'}")
    # The swapped offsets are expected to fail; every other layout must pass.
    wrong = [n for n in failed if n != "interleave-swapped"]
    return 1 if wrong or "interleave-swapped" not in failed else 0


if __name__ == "__main__":
    sys.exit(main())
