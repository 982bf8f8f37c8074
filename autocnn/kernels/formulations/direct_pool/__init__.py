"""direct_pool: conv_pool_fwd on the direct core (_direct.cuh.j2, cores/direct_correlation.py), for
windows that do not overlap.

The core tiles its output map into TP x TQ blocks from the origin; over a virtual map shifted by
the pooling's top and left padding, a tile of TP = TPP*PSH rows holds TPP whole windows when the
windows do not overlap (window <= stride), so every block averages its own windows and no
convolution output is computed twice. Its parameters are the direct core's (the tile TP x TQ must
be a multiple of the pooling stride); overlapping windows are left to igemm_pool.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Formulation
from autocnn.kernels.formulations.cores.direct_correlation import (CorrelationEnvelope, DirectCorrelation,
                                                                   direct_smem_bytes, direct_threads)
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.rules import sixteen_bit_rule, smem_rule
from autocnn.kernels.space import Config, Constraint
from autocnn.kernels.steps import Launch

if TYPE_CHECKING:
    from autocnn.kernels.conv_pool_problems import ConvPoolFwdProblem

NAME = "direct_pool"


def tile_smem_bytes(env: CorrelationEnvelope, KB: int, TP: int, TQ: int, CB: int, PAD: int) -> int:
    """The core's staging and, behind it, the KB x TP x TQ activation tile."""
    return direct_smem_bytes(env, KB, TP, TQ, CB, PAD) + env.stage_size * KB * TP * TQ


class DirectPoolFwd(DirectCorrelation):
    formulation = NAME
    op = "conv_pool_fwd"
    summary = "direct tiles of whole windows that do not overlap, averaged in shared memory"
    templates = ("direct_pool_conv_pool_fwd.cu.j2", "_direct.cuh.j2")

    def envelope(self, p: "ConvPoolFwdProblem") -> CorrelationEnvelope:
        return CorrelationEnvelope(CI=p.C, CO=p.K, OH=p.P + p.pool_padding[0], OW=p.Q + p.pool_padding[1],
                                   R=p.R, S=p.S, STH=p.stride[0], STW=p.stride[1], grid_z=p.N,
                                   stage_size=p.precision.accumulator.size)

    def constraints(self, p: "ConvPoolFwdProblem", limits: DeviceLimits) -> list[Constraint]:
        (kh, kw), (sh, sw) = p.pool_window, p.pool_stride
        overlap = f"the {kh}x{kw} windows of stride {sh}x{sw} overlap (igemm_pool serves them)"
        env = self.envelope(p)
        return [*super().constraints(p, limits),
                sixteen_bit_rule(p, NAME, "KB", "the fused convolution and averaging reads and writes float32 "
                                                "tensors only"),
                Constraint(("TP",), lambda tp: None if kh <= sh and kw <= sw else overlap),
                Constraint(("TP",), lambda tp: None if tp % sh == 0 else f"TP={tp} is not a multiple of the stride {sh}"),
                Constraint(("TQ",), lambda tq: None if tq % sw == 0 else f"TQ={tq} is not a multiple of the stride {sw}"),
                smem_rule(limits, ("KB", "TP", "TQ", "CB", "PAD"),
                          lambda kb, tp, tq, cb, pad: tile_smem_bytes(env, kb, tp, tq, cb, pad))]

    def default_candidates(self, p: "ConvPoolFwdProblem") -> list[dict[str, Any]]:
        # The direct core's own (those whose tile is no multiple of the stride fail with that reason),
        # then each with one output per thread: small maps need them to fill a warp.
        own = super().default_candidates(p)
        return own + [{**c, "KPT": 1, "PPT": 1, "QPT": 1} for c in own]

    def context(self, p: "ConvPoolFwdProblem", c: Config) -> dict[str, Any]:
        return {**super().context(p, c), "TPP": c["TP"] // p.pool_stride[0], "TQQ": c["TQ"] // p.pool_stride[1]}

    def launches(self, p: "ConvPoolFwdProblem", c: Config) -> tuple[Launch, ...]:
        env = self.envelope(p)
        tiles = cdiv(env.OH, c["TP"]) * cdiv(env.OW, c["TQ"])
        smem = tile_smem_bytes(env, c["KB"], c["TP"], c["TQ"], c["CB"], c["PAD"])
        return (Launch("conv_pool_fwd", (tiles, cdiv(p.K, c["KB"]), p.N), (direct_threads(c), 1, 1), smem,
                       ("x", "w", "bias", "y", "a")),)

    def code_helpers(self) -> tuple:
        return (*super().code_helpers(), tile_smem_bytes)


DIRECT_POOL = Formulation(NAME, (DirectPoolFwd(),))
