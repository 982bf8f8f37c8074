"""The tangent projection of projection.py on the GPU: a generated kernel per (R, S, rank), one
block per filter (tangent_projection.cu.j2), from the factor gradients (``tangent_projection``)
or from the 2D gradient G itself (``tangent_projection_from_g``, which also writes the factor
gradients). Capturable in a CUDA graph: each is one launch, with no allocation."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from autocnn.separable.projection import SIGMA_FLOOR
from autocnn.separable.templates import load_module, render

TEMPLATE = "tangent_projection.cu.j2"
KERNEL = "separable_tangent_projection"
KERNEL_FROM_G = "separable_tangent_projection_from_g"


def threads_for(R: int, S: int) -> int:
    """Threads of a block: one per filter element, in whole warps (at most 128: 11x11 is 121)."""
    return min(128, 32 * -(-R * S // 32))


def render_source(R: int, S: int, rank: int, from_g: bool = False) -> str:
    return render(TEMPLATE, R=R, S=S, RANK=rank, THREADS=threads_for(R, S), FROM_G=from_g,
                  kernel=KERNEL_FROM_G if from_g else KERNEL, SIGMA_FLOOR=repr(SIGMA_FLOOR["float32"]))


@functools.lru_cache(maxsize=None)
def _function(R: int, S: int, rank: int, from_g: bool = False) -> Any:
    return load_module(render_source(R, S, rank, from_g)).get_function(KERNEL_FROM_G if from_g else KERNEL)


def _check(arrays: tuple[tuple[str, Any, tuple[int, ...]], ...]) -> None:
    for name, array, shape in arrays:
        if tuple(array.shape) != shape or array.dtype != np.float32 or not array.flags.c_contiguous:
            raise ValueError(f"tangent projection: {name} must be a contiguous float32 array {shape}, got "
                             f"{tuple(array.shape)} {array.dtype}")


def tangent_projection(gu: Any, gv: Any, u: Any, v: Any, dw: Any) -> Any:
    """dw [K, C, R, S] = P(G) from gu, u [K, C, r, R] and gv, v [K, C, r, S] (float32 CuPy arrays)."""
    K, C, rank, R = (int(s) for s in u.shape)
    S = int(v.shape[-1])
    _check((("u", u, (K, C, rank, R)), ("gu", gu, (K, C, rank, R)), ("gv", gv, (K, C, rank, S)),
            ("v", v, (K, C, rank, S)), ("dw", dw, (K, C, R, S))))
    _function(R, S, rank)((K * C,), (threads_for(R, S),), (u, v, gu, gv, dw))
    return dw


def tangent_projection_from_g(g: Any, u: Any, v: Any, gu: Any, gv: Any, dw: Any) -> Any:
    """dw [K, C, R, S] = P(G) from the 2D gradient g [K, C, R, S] and the factors u [K, C, r, R],
    v [K, C, r, S]; writes the factor gradients gu = G v and gv = u^T G on the way."""
    K, C, rank, R = (int(s) for s in u.shape)
    S = int(v.shape[-1])
    _check((("g", g, (K, C, R, S)), ("u", u, (K, C, rank, R)), ("v", v, (K, C, rank, S)),
            ("gu", gu, (K, C, rank, R)), ("gv", gv, (K, C, rank, S)), ("dw", dw, (K, C, R, S))))
    _function(R, S, rank, True)((K * C,), (threads_for(R, S),), (u, v, g, gu, gv, dw))
    return dw
