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

PRODUCTS "mma" runs the points' products in a generated kernel instead (winograd_products: the tc
formulation's warp-level mma.sync core, tcgemm.cuh.j2, over a grid of tiles x points x splits):
the transforms write each value once in FP32 and the core splits it into its TF32 parts in
registers (fp32: 3xTF32 with each tile's products summed in FP32; tf32: one TF32 product). cuBLAS
cannot take that split, so its 3xTF32 reads and the transforms write every operand two or three
times: on an H100 the modern_14 weight gradient's transforms took 37 + 39 us with parts against
22 + 22 without, and its three TF32 GEMMs 153 us. Its tile (MMA_BM x MMA_BN x MMA_BK over
MMA_WM x MMA_WN warps), pipeline (MMA_STAGES, cp.async), fragment reads (MMA_FRAG) and, in fp32,
MMA_CROSS (3xTF32's two cross products as one BF16 mma, tc's CROSS) are parameters; conv_wgrad, whose products are few and long (K x C, the reduction over the images'
tiles), also splits the reduction over MMA_SPLITK blocks that add into M with atomics (M cleared
first by winograd_clear). The core is shared by including its template with the names it reads;
what this user adds to it (ROW_VECTORS: 16-byte cp.async along an operand stored along its rows, for
V) renders only where it is set, so the tc formulation's code does not change.

PRODUCTS "wgmma" (Hopper, sm_90a) runs them on the wgmma formulation's block GEMM
(wgmma_mainloop.cuh.j2, with its core in a namespace of its own), which reads both operands from
swizzled shared memory for a warpgroup instead of every warp loading fragments (on an H100,
modern_14's 3xTF32 products ran at 136 TFLOP/s of TF32 work in the mma kernel, its weight
gradient's 106 us, and at 190 in cuBLAS's GEMM over 3·CIN, its forward's 76 us). wgmma takes 32-bit operands K-major only: conv_wgrad's P and V already run along the tiles, its
reduction (every block's tiles a multiple of 4: whole 16-byte chunks); conv_fwd and conv_bwd_data
multiply U[e] (COUT x CIN) by V[e] stored tiles x CIN, which their input transform writes through a
shared-memory window of 32 channels of a block's tiles, a warp a tile and a lane a channel, so that
each point's stores are 32 consecutive channels (CIN a multiple of 4). fp32 is 3xTF32 with each
operand copied once, in FP32: each thread splits the chunks it copied into their TF32 parts in
shared memory as soon as its copies land (split_in_smem), so no operand is written twice to
global memory as the wgmma formulation's staged parts are. Its parameters are the wgmma
formulation's, prefixed WGMMA_: warpgroups, columns, stages, a group in flight, and conv_wgrad's
reduction splits. Only these configs compile for sm_90a (a config-dependent target,
OpFormulation.compile_suffix); the rest of winograd keeps the portable one. Measured slower than
cuBLAS's products on the seed layers: a block's 8 reduction tiles and one block an SM leave its
split and epilogue unhidden (MEASUREMENTS.md).

WG_OUTPUT (conv_fwd, conv_bwd_data): "tiles" has each thread of the output transform store its own
m x m tile, a warp's stores 16-byte pieces of rows m floats apart; "rows" has a block transform its
tiles into shared memory laid out as the output and store whole rows, a thread an element
(output_rows: whole planes of one channel where a plane's tiles fit the block, else bands of tile
rows). On the H200, modern_14's output transform took 16.2 us with "rows" against 28.2.

BIAS_FUSED (conv_wgrad with a bias): winograd_grad, which reads every element of dY once, also sums
each tile into db (a warp's lanes of one filter by shuffles, then one atomic; db zeroed before the
plan) instead of conv_bias_grad's second pass over dY, a block per filter (15-16 us of the H100's
modern_14 weight gradient). The atomics make db's rounding depend on their order.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.cores import wgmma_gemm as hopper
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_upto
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.formulations.winograd.winograd_products import (MMA_FRAGS, MMA_PAD_KMAJOR, MMA_PAD_ROWMAJOR,
                                                                     MMA_SPLITS, MMA_STAGES, MMA_STEPS, MMA_TILES,
                                                                     MMA_WARPS, PRODUCTS_TEMPLATES, WGMMA_BNS,
                                                                     WGMMA_INFLIGHT, WGMMA_SPLITS, WGMMA_STAGES,
                                                                     WGMMA_WGS, ProductsGemm, default_split,
                                                                     generated_products, input_window, products_active,
                                                                     products_constraints, products_context,
                                                                     products_gemm, products_launch,
                                                                     products_smem_bytes, wgmma_products_context)
from autocnn.kernels.formulations.cores.winograd_transforms import (SANDWICH_CODE, TRANSFORMS, WinogradView, sandwich,
                                                                    serves, tiles, unserved, view)
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import GRID_X_LIMIT, STATIC_SMEM_LIMIT, sixteen_bit_rule, workspace_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch, LibraryGemm, MatrixView

NAME = "winograd"
TILES = (2, 4)
IMGS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
THREADS = (64, 128, 256)
DEFAULT_WORKSPACE_BYTES = WORKSPACE_LIMIT_BYTES // 4
# The points' products: cuBLAS batched GEMMs (the code before the parameter, first), the generated
# mma.sync kernel winograd_products, or the generated wgmma kernel of that name (Hopper).
PRODUCTS = ("cublas", "mma", "wgmma")
# The output transform (conv_fwd, conv_bwd_data): each thread stores its own tile (the code before
# the parameter, first), or the block stages its tiles in shared memory and stores whole rows.
WG_OUTPUTS = ("tiles", "rows")


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


def transposed_input(problem: Any, config: Config) -> dict[str, int] | None:
    """PRODUCTS "wgmma" for conv_fwd / conv_bwd_data: V stored tiles x CIN (its products' B operand,
    K-major), by an input transform whose blocks take 32 channels of tiles_h x tiles_w tiles, a warp
    a tile: as wide as the tile rows allow (a power of two), the rest of the warps on further rows."""
    if problem.op == "conv_wgrad" or config.get("PRODUCTS", "cublas") != "wgmma":
        return None
    return input_window(problem, config["TILE"], config["WG_THREADS"])


def output_rows(problem: Any, m: int, imgs: int, threads: int) -> dict[str, int]:
    """The blocks of the output transform with WG_OUTPUT "rows": ``planes`` whole planes (images) of
    one output channel where a plane's tiles fit the block (at most the block of images), else
    ``band`` rows of tiles of one plane, as many as the threads take one tile each (at least one
    row, the threads then looping over its tiles); ``bands`` a plane, and the shared memory that
    holds the block's outputs."""
    v = view(problem)
    th, tw = tiles(v, m)
    if th * tw <= threads:
        planes, band = max(1, min(threads // (th * tw), imgs, v.N)), th
    else:
        planes, band = 1, max(1, min(th, threads // tw))
    return {"planes": planes, "band": band, "bands": cdiv(th, band),
            "smem": problem.precision.accumulator.size * planes * band * m * v.WO}


def output_blocks(problem: Any, rows: dict[str, int], nb: int) -> int:
    """The output transform's blocks (WG_OUTPUT "rows") for a launch over nb images: per output
    channel, a group of rows["planes"] images by each band."""
    return view(problem).COUT * cdiv(nb, rows["planes"]) * rows["bands"]


def output_context(problem: Any, config: Config) -> dict[str, int] | None:
    """output_rows of the config, or None where each thread stores its own tile."""
    if problem.op == "conv_wgrad" or config.get("WG_OUTPUT", "tiles") != "rows":
        return None
    return output_rows(problem, config["TILE"], config["IMGS"], config["WG_THREADS"])


class _Winograd(OpFormulation):
    formulation = NAME
    summary = "Winograd F(2x2,3x3) / F(4x4,3x3) transforms + cuBLAS batched products"
    src, dst = "", ""          # the op's input and output buffers

    def __init__(self, op: str, src: str, dst: str):
        self.op, self.src, self.dst = op, src, dst
        self.templates = (f"winograd_{op}.cu.j2", "_winograd.cuh.j2", "_winograd_transform.cuh.j2",
                          "_winograd_correlation.cuh.j2", *PRODUCTS_TEMPLATES)

    def params(self, problem: Any) -> list[Param]:
        out = [Param("TILE", TILES, "output tile m of F(m x m, 3x3)"),
               Param("IMGS", choices_upto(IMGS, next_pow2(problem.N)), "images per block (V and M hold one block)"),
               Param("WG_THREADS", THREADS, "threads per block of the transform kernels")]
        if problem.precision.tf32:
            out.append(Param("TF32_GEMM", (0, 1), "cuBLAS with TF32 tensor-op math (tf32 problems only)"))
        else:
            out.append(Param("GEMM_3XTF32", (0, 1), "the products as 3xTF32 on the tensor cores, FP32-accurate "
                             "(fp32 problems only; 0: cuBLAS SGEMM)"))
        if problem.op != "conv_wgrad":
            out.append(Param("WG_OUTPUT", WG_OUTPUTS, "output transform: each thread stores its tile, or the block "
                             "stages its tiles in shared memory and stores whole rows"))
        mma = (("PRODUCTS", ("mma",)),)
        out += [Param("PRODUCTS", PRODUCTS, "the points' products: cuBLAS batched GEMMs, or the generated mma.sync "
                      "kernel (fp32: 3xTF32 split in registers)"),
                Param("MMA_BM", MMA_TILES, "mma products: rows (output channels) per block", mma),
                Param("MMA_BN", MMA_TILES, "mma products: columns per block", mma),
                Param("MMA_BK", MMA_STEPS, "mma products: reduction step staged in shared memory", mma),
                Param("MMA_WM", MMA_WARPS, "mma products: warps along the block's rows", mma),
                Param("MMA_WN", MMA_WARPS, "mma products: warps along the block's columns", mma),
                Param("MMA_STAGES", MMA_STAGES, "mma products: cp.async pipeline stages", mma),
                Param("MMA_FRAG", MMA_FRAGS, "mma products: fragment reads of one or two mma k-steps", mma)]
        if problem.precision.tf32x3:
            # 0 first: the three TF32 mmas, the code of configs written before the parameter
            out.append(Param("MMA_CROSS", (0, 1), "mma products: 3xTF32's cross products as one BF16 mma per k-step "
                             "(0: two TF32 mmas)", mma))
        wgmma = (("PRODUCTS", ("wgmma",)),)
        out += [Param("WGMMA_WGS", WGMMA_WGS, "wgmma products: warpgroups along the rows (64 rows each)", wgmma),
                Param("WGMMA_BN", WGMMA_BNS, "wgmma products: columns per block (the wgmma's N)", wgmma),
                Param("WGMMA_STAGES", WGMMA_STAGES, "wgmma products: shared-memory pipeline stages", wgmma),
                Param("WGMMA_INFLIGHT", WGMMA_INFLIGHT, "wgmma products: groups of wgmmas left in flight across the "
                      "next tile's barrier", wgmma)]
        if problem.op == "conv_wgrad":
            out.append(Param("MMA_SPLITK", MMA_SPLITS, "mma products: blocks sharing one tile's reduction "
                             "(added into M with atomics)", mma))
            out.append(Param("WGMMA_SPLITK", WGMMA_SPLITS, "wgmma products: blocks sharing one tile's reduction "
                             "(added into M with atomics)", wgmma))
            if problem.bias:
                out.append(Param("BIAS_FUSED", (0, 1), "the bias gradient summed by dY's transform (warp "
                                 "sums, atomics into a zeroed db) instead of a kernel of its own"))
        return out

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p = problem
        why = unserved(p, NAME)
        if why:
            return [Constraint(("TILE",), lambda m: why)]
        if p.precision.sixteen_bit:   # (the products' rules below name fp32's and tf32's parameters)
            return [sixteen_bit_rule(p, NAME, "TILE", "its transforms run on float32 tiles and its products on "
                                                      "FP32 or TF32 operands")]
        v = view(p)
        # GEMM_3XTF32 is a parameter of fp32 problems only; a tf32 problem's products keep one block.
        params = ("TILE", "IMGS") if p.precision.tf32 else ("TILE", "IMGS", "GEMM_3XTF32")
        out = [workspace_rule(limits.workspace_bytes, params, lambda m, imgs, x3=0: WORKSPACE_ELEMENT.size * sum(
            workspace_elements(v, m, imgs, splits(p.op, x3)).values())), *products_constraints(p, limits)]
        if p.op != "conv_wgrad":
            def staged_rows(kind, m, imgs, threads):
                if kind != "rows":
                    return None
                rows = output_rows(p, m, imgs, threads)
                if rows["smem"] > STATIC_SMEM_LIMIT:
                    return (f"WG_OUTPUT=rows stages {rows['band'] * m} output rows of {v.WO} in "
                            f"{rows['smem']} bytes of shared memory, more than a block's static "
                            f"{STATIC_SMEM_LIMIT}")
                blocks = output_blocks(p, rows, min(imgs, v.N))
                return None if blocks <= GRID_X_LIMIT else f"WG_OUTPUT=rows: {blocks} blocks exceed {GRID_X_LIMIT}"
            out.append(Constraint(("WG_OUTPUT", "TILE", "IMGS", "WG_THREADS"), staged_rows))
        return out

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        """Each tile with the largest block within a quarter of the workspace limit, then one image;
        for fp32, FP32 products first, then each tile with 3xTF32 products."""
        v = view(problem)
        imgs_choices = choices_upto(IMGS, next_pow2(problem.N))
        tf32 = problem.precision.tf32
        extra = {"TF32_GEMM": 0} if tf32 else {"GEMM_3XTF32": 0}

        def largest_block(m: int, parts: int) -> int:
            fits = [i for i in imgs_choices
                    if WORKSPACE_ELEMENT.size * sum(workspace_elements(v, m, i, parts).values()) <= DEFAULT_WORKSPACE_BYTES]
            return max(fits, default=1)

        extra["PRODUCTS"] = "cublas"
        if problem.op == "conv_wgrad" and problem.bias:
            extra["BIAS_FUSED"] = 0
        out = [{"formulation": NAME, "TILE": m, "IMGS": largest_block(m, 1), "WG_THREADS": 128, **extra}
               for m in (4, 2)]
        out.append({"formulation": NAME, "TILE": 2, "IMGS": 1, "WG_THREADS": 128, **extra})
        if not tf32:
            out += [{"formulation": NAME, "TILE": m, "IMGS": largest_block(m, splits(problem.op, 1)), "WG_THREADS": 128,
                     **extra, "GEMM_3XTF32": 1} for m in (4, 2)]
        # The mma products last: tiles of up to 64 x 64 over 2 x 2 warps, a 3-stage pipeline, and
        # for the weight gradient the reduction split so that about two blocks per SM of an H100 run.
        for m in (4, 2):
            imgs = largest_block(m, 1)
            gemm = products_gemm(problem, imgs, m)
            bm, bn = (min(64, max(32, next_pow2(n))) for n in (gemm.GM, gemm.GN))
            cand = {"formulation": NAME, "TILE": m, "IMGS": imgs, "WG_THREADS": 128, **extra, "PRODUCTS": "mma",
                    "MMA_BM": bm, "MMA_BN": bn, "MMA_BK": 32, "MMA_WM": 2, "MMA_WN": 2, "MMA_STAGES": 3,
                    "MMA_FRAG": "pair", **({} if tf32 else {"MMA_CROSS": 0})}
            if problem.op == "conv_wgrad":
                cand["MMA_SPLITK"] = default_split(m, gemm, bm, bn, MMA_SPLITS)
            out.append(cand)
        # The wgmma products (Hopper) after them, where the shape lets their operands move in float4s:
        # 128 rows where there are that many, 128 columns (fewer where there are), 3 stages; the
        # weight gradient's reduction split as for mma.
        for m in (4, 2):
            imgs = largest_block(m, 1)
            gemm = products_gemm(problem, imgs, m)
            whole_chunks = gemm.vec_a == 4 if problem.op == "conv_wgrad" else v.CIN % 4 == 0
            if not whole_chunks:
                continue
            wgs = 2 if gemm.GM > 64 else 1
            wbn = 128 if gemm.GN > 64 else min(64, max(32, next_pow2(gemm.GN)))
            cand = {"formulation": NAME, "TILE": m, "IMGS": imgs, "WG_THREADS": 256, **extra, "PRODUCTS": "wgmma",
                    "WGMMA_WGS": wgs, "WGMMA_BN": wbn, "WGMMA_STAGES": 3, "WGMMA_INFLIGHT": 0}
            if problem.op == "conv_wgrad":
                cand["WGMMA_SPLITK"] = default_split(m, gemm, 64 * wgs, wbn, WGMMA_SPLITS)
            out.append(cand)
        if problem.op != "conv_wgrad":
            # The output transform stages whole rows (WG_OUTPUT "rows": on the H200, modern_14's
            # forward took 16.2 us there against 28.2 with each thread storing its tile) where its
            # shared memory allows.
            for cand in out:
                rows = output_rows(problem, cand["TILE"], cand["IMGS"], cand["WG_THREADS"])
                cand["WG_OUTPUT"] = "rows" if rows["smem"] <= STATIC_SMEM_LIMIT else "tiles"
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
                "wg_output": sandwich("y", at, "mm", m + 2, "part"), "wg_mma": products_context(problem, config),
                "wg_wgmma": wgmma_products_context(problem, config), "wg_vt": transposed_input(problem, config),
                "wg_out_rows": output_context(problem, config)}

    def compile_suffix(self, config: Config) -> str:
        # wgmma runs on the architecture-specific target (sm_90a) only; the other products keep the
        # portable one.
        return "a" if config.get("PRODUCTS") == "wgmma" else ""

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
        mma = generated_products(problem, config)
        vt = transposed_input(problem, config)
        out_rows = output_context(problem, config)
        for n0 in range(0, v.N, b):
            nb = min(b, v.N - n0)
            if vt is not None:    # V stored tiles x CIN: 32 channels of tiles_h x tiles_w tiles a block
                grid = (cdiv(tw, vt["tiles_w"]), nb * cdiv(th, vt["tiles_h"]), cdiv(v.CIN, 32))
            else:
                grid = (cdiv(v.CIN * ld, threads), 1, 1)
            steps.append(Launch("winograd_input", grid, (threads, 1, 1), 0, (self.src, "wg_v"), (n0, nb)))
            if mma is not None:
                steps.append(products_launch(mma, ("wg_u", "wg_v", "wg_m"), nb * th * tw, False))
            else:
                steps.append(LibraryGemm(m=v.COUT, n=nb * th * tw, k=red, a=MatrixView("wg_u", 0, red, v.COUT * red),
                                         b=MatrixView("wg_v", 0, ld, red * ld),
                                         c=MatrixView("wg_m", 0, ld, v.COUT * ld),
                                         batch=points, tf32=bool(config.get("TF32_GEMM", 0)) or red > v.CIN))
            blocks = output_blocks(problem, out_rows, nb) if out_rows is not None else cdiv(v.COUT * ld, threads)
            steps.append(Launch("winograd_output", (blocks, 1, 1), (threads, 1, 1), 0,
                                ("wg_m", "bias", self.dst), (n0, nb)))
        return tuple(steps)

    def code_helpers(self) -> tuple:
        return (WinogradView, serves, view, tiles, block_tiles, workspace_elements, splits, config_splits,
                *SANDWICH_CODE, TRANSFORMS, ProductsGemm, products_gemm, products_smem_bytes, products_active,
                products_context, products_launch, MMA_PAD_KMAJOR, MMA_PAD_ROWMAJOR, wgmma_products_context,
                transposed_input, input_window, output_rows, output_blocks, output_context, generated_products,
                hopper.smem_bytes, hopper.BK, hopper.ALIGN_SLACK)


class _WinogradWgrad(_Winograd):
    """conv_wgrad: per block of images, X's input transform (V) and dY's (P = A dY A^T), then the
    points' GEMMs M[e] (+)= P[e] V[e]^T (K x C, accumulated over the blocks); after the last block
    dW = G^T M G, and db by its own reduction (or, BIAS_FUSED, summed by winograd_grad as it reads dY)."""

    def __init__(self) -> None:
        super().__init__("conv_wgrad", "x", "dw")
        self.templates = ("winograd_conv_wgrad.cu.j2", "_winograd.cuh.j2", "_winograd_transform.cuh.j2",
                          "_winograd_correlation.cuh.j2", "_bias_grad.cuh.j2", *PRODUCTS_TEMPLATES)

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        m = config["TILE"]
        _, g, at = TRANSFORMS[m]
        a = tuple(zip(*at))           # A, (m+2) x m
        gt = tuple(zip(*g))           # G^T, 3 x (m+2)
        fused = bool(config.get("BIAS_FUSED", 0))
        return {**super().context(problem, config), "wg_wgrad": True, "wg_bias_grad": bool(problem.bias) and not fused,
                "wg_bias_fused": fused,
                "wg_grad": sandwich("x", a, "g", m, "part"), "wg_wgrad_out": sandwich("y", gt, "mm", m + 2, "part")}

    def buffers(self, problem: Any, config: Config) -> Buffers:
        _zero, workspaces = super().buffers(problem, config)
        return (("db",) if config.get("BIAS_FUSED", 0) else ()), workspaces    # BIAS_FUSED's atomics add into db

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
        mma = generated_products(problem, config)
        fused = bool(config.get("BIAS_FUSED", 0))
        if mma is not None and mma["splitk"] > 1:     # the splits add into M from the first block of images on
            steps.append(Launch("winograd_clear", (cdiv(points * v.COUT * v.CIN, threads), 1, 1), (threads, 1, 1), 0,
                                ("wg_m",)))
        for n0 in range(0, v.N, b):
            nb = min(b, v.N - n0)
            steps.append(Launch("winograd_input", (cdiv(v.CIN * ld, threads), 1, 1), (threads, 1, 1), 0,
                                (self.src, "wg_v"), (n0, nb)))
            steps.append(Launch("winograd_grad", (cdiv(v.COUT * ld, threads), 1, 1), (threads, 1, 1), 0,
                                ("dy", "wg_p", "db") if fused else ("dy", "wg_p"), (n0, nb)))
            if mma is not None:
                steps.append(products_launch(mma, ("wg_p", "wg_v", "wg_m"), nb * th * tw, n0 > 0))
                continue
            for i, (jp, jv) in enumerate(pairs):
                steps.append(LibraryGemm(
                    m=v.COUT, n=v.CIN, k=nb * th * tw,
                    a=MatrixView("wg_p", jp * points * v.COUT * ld, ld, v.COUT * ld),
                    b=MatrixView("wg_v", jv * points * v.CIN * ld, ld, v.CIN * ld), trans_b=True,
                    c=MatrixView("wg_m", 0, v.CIN, v.COUT * v.CIN), batch=points, tf32=tf32,
                    accumulate=n0 > 0 or i > 0))
        steps.append(Launch("winograd_wgrad_output", (cdiv(v.COUT * v.CIN, threads), 1, 1), (threads, 1, 1), 0,
                            ("wg_m", "dw")))
        if problem.bias and not fused:
            steps.append(Launch("conv_bias_grad", (v.COUT, 1, 1), (threads, 1, 1), 0, ("dy", "db")))
        return tuple(steps)


WINOGRAD = Formulation(NAME, (_Winograd("conv_fwd", "x", "y"), _Winograd("conv_bwd_data", "dy", "dx"),
                              _WinogradWgrad()))
