"""igemm_pool: conv_pool_fwd on the implicit-GEMM core (_igemm.cuh.j2, cores/igemm_gemm.py) with
conv_fwd's operand gathers (gemm_operands_conv_fwd.cuh.j2) and an averaging epilogue
(_conv_pool.cuh.j2).

A block computes the convolution outputs of whole pooling windows: its GEMM rows are the CH x CW
rectangle of a TPP x TQQ tile of pooled outputs (pool_blocks.py), for as many images as fit in BM
rows, and its columns BN filters. Overlapping windows share their overlap in shared memory inside
the block; between neighbouring tiles it is recomputed (a rectangle's extra rows: window - stride
per tile). Serves every window whose one-window rectangle fits in MAX_BLOCK_CELLS rows (pool_blocks.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Formulation, pragma_unroll
from autocnn.kernels.formulations.cores.igemm_gemm import (CONV_BM, CORE_TEMPLATES, ConvIgemm, GemmEnvelope,
                                                           igemm_smem_bytes, igemm_threads)
from autocnn.kernels.formulations.cores.pool_blocks import block_extent, rectangle
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import sixteen_bit_rule, smem_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch

if TYPE_CHECKING:
    from autocnn.kernels.conv_pool_problems import ConvPoolFwdProblem

NAME = "igemm_pool"
POOLED_TILE = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def block_rows(p: "ConvPoolFwdProblem", bm: int, tpp: int, tqq: int) -> tuple[int, int, int]:
    """(CH, CW, IMGS): a block's rectangle and how many images' rectangles fill its BM rows."""
    ch, cw = rectangle(p, tpp, tqq)
    return ch, cw, max(1, min(p.N, bm // (ch * cw)))


def pool_smem_bytes(p: "ConvPoolFwdProblem", c: Config) -> int:
    """The GEMM's staging, reused afterwards by the BN x rows activation tile: the larger of the two."""
    ch, cw, imgs = block_rows(p, c["BM"], c["TPP"], c["TQQ"])
    stage = p.precision.accumulator.size
    return max(igemm_smem_bytes(stage, c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"]), stage * c["BN"] * imgs * ch * cw)


class IgemmPoolFwd(ConvIgemm):
    formulation = NAME
    op = "conv_pool_fwd"
    summary = "implicit GEMM over whole pooling windows, averaged in shared memory"
    templates = ("igemm_pool_conv_pool_fwd.cu.j2", *CORE_TEMPLATES, "gemm_operands_conv_fwd.cuh.j2",
                 "_conv_fwd_operands.cuh.j2", "_operand_access.cuh.j2")

    def envelope(self, p: "ConvPoolFwdProblem") -> GemmEnvelope:
        # A block's rows may exceed a small map's outputs (its rectangle reaches into the padding).
        ch, cw = rectangle(p, 1, 1)
        return GemmEnvelope(GM=max(p.N * p.P * p.Q, ch * cw), GN=p.K, GK=p.C * p.R * p.S,
                            stage_size=p.precision.accumulator.size)

    def params(self, p: "ConvPoolFwdProblem") -> list[Param]:
        return [*super().params(p),
                Param("TPP", tuple(t for t in POOLED_TILE if t <= p.PP), "pooled output rows per block"),
                Param("TQQ", tuple(t for t in POOLED_TILE if t <= p.QQ), "pooled output columns per block")]

    def constraints(self, p: "ConvPoolFwdProblem", limits: DeviceLimits) -> list[Constraint]:
        def fits(bm, tpp, tqq):
            ch, cw = rectangle(p, tpp, tqq)
            return None if ch * cw <= bm else f"a {ch}x{cw} rectangle of convolution outputs exceeds BM={bm} rows"

        def smem(bm, bn, bk, pad_a, pad_b, tpp, tqq):
            values = {"BM": bm, "BN": bn, "BK": bk, "PAD_A": pad_a, "PAD_B": pad_b, "TPP": tpp, "TQQ": tqq}
            return pool_smem_bytes(p, values)  # type: ignore[arg-type]

        return [*super().constraints(p, limits),
                sixteen_bit_rule(p, NAME, "BM", "the fused convolution and averaging reads and writes float32 tensors "
                                                "only"),
                Constraint(("BM", "TPP", "TQQ"), fits),
                smem_rule(limits, ("BM", "BN", "BK", "PAD_A", "PAD_B", "TPP", "TQQ"), smem)]

    def default_candidates(self, p: "ConvPoolFwdProblem") -> list[dict[str, Any]]:
        """Per block size, the pooled tile that gives its rows the most new convolution outputs;
        the last candidate (the smallest BM that holds one window) fits every problem."""
        bn = max(16, min(64, next_pow2(p.K)))
        tn = 4 if bn >= 32 else 2
        gemm = {"formulation": NAME, "PAD_A": 0, "PAD_B": 4, "UNROLL_K": 0, "BN": bn, "TN": tn}
        out = [{**gemm, "BM": bm, "BK": 8, "TM": tm, **self._tile(p, bm)} for bm, tm in ((128, 8), (64, 4))]
        one = rectangle(p, 1, 1)
        bm = min(b for b in CONV_BM if b >= one[0] * one[1])
        # Few threads or a small k-step can leave a tile unevenly split; these choices divide evenly.
        last = {"BM": bm, "BN": 16, "TN": 2, "TM": min(8, bm // 16), "BK": 16 if bm >= 128 else 8, "PAD_B": 0}
        return out + [{**gemm, **last, "TPP": 1, "TQQ": 1}]

    def _tile(self, p: "ConvPoolFwdProblem", bm: int) -> dict[str, int]:
        kh, kw = p.pool_window
        sh, sw = p.pool_stride
        best, score = {"TPP": 1, "TQQ": 1}, 0
        for tpp in (t for t in POOLED_TILE if t <= p.PP):
            for tqq in (t for t in POOLED_TILE if t <= p.QQ):
                ch, cw, imgs = block_rows(p, bm, tpp, tqq)
                if ch * cw > bm:
                    continue
                new = imgs * tpp * tqq * min(kh, sh) * min(kw, sw)
                if new > score:
                    best, score = {"TPP": tpp, "TQQ": tqq}, new
        return best

    def context(self, p: "ConvPoolFwdProblem", c: Config) -> dict[str, Any]:
        ch, cw, imgs = block_rows(p, c["BM"], c["TPP"], c["TQQ"])
        return {"UNROLL_K": pragma_unroll(c["UNROLL_K"]), "NHWC": False, "CH": ch, "CW": cw, "IMGS": imgs}

    def launches(self, p: "ConvPoolFwdProblem", c: Config) -> tuple[Launch, ...]:
        _, _, imgs = block_rows(p, c["BM"], c["TPP"], c["TQQ"])
        tiles = cdiv(p.PP, c["TPP"]) * cdiv(p.QQ, c["TQQ"])
        grid = (cdiv(p.N, imgs) * tiles, cdiv(p.K, c["BN"]), 1)
        return (Launch("conv_pool_fwd", grid, (igemm_threads(c), 1, 1), pool_smem_bytes(p, c),
                       ("x", "w", "bias", "y", "a")),)

    def code_helpers(self) -> tuple:
        return (type(self).envelope, block_rows, rectangle, block_extent, pool_smem_bytes, igemm_smem_bytes, igemm_threads,
                pragma_unroll)


IGEMM_POOL = Formulation(NAME, (IgemmPoolFwd(),))
