"""Staging a convolution's operands contiguous along the reduction, before a tensor-core GEMM that
reads them K-major: the staging kernels' launches and workspaces.

conv_fwd: X as NHWC and W as KRSC (nhwc_stage_conv_fwd.cuh.j2: tc's NHWC configs and wgmma), in two
kernels, in one, or by whole planes (STAGE_PLANES); conv_bwd_data: dY as NHWC and W as CRSK (wgmma
and tma); conv_wgrad: dY and X on a padded grid on which each filter tap is a constant shift
(``PaddedGrid``), or dY as it is and X unrolled (wgmma). With 3xTF32 (wgmma_gemm.split) each staged
copy holds its TF32 parts and then the TF32 parts of the remainders.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.kernels.formulations.cores.wgmma_gemm import BK, split
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.steps import Launch
from autocnn.precision import FLOAT32


def nhwc_stage_launches(problem: Any, threads: tuple[int, int, int]) -> tuple[Launch, Launch]:
    """conv_fwd's staging kernels (nhwc_stage_conv_fwd.cuh.j2: X to NHWC, W to KRSC), run before a
    GEMM that reads them, with the GEMM's block size."""
    p = problem
    stage_x = Launch("conv_fwd_stage_x", (cdiv(p.H * p.W, 32), cdiv(p.C, 32), p.N), threads, 0, ("x", "xt"))
    stage_w = Launch("conv_fwd_stage_w", (min(1024, cdiv(p.K * p.C * p.R * p.S, threads[0])), 1, 1), threads, 0,
                     ("w", "wt"))
    return stage_x, stage_w


def nhwc_stage_workspaces(problem: Any) -> tuple[tuple[str, int], ...]:
    """The staged copies' workspaces (float32 elements): Xt as NHWC, Wt as KRSC."""
    p = problem
    return (("xt", p.N * p.C * p.H * p.W), ("wt", p.K * p.C * p.R * p.S))


def stage_w_blocks(problem: Any, threads: tuple[int, int, int]) -> int:
    """The blocks that gather W into its staged copy (grid-strided beyond 1,024 of them): as many as
    W's own staging launch has, in either op."""
    p = problem
    return min(1024, cdiv(p.K * p.C * p.R * p.S, threads[0]))


def fwd_stage_launch(problem: Any, threads: tuple[int, int, int], planes_smem: int = 0) -> Launch:
    """conv_fwd's staging in one kernel (STAGE_LAUNCHES 1; nhwc_stage_conv_fwd.cuh.j2): W's gather in
    the first blocks, then X's 32 x 32 tiles; or (STAGE_PLANES, planes_smem bytes of shared memory a
    block) a block per filter, then a block per image and 32 channels."""
    p = problem
    if planes_smem:
        blocks = p.K + p.N * cdiv(p.C, PLANE_CHANNELS)
        return Launch("conv_fwd_stage", (blocks, 1, 1), threads, planes_smem, ("x", "w", "xt", "wt"))
    tiles = cdiv(p.H * p.W, 32) * cdiv(p.C, 32) * p.N
    return Launch("conv_fwd_stage", (stage_w_blocks(p, threads) + tiles, 1, 1), threads, 0, ("x", "w", "xt", "wt"))


# STAGE_PLANES: a block stages one image's plane of up to 32 channels; shared memory for it (and for
# one filter's or one input channel's weights) at most this much, so that two blocks fit an SM.
PLANE_CHANNELS = 32
PLANE_SMEM_LIMIT = 112 * 1024


def plane_stage_smem(plane: int, w_slice_floats: int) -> int:
    """Bytes of dynamic shared memory of the planes staging kernel: the larger of a plane of 32
    channels (rows padded to 1 mod 32 floats) and a block's slice of W as the op lays it out."""
    row = plane + (33 - plane % 32) % 32
    return FLOAT32.size * max(PLANE_CHANNELS * row, w_slice_floats)   # the staging moves FP32 float4s


def bwd_data_stage_launches(problem: Any, threads: tuple[int, int, int], launches: int = 2,
                            planes_smem: int = 0) -> tuple[Launch, ...]:
    """conv_bwd_data's staging kernels (wgmma_conv_bwd_data.cu.j2: dY to NHWC, W to CRSK), run before
    the GEMM with its block size; in 1 launch (STAGE_LAUNCHES) one kernel does both (W's blocks
    first, then dY's 32 x 32 tiles), so that W's small gather runs beside dY's transpose instead of
    after it; with STAGE_PLANES (planes_smem bytes of shared memory a block) a block per input
    channel's weights, then a block per image and 32 of dY's channels."""
    p = problem
    if planes_smem:
        blocks = p.C + p.N * cdiv(p.K, PLANE_CHANNELS)
        return (Launch("conv_bwd_data_stage", (blocks, 1, 1), threads, planes_smem, ("dy", "w", "dyt", "wt")),)
    w_blocks = stage_w_blocks(p, threads)
    if launches == 1:
        tiles = cdiv(p.P * p.Q, 32) * cdiv(p.K, 32) * p.N
        return (Launch("conv_bwd_data_stage", (w_blocks + tiles, 1, 1), threads, 0, ("dy", "w", "dyt", "wt")),)
    stage_dy = Launch("conv_bwd_data_stage_dy", (cdiv(p.P * p.Q, 32), cdiv(p.K, 32), p.N), threads, 0, ("dy", "dyt"))
    stage_w = Launch("conv_bwd_data_stage_w", (w_blocks, 1, 1), threads, 0, ("w", "wt"))
    return stage_dy, stage_w


def bwd_data_stage_workspaces(problem: Any, a_regs: int = 0) -> tuple[tuple[str, int], ...]:
    """The staged copies' workspaces (float32 elements): dYt as NHWC (its small parts too with 3xTF32,
    unless A_REGS splits it in registers), Wt as CRSK."""
    p, parts = problem, 2 if split(problem) else 1
    return (("dyt", (1 if a_regs else parts) * p.N * p.K * p.P * p.Q), ("wt", parts * p.K * p.C * p.R * p.S))


@dataclass(frozen=True)
class PaddedGrid:
    """conv_wgrad's reduction on wgmma: GK = N * HP * WP positions j = (n, hp, wp) of an HP x WP grid
    per image, the output's P x Q positions and room for the largest filter tap's shift. With stride
    1 a tap (r, s) is the shift r*WP + s of X laid on the grid. With stride (SH, SW) X is laid on the
    grid once per stride phase (a, b), PHASES = SH * SW grids: grid position (hp, wp) of phase (a, b)
    holds X's row SH*(hp - OH) + a and column SW*(wp - OW) + b, and tap (r, s) reads phase
    ((r - PT) mod SH, (s - PL) mod SW) at the shift floor((r - PT) / SH) + OH rows and
    floor((s - PL) / SW) + OW columns (OH, OW make every shift >= 0; with stride 1, OH = PT, OW = PL).
    WP is a multiple of 4, so a tap's shift is aligned for 16-byte copies when its column shift is;
    X is staged in XCOPIES copies (as many as column shifts, at most 4), copy d starting d floats
    later, each LC floats per channel (the grid and the largest shift). dY is zero on the last rows
    of each image's grid: IMAGE_TILES=1 runs the reduction over TPI tiles of each image's first P
    rows instead of over the whole grid (modern_14: 7 tiles of 32 per image instead of 8; an H100
    took its tf32 plan from 207 to 190 us, most of it from staging X's copies in one pass, 38.8 ->
    26.9 us)."""
    HP: int
    WP: int
    GK: int
    LC: int
    XCOPIES: int
    TPI: int            # IMAGE_TILES=1: the BK tiles of one image's P rows (its last rows hold no dY)
    OH: int = 0         # the grid rows and columns before X's first (stride phases; PT, PL for stride 1)
    OW: int = 0
    PHASES: int = 1     # X's grids, one per stride phase

    @staticmethod
    def of(problem: Any) -> "PaddedGrid":
        p = problem
        (sh, sw), pt, pl = p.stride, p.padding[0], p.padding[1]
        oh, ow = cdiv(pt, sh), cdiv(pl, sw)
        dh, dw = (p.R - 1 - pt) // sh + oh, (p.S - 1 - pl) // sw + ow   # the largest row and column shifts
        hp, wp = p.P + dh, 4 * cdiv(p.Q + dw, 4)
        gk = p.N * hp * wp
        return PaddedGrid(hp, wp, gk, gk + 4 * cdiv(dh * wp + dw + 1, 4), min(dw + 1, 4), cdiv(p.P * wp, BK),
                          oh, ow, sh * sw)

    def tiles(self, problem: Any, image_tiles: int) -> int:
        """The reduction's BK tiles: of the whole grid, or (IMAGE_TILES=1) of each image's P rows,
        which skips the R - 1 rows per image where dY is zero but rounds each image up to whole tiles."""
        return problem.N * self.TPI if image_tiles else cdiv(self.GK, BK)


def unrolled_length(problem: Any) -> int:
    """X_UNROLLED=1: the reduction's length, the N*P*Q output positions rounded up to whole BK tiles.
    The padded grid runs over (P + R - 1) x (Q + S - 1) rounded up positions per image instead: for
    ResNet-18's 7x7 layers 108 against 49 (96 with IMAGE_TILES), while their X unrolled is 58 MB."""
    p = problem
    return BK * cdiv(p.N * p.P * p.Q, BK)


def wgrad_stage_workspaces(problem: Any, x_unrolled: int = 0, dy_in_place: int = 0,
                           x_in_place: int = 0) -> tuple[tuple[str, int], ...]:
    """The staged copies' workspaces (float32 elements): dYp on the padded grid (none with
    DY_IN_PLACE), the copies of Xs (none with X_IN_PLACE); with X_UNROLLED dY as it is and X
    unrolled, C*R*S rows, each over the unrolled length (twice each for 3xTF32: the small parts
    follow)."""
    p, parts = problem, 2 if split(problem) else 1
    if x_unrolled:
        lj = unrolled_length(p)
        return (("dyp", parts * p.K * lj), ("xs", parts * p.C * p.R * p.S * lj))
    g = PaddedGrid.of(problem)
    xs = () if x_in_place else (("xs", parts * g.PHASES * g.XCOPIES * p.C * g.LC),)
    return xs if dy_in_place else (("dyp", parts * p.K * g.GK), *xs)


def dy_images(problem: Any) -> int:
    """Images of one dY plane that a staging block copies (and sums for db): about 2,048 blocks."""
    return max(1, problem.N // max(1, 2048 // problem.K))


def wgrad_stage_launches(problem: Any, threads: tuple[int, int, int], image_tiles: int,
                         x_unrolled: int = 0, dy_in_place: int = 0, x_in_place: int = 0) -> tuple[Launch, ...]:
    """conv_wgrad's staging kernels (wgmma_conv_wgrad.cu.j2): dY onto the padded grid (one block per
    plane, db summed on the way) and X's copies, run before the GEMM with its block size. X's copies
    are one block per copy and range of a channel (IMAGE_TILES=0), or (1) one pass for all of them,
    a block per range of 4 * threads floats of a channel, written in float4s. X_UNROLLED: dY's
    planes side by side, and X unrolled, a block per range of 4 * threads positions of a tap's row.
    DY_IN_PLACE: X's copies only, and with a bias db's own kernel (a block per range of images of a
    plane, as dY's staging sums it). X_IN_PLACE: no copies of X."""
    p, g = problem, PaddedGrid.of(problem)
    stage_dy = Launch("conv_wgrad_stage_dy", (cdiv(p.N, dy_images(p)), p.K, 1), threads, 0, ("dy", "dyp", "db"))
    if x_unrolled:
        stage_x = Launch("conv_wgrad_stage_x", (min(1024, cdiv(unrolled_length(p), 4 * threads[0])),
                                                p.C * p.R * p.S, 1), threads, 0, ("x", "xs"))
    elif image_tiles:
        stage_x = Launch("conv_wgrad_stage_x", (min(1024, cdiv(g.LC, 4 * threads[0])), p.C, g.PHASES), threads, 0,
                         ("x", "xs"))
    else:
        stage_x = Launch("conv_wgrad_stage_x", (min(256, cdiv(g.LC, threads[0])), p.C, g.XCOPIES), threads, 0,
                         ("x", "xs"))
    staged_x = () if x_in_place else (stage_x,)
    if not dy_in_place:
        return (stage_dy, *staged_x)
    db = (Launch("conv_wgrad_db", (cdiv(p.N, dy_images(p)), p.K, 1), threads, 0, ("dy", "db")),) if p.bias else ()
    return (*db, *staged_x)
