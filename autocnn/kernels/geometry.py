"""Integer geometry that operations and formulations share: ceiling division and powers of two
(tiles, grids, launch sizes), and the stride phases of a strided convolution's input gradient.

conv_bwd_data splits its outputs into stride phases (a, b) = ((h + pad_top) % SH, (w + pad_left) % SW);
in each phase the contributing taps are r = a + SH*j, so the strided gather becomes a dense stride-1
correlation of dY with a flipped sub-filter, with no work on the "holes". Every formulation that
runs the backward-data phases (direct, igemm, gather, tc, wgmma, halo, tma, the op template) and
the fused backward take them from here. A dilated layer's phases (tap_phases: its taps r with
r*DIL = a mod SH, which gcd(SH, DIL) decides) are the same phases with other taps (igemm).
"""
from __future__ import annotations

import math
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


@dataclass(frozen=True)
class TapSteps:
    """How a dilated layer's taps advance within one stride phase of its input gradient (per axis):
    the phase's taps are RSTEP apart and their dY rows PSTEP apart (SSTEP, QSTEP along w)."""
    rstep: int
    sstep: int
    pstep: int
    qstep: int


@dataclass(frozen=True)
class TapPhase(StridePhase):
    """A stride phase of a dilated layer: its taps are r = r0 + rstep*j (0 <= j < Ra), and output row
    ilo + i of the phase reads dY row ilo + i - (e0 + pstep*j) (likewise s0, f0 along w)."""
    r0: int
    s0: int
    e0: int
    f0: int


def tap_steps(p: ConvBwdDataProblem) -> TapSteps:
    """Within a phase, h + PT = p*SH + r*DIL is held by taps whose r*DIL agree modulo SH, that is
    r modulo SH / gcd(SH, DIL): consecutive taps of the phase are that far apart, and their dY rows
    DIL / gcd(SH, DIL) apart (undilated: SH and 1, the plain stride phases)."""
    (sh, sw), (dh, dw) = p.stride, p.dilation
    gh, gw = math.gcd(sh, dh), math.gcd(sw, dw)
    return TapSteps(sh // gh, sw // gw, dh // gh, dw // gw)


def _first_tap(residue: int, stride: int, dilation: int, taps: int) -> tuple[int, int, int]:
    """The first tap r >= 0 with r*dilation = residue (mod stride), the dY row offset e of that tap
    ((r*dilation - residue) / stride) and how many taps below ``taps`` the phase has: none where
    gcd(stride, dilation) does not divide the residue (no tap reaches those outputs)."""
    g = math.gcd(stride, dilation)
    if residue % g:
        return 0, 0, 0
    step = stride // g
    r0 = (residue // g) * pow(dilation // g, -1, step) % step
    count = -(-(taps - r0) // step) if r0 < taps else 0
    return r0, (r0 * dilation - residue) // stride, count


def tap_phases(p: ConvBwdDataProblem) -> list[TapPhase]:
    """The stride phases of conv_bwd_data (stride_phases: the outputs (h + PT) % SH = a of one phase)
    with the taps that reach them through the dilation. A phase decomposition rather than a test of
    divisibility per tap: every phase stays a dense GEMM (each of its taps reaches every output of
    the phase), and a phase no tap reaches is zero without a product. Undilated, these are
    stride_phases' phases, each with r0 = a and e0 = 0."""
    (sh, sw), (dh, dw) = p.stride, p.dilation
    out = []
    for ph in stride_phases(p):
        r0, e0, ra = _first_tap(ph.a, sh, dh, p.R)
        s0, f0, sb = _first_tap(ph.b, sw, dw, p.S)
        out.append(TapPhase(ph.a, ph.b, ph.Ha, ph.Wb, ph.ilo, ph.jlo, ra, sb, r0, s0, e0, f0))
    return out
