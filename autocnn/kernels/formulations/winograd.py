"""winograd: Winograd's minimal filtering F(m x m, 3x3) for 3x3 stride-1 convolutions, all three
ops (Lavin and Gray 2016). With d an (m+2) x (m+2) input tile and g a 3x3 filter, an m x m output
tile of the correlation is A^T [(G g G^T) . (B^T d B)] A; over channels the element-wise products
become, for each of the (m+2)^2 points of the transformed tile, a GEMM:

    winograd_filter   U[e][co][ci] = (G g[co][ci] G^T)[e]        a generated kernel
    winograd_input    V[e][ci][t]  = (B^T d[ci][t] B)[e]          a generated kernel, per block of images
    the products      M[e] = U[e] V[e], (m+2)^2 GEMMs             cuBLAS batched GEMMs, a library
                                                                  GEMM step of the plan
    winograd_output   Y tile = A^T M[.][co][t] A, + bias, activation, cropped to the output

conv_bwd_data of a stride-1 convolution is a forward one: dX is the correlation of dY with the
filters flipped and transposed (C outputs, K inputs), padded by R-1-pad_top and S-1-pad_left;
the filter transform reads them so.

conv_wgrad differentiates the forward tile: the gradient of A^T [U . V] A with respect to g is
G^T [(A dY A^T) . V] G, so per point M[e] = sum over images and tiles of P[e] V[e]^T (K x C, the
GEMMs accumulating over blocks of images), with P = A dY A^T (winograd_grad) and V the forward's
input transform of X; dW = G^T M G (winograd_wgrad_output), db by its own reduction. The
reduction is long (images x tiles) and the output small, the shape where the GEMM's tensor cores
pay most.

Parameters: TILE (m = 2 or 4: F(4x4,3x3) does 4x fewer multiplications than the direct form,
F(2x2,3x3) 2.25x, with larger rounding from its larger transform constants: the tuner's
verification decides where it passes the bound), IMGS (images per block: the workspaces hold one
block), WG_THREADS of the transform kernels, TF32_GEMM for tf32 problems, and GEMM_3XTF32 for
fp32 problems.

GEMM_3XTF32 runs the FP32 products on the tensor cores, FP32-accurate: the transforms write each
value x as its TF32 part hi(x) and the TF32 part of the remainder lo(x) (3xTF32). For conv_fwd and
conv_bwd_data they go in three blocks along the reduction, U as (hi, lo, hi) and V as (hi, hi,
lo), so that one TF32 GEMM over 3·CIN sums hi·hi + lo·hi + hi·lo; conv_wgrad, whose M is small,
keeps two parts of each operand and accumulates three GEMMs. Products of TF32 values are exact
in FP32, and TF32 inputs pass the tensor cores unchanged whatever rounding cuBLAS applies; what is
left out, lo·lo, is below FP32's own rounding. Three times the reduction on the TF32 units still
takes a third less time than FP32 SGEMM on an H100 where the channels are many (modern_14 forward,
F(4x4): 79.5 against 129.4 us); V's writes triple, so with few channels (64) the FP32 products
stay faster there.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_upto
from autocnn.kernels.formulations.igemm import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.operation import Launch, LibraryGemm, MatrixView, cdiv, next_pow2, workspace_rule
from autocnn.kernels.space import Config, Constraint, Param

NAME = "winograd"
TILES = (2, 4)
IMGS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
THREADS = (64, 128, 256)
DEFAULT_WORKSPACE_BYTES = WORKSPACE_LIMIT_BYTES // 4

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


def view(p: Any) -> WinogradView:
    if p.op in ("conv_fwd", "conv_wgrad"):     # conv_wgrad: the forward correlation it differentiates
        return WinogradView(p.op, p.N, p.C, p.K, p.H, p.W, p.P, p.Q, p.padding[0], p.padding[1], False)
    return WinogradView(p.op, p.N, p.K, p.C, p.P, p.Q, p.H, p.W, p.R - 1 - p.padding[0], p.S - 1 - p.padding[1], True)


def tiles(v: WinogradView, m: int) -> tuple[int, int]:
    """Output tiles along the height and the width."""
    return cdiv(v.HO, m), cdiv(v.WO, m)


def block_tiles(v: WinogradView, m: int, imgs: int) -> int:
    """Columns of V and M: the tiles of one block of images."""
    th, tw = tiles(v, m)
    return min(imgs, v.N) * th * tw


def workspace_elements(v: WinogradView, m: int, imgs: int, parts: int = 1) -> dict[str, int]:
    """The transformed operands and the products for one block of images, each operand in
    ``parts`` blocks (``splits``). conv_wgrad: V (X's transform), P (dY's) and M, K x C a point."""
    points = (m + 2) ** 2
    cols = block_tiles(v, m, imgs)
    if v.op == "conv_wgrad":
        return {"wg_v": parts * points * v.CIN * cols, "wg_p": parts * points * v.COUT * cols,
                "wg_m": points * v.COUT * v.CIN}
    return {"wg_u": points * v.COUT * parts * v.CIN, "wg_v": points * parts * v.CIN * cols,
            "wg_m": points * v.COUT * cols}


def splits(op: str, x3: int) -> int:
    """Blocks of each transformed operand: 1 for FP32 or TF32 products; with 3xTF32 products (x3,
    the config's GEMM_3XTF32), three along the reduction (conv_fwd, conv_bwd_data: one GEMM) or a
    TF32 part and a remainder part (conv_wgrad: three GEMMs accumulate into its small M)."""
    if not x3:
        return 1
    return 2 if op == "conv_wgrad" else 3


def config_splits(op: str, config: Config) -> int:
    return splits(op, config.get("GEMM_3XTF32", 0))


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


class _Winograd(OpFormulation):
    formulation = NAME
    summary = "Winograd F(2x2,3x3) / F(4x4,3x3) transforms + cuBLAS batched products"
    src, dst = "", ""          # the op's input and output buffers

    def __init__(self, op: str, src: str, dst: str):
        self.op, self.src, self.dst = op, src, dst
        self.templates = (f"winograd_{op}.cu.j2", "_winograd.cuh.j2")

    def params(self, problem: Any) -> list[Param]:
        out = [Param("TILE", TILES, "output tile m of F(m x m, 3x3)"),
               Param("IMGS", choices_upto(IMGS, next_pow2(problem.N)), "images per block (V and M hold one block)"),
               Param("WG_THREADS", THREADS, "threads per block of the transform kernels")]
        if problem.precision == "tf32":
            out.append(Param("TF32_GEMM", (0, 1), "cuBLAS with TF32 tensor-op math (tf32 problems only)"))
        else:
            out.append(Param("GEMM_3XTF32", (0, 1), "the products as 3xTF32 on the tensor cores, FP32-accurate "
                             "(fp32 problems only; 0: cuBLAS SGEMM)"))
        return out

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p = problem
        if not serves(p):
            why = (f"winograd computes 3x3 stride-1 convolutions, not {p.R}x{p.S} with stride "
                   f"{p.stride[0]}x{p.stride[1]}")
            return [Constraint(("TILE",), lambda m: why)]
        v = view(p)
        # GEMM_3XTF32 is a parameter of fp32 problems only; a tf32 problem's products keep one block.
        params = ("TILE", "IMGS") if p.precision == "tf32" else ("TILE", "IMGS", "GEMM_3XTF32")
        return [workspace_rule(limits.workspace_bytes, params, lambda m, imgs, x3=0: 4 * sum(
            workspace_elements(v, m, imgs, splits(p.op, x3)).values()))]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        """Each tile with the largest block within a quarter of the workspace limit, then one image;
        for fp32, FP32 products first, then each tile with 3xTF32 products."""
        v = view(problem)
        imgs_choices = choices_upto(IMGS, next_pow2(problem.N))
        tf32 = problem.precision == "tf32"
        extra = {"TF32_GEMM": 0} if tf32 else {"GEMM_3XTF32": 0}

        def largest_block(m: int, parts: int) -> int:
            fits = [i for i in imgs_choices
                    if 4 * sum(workspace_elements(v, m, i, parts).values()) <= DEFAULT_WORKSPACE_BYTES]
            return max(fits, default=1)

        out = [{"formulation": NAME, "TILE": m, "IMGS": largest_block(m, 1), "WG_THREADS": 128, **extra}
               for m in (4, 2)]
        out.append({"formulation": NAME, "TILE": 2, "IMGS": 1, "WG_THREADS": 128, **extra})
        if not tf32:
            out += [{"formulation": NAME, "TILE": m, "IMGS": largest_block(m, splits(problem.op, 1)), "WG_THREADS": 128,
                     "GEMM_3XTF32": 1} for m in (4, 2)]
        return out

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        m = config["TILE"]
        bt, g, at = TRANSFORMS[m]
        v = view(problem)
        split = config_splits(problem.op, config)
        return {"wg_m": m, "wg_alpha": m + 2, "wg_threads": config["WG_THREADS"], "wg_wgrad": False,
                "wg_split": {1: "", 2: "parts", 3: "kconcat"}[split],
                "wg_block": min(config["IMGS"], v.N), "wg_pad_t": v.PAD_T, "wg_pad_l": v.PAD_L,
                "wg_filter": sandwich("x", g, "g", 3, "part"), "wg_input": sandwich("x", bt, "d", m + 2, "part"),
                "wg_output": sandwich("y", at, "mm", m + 2, "part")}

    def buffers(self, problem: Any, config: Config) -> Buffers:
        return (), tuple(workspace_elements(view(problem), config["TILE"], config["IMGS"],
                                            config_splits(problem.op, config)).items())

    def launches(self, problem: Any, config: Config) -> tuple:
        v, m, threads = view(problem), config["TILE"], config["WG_THREADS"]
        points, red = (m + 2) ** 2, config_splits(problem.op, config) * v.CIN    # red: the GEMMs' reduction
        th, tw = tiles(v, m)
        ld = block_tiles(v, m, config["IMGS"])   # columns of V and M
        b = min(config["IMGS"], v.N)
        steps: list = [Launch("winograd_filter", (cdiv(v.COUT * v.CIN, threads), 1, 1), (threads, 1, 1), 0,
                              ("w", "wg_u"))]
        for n0 in range(0, v.N, b):
            nb = min(b, v.N - n0)
            steps.append(Launch("winograd_input", (cdiv(v.CIN * ld, threads), 1, 1), (threads, 1, 1), 0,
                                (self.src, "wg_v"), (n0, nb)))
            steps.append(LibraryGemm(m=v.COUT, n=nb * th * tw, k=red, a=MatrixView("wg_u", 0, red, v.COUT * red),
                                     b=MatrixView("wg_v", 0, ld, red * ld), c=MatrixView("wg_m", 0, ld, v.COUT * ld),
                                     batch=points, tf32=bool(config.get("TF32_GEMM", 0)) or red > v.CIN))
            steps.append(Launch("winograd_output", (cdiv(v.COUT * ld, threads), 1, 1), (threads, 1, 1), 0,
                                ("wg_m", "bias", self.dst), (n0, nb)))
        return tuple(steps)

    def code_helpers(self) -> tuple:
        return (WinogradView, serves, view, tiles, block_tiles, workspace_elements, splits, config_splits, _literal,
                _combination, sandwich, TRANSFORMS)


class _WinogradWgrad(_Winograd):
    """conv_wgrad: per block of images, X's input transform (V) and dY's (P = A dY A^T), then the
    points' GEMMs M[e] (+)= P[e] V[e]^T (K x C, accumulated over the blocks); after the last block
    dW = G^T M G, and db by its own reduction."""

    def __init__(self) -> None:
        super().__init__("conv_wgrad", "x", "dw")
        self.templates = ("winograd_conv_wgrad.cu.j2", "_winograd.cuh.j2", "_bias_grad.cuh.j2")

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        m = config["TILE"]
        _, g, at = TRANSFORMS[m]
        a = tuple(zip(*at))           # A, (m+2) x m
        gt = tuple(zip(*g))           # G^T, 3 x (m+2)
        return {**super().context(problem, config), "wg_wgrad": True, "wg_bias_grad": bool(problem.bias),
                "wg_grad": sandwich("x", a, "g", m, "part"), "wg_wgrad_out": sandwich("y", gt, "mm", m + 2, "part")}

    def launches(self, problem: Any, config: Config) -> tuple:
        v, m, threads = view(problem), config["TILE"], config["WG_THREADS"]
        points, parts = (m + 2) ** 2, config_splits(problem.op, config)
        th, tw = tiles(v, m)
        ld = block_tiles(v, m, config["IMGS"])
        b = min(config["IMGS"], v.N)
        tf32 = parts > 1 or bool(config.get("TF32_GEMM", 0))
        # (P part, V part) of each GEMM: FP32 or TF32 products take the one pair; 3xTF32 the TF32
        # parts' product, then the remainders' products with them, accumulating.
        pairs = ((0, 0),) if parts == 1 else ((0, 0), (1, 0), (0, 1))
        steps: list = []
        for n0 in range(0, v.N, b):
            nb = min(b, v.N - n0)
            steps.append(Launch("winograd_input", (cdiv(v.CIN * ld, threads), 1, 1), (threads, 1, 1), 0,
                                (self.src, "wg_v"), (n0, nb)))
            steps.append(Launch("winograd_grad", (cdiv(v.COUT * ld, threads), 1, 1), (threads, 1, 1), 0,
                                ("dy", "wg_p"), (n0, nb)))
            for i, (jp, jv) in enumerate(pairs):
                steps.append(LibraryGemm(
                    m=v.COUT, n=v.CIN, k=nb * th * tw,
                    a=MatrixView("wg_p", jp * points * v.COUT * ld, ld, v.COUT * ld),
                    b=MatrixView("wg_v", jv * points * v.CIN * ld, ld, v.CIN * ld), trans_b=True,
                    c=MatrixView("wg_m", 0, v.CIN, v.COUT * v.CIN), batch=points, tf32=tf32,
                    accumulate=n0 > 0 or i > 0))
        steps.append(Launch("winograd_wgrad_output", (cdiv(v.COUT * v.CIN, threads), 1, 1), (threads, 1, 1), 0,
                            ("wg_m", "dw")))
        if problem.bias:
            steps.append(Launch("conv_bias_grad", (v.COUT, 1, 1), (threads, 1, 1), 0, ("dy", "db")))
        return tuple(steps)


WINOGRAD = Formulation(NAME, (_Winograd("conv_fwd", "x", "y"), _Winograd("conv_bwd_data", "dy", "dx"),
                              _WinogradWgrad()))
