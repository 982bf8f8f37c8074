"""The batched power-method SVD on the GPU: a generated kernel, measured and verified per shape.

The kernel (power_svd.cu.j2) runs the steps of autocnn.separable.svd in float32: one group of
``threads_per_filter`` threads per filter, ``filters_per_block`` groups per block, everything a
filter needs in shared memory. Those two are its only parameters. On the first call for a shape
(filters, R, S, rank) every variant that fits is compiled (one NVRTC module), run on fresh random
filters of that shape and verified (svd_check: finite, orthonormal v, the approximation's error
within the tolerance-derived allowance over the float64 truncated SVD), then timed
(measurement.measure.time_callable, from a cold start); the fastest verified variant serves the shape
for the rest of the process.

Why not an Operation of the tuner (kernels/registry.py)? Its machinery judges a kernel by
one relative error of each output against a deterministic float64 reference, and keys records by
a problem that fully determines the result. The power method's result depends on its start
(warm starts carry state from call to call), its vectors are unique only up to sign and within
nearly degenerate pairs, and its capped filters are allowed to be off; so it needs its own
verification (svd_check), and with two parameters and a few dozen variants the whole search
takes well under a second, so it is measured where it is first needed instead of being stored.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autocnn.kernels.rules import STATIC_SMEM_LIMIT
from autocnn.separable.svd import SvdReport, SvdSettings, check_rank, report_from
from autocnn.separable.svd_check import FactorCheck, check_factors
from autocnn.separable.templates import load_module, render

TEMPLATE = "power_svd.cu.j2"
GROUP_SIZES = (1, 2, 4, 8, 16, 32)
BLOCK_SIZES = (32, 64, 128, 256)
TUNING_BUDGET_S = 0.02


@dataclass(frozen=True)
class SvdVariant:
    threads_per_filter: int
    filters_per_block: int

    @property
    def kernel(self) -> str:
        return f"power_svd_t{self.threads_per_filter}_f{self.filters_per_block}"

    @property
    def threads(self) -> int:
        return self.threads_per_filter * self.filters_per_block


def shared_bytes(R: int, S: int, rank: int, filters_per_block: int) -> int:
    """Static shared memory of a block: F, A, the iterate, A b, u and the previous v's per filter."""
    return 4 * filters_per_block * (R * S + S * S + 2 * S + R + rank * S)


def candidate_variants(R: int, S: int, rank: int) -> list[SvdVariant]:
    """Every (threads per filter, filters per block) whose block has 32-256 threads and fits in
    static shared memory; groups wider than the Gram matrix has entries would only idle."""
    widest = max(S * S, R * S)
    out = []
    for tpf in GROUP_SIZES:
        if tpf > 1 and tpf // 2 >= widest:
            continue
        for threads in BLOCK_SIZES:
            fpb = threads // tpf
            if fpb >= 1 and shared_bytes(R, S, rank, fpb) <= STATIC_SMEM_LIMIT:
                out.append(SvdVariant(tpf, fpb))
    return out


def render_source(R: int, S: int, rank: int, variants: list[SvdVariant]) -> str:
    return render(TEMPLATE, R=R, S=S, RANK=rank, variants=variants)


@dataclass(frozen=True)
class VariantResult:
    variant: SvdVariant
    check: FactorCheck
    median_us: float | None


@dataclass(frozen=True)
class ShapeChoice:
    """The variant chosen for one shape and what each candidate did."""

    filters: int
    R: int
    S: int
    rank: int
    variant: SvdVariant
    results: tuple[VariantResult, ...] = field(default_factory=tuple)


class SvdCall:
    """One launch's outputs left on the device; ``report()`` reads them (and so waits for it)."""

    def __init__(self, iterations: Any, status: Any, settings: SvdSettings) -> None:
        self.iterations = iterations
        self.status = status
        self.settings = settings

    def report(self) -> SvdReport:
        import cupy

        return report_from(cupy.asnumpy(self.iterations), cupy.asnumpy(self.status), self.settings)


class CudaPowerSvd:
    """The tuned batched SVD on the current device; one instance per process is enough (``shared``)."""

    def __init__(self) -> None:
        from autocnn.gpu import require_cupy

        self.cp = require_cupy()
        self.choices: dict[tuple[int, int, int, int, int], ShapeChoice] = {}
        self._functions: dict[tuple[int, int, int, int, int], Any] = {}

    # -- tuning ----------------------------------------------------------------------------------
    def prepare(self, filters: int, R: int, S: int, rank: int, settings: SvdSettings | None = None) -> ShapeChoice:
        """Measure and verify the variants for this shape (once per device and shape)."""
        settings = settings or SvdSettings()
        rank = check_rank(rank, R, S)
        key = (self.cp.cuda.Device().id, filters, R, S, rank)
        if key in self.choices:
            return self.choices[key]
        from autocnn.measurement.measure import time_callable

        cp = self.cp
        variants = candidate_variants(R, S, rank)
        module = load_module(render_source(R, S, rank, variants))
        gen = cp.random.RandomState()
        w = gen.standard_normal((filters, R, S), dtype=cp.float32)
        u = cp.empty((filters, rank, R), dtype=cp.float32)
        v = cp.empty((filters, rank, S), dtype=cp.float32)
        its = cp.empty((filters, rank), dtype=cp.int32)
        status = cp.empty((filters, rank), dtype=cp.int32)
        w_host = cp.asnumpy(w)
        results = []
        for variant in variants:
            fn = module.get_function(variant.kernel)

            def run(fn: Any = fn, variant: SvdVariant = variant) -> None:
                v.fill(0)   # a cold start every time, so that every variant does the same work
                self._launch(fn, variant, w, u, v, its, status, filters, settings)

            u.fill(cp.nan)
            run()
            cp.cuda.get_current_stream().synchronize()
            check = check_factors(w_host, cp.asnumpy(u), cp.asnumpy(v), cp.asnumpy(status), settings, "float32")
            timing = time_callable(run, budget_s=TUNING_BUDGET_S) if check.passed else None
            results.append(VariantResult(variant, check, timing.median_us if timing else None))
        timed = [r for r in results if r.median_us is not None]
        if not timed:
            raise RuntimeError(f"no variant of the batched SVD passed verification for {filters} filters "
                               f"{R}x{S} at rank {rank}: " + "; ".join(f"{r.variant.kernel}: {r.check.message}"
                                                                        for r in results[:3]))
        best = min(timed, key=lambda r: r.median_us)
        choice = ShapeChoice(filters, R, S, rank, best.variant, tuple(results))
        self.choices[key] = choice
        self._functions[key] = module.get_function(best.variant.kernel)
        return choice

    # -- running ---------------------------------------------------------------------------------
    def decompose(self, w: Any, u: Any, v: Any, iterations: Any, status: Any, settings: SvdSettings | None = None,
                  warm_start: bool = True) -> SvdCall:
        """Factors of the filters ``w`` [..., R, S] into ``u`` [.., rank, R] and ``v`` [.., rank, S]
        (float32 device arrays); ``v`` holds the previous call's vectors, the warm start (zeros, or
        ``warm_start=False``, start cold). Queued on the current stream, without waiting."""
        settings = settings or SvdSettings()
        R, S = int(w.shape[-2]), int(w.shape[-1])
        filters = int(w.size // (R * S))
        rank = int(v.shape[-2])
        expected = {"u": (filters * rank * R, u), "v": (filters * rank * S, v),
                    "iterations": (filters * rank, iterations), "status": (filters * rank, status)}
        for name, (size, array) in expected.items():
            if int(array.size) != size or not array.flags.c_contiguous:
                raise ValueError(f"batched SVD: {name} must be a contiguous array of {size} elements for "
                                 f"{filters} filters {R}x{S} at rank {rank}, got shape {tuple(array.shape)}")
        if not w.flags.c_contiguous:
            raise ValueError(f"batched SVD: the filters must be a contiguous array, got strides {w.strides}")
        if w.dtype != np.float32 or u.dtype != np.float32 or v.dtype != np.float32:
            raise TypeError("batched SVD: w, u and v must be float32")
        if iterations.dtype != np.int32 or status.dtype != np.int32:
            raise TypeError("batched SVD: iterations and status must be int32")
        choice = self.prepare(filters, R, S, rank, settings)
        key = (self.cp.cuda.Device().id, filters, R, S, rank)
        if not warm_start:
            v.fill(0)
        self._launch(self._functions[key], choice.variant, w, u, v, iterations, status, filters, settings)
        return SvdCall(iterations, status, settings)

    @staticmethod
    def _launch(fn: Any, variant: SvdVariant, w: Any, u: Any, v: Any, iterations: Any, status: Any,
                filters: int, settings: SvdSettings) -> None:
        blocks = -(-filters // variant.filters_per_block)
        fn((blocks,), (variant.threads,), (w, u, v, iterations, status, np.int32(filters),
                                           np.float32(settings.tolerance), np.int32(settings.max_iterations)))


@functools.lru_cache(maxsize=1)
def shared() -> CudaPowerSvd:
    """The process's CudaPowerSvd (its tuned choices serve every layer)."""
    return CudaPowerSvd()
