"""Block geometry of the fused convolution + averaging kernels (conv_pool_fwd).

A block of a fused kernel computes the convolution outputs of whole pooling windows: a tile of
TPP x TQQ pooled outputs needs the convolution outputs of the rectangle from its first window's
first row to its last window's last row. Windows that overlap (stride < window) share their
overlap inside a block (it is computed once and read from shared memory by each window); at
block borders the overlap is computed again by both neighbours, ((window - stride) rows per
tile). With ``keep_activation`` every convolution output must be written once to ``a``, so a
block's rectangle also covers the rows between windows (stride > window) and, in the last tile,
the rows after the last window; each output is written by the one block that owns it.

Used by the formulations (launch geometry, shared memory) and by the problem's validation (the
smallest block must fit), so it lives apart from both.
"""
from __future__ import annotations

from autocnn.kernels.formulations.cores.igemm_gemm import CONV_BM
from autocnn.kernels.geometry import cdiv

MAX_BLOCK_CELLS = max(CONV_BM)     # a block's rectangle must fit in igemm_pool's GEMM rows


def block_extent(conv: int, pooled: int, window: int, stride: int, pad_lo: int, per_block: int,
                 keep: bool) -> int:
    """Convolution outputs along one axis that a block of ``per_block`` pooled outputs computes.

    ``conv``: convolution outputs along the axis (P or Q); ``pooled``: pooled outputs (PP or QQ);
    ``pad_lo``: the pooling's padding before the first row (or column)."""
    extent = (per_block - 1) * stride + window
    if not keep:
        return extent
    tiles = cdiv(pooled, per_block)
    # Tile t owns rows [t*per_block*stride - pad_lo, (t+1)*per_block*stride - pad_lo); the last
    # tile also owns every row after that up to the end of the map.
    owned = per_block * stride if tiles > 1 else 0
    last = conv - ((tiles - 1) * per_block * stride - pad_lo)
    return max(extent, owned, last)


def rectangle(problem, tpp: int, tqq: int) -> tuple[int, int]:
    """(CH, CW): the convolution rectangle of a block of TPP x TQQ pooled outputs."""
    kh, kw = problem.pool_window
    sh, sw = problem.pool_stride
    pt, pl = problem.pool_padding[0], problem.pool_padding[1]
    return (block_extent(problem.P, problem.PP, kh, sh, pt, tpp, problem.keep_activation),
            block_extent(problem.Q, problem.QQ, kw, sw, pl, tqq, problem.keep_activation))
