"""The winograd formulation's generated products (PRODUCTS "mma" and "wgmma"): the GEMM of each point
of the transformed tile over a block of images, on the tc formulation's mma.sync core
(_winograd_products.cuh.j2 over tcgemm.cuh.j2) or on the wgmma block GEMM
(_winograd_wgmma_products.cuh.j2 over wgmma_mainloop.cuh.j2): their parameters' choices, rules,
template variables and launch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.cores import wgmma_gemm as hopper
from autocnn.kernels.formulations.cores.mma_rules import accumulator_violation, arch_violation, warp_tile_violation
from autocnn.kernels.formulations.cores.winograd_transforms import tiles, view
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import GRID_YZ_LIMIT, grid_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint
from autocnn.kernels.steps import Launch
from autocnn.precision import FLOAT32


MMA_TILES = (32, 64, 128)
MMA_STEPS = (16, 32)
MMA_WARPS = (1, 2, 4)
MMA_STAGES = (2, 3, 4)
MMA_FRAGS = ("pair", "quad")
MMA_SPLITS = (1, 2, 4, 8, 16, 32)
# Shared-memory padding of the staged rows, fixed where tcgemm.cuh.j2's fragment reads are free of
# bank conflicts: an operand stored along k as [row][BK + 4] (row length 4, 20 mod 32 floats), one
# stored along its rows as [k][ROWS + 8] (8 mod 32).
MMA_PAD_KMAJOR, MMA_PAD_ROWMAJOR = 4, 8
# PRODUCTS "wgmma": warpgroups along the rows (64 each), the wgmma's N (columns per block), stages,
# a group of wgmmas left in flight across the next tile's barrier, and (conv_wgrad) reduction splits.
WGMMA_WGS = (1, 2, 4)
WGMMA_BNS = (128, 64, 256, 32)
WGMMA_STAGES = (3, 4, 2, 5)
WGMMA_INFLIGHT = (0, 1)
WGMMA_SPLITS = (1, 2, 4, 8, 16, 32)
WGMMA_NAMES = hopper.BlockNames("WGMMA_WGS", "WGMMA_BN", "WGMMA_STAGES", "WGMMA_INFLIGHT")
PRODUCTS_TEMPLATES = ("_winograd_points.cuh.j2", "_winograd_products.cuh.j2", "tcgemm.cuh.j2", "_mma16_fragments.cuh.j2",
                      "_gemm_row_sums.cuh.j2",
                      "_mma_sync.cuh.j2", "_mma_tiles.cuh.j2", "_winograd_wgmma_products.cuh.j2", "wgmma_core.cuh.j2",
                      "_wgmma_ops.cuh.j2",
                      "wgmma_mainloop.cuh.j2")


@dataclass(frozen=True)
class ProductsGemm:
    """The GEMM of each point that winograd_products runs (PRODUCTS "mma"), C = A B over a block of
    images. conv_fwd / conv_bwd_data: M[e] (COUT x tiles) = U[e] (COUT x CIN, stored along k) V[e]
    (CIN x tiles, stored along its columns). conv_wgrad: M[e] (COUT x CIN) = P[e] V[e]^T, both
    stored along k, the tiles; the block's tiles are GN or GK. Rows, columns and reduction are the
    largest block's; a short last block passes its own."""

    GM: int
    GN: int
    GK: int
    b_kmajor: bool
    vec_a: int        # floats per load of A (4: 16-byte loads along k, every row start aligned)
    vec_b: int        # of B: along k (conv_wgrad) or along its columns, the tiles
    split3: bool      # fp32: 3xTF32 in registers


def products_gemm(problem: Any, imgs: int, m: int) -> ProductsGemm:
    v = view(problem)
    th, tw = tiles(v, m)
    b = min(imgs, v.N)
    ld = b * th * tw
    # Whole float4s along k need row starts at multiples of 4 floats and a reduction of whole
    # float4s in every block (the short last one too: its reduction is its own tiles).
    last = (v.N - (v.N - 1) // b * b) * th * tw
    split3 = problem.precision.tf32x3
    tiles_vec = 4 if ld % 4 == 0 and last % 4 == 0 else 1
    if problem.op == "conv_wgrad":
        return ProductsGemm(v.COUT, v.CIN, ld, True, tiles_vec, tiles_vec, split3)
    # V (CIN x tiles) is stored along the tiles: its float4s run along them (ROW_VECTORS).
    return ProductsGemm(v.COUT, ld, v.CIN, False, 4 if v.CIN % 4 == 0 else 1, tiles_vec, split3)


def products_smem_bytes(gemm: ProductsGemm, bm: int, bn: int, bk: int, stages: int) -> int:
    fa = bm * (bk + MMA_PAD_KMAJOR)
    fb = bn * (bk + MMA_PAD_KMAJOR) if gemm.b_kmajor else bk * (bn + MMA_PAD_ROWMAJOR)
    return FLOAT32.size * stages * (fa + fb)   # the TF32 core's stages: FP32 values


def products_active(config: Config) -> bool:
    return config.get("PRODUCTS", "cublas") == "mma"


def products_constraints(p: Any, limits: DeviceLimits) -> list[Constraint]:
    """Static feasibility of the mma products (tcgemm.cuh.j2's static_asserts, and the device's
    limits); each rule names MMA_ parameters, so it applies only where PRODUCTS is "mma"."""
    wgrad = p.op == "conv_wgrad"
    split3 = p.precision.tf32x3
    cublas_flag = "GEMM_3XTF32" if split3 else "TF32_GEMM"

    @functools.lru_cache(maxsize=None)     # a few (TILE, IMGS) pairs, asked by every rule of every config
    def gemm(m: int, imgs: int) -> ProductsGemm:
        return products_gemm(p, imgs, m)

    rows = view(p).COUT

    def one_pass(products, flag):
        # cuBLAS's flag has no meaning for the generated kernels: one value, so no config is tried twice.
        if products == "cublas" or not flag:
            return None
        where = "in registers" if products == "mma" else "in shared memory"
        return f"PRODUCTS={products} splits {where}: {cublas_flag} must be 0"

    def arch(_):
        return arch_violation(limits)

    def warp_tiles(bm, bn, wm, wn):
        return warp_tile_violation(bm, bn, wm, wn) or accumulator_violation(bm, bn, wm, wn, split3)

    def even_loads(m, imgs, bm, bn, bk, wm, wn):
        g, n = gemm(m, imgs), 32 * wm * wn
        if (bm * bk) % (n * g.vec_a) or (bn * bk) % (n * g.vec_b):
            return f"a {bm}x{bk} / {bn}x{bk} tile does not split evenly into the loads of {n} threads"
        return None

    def columns(m, imgs, bn):
        g = gemm(m, imgs)
        return None if bn <= max(32, next_pow2(g.GN)) else f"MMA_BN={bn} exceeds the products' {g.GN} columns"

    out = [Constraint(("PRODUCTS", cublas_flag), one_pass),
           Constraint(("MMA_BM",), arch),
           Constraint(("MMA_BM",), lambda bm: None if bm <= max(32, next_pow2(rows))
                      else f"MMA_BM={bm} exceeds the products' {rows} rows"),
           Constraint(("TILE", "IMGS", "MMA_BN"), columns),
           Constraint(("MMA_BM", "MMA_BN", "MMA_WM", "MMA_WN"), warp_tiles),
           Constraint(("TILE", "IMGS", "MMA_BM", "MMA_BN", "MMA_BK", "MMA_WM", "MMA_WN"), even_loads),
           threads_rule(limits, ("MMA_WM", "MMA_WN"), lambda wm, wn: 32 * wm * wn),
           smem_rule(limits, ("TILE", "IMGS", "MMA_BM", "MMA_BN", "MMA_BK", "MMA_STAGES"),
                     lambda m, imgs, bm, bn, bk, st: products_smem_bytes(gemm(m, imgs), bm, bn, bk, st)),
           grid_rule(("TILE", "IMGS", "MMA_BN"), lambda m, imgs, bn: cdiv(gemm(m, imgs).GN, bn))]
    out += wgmma_products_constraints(p, limits, gemm)
    if wgrad:
        def reduction(m, imgs, bk, splitk):
            steps = cdiv(gemm(m, imgs).GK, bk)
            return None if splitk <= steps else f"MMA_SPLITK={splitk} exceeds the {steps} reduction steps"
        out += [Constraint(("TILE", "IMGS", "MMA_BK", "MMA_SPLITK"), reduction),
                Constraint(("TILE", "MMA_SPLITK"), lambda m, splitk: None if (m + 2) ** 2 * splitk <= GRID_YZ_LIMIT
                           else "too many splits")]
    return out


def wgmma_products_constraints(p: Any, limits: DeviceLimits, gemm: Any) -> list[Constraint]:
    """Static feasibility of the wgmma products (the block GEMM's own rules, hopper.block_rules, and
    the K-major operands' 16-byte chunks); each rule names WGMMA_ parameters, so it applies only
    where PRODUCTS is "wgmma"."""
    wgrad = p.op == "conv_wgrad"
    split3 = p.precision.tf32x3
    rows = view(p).COUT

    def chunks(m, imgs, _wgs):
        # Both operands move in 16-byte chunks along the reduction, each chunk whole: the channels
        # (conv_fwd, conv_bwd_data) or every block's tiles (conv_wgrad) a multiple of 4.
        g = gemm(m, imgs)
        if not wgrad:
            cin = view(p).CIN
            return None if cin % 4 == 0 else (
                f"PRODUCTS=wgmma reads the products' reduction, the {cin} input channels, in float4s: "
                "a multiple of 4 is needed")
        return None if g.vec_a == 4 else (
            f"PRODUCTS=wgmma reads the products' reduction, each block's tiles ({g.GK} with {imgs} images a block, "
            "and the last block's), in float4s: multiples of 4 are needed")

    def columns(m, imgs, wbn):
        gn = gemm(m, imgs).GN
        return None if wbn <= max(32, next_pow2(gn)) else f"WGMMA_BN={wbn} exceeds the products' {gn} columns"

    out = [*hopper.block_rules(limits, split3, WGMMA_NAMES),
           Constraint(("TILE", "IMGS", "WGMMA_WGS"), chunks),
           Constraint(("WGMMA_WGS",), lambda wgs: None if wgs == 1 or 64 * wgs <= max(64, next_pow2(rows))
                      else f"WGMMA_WGS={wgs} exceeds the products' {rows} rows"),
           Constraint(("TILE", "IMGS", "WGMMA_BN"), columns),
           grid_rule(("TILE", "IMGS", "WGMMA_BN"), lambda m, imgs, wbn: cdiv(gemm(m, imgs).GN, wbn))]
    if not wgrad:
        def input_rows(m, imgs, threads, _wgs):
            # the transposed input transform's blocks along y: the block's images x its tile rows
            return min(imgs, p.N) * cdiv(tiles(view(p), m)[0], input_window(p, m, threads)["tiles_h"])
        out.append(grid_rule(("TILE", "IMGS", "WG_THREADS", "WGMMA_WGS"), input_rows))
    else:
        def reduction(m, imgs, splitk):
            steps = cdiv(gemm(m, imgs).GK, hopper.BK)
            return None if splitk <= steps else f"WGMMA_SPLITK={splitk} exceeds the {steps} reduction tiles"
        out += [Constraint(("TILE", "IMGS", "WGMMA_SPLITK"), reduction),
                Constraint(("TILE", "WGMMA_SPLITK"), lambda m, splitk: None if (m + 2) ** 2 * splitk <= GRID_YZ_LIMIT
                           else "too many splits")]
    return out


def products_context(problem: Any, config: Config) -> dict[str, Any] | None:
    """What tcgemm.cuh.j2 reads, for the mma products (None with cuBLAS's)."""
    if not products_active(config):
        return None
    c = config
    g = products_gemm(problem, c["IMGS"], c["TILE"])
    return {"BM": c["MMA_BM"], "BN": c["MMA_BN"], "BK": c["MMA_BK"], "WM": c["MMA_WM"], "WN": c["MMA_WN"],
            "STAGES": c["MMA_STAGES"], "CP_ASYNC": 1, "split3": g.split3, "PAD_A": MMA_PAD_KMAJOR,
            "PAD_B": MMA_PAD_KMAJOR if g.b_kmajor else MMA_PAD_ROWMAJOR, "TABLE_A": 0, "VEC_A": g.vec_a,
            "VEC_B": g.vec_b, "FRAG": c["MMA_FRAG"], "TF32_ROUND": "nearest", "UNROLL_K": "",
            "cross": c.get("MMA_CROSS", 0),
            "ROW_VECTORS": int(not g.b_kmajor and g.vec_b > 1), "gemm": g, "points": (c["TILE"] + 2) ** 2,
            "splitk": c.get("MMA_SPLITK", 1), "threads": 32 * c["MMA_WM"] * c["MMA_WN"],
            "smem": products_smem_bytes(g, c["MMA_BM"], c["MMA_BN"], c["MMA_BK"], c["MMA_STAGES"])}


def wgmma_products_context(problem: Any, config: Config) -> dict[str, Any] | None:
    """What _winograd_wgmma_products.cuh.j2 reads (None unless PRODUCTS is "wgmma"), in the same
    terms as products_context where products_launch reads it."""
    c = config
    if c.get("PRODUCTS", "cublas") != "wgmma":
        return None
    g = products_gemm(problem, c["IMGS"], c["TILE"])
    split3 = problem.precision.tf32x3
    wgs, wbn = c["WGMMA_WGS"], c["WGMMA_BN"]
    return {"WGS": wgs, "WBN": wbn, "BK": hopper.BK, "WSTAGES": c["WGMMA_STAGES"], "INFLIGHT": c["WGMMA_INFLIGHT"],
            "ALIGN_SLACK": hopper.ALIGN_SLACK, "split3": split3, "gemm": g, "points": (c["TILE"] + 2) ** 2,
            "splitk": c.get("WGMMA_SPLITK", 1), "threads": 128 * wgs, "BM": 64 * wgs, "BN": wbn,
            "smem": hopper.smem_bytes(wgs, wbn, c["WGMMA_STAGES"], split3)}


def input_window(problem: Any, m: int, threads: int) -> dict[str, int]:
    """The tiles of one block of the transposed input transform: a warp each."""
    warps = threads // 32
    _th, tw = tiles(view(problem), m)
    wide = min(warps, next_pow2(tw))
    return {"tiles_h": warps // wide, "tiles_w": wide}


def generated_products(problem: Any, config: Config) -> dict[str, Any] | None:
    """The generated products kernel's context (mma's or wgmma's; None with cuBLAS's), in the terms
    products_launch reads."""
    return products_context(problem, config) or wgmma_products_context(problem, config)


def default_split(m: int, gemm: ProductsGemm, bm: int, bn: int, choices: tuple[int, ...]) -> int:
    """The default candidates' reduction split of conv_wgrad's products: enough blocks for about two
    per SM of an H100 (132), each split at least four steps of 32 of the reduction."""
    blocks = (m + 2) ** 2 * cdiv(gemm.GM, bm) * cdiv(gemm.GN, bn)
    want = max(1, min(2 * 132 // blocks, cdiv(gemm.GK, 4 * 32)))
    return max(s for s in choices if s <= want)


def products_launch(mma: dict[str, Any], args: tuple[str, str, str], cols: int, accumulate: bool) -> Launch:
    """winograd_products over one block of images (``cols`` of its tiles), from the plan's
    products_context: C = A B of every point, added to C where ``accumulate`` (conv_wgrad's later
    blocks) or with the splits' atomics."""
    g = mma["gemm"]
    gn = g.GN if g.b_kmajor else cols      # conv_wgrad's columns are channels; the others' the tiles
    grid = (cdiv(g.GM, mma["BM"]), cdiv(gn, mma["BN"]), mma["points"] * mma["splitk"])
    return Launch("winograd_products", grid, (mma["threads"], 1, 1), mma["smem"], args, (cols, int(accumulate)))
