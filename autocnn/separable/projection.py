"""The separable layer's weight update: the 2D gradient projected onto the tangent space.

The layer's filters are W_eff = sum_j u_j v_j^T, a rank-r matrix per filter, with Uhat (columns
uhat_j = u_j / sigma_j) and V (columns v_j) orthonormal. The gradient of the loss with respect to
W_eff is the 2D weight gradient G; the separable weight-gradient kernel gives only its products
with the factors, gu_j = G v_j and gv_j = u_j^T G (the gradients with respect to u_j and v_j).
The update applied to the full filters W is G projected onto the tangent space of rank-r matrices
at W_eff:

    P(G) = Uhat Uhat^T G + G V V^T - Uhat Uhat^T G V V^T
         = sum_j gu_j v_j^T + sum_i u_i / sigma_i^2 (gv_i - sum_j (u_i . gu_j) v_j)^T,

which needs gu, gv, u and v only (u_i . gu_j = sigma_i uhat_i^T G v_j). Where W is itself of rank r
the derivative of its rank-r approximation is this projection, so P(G) is then the exact gradient
of the loss with respect to W. A component with sigma_i negligible (at most SIGMA_FLOOR times the
filter's largest sigma^2, or zero) contributes no Uhat direction: 1/sigma_i^2 is taken as 0.

This module is the NumPy (float64-checkable) form; projection_cuda runs the same formula on the GPU.
"""
from __future__ import annotations

import numpy as np

# sigma_i^2 at most this share of the filter's largest is taken as zero (float32 rounding of the
# deflation, ~(64 eps)^2, would otherwise blow up as 1/sigma^2).
SIGMA_FLOOR = {"float32": (64 * float(np.finfo(np.float32).eps)) ** 2,
               "float64": (64 * float(np.finfo(np.float64).eps)) ** 2}


def inverse_sigma2(u: np.ndarray) -> np.ndarray:
    """1/sigma_i^2 per component of u [..., r, R], 0 where sigma_i is negligible."""
    s2 = np.sum(u * u, axis=-1)
    floor = SIGMA_FLOOR["float64" if u.dtype == np.float64 else "float32"] * s2.max(axis=-1, keepdims=True)
    return np.divide(1.0, s2, out=np.zeros_like(s2), where=(s2 > floor) & (s2 > 0))


def factor_gradients(g: np.ndarray, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gu [..., r, R] = G v_j and gv [..., r, S] = u_j^T G from the 2D gradient G [..., R, S]."""
    gu = np.einsum("...yx,...jx->...jy", g, v)
    gv = np.einsum("...jy,...yx->...jx", u, g)
    return gu, gv


def tangent_projection(gu: np.ndarray, gv: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """P(G) [..., R, S] from the factor gradients and the factors (see the module docstring)."""
    d = inverse_sigma2(u)
    m = np.einsum("...iy,...jy->...ij", u, gu)
    inner = gv - np.einsum("...ij,...jx->...ix", m, v)
    return np.einsum("...jy,...jx->...yx", gu, v) + np.einsum("...iy,...i,...ix->...yx", u, d, inner)


def projection_from_svd(g: np.ndarray, w: np.ndarray, rank: int) -> np.ndarray:
    """P(G) with Uhat and V from LAPACK's SVD of W [..., R, S] (an independent check of the formula)."""
    U, _, Vt = np.linalg.svd(w)
    Uh, V = U[..., :, :rank], np.swapaxes(Vt[..., :rank, :], -1, -2)
    left = Uh @ np.swapaxes(Uh, -1, -2)
    right = V @ np.swapaxes(V, -1, -2)
    return left @ g + g @ right - left @ g @ right

