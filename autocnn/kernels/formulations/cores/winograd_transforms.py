"""Winograd F(m x m, 3x3), m = 2 and 4: the transform matrices, a 3x3 stride-1 convolution seen as the
forward correlation the transforms compute (``WinogradView``), its output tiles, and the generated C
that applies a transform to a tile (``sandwich``). The winograd formulation (transforms and products
as separate kernels) and winograd_fused (one kernel) share them.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from autocnn.kernels.geometry import cdiv


_h = Fraction(1, 2)
# (B^T, G, A^T) of F(m x m, 3x3) for m = 2 and 4 (the points 0, +-1 and 0, +-1, +-2, infinity).
TRANSFORMS: dict[int, tuple[tuple[tuple[Fraction, ...], ...], ...]] = {
    2: (((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        ((1, 0, 0), (_h, _h, _h), (_h, -_h, _h), (0, 0, 1)),
        ((1, 1, 1, 0), (0, 1, -1, -1))),
    4: (((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
         (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
        ((Fraction(1, 4), 0, 0), (Fraction(-1, 6), Fraction(-1, 6), Fraction(-1, 6)),
         (Fraction(-1, 6), Fraction(1, 6), Fraction(-1, 6)), (Fraction(1, 24), Fraction(1, 12), Fraction(1, 6)),
         (Fraction(1, 24), Fraction(-1, 12), Fraction(1, 6)), (0, 0, 1)),
        ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))),
}


@dataclass(frozen=True)
class WinogradView:
    """A 3x3 stride-1 convolution as a forward correlation: in CIN x HI x WI, out COUT x HO x WO."""

    op: str
    N: int
    CIN: int
    COUT: int
    HI: int
    WI: int
    HO: int
    WO: int
    PAD_T: int
    PAD_L: int
    FLIP: bool          # the filters flipped and transposed (conv_bwd_data)


def serves(p: Any) -> bool:
    return p.R == 3 and p.S == 3 and tuple(p.stride) == (1, 1)


def unserved(p: Any, formulation: str) -> str | None:
    """Why a Winograd formulation cannot compute the problem, if it cannot (every one of its
    configs is infeasible then, with this reason)."""
    if serves(p):
        return None
    return (f"{formulation} computes 3x3 stride-1 convolutions, not {p.R}x{p.S} with stride "
            f"{p.stride[0]}x{p.stride[1]}")


def view(p: Any) -> WinogradView:
    if p.op in ("conv_fwd", "conv_wgrad"):     # conv_wgrad: the forward correlation it differentiates
        return WinogradView(p.op, p.N, p.C, p.K, p.H, p.W, p.P, p.Q, p.padding[0], p.padding[1], False)
    return WinogradView(p.op, p.N, p.K, p.C, p.P, p.Q, p.H, p.W, p.R - 1 - p.padding[0], p.S - 1 - p.padding[1], True)


def tiles(v: WinogradView, m: int) -> tuple[int, int]:
    """Output tiles along the height and the width."""
    return cdiv(v.HO, m), cdiv(v.WO, m)


def _literal(c: Fraction) -> str:
    c = Fraction(c)
    return f"{c.numerator}.0f" if c.denominator == 1 else f"({c.numerator}.0f / {c.denominator}.0f)"


def _combination(coeffs: tuple, terms: list[str]) -> str:
    """sum_k coeffs[k] * terms[k] as C, zero coefficients left out."""
    out = ""
    for c, term in zip(coeffs, terms):
        c = Fraction(c)
        if c == 0:
            continue
        sign = "-" if c < 0 else "+"
        body = term if abs(c) == 1 else f"{_literal(abs(c))} * {term}"
        out += f" {sign} {body}" if out else (f"-{body}" if c < 0 else body)
    return out or "0.0f"


def sandwich(out: str, mat: tuple, src: str, cols: int, tmp: str) -> list[str]:
    """Statements computing out = mat src mat^T (src cols x cols, out rows x rows) through tmp."""
    rows = len(mat)
    code = [f"float {tmp}[{rows}][{cols}];"]
    for i in range(rows):
        for j in range(cols):
            code.append(f"{tmp}[{i}][{j}] = {_combination(mat[i], [f'{src}[{k}][{j}]' for k in range(cols)])};")
    for i in range(rows):
        for j in range(rows):
            code.append(f"{out}[{i}][{j}] = {_combination(mat[j], [f'{tmp}[{i}][{k}]' for k in range(cols)])};")
    return code


# The functions that decide sandwich's code, in the order a formulation's fingerprint hashes them.
SANDWICH_CODE = (_literal, _combination, sandwich)
