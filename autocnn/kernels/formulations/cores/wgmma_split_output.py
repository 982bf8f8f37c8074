"""The wgmma GEMMs of conv_fwd and conv_bwd_data, whose reduction may be split into the output
(SplitOutputGemm: SPLITK shares or a stream-K schedule adding partial sums by atomics, the staging's
launches, fp32's A_REGS and CROSS), and conv_bwd_data's GEMM per stride phase (WgmmaConvBwdData),
which the wgmma formulation runs and the tma formulation builds on (its tiles copied by TMA). The
wgmma formulation's docstring says why and what they measured.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers
from autocnn.kernels.formulations.cores.staging import (PLANE_CHANNELS, PLANE_SMEM_LIMIT, bwd_data_stage_launches,
                                                        bwd_data_stage_workspaces, plane_stage_smem, stage_w_blocks)
from autocnn.kernels.formulations.cores.wgmma_gemm import ALIGN_SLACK, ARCH, BK, WgmmaGemm, smem_bytes, split
from autocnn.kernels.geometry import cdiv, stride_phases
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch

NAMESPACE = "wg"    # wgmma_core.cuh.j2's namespace in these kernels (winograd's products name their own)


# conv_fwd's and conv_bwd_data's splits of the reduction; 1 first: the code of configs written before
# the parameter.
OUTPUT_SPLITS = (1, 2, 4)

# The stream-K schedule's block counts (SK_BLOCKS): 1, 2 and 3 blocks an SM on GPUs of 132 SMs (H100
# SXM, H200) and of 114 (H100 PCIe); the constraints keep the device's own multiples. 0 first: a
# block per output tile (and SPLITK share), the code of configs written before the parameter.
STREAM_K_BLOCKS = (0, 114, 132, 228, 264, 342, 396)


class SplitOutputGemm(WgmmaGemm):
    """conv_fwd's and conv_bwd_data's GEMMs, whose reduction may be split over SPLITK blocks per output
    tile that add into the zeroed output by atomics: a layer with few output pixels leaves SMs idle
    otherwise (ResNet-18's 7x7 layers at batch 64: 3,136 rows, 100 blocks of 128 x 128 for an H100's
    132 SMs).

    Both take STAGE_LAUNCHES (the staging in two kernels or one) and, in fp32, A_REGS: operand A (X,
    or dY) staged once, in FP32, the tensor cores reading its truncated TF32 part and each thread
    forming the TF32 parts of its fragments' remainders in registers (wgmma with A from registers),
    so that A's small parts are neither written by the staging kernel nor copied into shared memory
    (for modern_56's backward-data: 51 of the staging's 154 MB, and half the main loop's A copies);
    B stays split in global memory. The wgmma formulation's docstring has their figures.

    SK_BLOCKS > 0 schedules the GEMM stream-K: that many blocks (a multiple of the GPU's SMs) each
    take an equal, contiguous run of the (output tile, reduction tile) pairs, tile by tile, and add
    every tile's partial sums into the zeroed output by atomics. A grid of one block per tile leaves
    SMs idle in its last wave: modern_14's tf32 forward (128 x 256 tiles, one block an SM) has 98
    tiles for 132 SMs.

    STAGE_PLANES=1 (with STAGE_LAUNCHES=1) stages by whole planes: a block per image and 32 of the
    input's channels, one contiguous run read in 16-byte chunks through shared memory and written a
    pixel's channels together, and a block per slice of W. A small image's 32 x 32 tiles read rows
    that start anywhere in a 128-byte line and last tiles mostly past the plane (modern_14's tf32
    staging on an H200: 14.2 -> 11.5 us).

    CROSS=1 (fp32) takes the two cross products of 3xTF32 as one BF16 wgmma over runs of BF16 values
    and remainders staged in the small parts' place (the wgmma formulation's docstring says how and
    what it costs in accuracy)."""

    output = ""   # the buffer the split blocks add into

    def workspace_params(self, problem: Any) -> tuple[str, ...]:
        return ("A_REGS",) if split(problem) else ()

    def reduction_tiles(self, problem: Any) -> int:   # BK tiles of the longest reduction of one launch
        raise NotImplementedError

    def params(self, problem: Any) -> list[Param]:
        # A_REGS only where there is a split to place (fp32); 0 first: A's small parts staged, the code
        # of configs written before the parameter
        a_regs = [Param("A_REGS", (0, 1), "operand A staged in FP32, its remainders' TF32 parts formed in "
                        "registers")] if split(problem) else []
        return [*super().params(problem),
                Param("SPLITK", OUTPUT_SPLITS, "blocks splitting each output tile's reduction (partial sums meet by "
                      "atomics in the zeroed output)"),
                *a_regs,
                # 2 first: the staging kernels of configs written before the parameter
                Param("STAGE_LAUNCHES", (2, 1), "launches staging the operands: A's transpose then W's gather, or "
                      "both in one kernel"),
                # 0 first: the staging kernels of configs written before the parameter
                Param("STAGE_PLANES", (0, 1), "the staging in one launch moves whole planes of 32 channels and "
                      "whole weight slices through shared memory, 16-byte loads and stores (0: 32 x 32 tiles)"),
                Param("SK_BLOCKS", STREAM_K_BLOCKS, "blocks of a stream-K schedule sharing out every output tile's "
                      "reduction tiles evenly (partial sums meet by atomics in the zeroed output; 0: a block a tile)"),
                # 0 first: the two TF32 cross products, the code of configs written before the parameter
                *([Param("CROSS", (0, 1), "3xTF32's cross products big x small + small x big as one BF16 wgmma of "
                         "depth 16 a k-step (0: two TF32 wgmmas)")] if split(problem) else [])]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p, tiles = problem, self.reduction_tiles(problem)
        activation = getattr(p, "activation", "none")

        def enough_tiles(splitk):
            return None if splitk <= tiles else f"SPLITK={splitk} exceeds the reduction: only {tiles} tiles of {BK}"

        def linear(splitk):
            return None if splitk == 1 or activation == "none" else (
                f"SPLITK={splitk} adds partial sums into the output, so the fused activation ({activation}) cannot "
                "be applied: split only layers without one")

        def registers_split(a_regs, inflight, wbn):
            if not a_regs:
                return None
            if inflight:
                return ("A_REGS=1 needs INFLIGHT=0: a group of wgmmas in flight would hold a second tile's A "
                        "fragments in registers")
            # the kernel is held to 128 registers a thread (two blocks of 2 warpgroups an SM): the totals
            # and partial sums (WBN) and A's 16 remainders fit beside the addresses up to 64 columns
            # (126 registers, no spill)
            return None if wbn <= 64 else (
                f"A_REGS=1 with WBN={wbn} holds {wbn + 16} totals, partial sums and A fragments a thread "
                "(the kernel is held to 128 registers: at most 64 columns)")

        def stream_k(blocks, splitk, wgs, wbn):
            if not blocks:
                return None
            sms = limits.sm_count
            if blocks % sms or blocks > 3 * sms:
                return (f"SK_BLOCKS={blocks} is not 1, 2 or 3 blocks for each of this GPU's {sms} SMs "
                        f"(allowed: 0, {sms}, {2 * sms}, {3 * sms})")
            if splitk != 1:
                return f"SK_BLOCKS={blocks} shares the reduction out itself: it needs SPLITK=1, not {splitk}"
            if activation != "none":
                return (f"SK_BLOCKS={blocks} adds partial sums into the output, so the fused activation "
                        f"({activation}) cannot be applied: only layers without one")
            if self.stride_phase_count(p) > 1:
                return (f"SK_BLOCKS={blocks} schedules one GEMM: this layer has {self.stride_phase_count(p)} "
                        "stride phases")
            work = cdiv(self.gemm_rows(p), 64 * wgs) * cdiv(self.gemm_columns(p)[0], wbn) * tiles
            return None if blocks <= work else (
                f"SK_BLOCKS={blocks} exceeds the {work} (output tile, reduction tile) pairs to share out")

        return [*super().constraints(p, limits), Constraint(("SPLITK",), enough_tiles), Constraint(("SPLITK",), linear),
                *([Constraint(("A_REGS", "INFLIGHT", "WBN"), registers_split),
                   Constraint(("CROSS", "A_REGS"), lambda on, a_regs: self.cross_problem(p, on, a_regs))]
                  if split(p) else []),
                Constraint(("SK_BLOCKS", "SPLITK", "WGS", "WBN"), stream_k),
                Constraint(("STAGE_PLANES", "STAGE_LAUNCHES"), lambda on, launches: self.planes_problem(p, on, launches))]

    def planes_problem(self, problem: Any, on: int, launches: int) -> str | None:
        """What is wrong with STAGE_PLANES=on beside STAGE_LAUNCHES=launches (None: nothing)."""
        if not on:
            return None
        if launches != 1:
            return f"STAGE_PLANES=1 is a way of the staging in one launch: it needs STAGE_LAUNCHES=1, not {launches}"
        need = self.plane_stage_smem(problem)
        return None if need <= PLANE_SMEM_LIMIT else (
            f"STAGE_PLANES=1 needs {need} bytes of shared memory a block for a plane of {PLANE_CHANNELS} "
            f"channels or a slice of W (at most {PLANE_SMEM_LIMIT}: two blocks an SM)")

    def cross_problem(self, problem: Any, on: int, a_regs: int = 0) -> str | None:
        """What is wrong with CROSS=on (beside A_REGS=a_regs) for this problem (None: nothing)."""
        if not on:
            return None
        if a_regs:
            return "CROSS=1 stages A's BF16 runs beside its TF32 parts: it needs A_REGS=0"
        channels, name = self.vector_channels(problem)
        # a k-step's run of 8 values must be 8 channels of one tap in both staged operands
        return None if channels % 8 == 0 else (
            f"CROSS=1 stages runs of 8 channels of one tap: {name} must be a multiple of 8, not {channels}")

    def plane_stage_smem(self, problem: Any) -> int:   # STAGE_PLANES' shared memory a block
        raise NotImplementedError

    def planes_smem(self, problem: Any, config: Config) -> int:
        """The staging's dynamic shared memory a block: STAGE_PLANES' need, or 0 (tiles)."""
        return self.plane_stage_smem(problem) if config["STAGE_PLANES"] else 0

    @staticmethod
    def split_context(config: Config) -> dict[str, Any]:
        """How the templates make fp32's 3xTF32 split (A_REGS, CROSS; 0 where the problem has none)."""
        return {"A_REGS": config.get("A_REGS", 0), "CROSS": config.get("CROSS", 0)}

    def stride_phase_count(self, problem: Any) -> int:   # GEMMs of one launch (conv_bwd_data: one a phase)
        return 1

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        fp32 = {"A_REGS": 0, "CROSS": 0} if split(problem) else {}
        return [{**cand, "SPLITK": 1, **fp32, "STAGE_LAUNCHES": 2, "STAGE_PLANES": 0, "SK_BLOCKS": 0}
                for cand in super().default_candidates(problem)]

    def buffers(self, problem: Any, config: Config) -> Buffers:
        zero, workspaces = super().buffers(problem, config)
        return zero + ((self.output,) if config["SPLITK"] > 1 or config["SK_BLOCKS"] else ()), workspaces

    def gemm_grid(self, problem: Any, config: Config, tiles: tuple[int, int, int]) -> tuple[int, int, int]:
        """The GEMM's grid: a block per output tile and share (``tiles``), or SK_BLOCKS blocks."""
        return (config["SK_BLOCKS"], 1, 1) if config["SK_BLOCKS"] else tiles



class WgmmaConvBwdData(SplitOutputGemm):
    """conv_bwd_data's implicit GEMM per stride phase (rows: the phase's input pixels, columns:
    input channels, reduction: the phase's taps x filters) on wgmma, over dY staged as NHWC and W
    as CRSK so that both operands are contiguous along the reduction (tap, filter)."""

    op = "conv_bwd_data"
    summary = "Hopper warpgroup tensor-core implicit GEMM per stride phase (sm_90a; fp32 as 3xTF32)"
    templates = ("wgmma_conv_bwd_data.cu.j2", "wgmma_core.cuh.j2", "_wgmma_ops.cuh.j2", "wgmma_mainloop.cuh.j2",
                 "gemm_operands_conv_bwd_data.cuh.j2", "_bwd_data_operands.cuh.j2", "_operand_access.cuh.j2",
                 "wgmma_stage_conv_bwd_data.cuh.j2", "_conv_groups.cuh.j2")
    ARGS = ("dyt", "wt", "dx")
    output = "dx"

    def reduction_tiles(self, problem: Any) -> int:
        return max(cdiv(problem.K * ph.Ra * ph.Sb, BK) for ph in stride_phases(problem))

    def gemm_rows(self, problem: Any) -> int:
        return max(problem.N * ph.Ha * ph.Wb for ph in stride_phases(problem))

    def gemm_columns(self, problem: Any) -> tuple[int, str]:
        return problem.C, "input channels"

    def stride_phase_count(self, problem: Any) -> int:
        return len(stride_phases(problem))

    def plane_stage_smem(self, problem: Any) -> int:
        """W's slice a block: one input channel's R*S x K, rows of K padded to odd."""
        p = problem
        return plane_stage_smem(p.P * p.Q, p.R * p.S * (p.K | 1))

    def vector_channels(self, problem: Any) -> tuple[int, str]:
        return problem.K, "K (dY's channels)"

    def workspaces(self, problem: Any, a_regs: int = 0, *_: Any) -> tuple[tuple[str, int], ...]:
        return bwd_data_stage_workspaces(problem, a_regs)

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        return {"NHWC": 1, "BK": BK, "ALIGN_SLACK": ALIGN_SLACK, "SPLIT": split(problem),
                "wgmma_namespace": NAMESPACE, **self.split_context(config),
                "stage_w_blocks": stage_w_blocks(problem, (128 * config["WGS"], 1, 1))}

    def launches(self, problem: Any, config: Config) -> tuple[Launch, ...]:
        p, c = problem, config
        threads = (128 * c["WGS"], 1, 1)
        grid = self.gemm_grid(p, c, (cdiv(self.gemm_rows(p), 64 * c["WGS"]), cdiv(p.C, c["WBN"]),
                                     len(stride_phases(p)) * c["SPLITK"]))
        main = Launch("conv_bwd_data", grid, threads,
                      smem_bytes(c["WGS"], c["WBN"], c["WSTAGES"], split(p), c.get("A_REGS", 0)), self.ARGS)
        return (*bwd_data_stage_launches(p, threads, c["STAGE_LAUNCHES"], self.planes_smem(p, c)), main)

    def code_helpers(self) -> tuple:
        return (smem_bytes, split, bwd_data_stage_launches, stage_w_blocks, bwd_data_stage_workspaces, stride_phases,
                BK, ALIGN_SLACK, ARCH, self.ARGS, OUTPUT_SPLITS, STREAM_K_BLOCKS, plane_stage_smem, PLANE_CHANNELS)
