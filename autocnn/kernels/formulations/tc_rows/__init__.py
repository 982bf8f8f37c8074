"""tc_rows: conv_wgrad on tensor cores over staged rows of dY and the input band under them.

The implicit GEMM ("tc") gathers its B operand X[n][c][p*SH+r-PT][q*SW+s-PL] element by element
for every (c, r, s) column: each input value is fetched R*S times through the gather's index
arithmetic, which, not the mma, bounds it on small layers with long reductions (convnet18's 5x5 on
16x16 images: 73 us against cuDNN's 67 on an H100). This formulation stages, per slab of ROWS
output rows of one image, the dY rows of KB filters and the band of input rows under them for CB
channels (zero-padded, so no bounds checks remain), once, by cp.async, double-buffered; the filter
taps are then shifted reads of the staged band. Each warp runs m16n8k8 mma.sync over its filters x
(channel, tap) columns with the reduction along the slab's output positions (each staged row
padded to a multiple of 8 with zeros, so a k-step never straddles rows). Blocks loop over slabs and
add their sums into dW (and db) with one atomic per output per block: the "rows" formulation's
staging, with the products on tensor cores.

Precision comes from the problem: fp32 is 3xTF32 (each operand split into its TF32 part and the
TF32 part of the remainder; each group of FLUSH k-steps' products summed into the totals in FP32,
as the tc core does, because the tensor cores' accumulation does not round to nearest), tf32 one
product per term, operands rounded to nearest.

Parameters: KB filters and CB channels per block (the block's GEMM is KB x CB*R*S), warps WM x WN,
ROWS output rows per slab, BLOCKS (the grid along the slabs), PAD_X (floats of padding per staged
input row: bank conflicts of the shifted B reads), KUNROLL (k-steps unrolled together), ROUNDING
(operands rounded to TF32 by cvt.rna, or truncated by the tensor cores: fewer instructions, more
error; both must pass their precision's bound), SPLIT_X (each read of the band converted and, in fp32,
split at every one of the R*S taps that read it, or the band converted and split once a slab in
shared memory, the remainders in a buffer of their own beside it). The kernel is
tc_rows_conv_wgrad.cu.j2.

Where it wins: it took every small-image and few-channel weight gradient of the seed suite on both
GPUs, and loses to winograd and fft on the 3x3 and 7x7 layers with 64 channels (MEASUREMENTS.md).
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_upto, choices_with_own
from autocnn.kernels.formulations.cores.mma_rules import accumulator_violation, arch_violation
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.problem import ConvWgradProblem
from autocnn.kernels.rules import GRID_YZ_LIMIT, sixteen_bit_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch
from autocnn.precision import FLOAT32

NAME = "tc_rows"
STAGE_BUFFERS = 2      # the slab being multiplied and the next one, in flight
DY_PAD = 4             # dY rows' pitch is 4 past a multiple of 8: conflict-free A fragment reads
MAX_THREADS = 512      # a block; past it each thread has under 128 registers for its tiles
MAX_REGISTERS = 255    # a thread's
REGISTERS_PER_BLOCK = 65536   # sm_80 to sm_90


def slab_geometry(p: ConvWgradProblem, ROWS: int, PAD_X: int) -> tuple[int, int, int, int]:
    """(Q8, BANDH, LDX, LDY): a staged dY row's positions (Q padded to whole k-steps), the input
    rows under a slab, a staged input row's pitch (the columns the taps reach, plus PAD_X) and the
    pitch of a filter's staged dY (ROWS rows of Q8, plus DY_PAD)."""
    q8 = cdiv(p.Q, 8) * 8
    bandh = (ROWS - 1) * p.stride[0] + p.R
    ldx = (q8 - 1) * p.stride[1] + p.S + PAD_X
    ldy = ROWS * q8 + DY_PAD
    return q8, bandh, ldx, ldy


def smem_bytes(p: ConvWgradProblem, KB: int, CB: int, ROWS: int, PAD_X: int, SPLIT_X: str = "registers") -> int:
    """The double-buffered slabs, and for fp32 with SPLIT_X "smem" one band of remainders."""
    _, bandh, ldx, ldy = slab_geometry(p, ROWS, PAD_X)
    small = CB * bandh * ldx if SPLIT_X == "smem" and p.precision.tf32x3 else 0
    return FLOAT32.size * (STAGE_BUFFERS * (KB * ldy + CB * bandh * ldx) + small)   # TF32 slabs: FP32 values


def registers_needed(split3: bool, MT: int, NT: int, KUNROLL: int) -> int:
    """A thread's registers, roughly as ptxas allots them (sm_90, nvcc 13): the accumulators (and
    fp32's per-flush partial sums), each column tile's offset, the A and B fragments (both parts in
    fp32) of each k-step unrolled together, and about 32 for addresses and loop state."""
    fragments = (4 if split3 else 2) * NT + (8 if split3 else 4) * MT
    return (8 if split3 else 4) * MT * NT + NT + KUNROLL * fragments + 32


def column_tiles(p: ConvWgradProblem, CB: int, WN: int) -> int:
    """mma column tiles (of 8) per warp: the block's CB*R*S columns over WN warps."""
    return cdiv(cdiv(CB * p.R * p.S, 8), WN)


class TcRowsConvWgrad(OpFormulation):
    formulation = NAME
    op = "conv_wgrad"
    summary = "tensor cores over staged rows"
    templates = ("tc_rows_conv_wgrad.cu.j2", "_mma_sync.cuh.j2", "_mma_tiles.cuh.j2")

    def params(self, p: ConvWgradProblem) -> list[Param]:
        return [
            Param("KB", choices_upto((16, 32, 64), max(16, next_pow2(p.K))), "filters per block (GEMM rows)"),
            Param("CB", choices_with_own((1, 2, 4, 8, 16, 32), p.C, bound=32), "input channels per block"),
            Param("WM", (1, 2, 4), "warps along the filters"),
            Param("WN", (1, 2, 4, 8), "warps along the (channel, tap) columns"),
            Param("ROWS", choices_upto((1, 2, 4, 8, 16, 32), next_pow2(p.P)), "output rows of one image per slab"),
            Param("BLOCKS", (32, 64, 128, 256, 512, 1024, 2048), "blocks along the slabs (each loops over slabs)"),
            Param("PAD_X", (0, 1, 2, 4), "floats of padding per staged input row (bank conflicts)"),
            Param("KUNROLL", (1, 2, 4), "mma k-steps unrolled together (fragment reads overlap products)"),
            # "nearest" first: the code every config had before the parameter (SearchSpace.complete).
            Param("ROUNDING", ("nearest", "truncate"), "operands to TF32 by cvt.rna, or truncated by the tensor cores"),
            # "registers" first: the code every config had before the parameter.
            Param("SPLIT_X", ("registers", "smem"), "the input band split to TF32 parts at each read, or once per slab in shared memory"),
        ]

    def constraints(self, p: ConvWgradProblem, limits: DeviceLimits) -> list[Constraint]:
        split3 = p.precision.tf32x3

        def warp_rows(kb, wm):
            return None if kb % (16 * wm) == 0 else f"KB={kb} filters do not split into 16-row mma tiles over WM={wm} warps"

        def accumulators(kb, cb, wm, wn):
            return accumulator_violation(kb, 8 * wn * column_tiles(p, cb, wn), wm, wn, split3)

        def registers(kb, cb, wm, wn, unroll):
            need = registers_needed(split3, kb // (16 * wm), column_tiles(p, cb, wn), unroll)
            have = min(MAX_REGISTERS, REGISTERS_PER_BLOCK // (32 * wm * wn))
            return None if need <= have else f"about {need} registers a thread, more than the {have} of a {32 * wm * wn}-thread block"

        def bias_threads(kb, wm, wn):
            return None if 32 * wm * wn >= kb else f"{32 * wm * wn} threads cannot each sum one of KB={kb} filters' dY"

        return [
            sixteen_bit_rule(p, NAME, "KB", "its mma.sync products take TF32 operands (3xTF32 or TF32), not BF16 or "
                                            "FP16 ones"),
            Constraint(("WM",), lambda _: arch_violation(limits)),
            Constraint(("KB", "WM"), warp_rows),
            Constraint(("KB", "CB", "WM", "WN"), accumulators),
            Constraint(("KB", "CB", "WM", "WN", "KUNROLL"), registers),
            Constraint(("KB", "WM", "WN"), bias_threads),
            Constraint(("WM", "WN"), lambda wm, wn: None if 32 * wm * wn <= MAX_THREADS
                       else f"{32 * wm * wn} threads exceed {MAX_THREADS} (registers of the accumulators)"),
            threads_rule(limits, ("WM", "WN"), lambda wm, wn: 32 * wm * wn),
            Constraint(("CB", "WN"), lambda cb, wn: None if wn <= cdiv(cb * p.R * p.S, 8)
                       else f"WN={wn} warps leave one with no 8-column tile of the {cb * p.R * p.S} columns"),
            Constraint(("CB",), lambda cb: None if cdiv(p.C, cb) <= GRID_YZ_LIMIT else "too many channel tiles"),
            Constraint(("KB",), lambda kb: None if cdiv(p.K, kb) <= GRID_YZ_LIMIT else "too many filter tiles"),
            Constraint(("BLOCKS", "ROWS"), lambda b, rows: None if b <= max(32, next_pow2(self.slabs(p, rows)))
                       else f"BLOCKS={b} exceeds the {self.slabs(p, rows)} slabs"),
            smem_rule(limits, ("KB", "CB", "ROWS", "PAD_X", "SPLIT_X"), lambda *v: smem_bytes(p, *v)),
        ]

    @staticmethod
    def slabs(p: ConvWgradProblem, rows: int) -> int:
        return p.N * cdiv(p.P, rows)

    def default_candidates(self, p: ConvWgradProblem) -> list[dict[str, Any]]:
        # A block of 32 filters by as many channels as keep each warp's 8-column tiles within the
        # fp32 accumulator cap, slabs of whole small images; then smaller ones that fit any layer.
        def candidate(kb, cb, wn, rows, blocks):
            return {"formulation": NAME, "KB": kb, "CB": cb, "WM": 2 if kb == 32 else 1, "WN": wn, "ROWS": rows,
                    "BLOCKS": blocks, "PAD_X": 0, "KUNROLL": 1, "ROUNDING": "nearest",
                    "SPLIT_X": "registers"}

        kb = 32 if p.K > 16 else 16
        out = []
        for cb, rows, wn in ((16, 16, 4), (8, 8, 4), (4, 4, 2), (1, 1, 1)):
            rows = min(rows, next_pow2(p.P))
            out.append(candidate(kb, min(cb, p.C), wn, rows, max(32, min(256, next_pow2(self.slabs(p, rows)) // 2))))
        return [*out, candidate(16, 1, 1, 1, 32)]

    def context(self, problem: ConvWgradProblem, config: Config) -> dict[str, Any]:
        q8, bandh, ldx, ldy = slab_geometry(problem, config["ROWS"], config["PAD_X"])
        return {"split3": problem.precision.tf32x3, "Q8": q8, "BANDH": bandh, "LDX": ldx, "LDY": ldy,
                "NT": column_tiles(problem, config["CB"], config["WN"]), "STAGE_BUFFERS": STAGE_BUFFERS}

    def launches(self, p: ConvWgradProblem, c: Config) -> tuple[Launch, ...]:
        grid = (min(self.slabs(p, c["ROWS"]), c["BLOCKS"]), cdiv(p.C, c["CB"]), cdiv(p.K, c["KB"]))
        return (Launch("conv_wgrad", grid, (32 * c["WM"] * c["WN"], 1, 1),
                       smem_bytes(p, c["KB"], c["CB"], c["ROWS"], c["PAD_X"], c["SPLIT_X"]), ("x", "dy", "dw", "db")),)

    def buffers(self, p: ConvWgradProblem, c: Config) -> Buffers:
        # Every block adds its sums into dW and db.
        return ("dw", "db"), ()

    def code_helpers(self) -> tuple:
        return (slab_geometry, smem_bytes, column_tiles, registers_needed, STAGE_BUFFERS, DY_PAD, accumulator_violation)


TC_ROWS = Formulation(NAME, (TcRowsConvWgrad(),))
