"""Checking factors from the batched SVD against the float64 truncated SVD (numpy.linalg.svd).

Singular vectors are not unique where singular values are close (and the power method's are only
as good as its stopping rule), so factors are judged by what they are for: the approximation's
error. With V orthonormal (deflation, and each product projected off the earlier v's, make it so) the factors reconstruct F V V^T, whose squared
error is ||F||^2 - sum_j ||F_j v_j||^2. Its excess over the best rank-r error (the truncated SVD's,
sum_{j>=r} sigma_j^2) is the energy the components missed, and:

* a converged component (nu - mu <= tol nu, so ||A b - mu b|| <= sqrt(2 tol) nu, and no eigenvalue
  of its Gram matrix at or above nu + 2 sqrt(2 tol) nu: svd's dominance check) misses at most
  about 2 sqrt(2 tol) sigma_j^2; the check allows CONVERGED_FACTOR * sqrt(tol) * sigma_0^2 per
  converged component. Without the dominance check a start nearly orthogonal to the top
  eigenvector settles on the next one (measured: 0-4 of 1,024 random filters at the default
  settings; with it, none in 400 such batches), and so may a capped component's vector. A filter
  may then miss up to sigma_j^2 - sigma_{j+1}^2 per component (the truncated SVD's values), the
  most that settling costs; such *settled* filters may be at most SETTLED_SHARE of the batch, so
  a kernel that is wrong for many filters still fails;
* a capped component after m products misses at most about rho^(2m) (1 - rho) tan^2(theta_0)
  sigma_0^2 <= tan^2(theta_0) / (2 e m) sigma_0^2; the check allows S / m * sigma_0^2 (a cold start's
  tan^2 is at most about S);
* the factors' own rounding (float32 on a GPU) adds ROUNDING[dtype] * rank * ||F||^2.

Every element must be finite, every v a unit vector, and the V of a filter orthonormal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autocnn.separable.svd import CAPPED, CONVERGED, ZERO, SvdSettings

CONVERGED_FACTOR = 3.0
SETTLED_SHARE = 0.02
ROUNDING = {"float32": 1e-5, "float64": 1e-12}
ORTHONORMAL_TOLERANCE = {"float32": 1e-4, "float64": 1e-8}


@dataclass(frozen=True)
class FactorCheck:
    """The verdict on one call's factors: ``passed``, the worst excess error relative to its strict
    allowance (above 1: the filter settled, or failed), how many filters settled, and, when it
    failed, which filters and why."""

    passed: bool
    worst_ratio: float
    settled: int
    failing_filters: tuple[int, ...]
    message: str


def _batch(a: Any, shape_tail: int) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(-1, *a.shape[-shape_tail:]) if shape_tail else a.reshape(-1)


def check_factors(w: Any, u: Any, v: Any, status: Any, settings: SvdSettings, dtype: str = "float32"
                  ) -> FactorCheck:
    """Judge factors u [B, r, R], v [B, r, S] with status [B, r] of the filters w [B, R, S]."""
    if dtype not in ROUNDING:
        raise ValueError(f"dtype must be one of {', '.join(ROUNDING)}, got {dtype!r}")
    F, U, V = _batch(w, 2), _batch(u, 2), _batch(v, 2)
    st = np.asarray(status).reshape(U.shape[0], U.shape[1])
    B, R, S = F.shape
    rank = U.shape[1]
    if U.shape != (B, rank, R) or V.shape != (B, rank, S):
        raise ValueError(f"factors of shapes {U.shape} and {V.shape} do not fit {B} filters {R}x{S} at rank {rank}")
    problems: list[str] = []
    bad = np.zeros(B, dtype=bool)
    finite = np.isfinite(U).all(axis=(1, 2)) & np.isfinite(V).all(axis=(1, 2))
    if not finite.all():
        problems.append(f"{int((~finite).sum())} filters have non-finite factors")
        bad |= ~finite
    U, V = np.nan_to_num(U), np.nan_to_num(V)
    gram = np.einsum("bjx,bkx->bjk", V, V) - np.eye(rank)[None]
    skew = np.abs(gram).max(axis=(1, 2))
    not_orthonormal = skew > ORTHONORMAL_TOLERANCE[dtype]
    if not_orthonormal.any():
        problems.append(f"{int(not_orthonormal.sum())} filters' v are not orthonormal (worst "
                        f"|V^T V - I| = {skew.max():.3g})")
        bad |= not_orthonormal
    sigma = np.linalg.svd(F, compute_uv=False)
    energy = np.sum(F * F, axis=(1, 2))
    best = np.sum(sigma[:, rank:] ** 2, axis=1)
    error = np.sum((F - np.einsum("bjy,bjx->byx", U, V)) ** 2, axis=(1, 2))
    excess = error - best
    top = sigma[:, 0] ** 2
    strict = (np.sum(st == CONVERGED, axis=1) * CONVERGED_FACTOR * math.sqrt(settings.tolerance) * top
              + np.sum(st == CAPPED, axis=1) * S / settings.max_iterations * top
              + ROUNDING[dtype] * rank * energy)
    s2 = np.concatenate([sigma ** 2, np.zeros((B, 1))], axis=1)
    settling = np.sum(np.where(st != ZERO, s2[:, :rank] - s2[:, 1:rank + 1], 0.0), axis=1)
    ratio = np.divide(excess, strict, out=np.where(excess > 0, np.inf, 0.0), where=strict > 0)
    settled = (ratio > 1.0) & (excess <= strict + settling)
    too_far = (ratio > 1.0) & ~settled
    if too_far.any():
        worst = int(np.argmax(np.where(too_far, ratio, 0.0)))
        problems.append(f"{int(too_far.sum())} filters' approximations miss more than allowed (worst: filter "
                        f"{worst}, excess squared error {excess[worst]:.3g} over the truncated SVD's "
                        f"{best[worst]:.3g}, allowed {strict[worst]:.3g}, or {strict[worst] + settling[worst]:.3g} "
                        f"settled on a neighbouring singular value)")
        bad |= too_far
    allowed_settled = max(1, math.ceil(SETTLED_SHARE * B))
    if settled.sum() > allowed_settled:
        problems.append(f"{int(settled.sum())} filters settled on a neighbouring singular value, more than "
                        f"{allowed_settled} ({100 * SETTLED_SHARE:g}% of {B})")
        bad |= settled
    worst_ratio = float(np.max(np.where(finite, ratio, np.inf))) if B else 0.0
    return FactorCheck(passed=not problems, worst_ratio=worst_ratio, settled=int(settled.sum()),
                       failing_filters=tuple(int(i) for i in np.flatnonzero(bad)[:20]),
                       message="; ".join(problems) or "ok")
