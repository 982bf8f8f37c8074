"""The batched power-method SVD (autocnn.separable): the float64 NumPy implementation against
numpy.linalg.svd, warm starts, the cap, deflation, the energy rank, the factor check, and the CUDA
template (compiled with nvcc and run under the CPU emulator on the CPU; run against the NumPy one on a
GPU)."""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from autocnn.kernels.compiler import nvcc_path
from autocnn.separable.rank import energy_rank, energy_shares
from autocnn.separable.svd import (CAPPED, CONVERGED, ZERO, SvdSettings, _dominance_check, effective_filters,
                                   power_svd, report_from)
from autocnn.separable.svd_check import check_factors

TIGHT = SvdSettings(tolerance=1e-24, max_iterations=100_000)


def spectrum_filters(rng, sigmas, count, R=None, S=None):
    """``count`` random filters with the given singular values (R x S, default square)."""
    k = len(sigmas)
    R, S = R or k, S or k
    U = np.linalg.qr(rng.standard_normal((count, R, R)))[0][:, :, :k]
    V = np.linalg.qr(rng.standard_normal((count, S, S)))[0][:, :, :k]
    return np.einsum("bik,k,bjk->bij", U, np.asarray(sigmas, dtype=float), V)


def truncated(w, rank):
    U, s, Vt = np.linalg.svd(w)
    return np.einsum("bik,bk,bkj->bij", U[:, :, :rank], s[:, :rank], Vt[:, :rank])


@pytest.mark.parametrize("R,S,rank", [(3, 3, 1), (5, 5, 2), (5, 4, 3), (7, 7, 1), (4, 6, 4), (11, 11, 3)])
def test_power_svd_matches_lapack_on_separated_spectra(rng, R, S, rank):
    sigmas = 2.0 ** -np.arange(min(R, S))   # gaps of 2: the power method converges fast
    w = spectrum_filters(rng, sigmas, 50, R, S)
    result = power_svd(w, rank, TIGHT)
    assert result.u.shape == (50, rank, R) and result.v.shape == (50, rank, S)
    assert (result.status == CONVERGED).all()
    np.testing.assert_allclose(result.singular_values, np.broadcast_to(sigmas[:rank], (50, rank)), rtol=1e-10)
    np.testing.assert_allclose(effective_filters(result.u, result.v), truncated(w, rank), atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(result.v, axis=-1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("size", [3, 5, 7, 9, 11])
@pytest.mark.parametrize("rank", [1, 2])
def test_default_settings_pass_the_factor_check_on_random_filters(rng, size, rank):
    w = rng.standard_normal((1024, size, size))
    result = power_svd(w, rank)
    check = check_factors(w, result.u, result.v, result.status, result.settings, "float64")
    assert check.passed, check.message
    report = result.report()
    assert report.filters == 1024 and report.rank == rank
    assert all(1 <= m <= 100 for m in report.max_iterations)


def test_full_rank_reconstructs_every_filter_and_v_is_orthonormal(rng):
    w = rng.standard_normal((40, 5, 4))
    result = power_svd(w, 4, TIGHT)
    np.testing.assert_allclose(effective_filters(result.u, result.v), w, atol=1e-10)
    gram = np.einsum("bjx,bkx->bjk", result.v, result.v)
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(4), gram.shape), atol=1e-10)


def test_deflation_of_a_lower_rank_filter_gives_zero_components(rng):
    w = spectrum_filters(rng, [3.0, 1.0], 10, 5, 5)   # rank 2 filters, asked for rank 4
    result = power_svd(w, 4)
    assert (result.status[:, :2] == CONVERGED).all() and (result.status[:, 2:] == ZERO).all()
    assert (result.iterations[:, 2:] == 0).all()
    np.testing.assert_array_equal(result.u[:, 2:], 0.0)
    gram = np.einsum("bjx,bkx->bjk", result.v, result.v)
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(4), gram.shape), atol=1e-8)
    assert result.report().zero_components == 20
    zero = power_svd(np.zeros((3, 3, 3)), 2)
    assert (zero.status == ZERO).all() and np.isfinite(zero.v).all()


def test_warm_start_needs_fewer_iterations(rng):
    w = rng.standard_normal((1024, 7, 7))
    cold = power_svd(w, 2)
    # The same filters again: one product confirms every converged vector.
    again = power_svd(w, 2, start=cold.v)
    converged = cold.status == CONVERGED
    assert (again.iterations[converged] <= 2).all()
    # After a small step (as after an optimizer update) a warm start still saves most of the work.
    moved = w + 0.01 * rng.standard_normal(w.shape)
    warm, fresh = power_svd(moved, 2, start=cold.v), power_svd(moved, 2)
    assert warm.iterations.mean() < 0.6 * fresh.iterations.mean()
    assert check_factors(moved, warm.u, warm.v, warm.status, warm.settings, "float64").passed


def neighbour_gaps(s, rank):
    """Each leading singular value's relative distance to its nearest neighbour, [B, rank]."""
    s = np.concatenate([s, np.zeros((s.shape[0], 1))], axis=1)
    below = (s[:, :rank] - s[:, 1:rank + 1]) / s[:, :rank]
    above = np.concatenate([np.full((s.shape[0], 1), np.inf), (s[:, :rank - 1] - s[:, 1:rank]) / s[:, 1:rank]], axis=1)
    return np.minimum(below, above)


# Random 7x7 filters of which two settled on the wrong vector and said CONVERGED before the dominance
# check: filter 621's second component on sigma_2 = 3.14 (sigma = 3.97, 3.44, 3.14, ...), |<v, v_1>| =
# 0.0069, and 837's on sigma_2 = 3.33 instead of sigma_1 = 3.53; warm-started from those, the first
# took 54 products to reach the right one (test_warm_start_needs_fewer_iterations failed).
SETTLING_SEED, SETTLING_FILTERS = 1007, (621, 837)


def test_a_converged_vector_is_the_dominant_one():
    w = np.random.default_rng(SETTLING_SEED).standard_normal((1024, 7, 7))
    result = power_svd(w, 2)
    _, s, Vt = np.linalg.svd(w)
    dots = np.abs(np.einsum("bjx,bjx->bj", result.v, Vt[:, :2]))
    for f in SETTLING_FILTERS:
        assert (result.status[f] == CONVERGED).all() and dots[f, 1] > 0.999, (f, dots[f])
    # Against numpy's SVD where the filter's components so far converged. The stopping rule leaves
    # sin(angle) up to about sqrt(2 tol) sigma_j^2 / (sigma_j^2 - sigma_k^2): |<v, v_true>| >= 0.9975 at
    # 1% apart (this batch's filters 95 and 315 sit at 0.9987, 1.3-1.4% apart), >= 0.9994 at 2%.
    so_far = np.cumprod(result.status == CONVERGED, axis=1).astype(bool)
    gaps = neighbour_gaps(s, 2)
    assert (dots[so_far & (gaps > 0.02)] > 0.999).all()
    assert (dots[so_far & (gaps > 0.01)] > 0.995).all()
    # Every converged vector against its own deflated Gram matrix (also after a capped component):
    # its Rayleigh quotient within the dominance check's slack, 2 sqrt(2 tol), of the top eigenvalue.
    F = w.copy()
    for j in range(2):
        A = np.einsum("byx,byz->bxz", F, F)
        top = np.linalg.eigvalsh(A)[:, -1]
        quotient = np.einsum("bx,bxz,bz->b", result.v[:, j], A, result.v[:, j])
        converged = result.status[:, j] == CONVERGED
        assert (quotient[converged] >= top[converged] * (1 - 3 * np.sqrt(result.settings.tolerance))).all()
        F -= result.u[:, j][:, :, None] * result.v[:, j][:, None, :]
    check = check_factors(w, result.u, result.v, result.status, result.settings, "float64")
    assert check.passed and check.settled == 0, check.message
    # A warm start from the factors confirms every converged vector in one product (plus one at most).
    again = power_svd(w, 2, start=result.v)
    assert (again.iterations[result.status == CONVERGED] <= 2).all()


@pytest.mark.parametrize("S", [1, 2, 3, 7, 11])
def test_dominance_check_decides_by_the_top_eigenvalue(S):
    gen = np.random.default_rng(S)
    F = gen.standard_normal((2000, S + 2, S))
    A = np.einsum("byx,byz->bxz", F, F)
    top = np.linalg.eigvalsh(A)[:, -1]
    shift = top * gen.uniform(0.3, 1.3, 2000)
    certified, z = _dominance_check(A, shift)
    np.testing.assert_array_equal(certified, shift > top)
    # Where not: z's Rayleigh quotient is at least the shift, so power iteration from it rises above it.
    low = ~certified
    quotient = np.einsum("bi,bij,bj->b", z[low], A[low], z[low]) / np.einsum("bi,bi->b", z[low], z[low])
    assert (quotient >= shift[low] * (1 - 1e-12)).all()


def test_a_warm_start_that_is_not_a_unit_vector_starts_cold(rng):
    w = rng.standard_normal((20, 5, 5))
    cold = power_svd(w, 1)
    zeros = power_svd(w, 1, start=np.zeros((20, 1, 5)))
    np.testing.assert_array_equal(zeros.iterations, cold.iterations)
    with pytest.raises(ValueError, match="previous v"):
        power_svd(w, 1, start=np.zeros((20, 2, 5)))


def test_the_cap_is_honoured_and_reported(rng):
    # (sigma_1 / sigma_0)^2 = 0.81: each product shrinks the error by 0.81 only, far from 1e-10 in 5.
    slow = spectrum_filters(rng, [1.0, 0.9, 0.1], 8)
    fast = spectrum_filters(rng, [1.0, 0.01, 0.001], 8)
    w = np.concatenate([slow, fast])
    settings = SvdSettings(tolerance=1e-10, max_iterations=5)
    result = power_svd(w, 1, settings)
    assert result.iterations.max() <= 5
    assert (result.status[:8, 0] == CAPPED).all() and (result.iterations[:8, 0] == 5).all()
    assert (result.status[8:, 0] == CONVERGED).all()
    report = result.report()
    assert report.capped == 8 and report.capped_per_rank == (8,) and report.capped_share == 0.5
    assert report.max_iterations == (5,) and report.iteration_cap == 5
    assert "8 capped at 5" in report.summary()
    # Capped filters still approximate within the check's slack.
    assert check_factors(w, result.u, result.v, result.status, settings, "float64").passed


def test_report_counts_per_rank():
    iterations = np.array([[3, 7], [5, 0], [100, 2]])
    status = np.array([[CONVERGED, CONVERGED], [CONVERGED, ZERO], [CAPPED, CONVERGED]])
    report = report_from(iterations, status, SvdSettings())
    assert report.mean_iterations == (36.0, 4.5) and report.max_iterations == (100, 7)
    assert report.capped == 1 and report.capped_per_rank == (1, 0) and report.zero_components == 1


def test_factor_check_catches_wrong_factors(rng):
    w = rng.standard_normal((64, 5, 5))
    result = power_svd(w, 2)
    assert check_factors(w, result.u, result.v, result.status, result.settings).passed
    shuffled = result.v[np.roll(np.arange(64), 1)]   # another filter's vectors
    assert not check_factors(w, result.u, shuffled, result.status, result.settings).passed
    nan = result.u.copy()
    nan[3, 0, 1] = np.nan
    check = check_factors(w, nan, result.v, result.status, result.settings)
    assert not check.passed and "non-finite" in check.message and 3 in check.failing_filters
    skewed = result.v.copy()
    skewed[:, 1] = skewed[:, 0]
    assert "orthonormal" in check_factors(w, result.u, skewed, result.status, result.settings).message


def test_energy_rank_choice(rng):
    # Every filter has squared singular values 0.6, 0.3, 0.1 of its energy.
    w = spectrum_filters(rng, np.sqrt([0.6, 0.3, 0.1]), 30)
    np.testing.assert_allclose(energy_shares(w), [0.6, 0.9, 1.0], atol=1e-12)
    assert energy_rank(w, 0.5).rank == 1
    assert energy_rank(w, 0.6).rank == 1
    assert energy_rank(w, 0.9).rank == 2
    assert energy_rank(w, 0.95).rank == 3
    assert energy_rank(w, 1.0).rank == 3
    assert energy_rank(w).share == 0.9
    assert "rank 2 keeps 90.0%" in energy_rank(w, 0.9).summary()
    for bad in (0.0, 1.5, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match="energy share"):
            energy_rank(w, bad)


@pytest.mark.parametrize("kwargs,match", [
    (dict(tolerance=0.0), "tolerance"), (dict(tolerance=1.0), "tolerance"), (dict(tolerance="1e-6"), "tolerance"),
    (dict(max_iterations=0), "max_iterations"), (dict(max_iterations=2.5), "max_iterations"),
    (dict(max_iterations=True), "max_iterations"),
])
def test_settings_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SvdSettings(**kwargs)


def test_bad_filters_and_ranks_are_refused(rng):
    with pytest.raises(ValueError, match="rank must be an integer in 1..min"):
        power_svd(rng.standard_normal((2, 3, 4)), 4)
    with pytest.raises(ValueError, match="NaN"):
        power_svd(np.full((1, 3, 3), np.nan), 1)
    with pytest.raises(ValueError, match="at least one filter"):
        power_svd(np.zeros((0, 3, 3)), 1)


# -- the CUDA template, on the CPU -------------------------------------------------------------------

def test_variants_fit_the_block_and_shared_memory_limits():
    from autocnn.kernels.rules import STATIC_SMEM_LIMIT
    from autocnn.separable.svd_cuda import candidate_variants, shared_bytes

    for R, S, rank in [(3, 3, 1), (5, 5, 5), (11, 11, 11), (2, 7, 2)]:
        variants = candidate_variants(R, S, rank)
        assert variants
        for v in variants:
            assert 32 <= v.threads <= 256 and 32 % v.threads_per_filter == 0
            assert shared_bytes(R, S, rank, v.filters_per_block) <= STATIC_SMEM_LIMIT
        assert len({v.kernel for v in variants}) == len(variants)


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc (the CUDA toolkit) to compile the template")
@pytest.mark.parametrize("R,S,rank", [(3, 3, 1), (11, 11, 2), (5, 4, 4)])
def test_svd_template_compiles_with_nvcc(R, S, rank):
    from autocnn.separable.svd_cuda import candidate_variants, render_source
    from autocnn.separable.templates import nvcc_reports

    variants = candidate_variants(R, S, rank)
    reports = nvcc_reports(render_source(R, S, rank, variants), "sm_90")
    assert {v.kernel for v in variants} <= set(reports)
    assert any(not reports[v.kernel].spills for v in variants)


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc (the CUDA toolkit) to compile the template")
@pytest.mark.parametrize("R,S,rank", [(3, 3, 1), (11, 11, 11), (5, 7, 3)])
def test_projection_template_compiles_with_nvcc(R, S, rank):
    from autocnn.separable.projection_cuda import KERNEL, render_source
    from autocnn.separable.templates import nvcc_reports

    report = nvcc_reports(render_source(R, S, rank), "sm_80")[KERNEL]
    assert not report.spills


# The kernel under the CPU emulator (tests/cuda_emulator.py): one group per block (its warp barrier is
# then the group's), g++ in place of nvcc; the same steps as on a GPU, not the GPU's rounding.
EMULATOR_EXTRA = r"""
inline void __syncwarp(unsigned) { emu_warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
"""


def emulated_svd(R, S, rank, threads_per_filter, tmp_path):
    """A function (w, v0, settings) -> (u, v, iterations, status) running the kernel on the emulator."""
    from autocnn.separable.svd_cuda import SvdVariant, render_source
    from tests.cuda_emulator import PRELUDE, compile_library

    variant = SvdVariant(threads_per_filter, 1)
    source = (PRELUDE + EMULATOR_EXTRA + render_source(R, S, rank, [variant]).replace("__shared__", "static")
              + 'extern "C" void emu_svd(float* w, float* u, float* v, int* its, int* status, int filters, '
              f"float tolerance, int cap) {{ emu_run((unsigned)filters, {threads_per_filter}u, [&] {{ "
              f"{variant.kernel}(w, u, v, its, status, filters, tolerance, cap); }}); }}\n")
    emu = compile_library(source, tmp_path, variant.kernel)

    def run(w, v0=None, settings=SvdSettings()):
        B = w.shape[0]
        w = np.ascontiguousarray(w, dtype=np.float32)
        u = np.full((B, rank, R), np.nan, dtype=np.float32)
        v = np.zeros((B, rank, S), dtype=np.float32) if v0 is None else np.array(v0, dtype=np.float32)
        its = np.full((B, rank), -1, dtype=np.int32)
        status = np.full((B, rank), -1, dtype=np.int32)
        pointers = [ctypes.c_void_p(a.ctypes.data) for a in (w, u, v, its, status)]
        emu.emu_svd(*pointers, ctypes.c_int(B), ctypes.c_float(settings.tolerance),
                    ctypes.c_int(settings.max_iterations))
        return u, v, its, status

    return run


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")
@pytest.mark.parametrize("threads_per_filter", [1, 4, 32])
def test_emulated_kernel_runs_the_dominance_check_as_numpy_does(threads_per_filter, tmp_path):
    # Filters whose component settles on the wrong vector from its cold start: two at j = 1 (so
    # the restart is projected off v_0) and one at j = 0, among others that do not.
    w = np.random.default_rng(SETTLING_SEED).standard_normal((1024, 7, 7))
    other = np.random.default_rng(1010).standard_normal((1024, 7, 7))[14]
    w = np.concatenate([w[list(SETTLING_FILTERS)], other[None], w[:29]]).astype(np.float32)
    run = emulated_svd(7, 7, 2, threads_per_filter, tmp_path)
    u, v, its, status = run(w)
    ref = power_svd(w.astype(np.float64), 2)
    np.testing.assert_array_equal(status, ref.status)
    assert np.abs(its - ref.iterations).max() <= 2
    assert its[0, 1] > 7 and its[2, 0] > 5   # the check sent them on (7 and 5 products before it)
    _, _, Vt = np.linalg.svd(w.astype(np.float64))
    dots = np.abs(np.einsum("bjx,bjx->bj", v.astype(np.float64), Vt[:, :2]))
    assert (dots[:3][status[:3] == CONVERGED] > 0.999).all()
    np.testing.assert_allclose(effective_filters(u, v), effective_filters(ref.u, ref.v), atol=1e-4)
    assert check_factors(w, u, v, status, SvdSettings(), "float32").passed
    _, _, warm_its, warm_status = run(w, v0=v)
    assert (warm_its[status == CONVERGED] <= 2).all()


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")
def test_emulated_kernel_matches_numpy_at_full_rank(tmp_path):
    gen = np.random.default_rng(8)
    w = gen.standard_normal((256, 5, 5)).astype(np.float32)
    u, v, its, status = emulated_svd(5, 5, 5, 1, tmp_path)(w)
    ref = power_svd(w.astype(np.float64), 5)
    assert (status == ref.status).mean() > 0.99 and np.abs(its - ref.iterations).max() <= 2
    assert check_factors(w, u, v, status, SvdSettings(), "float32").passed


# -- on a GPU -------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("size,rank", [(3, 1), (5, 2), (7, 1), (11, 3), (9, 9)])
def test_cuda_svd_matches_the_numpy_one(size, rank):
    import cupy as cp

    from autocnn.separable.svd_cuda import CudaPowerSvd

    rng = np.random.default_rng()
    sigmas = 2.0 ** -np.arange(size)
    w = spectrum_filters(rng, sigmas, 300).astype(np.float32)
    svd = CudaPowerSvd()
    choice = svd.prepare(300, size, size, rank)
    assert all(r.check.passed for r in choice.results if r.variant == choice.variant)
    u = cp.empty((300, rank, size), dtype=cp.float32)
    v = cp.zeros((300, rank, size), dtype=cp.float32)
    its = cp.empty((300, rank), dtype=cp.int32)
    status = cp.empty((300, rank), dtype=cp.int32)
    call = svd.decompose(cp.asarray(w), u, v, its, status)
    ref = power_svd(w.astype(np.float64), rank)
    got_u, got_v = cp.asnumpy(u), cp.asnumpy(v)
    assert (cp.asnumpy(status) == CONVERGED).all()
    np.testing.assert_allclose(np.linalg.norm(got_u, axis=-1), ref.singular_values, rtol=1e-4)
    np.testing.assert_allclose(effective_filters(got_u, got_v), effective_filters(ref.u, ref.v), atol=1e-4)
    assert np.abs(cp.asnumpy(its) - ref.iterations).max() <= 2
    assert call.report().mean_iterations == pytest.approx(ref.report().mean_iterations, abs=1.0)
    check = check_factors(w, got_u, got_v, cp.asnumpy(status), SvdSettings(), "float32")
    assert check.passed, check.message
    # Warm: the same filters again need one product each.
    svd.decompose(cp.asarray(w), u, v, its, status)
    assert int(cp.asnumpy(its).max()) <= 2


@pytest.mark.gpu
def test_cuda_svd_cap_warm_start_and_random_filters():
    import cupy as cp

    from autocnn.separable.svd_cuda import CudaPowerSvd

    svd = CudaPowerSvd()
    gen = cp.random.RandomState()
    w = gen.standard_normal((1024, 9, 9), dtype=cp.float32)
    u = cp.empty((1024, 1, 9), dtype=cp.float32)
    v = cp.zeros((1024, 1, 9), dtype=cp.float32)
    its = cp.empty((1024, 1), dtype=cp.int32)
    status = cp.empty((1024, 1), dtype=cp.int32)
    capped = SvdSettings(max_iterations=4)
    report = svd.decompose(w, u, v, its, status, capped).report()
    assert report.max_iterations[0] <= 4 and report.capped == int((cp.asnumpy(status) == CAPPED).sum()) > 0
    cold = svd.decompose(w, u, v, its, status, warm_start=False).report()
    assert check_factors(cp.asnumpy(w), cp.asnumpy(u), cp.asnumpy(v), cp.asnumpy(status), SvdSettings()).passed
    moved = w + 0.01 * gen.standard_normal(w.shape, dtype=cp.float32)
    warm = svd.decompose(moved, u, v, its, status).report()
    assert warm.mean_iterations[0] < 0.6 * cold.mean_iterations[0]


@pytest.mark.gpu
def test_cuda_svd_converged_vectors_are_the_dominant_ones():
    import cupy as cp

    from autocnn.separable.svd_cuda import CudaPowerSvd

    w = np.random.default_rng(SETTLING_SEED).standard_normal((1024, 7, 7)).astype(np.float32)
    svd = CudaPowerSvd()
    u = cp.empty((1024, 2, 7), dtype=cp.float32)
    v = cp.zeros((1024, 2, 7), dtype=cp.float32)
    its = cp.empty((1024, 2), dtype=cp.int32)
    status = cp.empty((1024, 2), dtype=cp.int32)
    call = svd.decompose(cp.asarray(w), u, v, its, status)
    got_u, got_v, got_its, got_status = (cp.asnumpy(a) for a in (u, v, its, status))
    ref = power_svd(w.astype(np.float64), 2)
    _, _, Vt = np.linalg.svd(w.astype(np.float64))
    dots = np.abs(np.einsum("bjx,bjx->bj", got_v.astype(np.float64), Vt[:, :2]))
    for f in SETTLING_FILTERS:
        assert (got_status[f] == CONVERGED).all() and dots[f, 1] > 0.999, (f, dots[f], got_its[f])
    F = w.astype(np.float64)
    for j in range(2):
        A = np.einsum("byx,byz->bxz", F, F)
        top = np.linalg.eigvalsh(A)[:, -1]
        quotient = np.einsum("bx,bxz,bz->b", got_v[:, j], A, got_v[:, j])
        converged = got_status[:, j] == CONVERGED
        assert (quotient[converged] >= top[converged] * (1 - 3 * np.sqrt(SvdSettings().tolerance) - 1e-5)).all()
        F -= got_u[:, j].astype(np.float64)[:, :, None] * got_v[:, j].astype(np.float64)[:, None, :]
    assert (got_status == ref.status).mean() > 0.99
    assert call.report().mean_iterations == pytest.approx(ref.report().mean_iterations, abs=1.0)
    check = check_factors(w, got_u, got_v, got_status, SvdSettings(), "float32")
    assert check.passed and check.settled == 0, check.message
    svd.decompose(cp.asarray(w), u, v, its, status)   # warm: one product confirms each
    assert (cp.asnumpy(its)[got_status == CONVERGED] <= 2).all()


@pytest.mark.gpu
def test_cuda_projection_matches_the_numpy_one():
    import cupy as cp

    from autocnn.separable.projection import factor_gradients, tangent_projection
    from autocnn.separable.projection_cuda import tangent_projection as cuda_projection

    rng = np.random.default_rng()
    w = rng.standard_normal((6, 5, 5, 5))
    g = rng.standard_normal((6, 5, 5, 5))
    result = power_svd(w, 2, TIGHT)
    u, v = result.u.reshape(6, 5, 2, 5), result.v.reshape(6, 5, 2, 5)
    gu, gv = factor_gradients(g, u, v)
    expected = tangent_projection(gu, gv, u, v)
    dw = cp.full((6, 5, 5, 5), cp.nan, dtype=cp.float32)
    f32 = [cp.asarray(a, dtype=cp.float32) for a in (gu, gv, u, v)]
    cuda_projection(*f32, dw)
    got = cp.asnumpy(dw)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - expected) <= 1e-5 * np.linalg.norm(expected)
