"""The planes of the fft formulation's convolutions: FFT sizes, stride phases, FFT tiles, which
outputs an op keeps, where its operands are placed, and the workspace of a block of images (the
formulation is in fft.py; the generated kernels' tables and shared memory in fft_kernels.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.space import Config
from autocnn.kernels.steps import LibraryComplexGemm, MatrixView

SHARED_WITH = {"fft_a": "fft_of", "fft_o": "fft_af"}


def smooth_size(n: int) -> int:
    """The smallest size >= n whose prime factors are 2, 3, 5 and 7 (cuFFT's fast sizes)."""
    while True:
        m = n
        for prime in (2, 3, 5, 7):
            while m % prime == 0:
                m //= prime
        if m == 1:
            return n
        n += 1


@dataclass(frozen=True)
class FftConv:
    """One op as a sum of products of spectra: O[i][j] = sum over l of X(i, l) Y(j, l)."""

    op: str
    N: int
    C: int
    K: int
    HP: int          # the least FFT size: the padded input's height and width (with phases: see fft_conv)
    WP: int
    a_planes: int    # planes of A per image: X (conv_fwd, conv_wgrad) or dY (conv_bwd_data)
    b_planes: int    # planes of B: the filters (K*C), or per image dY's K (conv_wgrad)
    out_planes: int  # planes out per image (conv_fwd K, conv_bwd_data C), or K*C (conv_wgrad)
    phases: int = 1  # stride phases taken apart (SH*SW with STRIDE_PHASES=1): C counts C*phases planes
    tile: int = 0    # FFT_TILE: the F x F planes of FFT tiles, 0 for whole planes
    tiles: int = 1   # FFT tiles an image: the planes above count per tile, images count as N*tiles


def takes_phases(p: Any) -> bool:
    """Whether the problem offers STRIDE_PHASES: a stride above one in conv_bwd_data or conv_wgrad."""
    return p.op in ("conv_bwd_data", "conv_wgrad") and tuple(p.stride) != (1, 1)


def sub_filter(p: Any) -> tuple[int, int]:
    """The largest phase's sub-filter: ceil(R / SH) x ceil(S / SW) taps."""
    return cdiv(p.R, p.stride[0]), cdiv(p.S, p.stride[1])


@dataclass(frozen=True)
class FftTiles:
    """FFT tiling of one op (FFT_TILE = F): TY x TX outputs a tile, TH x TW tiles an image, and the
    windows (rows, columns) of the operands that the tiles read."""

    TY: int
    TX: int
    TH: int
    TW: int
    window_a: tuple[int, int]
    window_b: tuple[int, int] | None   # conv_wgrad's dY tile spread at the stride; None: the filters

    @property
    def count(self) -> int:
        return self.TH * self.TW


def fft_tiles(p: Any, tile: int) -> FftTiles:
    """The module's note: conv_fwd and conv_wgrad tile the P x Q positions of Y (dY), conv_bwd_data
    dX's H x W; a tile's outputs are capped at the plane's (one tile along a side that fits). A plane
    no larger than the filter still gets one output a tile (its window then exceeds the plane: the
    formulation's FFT_TILE rule refuses it, and the other rules can still be evaluated)."""
    (sh, sw) = p.stride
    if p.op == "conv_bwd_data":
        ty, tx = max(1, min(tile - p.R + 1, p.H)), max(1, min(tile - p.S + 1, p.W))
        return FftTiles(ty, tx, cdiv(p.H, ty), cdiv(p.W, tx), (ty + p.R - 1, tx + p.S - 1), None)
    ty, tx = max(1, min((tile - p.R) // sh + 1, p.P)), max(1, min((tile - p.S) // sw + 1, p.Q))
    window = ((ty - 1) * sh + p.R, (tx - 1) * sw + p.S)
    spread = ((ty - 1) * sh + 1, (tx - 1) * sw + 1) if p.op == "conv_wgrad" else None
    return FftTiles(ty, tx, cdiv(p.P, ty), cdiv(p.Q, tx), window, spread)


def tile_of(config: Config | dict) -> int:
    """FFT_TILE (0, whole planes, for configs without it)."""
    return config.get("FFT_TILE", 0)


def whole_planes(p: Any) -> tuple[int, int, int]:
    """(a_planes, b_planes, out_planes) of FftConv without the stride's phases (per tile with FFT tiles)."""
    return {"conv_fwd": (p.C, p.K * p.C, p.K), "conv_bwd_data": (p.K, p.K * p.C, p.C),
            "conv_wgrad": (p.C, p.K, p.K * p.C)}[p.op]


def fft_conv(p: Any, phased: bool = False, tile: int = 0) -> FftConv:
    if tile:
        t = fft_tiles(p, tile)
        return FftConv(p.op, p.N, p.C, p.K, *t.window_a, *whole_planes(p), 1, tile, t.count)
    if phased and takes_phases(p):
        (sh, sw), (ru, su), ph = p.stride, sub_filter(p), p.stride[0] * p.stride[1]
        # Wrap-free sizes: a full convolution of P positions with RU taps has P + RU - 1; conv_bwd_data
        # also reads dX's last row (H - 1 + PT) div SH of it, conv_wgrad X's phases up to that length.
        hp, wp = p.P + ru - 1, p.Q + su - 1
        if p.op == "conv_bwd_data":
            hp, wp = max(hp, (p.H - 1 + p.padding[0]) // sh + 1), max(wp, (p.W - 1 + p.padding[1]) // sw + 1)
            a, b, out = p.K, p.K * ph * p.C, ph * p.C
        else:
            a, b, out = ph * p.C, p.K, p.K * ph * p.C
        return FftConv(p.op, p.N, p.C, p.K, hp, wp, a, b, out, ph)
    hp, wp = p.H + p.padding[0] + p.padding[2], p.W + p.padding[1] + p.padding[3]
    return FftConv(p.op, p.N, p.C, p.K, hp, wp, *whole_planes(p))


def is_phased(config: Config | dict) -> bool:
    return bool(config.get("STRIDE_PHASES", 0))


def shares_buffers(p: Any) -> bool:
    """Whether the problem offers WS_SHARE: the ops that transform back every block of images (conv_wgrad
    keeps O's spectra across blocks, so no two of its buffers have lives that do not overlap)."""
    return p.op in ("conv_fwd", "conv_bwd_data")


def inverse_of(config: Config | dict) -> str:
    return config.get("XFORM_O", "cufft")


def kept_outputs(p: Any, axis: int, phased: bool = False, tile: int = 0) -> tuple[int, int, int]:
    """The rows (axis 0) or columns (axis 1) of each output plane the op keeps, as (first, step,
    count): Output::OFF_H, STEP_H, OUT_H or OFF_W, STEP_W, OUT_W in the op's template, which checks
    them against these. conv_fwd P x Q at the stride, conv_bwd_data H x W from (PT, PL), or with the
    phases apart every phase's positions up to dX's last row and column; FFT tiles: a tile's TY x TX
    outputs (conv_bwd_data's from (R - 1, S - 1)). conv_wgrad: dW's R x S taps at the origin of each
    plane, tiled or not, or with the phases apart a sub-filter's RU x SU."""
    if p.op == "conv_wgrad":
        return 0, 1, sub_filter(p)[axis] if phased and takes_phases(p) else (p.R, p.S)[axis]
    if tile:
        t = fft_tiles(p, tile)
        count = (t.TY, t.TX)[axis]
        return (0, p.stride[axis], count) if p.op == "conv_fwd" else ((p.R, p.S)[axis] - 1, 1, count)
    if p.op == "conv_fwd":
        return 0, p.stride[axis], (p.P, p.Q)[axis]
    extent = (p.H, p.W)[axis]
    if phased and takes_phases(p):
        return 0, 1, (extent - 1 + p.padding[axis]) // p.stride[axis] + 1
    return p.padding[axis], 1, extent


def kept_columns(p: Any, phased: bool = False, tile: int = 0) -> tuple[int, int, int]:
    return kept_outputs(p, 1, phased, tile)


def kept_rows(p: Any, phased: bool = False, tile: int = 0) -> tuple[int, int, int]:
    return kept_outputs(p, 0, phased, tile)


def placement(p: Any, phased: bool = False, tile: int = 0) -> dict[str, tuple[int, int, int, int]]:
    """Where each operand's data sits in its FH x FW plane, as (OFF_H, OFF_W, STEP_H, STEP_W): the
    OperandA / OperandB structs of the op's template, which checks them against these. X at the
    padding's offset; dY spread at the stride in conv_bwd_data (A) and conv_wgrad (B); filters at the
    origin; with the phases apart or FFT tiles every operand at the origin, one element a position
    (its Op::load finds the window's elements and the zeros of padding and stride)."""
    if tile or (phased and takes_phases(p)):
        return {"A": (0, 0, 1, 1), "B": (0, 0, 1, 1)}
    x, origin, dy = (p.padding[0], p.padding[1], 1, 1), (0, 0, 1, 1), (0, 0, *p.stride)
    return {"conv_fwd": {"A": x, "B": origin}, "conv_bwd_data": {"A": dy, "B": origin},
            "conv_wgrad": {"A": x, "B": dy}}[p.op]


def fft_size(f: FftConv, how: str) -> tuple[int, int]:
    if f.tile:   # FFT tiles: F x F whatever FFT_SIZE says (a constraint keeps FFT_SIZE at its first value)
        return f.tile, f.tile
    size = smooth_size if how == "smooth" else next_pow2
    return size(f.HP), size(f.WP)


def spectrum(fh: int, fw: int) -> int:
    """Complex numbers of one half spectrum."""
    return fh * (fw // 2 + 1)


def operand_sizes(problem: Any, phased: bool = False, tile: int = 0) -> dict[str, tuple[int, int]]:
    """The data planes (height, width) of operands A and B, before placement (fft_place_a/b); with
    FFT tiles, a tile's windows."""
    p = problem
    if tile:
        t = fft_tiles(p, tile)
        return {"A": t.window_a, "B": t.window_b or (p.R, p.S)}
    if phased and takes_phases(p):
        f = fft_conv(p, True)
        return ({"A": (p.P, p.Q), "B": sub_filter(p)} if p.op == "conv_bwd_data"
                else {"A": (f.HP, f.WP), "B": (p.P, p.Q)})
    return {"conv_fwd": {"A": (p.H, p.W), "B": (p.R, p.S)}, "conv_bwd_data": {"A": (p.P, p.Q), "B": (p.R, p.S)},
            "conv_wgrad": {"A": (p.H, p.W), "B": (p.P, p.Q)}}[p.op]


def workspace_elements(f: FftConv, how: str, imgs: int, xform_a: str = "cufft", xform_b: str = "cufft",
                       xform_o: str = "cufft", share: bool = False) -> dict[str, int]:
    """Real planes and half spectra (two floats a complex number) of A, B and the output; an operand
    transformed directly (XFORM "dft" or "fdft") has no placed planes, nor the output its real planes
    when the factorised inverse (XFORM_O "fdft") stores the kept outputs. The filters' 4,096 placed
    planes of scherer10_l2's phases alone are 80 MB that would otherwise halve the images a block may take.
    With ``share`` (WS_SHARE 1) the pairs of SHARED_WITH are one buffer each."""
    fh, fw = fft_size(f, how)
    b = min(imgs, f.N) * f.tiles   # FFT tiles are images to every buffer
    a_planes = b * f.a_planes
    b_planes = b * f.b_planes if f.op == "conv_wgrad" else f.b_planes
    o_planes = f.out_planes if f.op == "conv_wgrad" else b * f.out_planes
    real, spec = fh * fw, 2 * spectrum(fh, fw)
    sizes = {"fft_a": a_planes * real, "fft_af": a_planes * spec, "fft_b": b_planes * real,
             "fft_bf": b_planes * spec, "fft_of": o_planes * spec, "fft_o": o_planes * real}
    unused = {"fft_a"} if xform_a != "cufft" else set()
    unused |= {"fft_b"} if xform_b != "cufft" else set()
    unused |= {"fft_o"} if xform_o != "cufft" else set()
    out = {name: n for name, n in sizes.items() if name not in unused}
    if share and f.op != "conv_wgrad":   # conv_wgrad keeps O's spectra across blocks: nothing shares
        for name, into in SHARED_WITH.items():
            if name in out:
                out[into] = max(out.pop(name), out[into])
    return out


def frequency_major(config: Config | dict) -> bool:
    """Whether the plan's spectra are stored frequency-major, [frequency][plane]: MAC "cublas"."""
    return config.get("MAC") == "cublas"


def mac_gemm(f: FftConv, images: int, spec: int, accumulate: bool, tf32: bool) -> LibraryComplexGemm:
    """MAC "cublas": the products summed over the channel as cuBLAS's complex GEMMs, one a frequency
    (batch SPEC). Spectra are frequency-major: frequency f of a buffer of P planes is the run
    [f*P, (f+1)*P), the next frequency's P on, and within a run each operand is a row-major matrix of
    its planes' order. ``images``: the block's images times its FFT tiles."""
    if f.op == "conv_fwd":       # Y[n][k] = sum over c of X[n][c] conj(W[k][c]): W stored K x C, used as W^H
        return LibraryComplexGemm(images, f.out_planes, f.C, MatrixView("fft_af", 0, f.C, images * f.C),
                                  MatrixView("fft_bf", 0, f.C, f.b_planes),
                                  MatrixView("fft_of", 0, f.out_planes, images * f.out_planes),
                                  "n", "h", spec, accumulate, tf32)
    if f.op == "conv_bwd_data":  # dX[n][c] = sum over k of dY[n][k] W[k][c] (c: C*phases planes)
        return LibraryComplexGemm(images, f.out_planes, f.K, MatrixView("fft_af", 0, f.K, images * f.K),
                                  MatrixView("fft_bf", 0, f.out_planes, f.b_planes),
                                  MatrixView("fft_of", 0, f.out_planes, images * f.out_planes),
                                  "n", "n", spec, accumulate, tf32)
    # conv_wgrad: dW[k][c] = sum over n of conj(dY[n][k]) X[n][c] (c: C*phases planes), dY stored images x K
    # and used as dY^H; every block after the first adds to O.
    cp = f.a_planes
    return LibraryComplexGemm(f.K, cp, images, MatrixView("fft_bf", 0, f.K, images * f.K),
                              MatrixView("fft_af", 0, cp, images * cp), MatrixView("fft_of", 0, cp, f.out_planes),
                              "h", "n", spec, accumulate, tf32)


def buffer_name(name: str, share: bool) -> str:
    """The workspace a plan step names for the buffer ``name``: its partner's under WS_SHARE 1."""
    return SHARED_WITH.get(name, name) if share else name


def shares_workspace(config: Config | dict) -> bool:
    """WS_SHARE 1 (a conv_wgrad config has no WS_SHARE)."""
    return bool(config.get("WS_SHARE", 0))
