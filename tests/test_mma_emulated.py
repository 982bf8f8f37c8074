"""The tensor-core kernels (mma.sync m16n8k8 on TF32) run by the CPU emulator of
tests/cuda_emulator.py, so that their indexing, fragments, pipelines and 3xTF32 splits are checked
on every CI run, not only on a GPU host: the tc formulation of all three convolutions, winograd's
PRODUCTS "mma" and fft's MAC "mma", in both precisions, on shapes that divide nothing evenly,
every element against float64 at the bound of the problem's precision. The emulator's own
translation of the PTX (the rounding of cvt.rna.tf32.f32, the operands the mma reads, the fragment
layouts) is checked first, against NumPy.

The emulator says nothing of speed, and its sums round differently from the tensor cores' in the
last bits: the GPU tests (-m gpu) remain the word on the hardware."""
from __future__ import annotations

import ctypes
import dataclasses
import random
import shutil

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import OPERATIONS, reference
from autocnn.kernels.codegen import environment
from autocnn.kernels.problem import PROBLEM_TYPES
from autocnn.kernels.suite import odd_problems
from autocnn.measurement.measure import verify_outputs
from tests.cuda_emulator import PRELUDE, compile_library, emulated_failure, run_emulated, translate_ptx
from tests.formulation_checks import EMULATIONS, build_sample
from tests.test_fft import small_problems as fft_problems
from tests.test_precision import to_bf16, to_tf32
from tests.test_winograd import wgmma_problems as winograd_problems

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")

OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
PRECISIONS = ("fp32", "tf32")
LIMITS = DeviceLimits.for_arch("sm_90")


def _library(tmp_path, body: str, prelude: str = PRELUDE) -> ctypes.CDLL:
    """The emulator's prelude and ``body`` (its PTX translated) as a shared library."""
    return compile_library(prelude + translate_ptx(body), tmp_path, "the unit test's source")


def test_the_emulated_cvt_rounds_to_tf32_as_the_instruction_does(tmp_path):
    """cvt.rna.tf32.f32 as the templates write it: round to nearest, ties away from zero, on random
    values of every magnitude, exact ties of both signs, and the infinities."""
    lib = _library(tmp_path, """
extern "C" void round_all(const float* x, unsigned* out, int n) {
    for (int i = 0; i < n; ++i) {
        unsigned r;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x[i]));
        out[i] = r;
    }
}
""")
    gen = np.random.default_rng()
    x = (gen.standard_normal(20000) * np.exp2(gen.integers(-60, 60, 20000))).astype(np.float32)
    x = np.concatenate([x, (x.view(np.uint32) & 0xFFFFE000 | 0x1000).view(np.float32),    # exact ties
                        np.float32([np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38])])
    out = np.empty(x.size, dtype=np.uint32)
    lib.round_all(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(x.size))
    finite = np.isfinite(x)
    assert np.array_equal(out[finite], to_tf32(x[finite]).view(np.uint32))
    assert np.array_equal(out[~finite], x[~finite].view(np.uint32))
    assert np.all(out & 0x1FFF == 0)


def test_the_emulated_mma_is_the_product_of_the_operands_top_19_bits(tmp_path):
    """One warp runs the templates' own mma (the macro of _mma_sync.cuh.j2) on a 16 x 8 A and an
    8 x 8 B loaded in PTX's fragment layouts: D = A B + C with each operand cut to its top 19 bits
    (what the tensor cores read of a register), not the FP32 product."""
    mma = environment().from_string('{% from "_mma_sync.cuh.j2" import mma_m16n8k8 %}{{ mma_m16n8k8() }}').render()
    lib = _library(tmp_path, mma + """
extern "C" void one_tile(const float* a, const float* b, const float* c, float* d) {
    emu_run(1u, 32u, [&] {
        const unsigned lane = threadIdx.x, g = lane / 4, q = lane % 4;
        const unsigned fa[4] = {__float_as_uint(a[g * 8 + q]), __float_as_uint(a[(g + 8) * 8 + q]),
                                __float_as_uint(a[g * 8 + q + 4]), __float_as_uint(a[(g + 8) * 8 + q + 4])};
        const unsigned fb[2] = {__float_as_uint(b[q * 8 + g]), __float_as_uint(b[(q + 4) * 8 + g])};
        float acc[4] = {c[g * 8 + 2 * q], c[g * 8 + 2 * q + 1], c[(g + 8) * 8 + 2 * q], c[(g + 8) * 8 + 2 * q + 1]};
        mma(acc, fa, fb);
        d[g * 8 + 2 * q] = acc[0], d[g * 8 + 2 * q + 1] = acc[1];
        d[(g + 8) * 8 + 2 * q] = acc[2], d[(g + 8) * 8 + 2 * q + 1] = acc[3];
    });
}
""")
    gen = np.random.default_rng()
    a, b, c = (gen.standard_normal(shape).astype(np.float32) for shape in ((16, 8), (8, 8), (16, 8)))
    d = np.full((16, 8), np.nan, dtype=np.float32)
    lib.one_tile(*(m.ctypes.data_as(ctypes.c_void_p) for m in (a, b, c, d)))
    top = lambda m: (m.view(np.uint32) & 0xFFFFE000).view(np.float32).astype(np.float64)   # noqa: E731
    expected = top(a) @ top(b) + c
    assert np.allclose(d, expected, rtol=1e-6, atol=1e-6)
    full = a.astype(np.float64) @ b.astype(np.float64) + c
    assert np.abs(d - full).max() > 1e-5        # the low 13 bits of each operand were dropped


def test_the_cross_mma_sums_both_cross_products_in_bf16(tmp_path):
    """One warp runs _mma_sync.cuh.j2's mma_cross (CROSS: one m16n8k16 BF16 mma) on the fp32
    fragments of a 16 x 8 A and an 8 x 8 B: D = C + bf16(x_a) bf16(rest_b) + bf16(rest_a) bf16(x_b)
    summed over the 8 terms, rest = x - tf32(x) rounded to nearest, each register formed from the
    lane's own m16n8k8 fragments; with the TF32 big x big mma it is the product within about 2**-17."""
    mma = environment().from_string('{% from "_mma_sync.cuh.j2" import mma_m16n8k8, mma_cross_m16n8k16 %}'
                                    '{{ mma_m16n8k8() }}{{ mma_cross_m16n8k16() }}').render()
    lib = _library(tmp_path, mma + """
extern "C" void one_tile(const float* a, const float* b, const float* c, float* d, float* full) {
    emu_run(1u, 32u, [&] {
        const unsigned lane = threadIdx.x, g = lane / 4, q = lane % 4;
        float x[4] = {a[g * 8 + q], a[(g + 8) * 8 + q], a[g * 8 + q + 4], a[(g + 8) * 8 + q + 4]};
        float y[2] = {b[q * 8 + g], b[(q + 4) * 8 + g]};
        unsigned xb[4], yb[2];
        float xr[4], yr[2];
        for (int i = 0; i < 4; ++i) split_cross(x[i], xb[i], xr[i]);
        for (int i = 0; i < 2; ++i) split_cross(y[i], yb[i], yr[i]);
        float acc[4] = {c[g * 8 + 2 * q], c[g * 8 + 2 * q + 1], c[(g + 8) * 8 + 2 * q], c[(g + 8) * 8 + 2 * q + 1]};
        mma_cross(acc, x, xr, y, yr);
        d[g * 8 + 2 * q] = acc[0], d[g * 8 + 2 * q + 1] = acc[1];
        d[(g + 8) * 8 + 2 * q] = acc[2], d[(g + 8) * 8 + 2 * q + 1] = acc[3];
        mma(acc, xb, yb);
        full[g * 8 + 2 * q] = acc[0], full[g * 8 + 2 * q + 1] = acc[1];
        full[(g + 8) * 8 + 2 * q] = acc[2], full[(g + 8) * 8 + 2 * q + 1] = acc[3];
    });
}
""")
    gen = np.random.default_rng()
    a, b = (gen.standard_normal(shape).astype(np.float32) for shape in ((16, 8), (8, 8)))
    c = np.zeros((16, 8), dtype=np.float32)
    d, full = (np.full((16, 8), np.nan, dtype=np.float32) for _ in range(2))
    lib.one_tile(*(m.ctypes.data_as(ctypes.c_void_p) for m in (a, b, c, d, full)))
    ra, rb = (m - to_tf32(m) for m in (a, b))
    f64 = lambda m: to_bf16(m).astype(np.float64)   # noqa: E731
    cross = f64(a) @ f64(rb) + f64(ra) @ f64(b)
    assert np.allclose(d, cross, rtol=1e-6, atol=1e-9)
    assert np.abs(cross).max() > 1e-4               # the cross products are there, not zero
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(full - exact).max() <= 2.0**-16 * (np.abs(a).astype(np.float64) @ np.abs(b)).max()


def test_a_launch_whose_threads_miss_a_barrier_ends_and_says_so(tmp_path):
    """A lane that returns before a __syncthreads the others reach would hang the emulator (and
    CI) forever; its barrier's wait gives up instead, every thread leaves, and the launch reports
    the deadlock. A launch whose threads all arrive reports none."""
    assert "constexpr int EMU_WAIT_S = 120;" in PRELUDE
    lib = _library(tmp_path, """
extern "C" void run(float* out, int leaver) {
    emu_run(3u, 64u, [&] {
        if ((int)threadIdx.x == leaver) return;
        __syncthreads();
        out[blockIdx.x * 64 + threadIdx.x] = 1.0f;
        __syncthreads();
    });
}
""", PRELUDE.replace("constexpr int EMU_WAIT_S = 120;", "constexpr int EMU_WAIT_S = 1;"))
    out = np.zeros(192, dtype=np.float32)
    lib.run(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(-1))
    assert lib.emu_take_deadlocked() == 0 and np.all(out == 1.0)
    lib.run(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(5))
    assert lib.emu_take_deadlocked() == 1
    assert lib.emu_take_deadlocked() == 0          # taken: the next launch starts clear


def test_an_emulated_tf32_kernel_meets_the_tf32_bound_and_not_the_fp32_one(tmp_path):
    """The emulated tensor cores keep TF32's precision: the tc forward's tf32 kernel (one product a
    term) passes the tf32 bound and fails the FP32 one on a 64-channel reduction, where the fp32
    kernel (3xTF32) passes the FP32 bound on the same inputs."""
    fp32 = dataclasses.replace(odd_problems("conv_fwd")[2][1], C=64)
    tf32 = dataclasses.replace(fp32, precision="tf32")
    gen = np.random.default_rng()
    inputs = {n: gen.standard_normal(s, dtype=np.float32) for n, s in reference.input_shapes(fp32).items()}
    outputs = {}
    for problem in (fp32, tf32):
        config = OPERATIONS["conv_fwd"].default_config(problem, LIMITS, formulation="tc")
        outputs[problem.precision] = run_emulated(OPERATIONS["conv_fwd"].plan(problem, config), inputs, tmp_path)
    assert verify_outputs(tf32, inputs, outputs["tf32"]).passed
    assert not verify_outputs(fp32, inputs, outputs["tf32"]).passed
    assert verify_outputs(fp32, inputs, outputs["fp32"]).passed


def _verify_all(cases, tmp_path) -> None:
    """Run each (name, problem, config) under the emulator on fresh random inputs; every failure
    reported with its seed."""
    seed = random.randrange(2**31)
    failures = []
    for i, (name, problem, config) in enumerate(cases):
        why = emulated_failure(OPERATIONS[problem.op], problem, config, tmp_path, seed + i)
        if why:
            failures.append(f"{name}: {why}")
    assert cases
    assert not failures, f"seed {seed}: {len(failures)} of {len(cases)} failed:\n" + "\n".join(failures[:6])


@pytest.mark.parametrize("emulations", EMULATIONS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", OPS)
def test_tc_kernels_verify_under_emulation(op, precision, emulations, tmp_path):
    """The tc formulation: the default of every odd shape (C not a multiple of 8, odd K, strides,
    asymmetric padding, batch 1) and two sampled configs of randomly chosen ones (stages, cp.async,
    fragment reads, NHWC staging, vector loads, TF32 rounding as the space offers them); the default
    run emulates a random sample of these cases, -m slow every one."""
    rng = random.Random()
    problems = [(n, dataclasses.replace(p, precision=precision)) for n, p in odd_problems(op)]
    defaults = {name: OPERATIONS[op].default_config(problem, LIMITS, formulation="tc") for name, problem in problems}
    cases = [(name, problem, defaults[name]) for name, problem in problems]
    for name, problem in rng.sample(problems, 2):
        space = OPERATIONS[op].space(problem, LIMITS).restrict({"formulation": "tc"})
        cases += [(name, problem, c) for c in space.sample(rng, 1, exclude=[defaults[name]])]
    _verify_all(build_sample(cases, emulations), tmp_path)


def _sixteen_bit_tc_cases(op: str, precision: str, shapes: int, sampled: int, rng: random.Random) -> list:
    """tc's default on the first ``shapes`` odd shapes and ``sampled`` sampled configs on each."""
    cases = []
    for name, problem in odd_problems(op)[:shapes]:
        problem = dataclasses.replace(problem, precision=precision)
        default = OPERATIONS[op].default_config(problem, LIMITS, formulation="tc")
        space = OPERATIONS[op].space(problem, LIMITS).restrict({"formulation": "tc"})
        cases += [(name, problem, c) for c in [default, *space.sample(rng, sampled, exclude=[default])]]
    return cases


@pytest.mark.parametrize("precision", ("bf16", "fp16"))
@pytest.mark.parametrize("op", OPS)
def test_sixteen_bit_tc_kernels_verify_under_emulation(op, precision, tmp_path):
    """tc on bf16 and fp16 (m16n8k16 mmas on the 16-bit operands as stored, the emulator's exact
    products): the default and one sampled config (fragment reads, 16-byte or single-element copies,
    cp.async, NHWC staging, TWO_PASS splits as the space offers them) on the first two odd shapes,
    every element against float64 at the precision's bound."""
    _verify_all(_sixteen_bit_tc_cases(op, precision, 2, 1, random.Random()), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ("bf16", "fp16"))
@pytest.mark.parametrize("op", OPS)
def test_more_sixteen_bit_tc_kernels_verify_under_emulation(op, precision, tmp_path):
    """The same on every odd shape, three sampled configs each."""
    _verify_all(_sixteen_bit_tc_cases(op, precision, len(odd_problems(op)), 3, random.Random()), tmp_path)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", OPS)
def test_winograd_mma_products_verify_under_emulation(op, precision, tmp_path):
    """winograd with PRODUCTS "mma" (the tc core over tiles x points x splits): a sampled config
    on each of the shapes the generated products take (odd sizes and channels, batch 1, a fused
    epilogue, a bias gradient). tf32 is held to F(2x2,3x3), as its GPU test is: F(4x4)'s transform
    constants with one TF32 product a term go past the tf32 bound (measured on an H100, and here)."""
    rng = random.Random()
    fixed = {"formulation": "winograd", "PRODUCTS": "mma", **({"TILE": 2} if precision == "tf32" else {})}
    cases = []
    for name, problem in winograd_problems(op):
        problem = dataclasses.replace(problem, precision=precision)
        space = OPERATIONS[op].space(problem, LIMITS).restrict(fixed)
        cases += [(name, problem, c) for c in space.sample(rng, 1)]
    _verify_all(cases, tmp_path)


@pytest.mark.parametrize("cases", EMULATIONS)
@pytest.mark.parametrize("op", OPS)
def test_cross_products_verify_under_emulation(op, cases, tmp_path):
    """CROSS=1 (fp32: 3xTF32's cross products as one BF16 mma) in the tc formulation, the first
    default with paired fragment reads on every odd shape; winograd's MMA_CROSS=1, a sampled config
    on each shape its products take; fft's MAC_CROSS=1 (MAC "mma"), a sampled config on a 7x5
    filter with asymmetric padding. Every element at the FP32 bound; the default run emulates three
    of these cases at random, `-m slow` all."""
    rng = random.Random()
    runs = []
    for name, problem in odd_problems(op):
        space = OPERATIONS[op].space(problem, LIMITS)
        default = OPERATIONS[op].default_config(problem, LIMITS, formulation="tc")
        runs.append((name, problem, space.validate({**default.as_dict(), "FRAG": "pair", "CROSS": 1})))
    fixed = {"formulation": "winograd", "PRODUCTS": "mma", "MMA_CROSS": 1}
    for name, problem in winograd_problems(op):
        problem = dataclasses.replace(problem, precision="fp32")
        runs += [(name, problem, c) for c in OPERATIONS[op].space(problem, LIMITS).restrict(fixed).sample(rng, 1)]
    name, problem = next((n, p) for n, p in fft_problems(op) if n == "f_7x5")
    problem = dataclasses.replace(problem, precision="fp32")
    fixed = {"formulation": "fft", "MAC": "mma", "MAC_CROSS": 1}
    runs += [(name, problem, c) for c in OPERATIONS[op].space(problem, LIMITS).restrict(fixed).sample(rng, 1)]
    _verify_all(build_sample(runs, cases), tmp_path)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", OPS)
def test_fft_mma_multiply_accumulate_verifies_under_emulation(op, precision, tmp_path):
    """fft with MAC "mma" (a warp a frequency, four real mmas a complex product): a sampled config
    on a 7x5 filter with asymmetric padding, its transforms whichever the sample takes (cuFFT's
    in NumPy, the generated direct ones emulated)."""
    rng = random.Random()
    name, problem = next((n, p) for n, p in fft_problems(op) if n == "f_7x5")
    problem = dataclasses.replace(problem, precision=precision)
    space = OPERATIONS[op].space(problem, LIMITS).restrict({"formulation": "fft", "MAC": "mma"})
    _verify_all([(name, problem, c) for c in space.sample(rng, 1)], tmp_path)


@pytest.mark.parametrize("op", OPS)
def test_fft_tiled_multiply_accumulates_cover_every_tile_in_either_block_order(op, tmp_path):
    """fft's MAC "block" and "mma" with O cut into several tiles both ways (rows: images, or filters in
    conv_wgrad; columns: filters or channels) and runs of frequencies past the spectrum's end, in
    both MAC_ORDERs: blocks taking tile and frequency group from their linear index must still
    cover every output once, and each copy of a stage (its row and term a compile-time step from the
    thread's first) must land where the products read it. fp32, so the mma's 3xTF32 path runs."""
    # conv_fwd/bwd_data rows are the block's images (5: three row tiles of MAC "block"'s 2), columns
    # K or C; conv_wgrad rows are K (17: two m16 tiles of "mma"), columns C.
    dims = {"conv_fwd": dict(N=5, C=3, K=11), "conv_bwd_data": dict(N=5, C=11, K=3),
            "conv_wgrad": dict(N=2, C=11, K=17)}[op]
    problem = PROBLEM_TYPES[op](H=9, W=7, R=5, S=6, stride=1, padding=(2, 2, 3, 2), **dims)
    space = OPERATIONS[op].space(problem, LIMITS)
    base = {"formulation": "fft", "FFT_SIZE": "smooth", "IMGS": 8 if problem.N > 2 else 2, "XFORM_A": "cufft",
            "XFORM_B": "dft"}
    # The first of each: several tiles each way. The second: tiles of more rows than a stage has
    # threads a frequency (block BJ 32 > 64/4, mma BI 64 > 256/8), so a thread's copies step rows too.
    macs = ({"MAC": "block", "FFT_THREADS": 64, "IT": 1, "JT": 1, "FB": 8, "BL": 4},
            {"MAC": "block", "FFT_THREADS": 64, "IT": 1, "JT": 4, "FB": 4, "BL": 4},
            {"MAC": "mma", "FFT_THREADS": 128, "IT": 1, "JT": 1, "FB": 4, "BL": 8},
            {"MAC": "mma", "FFT_THREADS": 256, "IT": 4, "JT": 1, "FB": 8, "BL": 8})
    cases = [(f"{mac} {order}", problem, space.complete({**base, **mac, "MAC_ORDER": order}))
             for mac in macs for order in ("frequencies", "tiles")]
    _verify_all(cases, tmp_path)


@pytest.mark.parametrize("kind", ("bf16", "f16"))
def test_the_emulated_sixteen_bit_mma_is_the_exact_product_in_ptx_fragment_layout(kind, tmp_path):
    """One warp runs the templates' m16n8k16 mma (_mma_sync.cuh.j2's mma_m16n8k16) on a 16 x 16 A and
    a 16 x 8 B of 16-bit values packed two a register as PTX lays them out (a0..a3: rows g, g+8 at k
    2q..2q+1, then 2q+8..2q+9; b0, b1: k 2q..2q+1, 2q+8..2q+9 at n g; the lower k in the low half):
    D = A B + C with every product exact, and a transposed packing gives another result."""
    mma = environment().from_string('{% from "_mma_sync.cuh.j2" import mma_m16n8k16 %}'
                                    '{{ mma_m16n8k16("' + kind + '") }}').render()
    lib = _library(tmp_path, mma + f"""
extern "C" void one_tile(const unsigned short* a, const unsigned short* b, const float* c, float* d) {{
    emu_run(1u, 32u, [&] {{
        const unsigned lane = threadIdx.x, g = lane / 4, q = lane % 4;
        auto two = [](unsigned short lo, unsigned short hi) {{ return (unsigned)lo | (unsigned)hi << 16; }};
        auto at = [&](int r, int k) {{ return a[r * 16 + k]; }};
        auto bt = [&](int k, int n) {{ return b[k * 8 + n]; }};
        const unsigned fa[4] = {{two(at(g, 2 * q), at(g, 2 * q + 1)), two(at(g + 8, 2 * q), at(g + 8, 2 * q + 1)),
                                 two(at(g, 2 * q + 8), at(g, 2 * q + 9)), two(at(g + 8, 2 * q + 8), at(g + 8, 2 * q + 9))}};
        const unsigned fb[2] = {{two(bt(2 * q, g), bt(2 * q + 1, g)), two(bt(2 * q + 8, g), bt(2 * q + 9, g))}};
        float acc[4] = {{c[g * 8 + 2 * q], c[g * 8 + 2 * q + 1], c[(g + 8) * 8 + 2 * q], c[(g + 8) * 8 + 2 * q + 1]}};
        mma_{kind}(acc, fa, fb);
        d[g * 8 + 2 * q] = acc[0], d[g * 8 + 2 * q + 1] = acc[1];
        d[(g + 8) * 8 + 2 * q] = acc[2], d[(g + 8) * 8 + 2 * q + 1] = acc[3];
    }});
}}
""")
    from autocnn.measurement import element_arrays
    from autocnn.precision import BF16, FP16

    element = BF16.x if kind == "bf16" else FP16.x
    gen = np.random.default_rng()
    a32, b32 = (gen.standard_normal(shape).astype(np.float32) for shape in ((16, 16), (16, 8)))
    a, b = (np.ascontiguousarray(element_arrays.rounded(m, element, np)).view(np.uint16) for m in (a32, b32))
    c = gen.standard_normal((16, 8)).astype(np.float32)
    d = np.full((16, 8), np.nan, dtype=np.float32)
    lib.one_tile(*(m.ctypes.data_as(ctypes.c_void_p) for m in (a, b, c, d)))
    values = lambda m: element_arrays.values(m.view(element_arrays.storage_dtype(element)), element, np)  # noqa: E731
    exact = values(a).astype(np.float64) @ values(b).astype(np.float64) + c
    assert np.allclose(d, exact, rtol=2e-7, atol=1e-6)
    assert not np.allclose(d, values(a).astype(np.float64) @ values(b)[::-1].astype(np.float64) + c, atol=1e-3)


def test_sixteen_bit_tc_variants_verify_under_emulation(tmp_path):
    """The 16-bit paths a sample may miss, each once: conv_fwd on NHWC staging with 16-byte copies
    (C % 8 == 0) by cp.async over three stages with quad fragment reads, and single-element copies
    by cp.async's path with scalar reads; conv_bwd_data at stride 2 with quad reads; conv_wgrad with
    its bias gradient (row sums of the staged 16-bit dY) over TWO_PASS splits, and one split stored
    at once."""
    from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem

    fwd = ConvFwdProblem(N=3, C=8, H=11, W=9, K=13, R=3, S=3, padding=(1, 0, 1, 1), bias=True, activation="relu",
                         precision="bf16")
    bwd = ConvBwdDataProblem(N=2, C=9, H=13, W=11, K=12, R=3, S=3, stride=2, padding=1, precision="fp16")
    wgrad = ConvWgradProblem(N=3, C=5, H=9, W=11, K=7, R=3, S=2, padding=(1, 0, 1, 1), bias=True, precision="bf16")
    base = {"formulation": "tc", "BM": 32, "BN": 32, "BK": 32, "WM": 2, "WN": 1, "UNROLL_K": 0, "PAD_A": 8, "PAD_B": 8}
    variants = [
        (fwd, {**base, "STAGES": 3, "CP_ASYNC": 1, "FRAG": "quad", "VEC": 4, "NHWC": 1, "TABLE_A": 1}),
        (fwd, {**base, "STAGES": 2, "CP_ASYNC": 1, "FRAG": "scalar", "PAD_A": 4, "PAD_B": 0, "VEC": 1, "NHWC": 0,
               "TABLE_A": 0}),
        (bwd, {**base, "STAGES": 2, "CP_ASYNC": 0, "FRAG": "quad", "TABLE_A": 0}),
        (wgrad, {**base, "BK": 16, "PAD_A": 0, "PAD_B": 0, "STAGES": 2, "CP_ASYNC": 0, "FRAG": "pair",
                 "SPLITK": 4, "TWO_PASS": 1}),
        (wgrad, {**base, "BK": 16, "PAD_A": 4, "PAD_B": 4, "STAGES": 4, "CP_ASYNC": 1, "FRAG": "scalar",
                 "SPLITK": 1, "TWO_PASS": 0}),
    ]
    cases = [(f"variant {i}", p, OPERATIONS[p.op].space(p, LIMITS).validate(v)) for i, (p, v) in enumerate(variants)]
    _verify_all(cases, tmp_path)
