"""Hopper's warpgroup tensor cores ("wgmma"): the three convolutions as implicit GEMMs on
wgmma.mma_async (sm_90a).

mma.sync (the tc formulation) feeds the tensor cores from registers that every warp fills from
shared memory: at its largest warp tile (64x64) the shared-memory reads already match the tensor
cores' TF32 rate, so the tc kernels stay at 15-23% of the H100's TF32 GEMM rate. wgmma reads both
operands straight from shared memory for a warpgroup (4 warps, a 64 x BN tile) and runs
asynchronously: no fragment loads, no conversions, and one read of each operand tile per
warpgroup instead of one per warp.

wgmma takes 32-bit operands K-major only, so both operands are staged first, contiguous along the
reduction: conv_fwd's X as NHWC and W as KRSC (nhwc_stage_conv_fwd.cuh.j2, shared with tc's NHWC
configs), reduction (r, s, c); conv_bwd_data's dY as NHWC and W as CRSK, reduction (tap, filter)
of each stride phase (one GEMM per phase along the grid's z, as the other formulations run them).
Each stage holds BK = 32 floats of the reduction per row (128 bytes, one row of the 128-byte
swizzle: chunk c of row r lives at c ^ (r % 8), which the descriptors name; the layout and
descriptor fields were checked on an H100 by scripts/probe_wgmma.py), filled by 16-byte cp.async
copies with zero fill at the gather's padding and the tiles' ragged edges. The block GEMM is one
source for both ops (wgmma_mainloop.cuh.j2).

Precision: tf32 reads each operand once; the tensor cores truncate it to TF32 (the tc
formulation's TF32_ROUND "zero", inside the tf32 bound). fp32 is 3xTF32: the staging kernels
write each operand's TF32 part and, after it, the TF32 part of the remainder (both rounded to
nearest, as tc's split does), the block copies both into shared memory, and every k-step adds
small*big, big*small and big*big to the tile's partial sums, which are added to the totals in FP32:
the tensor cores accumulate without round-to-nearest, an error that grew past the FP32 bound over
modern_14's 2,304 terms when every product went straight to the totals. So it passes the FP32 bound
as tc's 3xTF32 does, for twice the staged copies, shared memory and accumulator registers (WBN <=
128) and three times the tensor-core work.

Parameters: WGS warpgroups along the GEMM's rows (BM = 64 * WGS), WBN columns per block (the
wgmma's N: accumulators are WBN / 2 registers per thread), WSTAGES shared-memory stages, INFLIGHT:
with 0 each warpgroup waits for a tile's wgmmas before the barrier of the next, so the tensor cores
idle through every wait for copies and every barrier; with 1 the group of tile k is waited for only
after tile k + 1's is issued (wgmma.wait_group 1), which costs a stage (the copies run STAGES - 2
tiles ahead). fp32 pipelines pairs of tiles with a set of partial sums each (ptxas serializes
every wgmma when registers of a completed group are read while another is in flight).

conv_fwd and conv_bwd_data also take STAGE_LAUNCHES: 2, the input's transpose then W's gather, each
its own kernel; 1, one kernel whose first blocks gather W while the others transpose the input, so
that W's small, latency-bound gather no longer runs alone between the transpose and the GEMM
(modern_56's backward-data on an H200: 229.3 -> 225.4 us a plan). And, for fp32, A_REGS: 1 stages
operand A (X, or dY) once, in FP32; the tensor cores read it from shared memory as its TF32 part
(truncated: they ignore the low 13 bits), and each thread reads its wgmma A fragments into
registers, forms the TF32 parts of their remainders x - trunc(x) there and multiplies them by B's
big parts with A from registers. A's small parts are then neither written by the staging nor
copied into shared memory (modern_56's staging 46.6 -> 34.0 us on an H200), but the main loop
pays for the fragment reads and conversions on its path from barrier to wgmma (178.6 -> 190.9 us),
and on the H200 no row tuned took it. It waits for each tile's wgmmas (INFLIGHT 0: a group in
flight would hold a second tile's fragments) and holds at most 64 columns (128 registers a thread).

CROSS (fp32, conv_fwd and conv_bwd_data): 1 runs 3xTF32's two cross products big x small + small x
big as one BF16 wgmma of depth 16 (m64nNk16, the same FP32 partial sums) instead of two TF32 wgmmas,
so a k-step takes two tensor-core steps instead of three. The staging writes, in the small parts'
place and with the same bytes, runs of 8 BF16 values followed by their 8 BF16 remainders
x - tf32(x) (B: remainders first), so that the wgmma's 16 terms pair x_a with rest_b and rest_a
with x_b. A 32-byte run must be 8 channels of one tap in both operands: C (conv_fwd) or K
(conv_bwd_data) a multiple of 8. Each product is within about 2**-17 of itself (the BF16 roundings
of a factor, 2**-8, of a term of at most 2**-11): 6.9e-7 relative error on the seed layers against
2.6e-7 for 3xTF32 (H200), inside the FP32 bound with a factor of 14 to spare. modern_56's
backward-data main loop went from 176.8 to 166.0 us on an H200; not more, because the loop is not
bound by the tensor cores (54% busy before) but by its copies and waits.

conv_fwd and conv_bwd_data may split their reduction (SPLITK: partial sums added by atomics into
the zeroed output, the first share adding the bias; layers without a fused activation only), for
layers with too few output tiles to fill the GPU. Their GEMM may run stream-K (SK_BLOCKS: a grid of
1-3 blocks an SM, a multiple of the device's SMs checked against DeviceLimits.sm_count, each block an
equal contiguous run of (output tile, reduction tile) pairs, partial sums added by atomics; one GEMM,
so conv_bwd_data at stride 1), for grids whose last wave leaves SMs idle (modern_14's tf32 forward:
98 tiles of 128 x 256 for 132 SMs). The staging in one launch may move whole planes (STAGE_PLANES: a
block per image and 32 channels, one contiguous run read in 16-byte chunks, and a block per weight
slice, both through shared memory), for small images, whose 32 x 32 tiles read misaligned rows and
mostly empty last tiles.

conv_wgrad (WgmmaConvWgrad) is a GEMM over a padded grid on which each filter tap is a constant
shift (PaddedGrid; a strided layer's X laid on one grid per stride phase, where each tap is a
constant shift of its phase's grid), its reduction split over SPLITK blocks that meet by atomics and
tiled over the whole grid or (IMAGE_TILES=1, the only padded-grid staging that lays out phases) over
each image's P rows only, since the grid's last rows of an image hold no dY. X_UNROLLED=1 (any
stride) drops the grid: dY's planes side by side and X unrolled, a row per filter tap over the
N*P*Q output positions, which writes R*S times X but wastes nothing on small images (ResNet-18's
7x7 layers: 98 reduction tiles against the grid's 192), so the defaults take it where its copy is
at most 128 MiB (unrolled_pays). DY_IN_PLACE=1 (each image's tiles, tf32, Q a multiple of 4) reads
dY where it lies, a 16-byte chunk of grid columns wholly inside a row of dY or past it, so that only
X is staged (ResNet-18's first layer: dY on the grid would not fit the workspace); with a bias, db
is then a kernel of its own. On a 1x1 stride-1 layer without padding, whose grid is the image, X
may be read where it lies too (X_IN_PLACE=1, W a multiple of 4): a pointwise layer then stages
nothing.

The build tests fail on ptxas's wgmma-serialization warning C7514, which would silently turn
INFLIGHT 1 into INFLIGHT 0. Not offered, since measured slower (MEASUREMENTS.md): the 3xTF32 split
made in shared memory from one FP32 copy (it halves the staging but adds half again to the main
loop's shared-memory traffic: 38-41% slower in the main loop, also with the split moved off the
barrier path), the GEMM transposed, and a producer warpgroup.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation
from autocnn.kernels.formulations.cores.staging import (PLANE_CHANNELS, PaddedGrid, dy_images, fwd_stage_launch,
                                                        nhwc_stage_launches, nhwc_stage_workspaces, plane_stage_smem,
                                                        stage_w_blocks, unrolled_length, wgrad_stage_launches,
                                                        wgrad_stage_workspaces)
from autocnn.kernels.formulations.cores.wgmma_gemm import (ALIGN_SLACK, ARCH, BK, FORMULATION_WGMMA, WgmmaGemm,
                                                           smem_bytes, split)
from autocnn.kernels.formulations.cores.wgmma_split_output import (NAMESPACE, OUTPUT_SPLITS, STREAM_K_BLOCKS,
                                                                   SplitOutputGemm, WgmmaConvBwdData)
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch


class WgmmaConvFwd(SplitOutputGemm):
    """conv_fwd's implicit GEMM (rows: output pixels, columns: filters) on wgmma."""

    op = "conv_fwd"
    summary = "Hopper warpgroup tensor-core implicit GEMM (sm_90a; fp32 as 3xTF32)"
    templates = ("wgmma_conv_fwd.cu.j2", "wgmma_core.cuh.j2", "_wgmma_ops.cuh.j2", "wgmma_mainloop.cuh.j2", "gemm_operands_conv_fwd.cuh.j2",
                 "_conv_fwd_operands.cuh.j2", "_operand_access.cuh.j2", "nhwc_stage_conv_fwd.cuh.j2")
    ARGS = ("x", "w", "bias", "y", "xt", "wt")
    output = "y"

    def reduction_tiles(self, problem: Any) -> int:
        return cdiv(problem.C * problem.R * problem.S, BK)

    def plane_stage_smem(self, problem: Any) -> int:
        """W's slice a block: one filter's C x R*S, rows of R*S padded to odd."""
        p = problem
        return plane_stage_smem(p.H * p.W, p.C * (p.R * p.S | 1))

    def gemm_rows(self, problem: Any) -> int:
        return problem.N * problem.P * problem.Q

    def gemm_columns(self, problem: Any) -> tuple[int, str]:
        return problem.K, "filters"

    def vector_channels(self, problem: Any) -> tuple[int, str]:
        return problem.C, "C"

    def workspaces(self, problem: Any, a_regs: int = 0, *_: Any) -> tuple[tuple[str, int], ...]:
        parts = 2 if split(problem) else 1
        (x, nx), (w, nw) = nhwc_stage_workspaces(problem)
        return (x, (1 if a_regs else parts) * nx), (w, parts * nw)

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        # The operand gathers read the staged NHWC copies; the staging kernels take the block size.
        return {"NHWC": 1, "stage_threads": "wg::THREADS", "BK": BK, "ALIGN_SLACK": ALIGN_SLACK,
                "SPLIT": split(problem), "STAGE_SPLIT": split(problem), "wgmma_namespace": NAMESPACE,
                **self.split_context(config),
                "stage_w_blocks": stage_w_blocks(problem, (128 * config["WGS"], 1, 1))}

    def launches(self, problem: Any, config: Config) -> tuple[Launch, ...]:
        p, c = problem, config
        threads = (128 * c["WGS"], 1, 1)
        grid = self.gemm_grid(p, c, (cdiv(p.N * p.P * p.Q, 64 * c["WGS"]), cdiv(p.K, c["WBN"]), c["SPLITK"]))
        main = Launch("conv_fwd", grid, threads,
                      smem_bytes(c["WGS"], c["WBN"], c["WSTAGES"], split(p), c.get("A_REGS", 0)), self.ARGS)
        staging = (fwd_stage_launch(p, threads, self.planes_smem(p, c)),) if c["STAGE_LAUNCHES"] == 1 else \
            nhwc_stage_launches(p, threads)
        return (*staging, main)

    def code_helpers(self) -> tuple:
        return (smem_bytes, split, nhwc_stage_launches, stage_w_blocks, fwd_stage_launch, nhwc_stage_workspaces, BK,
                ALIGN_SLACK, ARCH, self.ARGS, OUTPUT_SPLITS, STREAM_K_BLOCKS, plane_stage_smem, PLANE_CHANNELS)


def x_in_place_fits(problem: Any) -> bool:
    """Whether the GEMM can read X where it lies (X_IN_PLACE): a 1x1 stride-1 layer without padding,
    whose padded grid is the image itself, in tf32 (3xTF32 stages X's TF32 parts), with W a multiple
    of 4 (16-byte chunks of X's rows). A pointwise layer's copies of X and dY were most of its time
    (256->512 channels, 28x28, batch 64, tf32, H200: 32.1 and 60.3 us of 171 beside a 76.5 us GEMM)."""
    p = problem
    return (p.R, p.S) == (1, 1) and tuple(p.stride) == (1, 1) and not any(p.padding) and not split(p) \
        and p.W % 4 == 0


def image_tiles_pay(problem: Any) -> bool:
    """Whether tiling each image's P rows (IMAGE_TILES=1) runs fewer reduction tiles than the whole
    grid: it skips the grid's last rows per image but rounds each image up to whole tiles. A strided
    layer's X is staged by phases in that staging kernel only."""
    g = PaddedGrid.of(problem)
    return g.PHASES > 1 or g.tiles(problem, 1) < g.tiles(problem, 0)


WGRAD_SPLITS = (8, 4, 16, 2, 1, 32)

# The defaults stage X unrolled where its copy (with 3xTF32's small parts) is at most this big. Tuned
# on an H100 (tf32), ResNet-18's weight gradients ran faster unrolled up to 116 MB of X: the 7x7 layer
# (58 MB) 134.7 against 252.6 us, the strided 14x14 and 28x28 (29 and 58 MB) 79.1 against 150.8 and
# 110.8 against 182.3, the 14x14 (116 MB) 161.9 against 178.7; the 28x28 (231 MB) slower, 245.0 against
# 212.9. The first defaults of each tiling, side by side on an H100 (seed and ResNet-18 shapes under
# the limit, both precisions): unrolled took 0.45-0.99 of the padded grid's time in 19 of 20 pairs,
# 1.52 in convnet18_c2's tf32 (105.7 against 69.3 us; 32 filters, 5x5 taps over 16x16 images).
UNROLLED_DEFAULT_BYTES = 128 * 2 ** 20


def unrolled_pays(problem: Any) -> bool:
    """Whether the default configs stage X unrolled (X_UNROLLED=1): where its copy is small enough that
    writing it costs less than the padded grid's waste and its copies (UNROLLED_DEFAULT_BYTES)."""
    return WORKSPACE_ELEMENT.size * dict(wgrad_stage_workspaces(problem, 1))["xs"] <= UNROLLED_DEFAULT_BYTES


class WgmmaConvWgrad(WgmmaGemm):
    """conv_wgrad's GEMM (rows: filters, columns: filter taps C*R*S, reduction: the padded grid, split
    over SPLITK blocks) on wgmma; with a stride, each tap a constant shift of its stride phase's grid."""

    op = "conv_wgrad"
    summary = "Hopper warpgroup tensor-core GEMM over a padded grid, split reduction (sm_90a; fp32 as 3xTF32)"
    templates = ("wgmma_conv_wgrad.cu.j2", "wgmma_core.cuh.j2", "_wgmma_ops.cuh.j2", "wgmma_mainloop.cuh.j2")
    ARGS = ("dyp", "xs", "dw")

    def gemm_rows(self, problem: Any) -> int:
        return problem.K

    def gemm_columns(self, problem: Any) -> tuple[int, str]:
        return problem.C * problem.R * problem.S, "filter taps (C*R*S)"

    def vector_channels(self, problem: Any) -> tuple[int, str] | None:
        return None   # both operands are contiguous along the grid, whatever the channels

    def workspace_params(self, problem: Any) -> tuple[str, ...]:
        return ("X_UNROLLED", "DY_IN_PLACE", *(("X_IN_PLACE",) if x_in_place_fits(problem) else ()))

    def workspaces(self, problem: Any, x_unrolled: int = 0, dy_in_place: int = 0,
                   x_in_place: int = 0) -> tuple[tuple[str, int], ...]:
        return wgrad_stage_workspaces(problem, x_unrolled, dy_in_place, x_in_place)

    def params(self, problem: Any) -> list[Param]:
        return [*super().params(problem),
                Param("SPLITK", WGRAD_SPLITS, "blocks splitting the reduction (partial sums meet by atomics)"),
                # 0 first: the code of configs written before the parameter
                Param("IMAGE_TILES", (0, 1), "reduction tiles over each image's P rows (skipping the grid's R - 1 "
                      "rows of zeros) and X's copies staged in one pass, against tiles over the whole grid"),
                # 0 first: the padded grid of the configs written before the parameter
                Param("X_UNROLLED", (0, 1), "X staged unrolled (a row per filter tap over the N*P*Q output "
                      "positions: no grid, more staging) instead of on the padded grid"),
                # 0 first: dY staged on the grid, as configs written before the parameter
                Param("DY_IN_PLACE", (0, 1), "dY read where it lies instead of staged on the padded grid (each "
                      "image's tiles, tf32, Q a multiple of 4; with a bias, db by a kernel of its own)"),
                # 0 first: X staged, as configs written before the parameter; only where it can apply
                *([Param("X_IN_PLACE", (0, 1), "X read where it lies instead of staged (a 1x1 stride-1 layer "
                         "without padding: each image's tiles, tf32, W a multiple of 4)")]
                  if x_in_place_fits(problem) else [])]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p = problem
        grid = PaddedGrid.of(p)

        def stride(image_tiles, x_unrolled):
            return None if tuple(p.stride) == (1, 1) or image_tiles or x_unrolled else (
                f"a strided weight gradient ({p.stride}) on wgmma needs IMAGE_TILES=1 (its staging lays X on "
                "the grid by stride phases) or X_UNROLLED=1")

        def one_tiling(image_tiles, x_unrolled):
            return None if not (image_tiles and x_unrolled) else (
                "X_UNROLLED=1 has no padded grid to tile by images: it takes IMAGE_TILES=0")

        def unrolled_rows(x_unrolled):
            # the unrolled X's staging runs a row of blocks per filter tap
            crs = p.C * p.R * p.S
            return None if not x_unrolled or crs <= 65535 else (
                f"X_UNROLLED=1 stages C*R*S = {crs} rows, a grid row each (at most 65535)")

        def enough_tiles(splitk, image_tiles, x_unrolled):
            tiles = unrolled_length(p) // BK if x_unrolled else grid.tiles(p, image_tiles)
            return None if splitk <= tiles else (
                f"SPLITK={splitk} exceeds the reduction: only {tiles} reduction tiles of {BK}")

        def in_place(dy_in_place, image_tiles, x_unrolled):
            if not dy_in_place:
                return None
            why = [w for w, bad in (
                ("IMAGE_TILES=1 (the padded grid, tiled by images)", not image_tiles or x_unrolled),
                ("tf32 (3xTF32 stages dY's TF32 parts)", split(p)),
                (f"Q a multiple of 4 (16-byte chunks of dY's rows), not {p.Q}", p.Q % 4)) if bad]
            return None if not why else "DY_IN_PLACE=1 needs " + "; ".join(why)

        def x_in_place(on, image_tiles, x_unrolled):
            # the image is the grid only when its tiles run per image (x_in_place_fits holds the rest)
            return None if not on or (image_tiles and not x_unrolled) else (
                "X_IN_PLACE=1 reads each image's tiles where they lie: it needs IMAGE_TILES=1 and X_UNROLLED=0")

        return [*super().constraints(p, limits), Constraint(("IMAGE_TILES", "X_UNROLLED"), stride),
                Constraint(("DY_IN_PLACE", "IMAGE_TILES", "X_UNROLLED"), in_place),
                *([Constraint(("X_IN_PLACE", "IMAGE_TILES", "X_UNROLLED"), x_in_place)]
                  if x_in_place_fits(p) else []),
                Constraint(("IMAGE_TILES", "X_UNROLLED"), one_tiling), Constraint(("X_UNROLLED",), unrolled_rows),
                Constraint(("SPLITK", "IMAGE_TILES", "X_UNROLLED"), enough_tiles)]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        # Enough splits for about two blocks per SM of an H100 over the output tiles. X unrolled first
        # where it pays (its copy small enough), the padded grid after (a lower workspace limit).
        p, out = problem, []
        image_tiles = int(image_tiles_pay(p))
        tilings = [(0, 1, unrolled_length(p) // BK)] if unrolled_pays(p) else []
        tilings.append((image_tiles, 0, PaddedGrid.of(p).tiles(p, image_tiles)))
        for image_tiles, x_unrolled, tiles in tilings:
            for cand in super().default_candidates(problem):
                blocks = cdiv(p.K, 64 * cand["WGS"]) * cdiv(p.C * p.R * p.S, cand["WBN"])
                want = max(1, min(tiles, 264 // blocks))
                out.append({**cand, "SPLITK": max([s for s in WGRAD_SPLITS if s <= want], default=1),
                            "IMAGE_TILES": image_tiles, "X_UNROLLED": x_unrolled, "DY_IN_PLACE": 0})
        # Last, dY read in place, where staging it would not fit the workspace (ResNet-18's first layer)
        out += [{**c, "DY_IN_PLACE": 1} for c in out if c["IMAGE_TILES"] and not c["X_UNROLLED"]]
        if not x_in_place_fits(p):
            return out
        # A pointwise layer: then both operands where they lie, each image's tiles (no copies at all).
        out = [{**c, "X_IN_PLACE": 0} for c in out]
        tiles = PaddedGrid.of(p).tiles(p, 1)
        grid = [c for c in out if not c["X_UNROLLED"] and not c["DY_IN_PLACE"]]
        return out + [{**c, "IMAGE_TILES": 1, "DY_IN_PLACE": 1, "X_IN_PLACE": 1, "SPLITK": min(c["SPLITK"], tiles)}
                      for c in grid]

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        g = PaddedGrid.of(problem)
        return {"BK": BK, "ALIGN_SLACK": ALIGN_SLACK, "SPLIT": split(problem), "wgmma_namespace": NAMESPACE,
                "HP": g.HP, "WP": g.WP, "LC": g.LC,
                "XCOPIES": g.XCOPIES, "DY_IMAGES": dy_images(problem), "TPI": g.TPI, "OH": g.OH, "OW": g.OW,
                "PHASES": g.PHASES, "LJ": unrolled_length(problem), "X_IN_PLACE": config.get("X_IN_PLACE", 0)}

    def launches(self, problem: Any, config: Config) -> tuple[Launch, ...]:
        p, c = problem, config
        threads = (128 * c["WGS"], 1, 1)
        grid = (cdiv(p.K, 64 * c["WGS"]), cdiv(p.C * p.R * p.S, c["WBN"]), c["SPLITK"])
        x_in_place = c.get("X_IN_PLACE", 0)
        # the GEMM reads dY itself, and X
        args = ("dy" if c["DY_IN_PLACE"] else "dyp", "x" if x_in_place else "xs", "dw")
        main = Launch("conv_wgrad", grid, threads, smem_bytes(c["WGS"], c["WBN"], c["WSTAGES"], split(p)), args)
        return (*wgrad_stage_launches(p, threads, c["IMAGE_TILES"], c["X_UNROLLED"], c["DY_IN_PLACE"], x_in_place),
                main)

    def buffers(self, problem: Any, config: Config) -> Buffers:
        zero = (("dw",) if config["SPLITK"] > 1 else ()) + (("db",) if problem.bias else ())
        return zero, self.workspaces(problem, config["X_UNROLLED"], config["DY_IN_PLACE"], config.get("X_IN_PLACE", 0))

    def code_helpers(self) -> tuple:
        return (smem_bytes, split, PaddedGrid, dy_images, wgrad_stage_launches, wgrad_stage_workspaces, WGRAD_SPLITS, BK,
                ALIGN_SLACK, ARCH, self.ARGS, image_tiles_pay, unrolled_length, unrolled_pays, UNROLLED_DEFAULT_BYTES,
                x_in_place_fits)


WGMMA = Formulation(FORMULATION_WGMMA, (WgmmaConvFwd(), WgmmaConvBwdData(), WgmmaConvWgrad()))
