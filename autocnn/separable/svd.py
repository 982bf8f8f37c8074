"""The batched power-method SVD of small filters (seed 002, section 3.1), in float64 NumPy.

Each filter F (R x S) gets its ``rank`` leading singular triplets, one after another (deflation):

* component j works on the deflated filter F_j (F_0 = F) through its Gram matrix A_j = F_j^T F_j
  (S x S): power iteration b <- A_j b / ||A_j b|| from a start vector;
* converged when the two estimates of sigma_j^2 that one product gives agree to the relative
  tolerance: the Rayleigh quotient mu = b^T A_j b and the norm nu = ||A_j b|| (equal only at an
  eigenvector), nu - mu <= tolerance * nu. It is tested as ||A_j b - mu b||^2 <= tolerance * nu
  * (nu + mu), the same inequality (nu^2 - mu^2 = ||A_j b - mu b||^2) without nu - mu's
  cancellation, so float32 reaches 1e-6. A component stops after ``max_iterations`` products
  (the seed's cap, so that a few slow filters do not hold the batch): it is *capped*;
* that test holds at any eigenvector: from a start nearly orthogonal to the top one the iteration
  settles on a lower one (measured: about 1 in 2,800 components of random 7x7 filters at rank 2).
  So a component converges only where, besides, no eigenvalue of A_j reaches nu + slack, slack =
  2 sqrt(tolerance nu (nu + mu)) + 64 eps trace A_j: twice the residual the test allows (a vector
  mostly along the top eigenvector lies at most about that residual below it) plus rounding. As
  nu = ||A_j b|| <= sigma_j^2, a converged component has sigma_j^2 in [nu, nu + slack). The check
  is Sylvester's law of inertia: (nu + slack) I - A_j is positive definite exactly when its
  Cholesky factorisation (no pivoting) meets no pivot <= 0; about S^3 / 6 multiply-adds, one
  product's worth at 7x7, and conclusive (the trace bound mu >= trace A_j - mu holds for only 13%
  of random 7x7 filters and none at 11x11, and a power iteration on A_j with b deflated out can
  settle low just the same). A pivot d_k <= 0 yields a vector z of Rayleigh quotient nu + slack -
  d_k / ||z||^2, above the eigenvalue settled on; the iteration goes on from z (projected off the
  earlier v's), its products counted and capped as before. The Rayleigh quotients of power
  iterates of a PSD matrix never decrease, so each failed check lifts the next candidate above the
  last: at most S - 1 failures, and the cap bounds them anyway. The check is not a product, and
  ``iterations`` does not count it;
* v_j = b (a unit vector), u_j = F_j v_j (sigma_j = ||u_j|| folded in), and F_{j+1} = F_j - u_j v_j^T.
  F_{j+1} v_j = 0, so later v's are orthogonal to v_j whether or not it converged, and the sum of
  u_j v_j^T is F V V^T: the best approximation from the vectors found;
* start vector: the previous call's v_j where it is a unit vector (warm start: after an
  optimizer step the filters moved little, so one product usually confirms it), else the column
  of A_j with the largest norm (a vector in A_j's range, weighted towards its leading
  eigenvectors: of the simple choices measured, the one least often nearly orthogonal to the top
  one; no start is immune, which is what the check above is for). A warm start that A_j maps to
  zero starts over cold, once;
* a deflated filter with no energy left (trace A_j <= (64 eps)^2 ||F||^2: a filter of lower rank, or
  zero) is a *zero* component: u_j = 0, v_j the unit vector orthogonal to v_0..v_{j-1} closest to
  a coordinate axis, no iterations.

This module is the float64 implementation (the numpy backend's, and the reference the CUDA kernel
of ``svd_cuda`` is checked against, which runs the same steps in float32). ``SvdReport`` says per
call how many products each rank took (mean and max over the filters) and how many filters hit
the cap.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autocnn.kernels.reference import array_module

DEFAULT_TOLERANCE = 1e-6
DEFAULT_MAX_ITERATIONS = 100

# What each component's status code says (the CUDA kernel writes the same codes).
CONVERGED, CAPPED, ZERO = 0, 1, 2
# A deflated filter whose energy is at most ZERO_SHARE_EPS^2 * eps^2 of the filter's is empty:
# rounding, not signal (64 units in the last place of the filter's norm).
ZERO_SHARE_EPS = 64.0


@dataclass(frozen=True)
class SvdSettings:
    """The power method's stopping rule: relative tolerance and the cap on products per component."""

    tolerance: float = DEFAULT_TOLERANCE
    max_iterations: int = DEFAULT_MAX_ITERATIONS

    def __post_init__(self) -> None:
        tol = self.tolerance
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (0.0 < float(tol) < 1.0):
            raise ValueError(f"SvdSettings: tolerance must be a number in (0, 1), got {tol!r}")
        cap = self.max_iterations
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or not 1 <= int(cap) <= 1_000_000:
            raise ValueError(f"SvdSettings: max_iterations must be an integer in 1..1000000, got {cap!r}")
        object.__setattr__(self, "tolerance", float(tol))
        object.__setattr__(self, "max_iterations", int(cap))


@dataclass(frozen=True)
class SvdReport:
    """One call of the batched SVD: products (power iterations) per rank and capped filters.

    ``mean_iterations[j]`` / ``max_iterations[j]``: over the filters whose component j was not
    zero; ``capped``: filters with at least one capped component; ``capped_per_rank[j]``: filters
    whose component j was capped; ``zero_components``: components of filters of lower rank.
    """

    filters: int
    rank: int
    tolerance: float
    iteration_cap: int
    mean_iterations: tuple[float, ...]
    max_iterations: tuple[int, ...]
    capped: int
    capped_per_rank: tuple[int, ...]
    zero_components: int

    @property
    def capped_share(self) -> float:
        return self.capped / self.filters if self.filters else 0.0

    def summary(self) -> str:
        means = ", ".join(f"{m:.1f}" for m in self.mean_iterations)
        maxes = ", ".join(str(m) for m in self.max_iterations)
        return (f"{self.filters} filters, rank {self.rank}: iterations per rank mean [{means}] max [{maxes}], "
                f"{self.capped} capped at {self.iteration_cap} ({100 * self.capped_share:.1f}%)")


def report_from(iterations: np.ndarray, status: np.ndarray, settings: SvdSettings) -> SvdReport:
    """The report of a call from its per-component iteration counts and status codes, [B, rank]."""
    iterations = np.asarray(iterations).reshape(-1, np.asarray(iterations).shape[-1])
    status = np.asarray(status).reshape(iterations.shape)
    filters, rank = iterations.shape
    means, maxes = [], []
    for j in range(rank):
        live = status[:, j] != ZERO
        means.append(float(iterations[live, j].mean()) if live.any() else 0.0)
        maxes.append(int(iterations[live, j].max()) if live.any() else 0)
    capped = status == CAPPED
    return SvdReport(filters=filters, rank=rank, tolerance=settings.tolerance,
                     iteration_cap=settings.max_iterations, mean_iterations=tuple(means),
                     max_iterations=tuple(maxes), capped=int(capped.any(axis=1).sum()),
                     capped_per_rank=tuple(int(c) for c in capped.sum(axis=0)),
                     zero_components=int((status == ZERO).sum()))


@dataclass(frozen=True)
class SvdResult:
    """Factors of B filters: u [B, rank, R] (sigma folded in), v [B, rank, S] (unit vectors), the
    products each component took and its status (CONVERGED, CAPPED, ZERO), both [B, rank]."""

    u: np.ndarray
    v: np.ndarray
    iterations: np.ndarray
    status: np.ndarray
    settings: SvdSettings

    @property
    def singular_values(self) -> np.ndarray:
        return np.linalg.norm(self.u, axis=-1)

    def report(self) -> SvdReport:
        return report_from(self.iterations, self.status, self.settings)


def check_rank(rank: Any, R: int, S: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 1 <= int(rank) <= min(R, S):
        raise ValueError(f"rank must be an integer in 1..min(R, S) = 1..{min(R, S)} for {R}x{S} filters, "
                         f"got {rank!r}")
    return int(rank)


def filters_as_batch(w: Any) -> np.ndarray:
    """Filters [..., R, S] (KCRS weights, or a stack) as a float64 [B, R, S] copy."""
    a = np.asarray(w)
    if a.ndim < 2 or a.size == 0:
        raise ValueError(f"filters must be an array [..., R, S] with at least one filter, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"filters must be floating point, got {a.dtype}")
    if not np.all(np.isfinite(a)):
        raise ValueError("filters hold NaN or infinite values: the SVD of such a filter is undefined")
    return a.reshape(-1, a.shape[-2], a.shape[-1]).astype(np.float64, copy=True)


def _cold_start(A: np.ndarray) -> np.ndarray:
    """The column of each Gram matrix with the largest norm, normalised (the first on ties)."""
    norms2 = np.einsum("bij,bij->bj", A, A)
    k = np.argmax(norms2, axis=1)
    b = A[np.arange(A.shape[0]), :, k]
    norm = np.sqrt(norms2[np.arange(A.shape[0]), k])[:, None]
    return np.divide(b, norm, out=np.zeros_like(b), where=norm > 0)


def _warm_start(b: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Previous vectors replace cold starts where they are unit vectors (a previous call's)."""
    n2 = np.sum(previous * previous, axis=1)
    ok = np.isfinite(n2) & (n2 >= 0.25) & (n2 <= 4.0)
    out = b.copy()
    out[ok] = previous[ok] / np.sqrt(n2[ok])[:, None]
    return out


def _orthogonal_completion(V: np.ndarray, S: int) -> np.ndarray:
    """For each filter, the unit vector orthogonal to the rows of V [B, j, S] nearest a coordinate axis."""
    P = np.eye(S)[None] - np.einsum("bji,bjk->bik", V, V)
    k = np.argmax(np.einsum("bii->bi", P), axis=1)
    col = P[np.arange(P.shape[0]), :, k]
    return col / np.linalg.norm(col, axis=1, keepdims=True)


def _dominance_check(A: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether every eigenvalue of each symmetric A [n, S, S] lies below ``shift`` [n]: the Cholesky
    factorisation of shift I - A, without pivoting, in place and column by column as the CUDA
    kernel runs it (the diagonal keeps the pivots, the columns below it the factor). Returns
    (certified [n], z [n, S]); where not certified, z (up to sign) has z^T A z >= shift z^T z:
    the first pivot d_k <= 0 is the Schur complement z^T (shift I - A) z of z = (y, -1, 0, ...),
    y solving the leading k x k block against the column above the pivot, found from the factor's
    row k by a back substitution."""
    n, S, _ = A.shape
    # Batch last: each step's arithmetic runs over contiguous rows of the batch.
    M = np.negative(A.transpose(1, 2, 0), out=np.empty((S, S, n)))
    for k in range(S):
        M[k, k] += shift
    first_bad = np.full(n, S)
    for k in range(S):
        # Past its first bad pivot a matrix's later columns are zeroed (the kernel stops there):
        # z needs none of them, and the whole batch goes on in step.
        p = M[k, k]
        first_bad[(first_bad == S) & ~(p > 0.0)] = k
        M[k + 1:, k] *= np.where(first_bad == S, 1.0 / np.sqrt(np.where(p > 0.0, p, 1.0)), 0.0)
        col = M[k + 1:, k]
        M[k + 1:, k + 1:] -= col[:, None] * col[None, :]
    z = np.zeros((n, S))
    for r in np.flatnonzero(first_bad < S):   # rare: only where the iteration settled low
        k = int(first_bad[r])
        y = M[k, :k, r].copy()
        for i in range(k - 1, -1, -1):
            y[i] /= np.sqrt(M[i, i, r])
            y[:i] -= M[i, :i, r] * y[i]
        z[r, :k] = y
        z[r, k] = -1.0
    return first_bad == S, z


def _power_iterate(A: np.ndarray, b: np.ndarray, settings: SvdSettings, floor: np.ndarray,
                   previous: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Power iteration on each A [n, S, S] from b [n, S], each product projected off the filter's
    earlier vectors ``previous`` [n, j, S] (A's null space in exact arithmetic; the projection keeps
    V orthonormal where rounding leaks earlier components into A, as the CUDA kernel does); returns
    (vectors, products, converged)."""
    n = A.shape[0]
    b = b.copy()
    iterations = np.zeros(n, dtype=np.int64)
    converged = np.zeros(n, dtype=bool)
    restarted = np.zeros(n, dtype=bool)
    shift = np.zeros(n)
    # Each filter's iteration depends on that filter alone, so the dominance checks wait for the
    # round to end and run together (the kernel checks each filter at once: the same steps).
    going = np.arange(n)
    while going.size:
        active, passed = going, []
        while active.size:
            w = np.einsum("bij,bj->bi", A[active], b[active])
            V = previous[active]
            w -= np.einsum("bji,bj->bi", V, np.einsum("bji,bi->bj", V, w))
            iterations[active] += 1
            mu = np.einsum("bi,bi->b", b[active], w)
            nu = np.linalg.norm(w, axis=1)
            # A warm start in A's null space (the filter changed that much) starts over cold, once.
            dead = (nu <= floor[active]) & ~restarted[active]
            if dead.any():
                rows = active[dead]
                b[rows] = _cold_start(A[rows])
                restarted[rows] = True
            live = ~dead
            rows, w, mu, nu = active[live], w[live], mu[live], nu[live]
            residual2 = np.sum((w - mu[:, None] * b[rows]) ** 2, axis=1)
            b[rows] = w / np.maximum(nu, np.finfo(np.float64).tiny)[:, None]
            allowed2 = settings.tolerance * nu * (nu + mu)
            done = residual2 <= allowed2
            passed.append(rows[done])
            shift[rows[done]] = nu[done] + 2.0 * np.sqrt(allowed2[done]) + floor[rows[done]]
            finished = np.zeros(active.size, dtype=bool)
            finished[np.flatnonzero(live)[done]] = True
            finished |= iterations[active] >= settings.max_iterations
            active = active[~finished]
        passed = np.concatenate(passed)
        # The residual test holds at any eigenvector: certify that none lies above this one, or go
        # on from above the one it settled on.
        certified, z = _dominance_check(A[passed], shift[passed])
        converged[passed[certified]] = True
        low, z = passed[~certified], z[~certified]
        if low.size:
            V = previous[low]
            z -= np.einsum("bji,bj->bi", V, np.einsum("bji,bi->bj", V, z))
            b[low] = z / np.maximum(np.linalg.norm(z, axis=1), np.finfo(np.float64).tiny)[:, None]
        going = low[iterations[low] < settings.max_iterations]
    return b, iterations, converged


def power_svd(w: Any, rank: int, settings: SvdSettings | None = None, start: Any = None) -> SvdResult:
    """The leading ``rank`` singular triplets of every filter of ``w`` [..., R, S], in float64.

    ``start``: the previous call's v ([..., rank, S] or [B, rank, S]) to warm-start from; None
    starts cold. Returns factors with the batch flattened: u [B, rank, R], v [B, rank, S].
    """
    settings = settings or SvdSettings()
    F = filters_as_batch(w)
    B, R, S = F.shape
    rank = check_rank(rank, R, S)
    previous = None
    if start is not None:
        previous = np.asarray(start, dtype=np.float64).reshape(-1, *np.shape(start)[-2:])
        if previous.shape != (B, rank, S):
            raise ValueError(f"start must hold the previous v of {B} filters, [.., {rank}, {S}]; got "
                             f"shape {np.shape(start)}")
    eps = np.finfo(np.float64).eps
    energy = np.einsum("bij,bij->b", F, F)
    zero_floor = (ZERO_SHARE_EPS * eps) ** 2 * energy
    u = np.zeros((B, rank, R))
    v = np.zeros((B, rank, S))
    iterations = np.zeros((B, rank), dtype=np.int32)
    status = np.full((B, rank), ZERO, dtype=np.int32)
    for j in range(rank):
        A = np.einsum("byx,byz->bxz", F, F)
        trace = np.einsum("bii->b", A)
        live = np.flatnonzero((trace > zero_floor) & (energy > 0))
        empty = np.setdiff1d(np.arange(B), live)
        if empty.size:
            v[empty, j] = _orthogonal_completion(v[empty, :j], S)
        if live.size:
            A_live = A[live]
            b = _cold_start(A_live)
            if previous is not None:
                b = _warm_start(b, previous[live, j])
            floor = ZERO_SHARE_EPS * eps * trace[live]
            b, its, conv = _power_iterate(A_live, b, settings, floor, v[live, :j])
            v[live, j] = b
            u[live, j] = np.einsum("byx,bx->by", F[live], b)
            iterations[live, j] = its
            status[live, j] = np.where(conv, CONVERGED, CAPPED)
            F[live] -= u[live, j][:, :, None] * b[:, None, :]
    return SvdResult(u=u, v=v, iterations=iterations, status=status, settings=settings)


def effective_filters(u: Any, v: Any) -> Any:
    """W_eff[..., y, x] = sum_j u[..., j, y] v[..., j, x] (NumPy or CuPy arrays)."""
    return array_module(u).einsum("...jy,...jx->...yx", u, v)
