"""The wgmma GEMM fed by Hopper's Tensor Memory Accelerator ("tma"): conv_bwd_data (stride 1).

The wgmma formulation's main loop is bound by its copies, not by the tensor cores: on modern_56's
fp32 backward-data (H200) the tensor pipe is busy 54% of the loop, and every thread spends the
rest computing gather addresses, issuing 16-byte cp.async copies, waiting for them and meeting the
block at a barrier before each tile's wgmmas. Here one thread of a producer warp requests each
reduction tile's operands whole, as boxes of the staged copies that land 128-byte swizzled, the
layout the wgmma descriptors read. The copies complete on a stage's mbarrier; the consumer
warpgroups wait on it, multiply, and release the stage to the producer through a second mbarrier,
so no warp waits at a block barrier and the producer runs WSTAGES - 1 tiles ahead. The tensor maps
the copies read are encoded by the driver when the plan runs (kernels/tensor_maps.py) and passed
by value.

The reduction runs by chunks of 32 of dY's channels (the last one zero-filled past K), each chunk
over every filter tap (r, s); W's tile of a tap is one tiled box of the staged CRSK copy. dY's tile
(A_TILES):

- ``im2col``: one im2col box of the NHWC copy (the wgmma formulation's staging) a tap: BM
  consecutive output positions, the chunk's channels from each position's window at the tap's
  offset; positions whose window leaves the image land as zeros, so the padding costs nothing. The
  measured first version: modern_56's fp32 GEMM 166 -> 156 us, tf32 98 -> 87 (H200). Both
  precisions then moved about 8 TB/s from L2 into shared memory, 9 copies of each dY value (one a
  tap) and the weights, with the tensor cores about 38% busy: the halo was made to halve the copies.
- ``halo``: dY staged once more on a zero-padded grid of (H + R - 1) x (W + S - 1) positions per
  image whose positions are the GEMM's rows (the halo formulation's geometry): on the grid each tap
  is a constant shift, (R-1-r) rows and (S-1-s) columns. A block copies the positions all its taps
  read, BM + (R-1) x grid width + S-1 of them, once a chunk (one to a few tiled boxes of at most
  256 rows) into one of ASLOTS halo slots, and each tap's A tile starts at its shift's row through
  the same descriptor (the swizzle is a function of the address). dY then crosses L2 about twice
  instead of nine times; grid positions past the outputs are computed and dropped (modern_56: 3,364
  a 56 x 56 image). The GEMM was only 5-10% faster for it (fp32 141 us, tf32 85): L2 was not the
  bound. With 64 columns each m64n64k8 wgmma reads 4 KB of operands from shared memory in its 32
  tensor-core cycles, all the bandwidth shared memory has, and the copies write into it too.

The precisions are the wgmma formulation's (tf32: the tensor cores truncate; fp32: 3xTF32 from
staged parts, each tile's partial sums added to the totals in FP32, CROSS the cross products as
one BF16 wgmma), as are the block's tile (WGS warpgroups of 64 rows by WBN columns, BK = 32 floats
a stage row) and the W staging.

dY's staging (STAGE_PIXELS): blocks of 128 or 64 pixels x 32 channels through shared memory, read
in float4s and written by 8 threads a pixel, 16 bytes each, so that a store instruction fills
whole 32-byte sectors (both tilings; 47-48 us for modern_56's fp32 dY on an H200 since the halo
grid's border is zeroed first and a float4 a thread, 57-61 before, 108-152 with a first version's
two 16-byte stores of one thread to each sector); or 0, the wgmma formulation's staging
(im2col only, 48.5 us there), with its STAGE_LAUNCHES and STAGE_PLANES.

INFLIGHT: tf32 leaves one group of wgmmas in flight and releases its stage a tile later. fp32 adds
each tile's partial sums to the totals once its wgmmas completed, so INFLIGHT 0 waits for every
tile and the tensor cores run dry between tiles; INFLIGHT 1 runs the tiles in pairs (the wgmma
formulation's pipelined loop), the first's group in flight while the second's is issued, then
adds both, the same sums in the same order: once every two tiles (with a halo, pairs within a
chunk, so that one slot serves: 5 waits a chunk of 9 taps instead of 9). The pair's three sets of
accumulators (totals and two partial sums) limit WBN by WGS (192 registers a thread over WGS); up
to 64 columns in at most two warpgroups the kernel is held to 112 registers a thread (__maxnreg__:
ptxas took 113 for modern_56's record's block, which left one block an SM instead of two).
They verify and lose on the H200: modern_56's GEMM 172.4 us in pairs against 142.4 a tile at a
time (MEASUREMENTS.md, the tma section), and the tuner keeps INFLIGHT 0 there.

PDL: the GEMM launched as a programmatic dependent of the staging (cuLaunchKernelEx with
programmatic stream serialization). The staging's blocks (STAGE_PIXELS > 0) let it launch as soon
as each of them has started (griddepcontrol.launch_dependents), so the GEMM's blocks take the SMs
the staging's last wave leaves and set up their barriers meanwhile; only the producer thread reads
what the staging wrote (through its copies), and it waits for the whole staging to complete and its
writes to be visible (griddepcontrol.wait) before the first one. The consumers read only shared
memory the copies filled, and write dX, which nothing before them in the stream still touches: the
GEMM starts only once every staging block has, and those only once the kernels before them ended.
It saves the gap between the two kernels, about 1 us on an H200 (MEASUREMENTS.md, the tma section).

GROUP_TILES (INFLIGHT 0): a warpgroup issues the wgmmas of up to 2 or 3 tiles as one group, each
tile's once its stage arrived, before it waits for them (with a halo, within a chunk, as the pairs;
a group holds a stage a tile, so WSTAGES >= GROUP_TILES). fp32 puts a group's products into one set
of partial sums, added to the totals in FP32 once a group: the tensor cores then add up to 96 terms
without round-to-nearest instead of 32, and every config is verified against the same FP32 bound.
The warpgroup waits once a group instead of once a tile, with the registers of INFLIGHT 0. ncu on
modern_56's fp32 record (H200) had the tensor pipe busy 51% of the GEMM, the consumers' most
sampled stall their wait for a tile's wgmmas (20% of samples) and the next its stage (13%); in
groups of 3 its plan took 175.8 us against 183.7-185.0 (MEASUREMENTS.md, the tma section).

TRANSPOSED blocks (W's 64 channels each wgmma's A, 128-256 of dY's positions its B: fewer shared
memory reads a multiply-add) were measured and dropped: with one warpgroup's
accumulators as wide as that, a block of one warpgroup and the producer left 1-3 warpgroups an SM,
and the GEMM took 103-130 us in tf32 against 75 (MEASUREMENTS.md).

Parameters: WGS, WBN, WSTAGES (W's stages, and im2col's dY tiles), INFLIGHT, GROUP_TILES, A_TILES,
ASLOTS (halo), STAGE_PIXELS, STAGE_LAUNCHES and STAGE_PLANES, PDL, CROSS (fp32).
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation
from autocnn.kernels.formulations.cores.staging import (bwd_data_stage_launches, bwd_data_stage_workspaces,
                                                        stage_w_blocks)
from autocnn.kernels.formulations.cores.wgmma_gemm import (ALIGN_SLACK, BK, TMA_PRODUCER_THREADS, WgmmaGemm,
                                                           block_rules, split)
from autocnn.kernels.formulations.cores.wgmma_split_output import WgmmaConvBwdData
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.rules import smem_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch
from autocnn.kernels.tensor_maps import MAX_BOX, TensorMap
from autocnn.precision import FLOAT32

FORMULATION_TMA = "tma"
ROW_BYTES = FLOAT32.size * BK   # a staged row of a tile in shared memory: 32 TF32 operands, one swizzle row
BARRIER_BYTES = 8           # an mbarrier; the kernel keeps 2 a stage and 1 a halo slot (static)


def im2col_window(problem: Any) -> tuple[int, int]:
    """(DH, DW): how far the im2col window of an output position starts before it in dY. Output row
    h reads dY's rows h + PT - r for filter rows r, so its window (offsets i = R-1-r) starts at
    h - (R - 1 - PT); problems keep the padding below the filter's extent, so DH, DW >= 0. On the
    halo grid dY's (y, x) sits at (y + DH, x + DW)."""
    p = problem
    return p.R - 1 - p.padding[0], p.S - 1 - p.padding[1]


def grid_shape(problem: Any) -> tuple[int, int]:
    """(HP, WP): the halo grid's rows and columns per image. Output (h, w) is grid position (h, w);
    tap (r, s) reads grid position (h + R-1-r, w + S-1-s), so the grid runs R - 1 rows and S - 1
    columns past the outputs (it then holds dY, whose last row lands on grid row P - 1 + DH)."""
    p = problem
    return p.H + p.R - 1, p.W + p.S - 1


def halo_boxes(problem: Any, wgs: int) -> tuple[int, int]:
    """(boxes, rows): the halo of a block of 64 * WGS grid rows, BM + (R-1) * WP + S - 1 positions,
    as that many tiled boxes of that many rows each (at most 256, a multiple of 8 so that each box
    starts on a 1024-byte swizzle atom)."""
    p = problem
    _, wp = grid_shape(p)
    halo = 64 * wgs + (p.R - 1) * wp + p.S - 1
    boxes = cdiv(halo, MAX_BOX)
    return boxes, 8 * cdiv(cdiv(halo, boxes), 8)


def workspaces(problem: Any, a_tiles: str) -> tuple[tuple[str, int], ...]:
    """The staged copies (float32 elements): dY as NHWC (im2col) or on the halo grid, W as CRSK,
    twice each with 3xTF32 (the small parts follow)."""
    if a_tiles == "im2col":
        return bwd_data_stage_workspaces(problem)
    p, parts = problem, 2 if split(problem) else 1
    hp, wp = grid_shape(p)
    return ("dyt", parts * p.N * hp * wp * p.K), ("wt", parts * p.K * p.C * p.R * p.S)


def tensor_maps(problem: Any, wgs: int, wbn: int, a_tiles: str) -> tuple[TensorMap, ...]:
    """The GEMM's maps, in the kernel's parameter order: dY's (im2col: over the NHWC copy, dims K,
    Q, P, N, a request BM positions of 32 channels, the bounding box running the window starts of
    every output position, from -DW to W - 1 - DW along W, likewise along H, relative to dY's first
    and last positions; halo: over the grid as K x positions, a box of 32 channels of the halo's
    rows) and W's (the CRSK copy as K, R*S, C; a box 32 channels of one tap for WBN input
    channels); with 3xTF32 the same over the small parts."""
    p = problem
    if a_tiles == "im2col":
        dh, dw = im2col_window(p)
        dy_dims, box = (p.K, p.Q, p.P, p.N), (BK, 64 * wgs)
        corners = {"lower": (-dw, -dh), "upper": (p.W - dw - p.Q, p.H - dh - p.P)}
    else:
        hp, wp = grid_shape(p)
        dy_dims, box, corners = (p.K, p.N * hp * wp), (BK, halo_boxes(p, wgs)[1]), {}
    w_dims = (p.K, p.R * p.S, p.C)
    maps = (TensorMap("dyt", 0, dy_dims, box, **corners), TensorMap("wt", 0, w_dims, (BK, 1, wbn)))
    if not split(p):
        return maps
    sizes = dict(workspaces(p, a_tiles))
    return (*maps, TensorMap("dyt", sizes["dyt"] // 2, dy_dims, box, **corners),
            TensorMap("wt", sizes["wt"] // 2, w_dims, (BK, 1, wbn)))


def smem_bytes(problem: Any, wgs: int, wbn: int, stages: int, a_tiles: str, aslots: int = 1) -> int:
    """Dynamic shared memory a block: dY's buffers (WSTAGES tiles of BM rows, or ASLOTS halos) and
    W's WSTAGES tiles, twice with 3xTF32, and the slack that aligns them to 1024 bytes."""
    parts = 2 if split(problem) else 1
    a_rows = stages * 64 * wgs if a_tiles == "im2col" else aslots * halo_boxes(problem, wgs)[0] * \
        halo_boxes(problem, wgs)[1]
    return parts * ROW_BYTES * (a_rows + stages * wbn) + ALIGN_SLACK


def barrier_bytes(stages: int, aslots: int = 0) -> int:
    """The kernel's static shared memory: a stage's arrival and release barriers, a slot's release."""
    return BARRIER_BYTES * (2 * stages + aslots)


def register_cap(problem: Any, config: Config) -> int:
    """The registers a thread the main kernel is held to (__maxnreg__), or 0 for ptxas's choice
    under __launch_bounds__. fp32's pairs of up to 64 columns in at most two warpgroups: left to
    itself, ptxas gave the pair's three sets of accumulators 113 registers a thread (modern_56's
    record's block of 288 threads: 120 a thread as allocated, 9 warps a block, one block an SM);
    112 take two blocks, which shared memory allows there, without spilling. (__launch_bounds__
    asking for two blocks had ptxas cap them at 96, and spill; it does not combine with
    __maxnreg__.)"""
    pairs = split(problem) and config["INFLIGHT"] and config["WBN"] <= 64 and config["WGS"] <= 2
    return 112 if pairs else 0


class TmaConvBwdData(WgmmaConvBwdData):
    """conv_bwd_data (stride 1) as one GEMM of input pixels (or halo-grid positions) by input
    channels over the staged dY and W, its tiles copied by TMA for a producer warp and multiplied
    by wgmma warpgroups."""

    formulation = FORMULATION_TMA
    summary = "Hopper warpgroup tensor-core implicit GEMM fed by TMA copies (stride 1; sm_90a; fp32 as 3xTF32)"
    templates = ("tma_conv_bwd_data.cu.j2", "wgmma_core.cuh.j2", "_wgmma_ops.cuh.j2", "wgmma_mainloop.cuh.j2",
                 "gemm_operands_conv_bwd_data.cuh.j2", "_bwd_data_operands.cuh.j2", "_operand_access.cuh.j2",
                 "wgmma_stage_conv_bwd_data.cuh.j2", "_tma_ops.cuh.j2", "_conv_groups.cuh.j2")
    ARGS = ("dx",)

    def workspace_params(self, problem: Any) -> tuple[str, ...]:
        return ("A_TILES",)

    def workspaces(self, problem: Any, a_tiles: str = "im2col", *_: Any) -> tuple[tuple[str, int], ...]:
        return workspaces(problem, a_tiles)

    def params(self, problem: Any) -> list[Param]:
        return [*WgmmaGemm.params(self, problem),
                Param("A_TILES", ("halo", "im2col"), "dY's tiles: a halo of the block's positions on a zero-padded "
                      "grid a chunk of channels, each tap a shift of it; or an im2col box a tap"),
                Param("ASLOTS", (1, 2), "halo buffers (2: the next chunk's halo lands while this one's taps run)",
                      active_if=(("A_TILES", ("halo",)),)),
                # 0 last: the wgmma formulation's staging kernels (im2col only)
                Param("STAGE_PIXELS", (128, 64, 0), "dY's pixels a staging block moves for 32 channels, through shared "
                      "memory with float4 reads and a pixel's 8 channels a thread written as 16-byte stores, beside "
                      "W's gather in one launch (0: the wgmma formulation's staging, im2col only)"),
                Param("STAGE_LAUNCHES", (1, 2), "launches staging the operands: both in one kernel, or dY's transpose "
                      "then W's gather (with STAGE_PIXELS=0)"),
                Param("STAGE_PLANES", (0, 1), "the staging in one launch moves whole planes of 32 channels and "
                      "whole weight slices through shared memory (0: 32 x 32 tiles; with STAGE_PIXELS=0)"),
                Param("PDL", (0, 1), "the GEMM a programmatic dependent launch: it starts while the staging's "
                      "last blocks run, and its producer waits for the staging (griddepcontrol) before the first "
                      "copy (0: launched after it)"),
                # 1 first: the loop of the configs written before the parameter
                Param("GROUP_TILES", (1, 2, 3), "tiles whose wgmmas a warpgroup issues as one group before it "
                      "waits for them (with a halo, within a chunk; fp32: into one set of partial sums, added to the "
                      "totals in FP32 once a group)", active_if=(("INFLIGHT", (0,)),)),
                *([Param("CROSS", (1, 0), "3xTF32's cross products big x small + small x big as one BF16 wgmma of "
                         "depth 16 a k-step (0: two TF32 wgmmas)")] if split(problem) else [])]

    def block_constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        return block_rules(limits, split(problem), tma=True)

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p = problem

        def stride(_):
            return None if tuple(p.stride) == (1, 1) else (
                f"the tma backward-data reads dY's windows as shifts of one grid: stride 1 only, not {tuple(p.stride)}")

        def maps(wgs, wbn, a_tiles):
            # what the driver would refuse in the copies' tensor maps (corners, alignment, box sizes)
            bad = [msg for spec in tensor_maps(p, wgs, wbn, a_tiles) for msg in spec.problems()]
            return None if not bad else "the TMA tensor maps: " + "; ".join(dict.fromkeys(bad))

        def paired_registers(on, wgs, wbn):
            # 3xTF32 in pairs holds the totals and two tiles' partial sums, 3 * WBN / 2 registers a
            # thread. ptxas (13.0, sm_90a) fits them without spilling up to 192 with one warpgroup, 96
            # with two and 48 with four (WBN 128, 64 and 32), and spills at the next width of each.
            acc = 3 * wbn // 2
            return None if not on or not split(p) or acc <= 192 // wgs else (
                f"INFLIGHT=1 with 3xTF32 runs the tiles in pairs and holds the totals and two tiles' partial sums, "
                f"{acc} registers a thread with WBN={wbn}: at most {192 // wgs} with WGS={wgs}")

        def group_stages(tiles, stages):
            # a group's tiles all wait in their stages until it completed
            return None if tiles <= stages else (
                f"GROUP_TILES={tiles} holds {tiles} stages until its wgmmas complete: it needs WSTAGES >= {tiles}, "
                f"not {stages}")

        def slot_in_flight(on, slots):
            # tf32 releases a chunk's last tile only after the next tile's wgmmas were issued, and that
            # tile, the next chunk's first, needs the slot: with one, the producer would wait for a
            # release the consumers make after that tile (fp32's pairs stay within a chunk; tests/
            # test_tma.py models the hand-over)
            return None if not on or slots > 1 or split(p) else (
                "INFLIGHT=1 (tf32) with A_TILES=halo needs ASLOTS=2: a chunk's last tile still holds its halo when "
                "the next chunk's first tile needs the slot")

        def staging(a_tiles, pixels, launches, planes):
            if not pixels:
                return None if a_tiles == "im2col" else (
                    "A_TILES=halo stages dY on its grid by blocks of pixels: it needs STAGE_PIXELS > 0")
            return None if (launches, planes) == (1, 0) else (
                f"STAGE_PIXELS={pixels} stages both operands in one launch of its own: it takes STAGE_LAUNCHES=1 "
                f"and STAGE_PLANES=0, not {launches} and {planes}")

        def im2col_smem(wgs, wbn, stages, a_tiles):
            return smem_bytes(p, wgs, wbn, stages, a_tiles) + barrier_bytes(stages) if a_tiles == "im2col" else 0

        return [*WgmmaGemm.constraints(self, p, limits),
                Constraint(("WGS",), stride), Constraint(("WGS", "WBN", "A_TILES"), maps),
                Constraint(("INFLIGHT", "WGS", "WBN"), paired_registers),
                Constraint(("INFLIGHT", "ASLOTS"), slot_in_flight),
                Constraint(("GROUP_TILES", "WSTAGES"), group_stages),
                Constraint(("A_TILES", "STAGE_PIXELS", "STAGE_LAUNCHES", "STAGE_PLANES"), staging),
                smem_rule(limits, ("WGS", "WBN", "WSTAGES", "A_TILES"), im2col_smem),
                smem_rule(limits, ("WGS", "WBN", "WSTAGES", "ASLOTS"), lambda wgs, wbn, stages, aslots:
                          smem_bytes(p, wgs, wbn, stages, "halo", aslots) + barrier_bytes(stages, aslots)),
                Constraint(("STAGE_PLANES", "STAGE_LAUNCHES"), lambda on, launches: self.planes_problem(p, on, launches)),
                *([Constraint(("CROSS",), lambda on: self.cross_problem(p, on))] if split(p) else [])]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        p = problem
        fp32 = {"CROSS": int(p.K % 8 == 0)} if split(p) else {}
        narrow = min(64, max(16, 1 << (p.C - 1).bit_length()))
        base = {"formulation": FORMULATION_TMA, "INFLIGHT": 0, "STAGE_PIXELS": 128, "STAGE_LAUNCHES": 1,
                "STAGE_PLANES": 0, "PDL": 0, "GROUP_TILES": 1, **fp32}
        halo, im2col = {**base, "A_TILES": "halo"}, {**base, "A_TILES": "im2col"}
        return [{**halo, "WGS": 2, "WBN": narrow, "WSTAGES": 3, "ASLOTS": 1},
                {**im2col, "WGS": 2, "WBN": narrow, "WSTAGES": 2},
                {**halo, "WGS": 1, "WBN": narrow, "WSTAGES": 3, "ASLOTS": 1},
                {**im2col, "WGS": 1, "WBN": narrow, "WSTAGES": 2}]

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        p, c = problem, config
        dh, dw = im2col_window(p)
        hp, wp = grid_shape(p)
        boxes, box_rows = halo_boxes(p, c["WGS"])
        return {**super().context(p, c), "TMA": 1, "DH": dh, "DW": dw, "HP": hp, "WP": wp, "HALO_BOXES": boxes,
                "HALO_BOX_ROWS": box_rows, "A_TILES": c["A_TILES"], "ASLOTS": c.get("ASLOTS", 1),
                "A_SMALL_FLOATS": dict(workspaces(p, c["A_TILES"]))["dyt"] // 2, "REGISTER_CAP": register_cap(p, c),
                "GROUP_TILES": c.get("GROUP_TILES", 1)}

    def launches(self, problem: Any, config: Config) -> tuple[Launch, ...]:
        p, c = problem, config
        threads = (128 * c["WGS"], 1, 1)
        a_tiles, pixels = c["A_TILES"], c["STAGE_PIXELS"]
        hp, wp = grid_shape(p)
        rows = p.N * p.H * p.W if a_tiles == "im2col" else p.N * hp * wp
        if pixels:
            # W's gather, dY's blocks of pixels, and (halo) a block an image zeroing the grid around dY
            blocks = stage_w_blocks(p, threads) + p.N * cdiv(p.K, BK) * cdiv(p.P * p.Q, pixels) + \
                (p.N if a_tiles == "halo" else 0)
            staging = (Launch("conv_bwd_data_stage", (blocks, 1, 1), threads, 0, ("dy", "w", "dyt", "wt")),)
        else:
            staging = bwd_data_stage_launches(p, threads, c["STAGE_LAUNCHES"], self.planes_smem(p, c))
        main = Launch("conv_bwd_data", (cdiv(rows, 64 * c["WGS"]), cdiv(p.C, c["WBN"]), 1),
                      (128 * c["WGS"] + TMA_PRODUCER_THREADS, 1, 1),
                      smem_bytes(p, c["WGS"], c["WBN"], c["WSTAGES"], a_tiles, c.get("ASLOTS", 1)),
                      self.ARGS, tensor_maps=tensor_maps(p, c["WGS"], c["WBN"], a_tiles), programmatic=bool(c["PDL"]))
        return (*staging, main)

    def buffers(self, problem: Any, config: Config) -> Buffers:
        return (), workspaces(problem, config["A_TILES"])

    def code_helpers(self) -> tuple:
        return (*super().code_helpers(), im2col_window, grid_shape, halo_boxes, workspaces, tensor_maps, smem_bytes,
                barrier_bytes, TensorMap, TMA_PRODUCER_THREADS, ROW_BYTES, BARRIER_BYTES, MAX_BOX)


TMA = Formulation(FORMULATION_TMA, (TmaConvBwdData(),))
