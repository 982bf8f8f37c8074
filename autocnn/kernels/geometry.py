"""Integer geometry that operations and formulations share: ceiling division and powers of two
(tiles, grids, launch sizes), and the stride phases of a strided convolution's input gradient.

conv_bwd_data splits its outputs into stride phases (a, b) = ((h + pad_top) % SH, (w + pad_left) % SW);
in each phase the contributing taps are r = a + SH*j, so the strided gather becomes a dense stride-1
correlation of dY with a flipped sub-filter, with no work on the "holes". Every formulation that
runs the backward-data phases (direct, igemm, gather, tc, wgmma, halo, tma, the op template) and
the fused backward take them from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autocnn.kernels.problem import ConvBwdDataProblem


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class StridePhase:
    a: int      # (h + pad_top) mod SH of this phase's outputs
    b: int
    Ha: int     # outputs of the phase along h: h = a - PT + SH*(ilo + i), 0 <= i < Ha
    Wb: int
    ilo: int
    jlo: int
    Ra: int     # filter taps of the phase along r: r = a + SH*j, 0 <= j < Ra (0: the gradient is zero)
    Sb: int


def stride_phases(p: ConvBwdDataProblem) -> list[StridePhase]:
    sh, sw = p.stride
    pt, pl = p.padding[0], p.padding[1]
    phases = []
    for a in range(sh):
        ilo = -((a - pt) // sh)                 # ceil((pt - a) / sh): the first output row >= 0
        ihi = (p.H - 1 - a + pt) // sh
        ha = ihi - ilo + 1
        ra = -(-(p.R - a) // sh) if a < p.R else 0
        for b in range(sw):
            jlo = -((b - pl) // sw)
            jhi = (p.W - 1 - b + pl) // sw
            wb = jhi - jlo + 1
            sb = -(-(p.S - b) // sw) if b < p.S else 0
            if ha > 0 and wb > 0:
                phases.append(StridePhase(a, b, ha, wb, ilo, jlo, ra, sb))
    return phases
