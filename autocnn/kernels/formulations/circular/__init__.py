"""circular: conv_fwd as Scherer, Schulz & Behnke (2010) build it: a shared-memory circular buffer of
source rows that slides down the input map, exchanging only the rows that enter it each step,
several target maps per block, each step's output rows written coalesced.

The paper's kernel is one configuration of this space (64x64 maps to 32x32, 8x8 filters, stride 2):
KB=8 target maps, TQ=32 output columns a row with one output per thread (256 threads), PPS=1
output row per step, ROWS=8 (its 70x8 window; two rows enter each step). Here any filter size,
stride, padding and channel count is served, and the searched parameters are the buffer's rows,
target maps per block and per thread, outputs per thread along a row and down the map, channels
staged per step, the rows a block walks, padding and unrolling. The template is
circular_conv_fwd.cu.j2 on the shared row buffer (circular_rows.cuh.j2, circular_rows.py).
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import FULL_UNROLL, Formulation, OpFormulation, choices_upto, pragma_unroll
from autocnn.kernels.formulations.cores.circular_rows import MINB_CHOICES, RowWindow, minb_rule, phase_len
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.problem import ConvFwdProblem
from autocnn.kernels.rules import (GRID_X_LIMIT, GRID_YZ_LIMIT, at_most, code_size_rule, grid_rule, sixteen_bit_rule,
                                   smem_rule, threads_rule)
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch

NAME = "circular"
PPS_CHOICES = (1, 2, 4)
# Rows in the buffer beyond what one step reads, in steps' worth of entering rows: 0 loads every
# entering row behind a barrier (the paper's 70x8 window), 1 loads all of them while a step
# computes, 2 a step further ahead.
EXTRA_STEPS = (0, 1, 2)


def rows_choices(p: ConvFwdProblem) -> tuple[int, ...]:
    """Every buffer size some PPS choice may use: its rows per step plus 0, half, 1 or 2 steps' entering rows."""
    out = set()
    for pps in PPS_CHOICES:
        win = RowWindow(p.R, p.stride[0], pps, 0)
        out.update(win.need + extra * win.enter for extra in EXTRA_STEPS)
        out.add(win.need + max(1, win.enter // 2))
    return tuple(sorted(out))


def circular_smem_bytes(p: ConvFwdProblem, KB: int, TQ: int, CB: int, ROWS: int, PAD: int) -> int:
    sw = p.stride[1]
    w_floats = (CB * p.R * p.S * KB + 3) // 4 * 4     # aligned like the template's W_FLOATS
    return p.precision.accumulator.size * (w_floats + CB * ROWS * sw * (phase_len(TQ, p.S, sw) + PAD))


def circular_threads(c: Config) -> int:
    return (c["KB"] // c["KPT"]) * (c["TQ"] // c["QPT"])


def circular_grid(p: ConvFwdProblem, c: Config) -> tuple[int, int, int]:
    return (cdiv(p.Q, c["TQ"]) * cdiv(p.P, c["PBLK"]), cdiv(p.K, c["KB"]), p.N)


class CircularConvFwd(OpFormulation):
    formulation = NAME
    op = "conv_fwd"
    summary = "circular buffer of source rows sliding down the map (Scherer et al. 2010)"
    templates = ("circular_conv_fwd.cu.j2", "circular_rows.cuh.j2")

    def params(self, p: ConvFwdProblem) -> list[Param]:
        # KB, KPT, TQ, QPT, CB, PAD and UNROLL_R mean what they mean for "direct": the operation
        # merges the shared names (each formulation held to its own choices).
        return [
            Param("KB", choices_upto((4, 8, 16, 32), max(4, next_pow2(p.K))), "output channels per block (target maps per block)"),
            Param("KPT", (1, 2, 4, 8), "output channels per thread"),
            Param("TQ", choices_upto((8, 16, 32, 64), max(8, next_pow2(p.Q))), "output columns per block"),
            Param("QPT", (1, 2, 4), "output columns per thread, TQ/QPT apart (each store instruction writes a coalesced row)"),
            Param("PPS", PPS_CHOICES, "output rows per step of the sliding window"),
            Param("ROWS", rows_choices(p), "source rows held in the circular buffer (at least the rows of one step)"),
            Param("PBLK", choices_upto((4, 8, 16, 32, 64, 128, 256), max(4, next_pow2(p.P))),
                  "output rows one block slides down"),
            Param("CB", choices_upto((1, 2, 4, 8, 16), max(1, next_pow2(p.C))), "input channels staged in shared memory per step"),
            Param("PAD", (0, 1, 2), "floats of padding per shared-memory input row (bank conflicts)"),
            Param("UNROLL_R", (1, FULL_UNROLL), "unrolling of the filter-row loop (0: complete)"),
            Param("MINB", MINB_CHOICES, "blocks per multiprocessor ptxas keeps registers for (__launch_bounds__)"),
        ]

    def constraints(self, p: ConvFwdProblem, limits: DeviceLimits) -> list[Constraint]:
        sh = p.stride[0]

        def rows_fit(pps, rows):
            win = RowWindow(p.R, sh, pps, rows)
            if rows < win.need:
                return f"ROWS={rows} is fewer than the {win.need} rows one step of {pps} output rows reads"
            if rows > win.need + 2 * win.enter:
                return f"ROWS={rows} holds more than two steps ahead ({win.need + 2 * win.enter} rows)"
            return None

        return [
            sixteen_bit_rule(p, NAME, "KB", "its kernels read and write float32 tensors only; direct, igemm and tc "
                                            "compute bf16 and fp16"),
            Constraint(("KB", "KPT"), lambda kb, kpt: None if kb % kpt == 0 else f"KPT={kpt} does not divide KB={kb}"),
            Constraint(("TQ", "QPT"), lambda tq, qpt: None if tq % qpt == 0 else f"QPT={qpt} does not divide TQ={tq}"),
            Constraint(("PPS", "PBLK"), lambda pps, pb: None if pb % pps == 0 else f"PPS={pps} does not divide PBLK={pb}"),
            Constraint(("PPS", "ROWS"), rows_fit),
            at_most("KB", max(4, next_pow2(p.K)), f"only {p.K} output channels"),
            at_most("TQ", max(8, next_pow2(p.Q)), f"only {p.Q} output columns"),
            at_most("PBLK", max(4, next_pow2(p.P)), f"only {p.P} output rows"),
            at_most("CB", max(1, next_pow2(p.C)), f"only {p.C} input channels"),
            Constraint(("PPS",), lambda pps: None if pps <= max(1, next_pow2(p.P)) else f"only {p.P} output rows"),
            threads_rule(limits, ("KB", "KPT", "TQ", "QPT"), lambda kb, kpt, tq, qpt: (kb // kpt) * (tq // qpt)),
            minb_rule(lambda kb, kpt, tq, qpt: (kb // kpt) * (tq // qpt), ("KB", "KPT", "TQ", "QPT")),
            Constraint(("KPT", "PPS", "QPT"),
                       lambda kpt, pps, qpt: None if kpt * pps * qpt <= 64
                       else f"{kpt * pps * qpt} accumulators per thread exceed 64 (registers)"),
            code_size_rule(("KPT", "PPS", "QPT", "UNROLL_R"),
                           lambda kpt, pps, qpt, ur: kpt * pps * qpt * p.S * (p.R if ur == FULL_UNROLL else 1)),
            smem_rule(limits, ("KB", "TQ", "CB", "ROWS", "PAD"),
                      lambda kb, tq, cb, rows, pad: circular_smem_bytes(p, kb, tq, cb, rows, pad)),
            grid_rule(("KB",), lambda kb: cdiv(p.K, kb)),
            Constraint(("TQ", "PBLK"), lambda tq, pb: None if cdiv(p.Q, tq) * cdiv(p.P, pb) <= GRID_X_LIMIT
                       else "too many blocks along x"),
            Constraint(("KB",), lambda kb: None if p.N <= GRID_YZ_LIMIT
                       else f"{p.N} images exceed {GRID_YZ_LIMIT} blocks along z"),
        ]

    def default_candidates(self, p: ConvFwdProblem) -> list[dict[str, Any]]:
        """A register-tiled variant, the paper's own configuration, and a small one that fits any problem."""
        sh = p.stride[0]
        kb = max(4, min(8, next_pow2(p.K)))
        cb = min(8, max(1, next_pow2(p.C)))
        tq = max(8, min(32, next_pow2(p.Q)))

        def rows(pps: int, extra: int) -> int:
            win = RowWindow(p.R, sh, pps, 0)
            return win.need + extra * win.enter

        pblk = max(4, next_pow2(p.P))     # PBLK's bound
        base = {"formulation": NAME, "CB": cb, "PAD": 1, "UNROLL_R": 1, "MINB": 1}
        return [
            {**base, "KB": kb, "KPT": min(2, kb), "TQ": tq, "QPT": 2, "PPS": 2, "ROWS": rows(2, 1),
             "PBLK": min(16, pblk)},
            {**base, "KB": kb, "KPT": 1, "TQ": tq, "QPT": 1, "PPS": 1, "ROWS": rows(1, 0), "PBLK": min(32, pblk)},
            {**base, "KB": 4, "KPT": 1, "TQ": 8, "QPT": 1, "PPS": 1, "ROWS": rows(1, 0), "PBLK": 4, "CB": 1, "PAD": 0},
        ]

    def context(self, problem: ConvFwdProblem, config: Config) -> dict[str, Any]:
        return {"UNROLL_R": pragma_unroll(config["UNROLL_R"])}

    def launches(self, p: ConvFwdProblem, c: Config) -> tuple[Launch, ...]:
        smem = circular_smem_bytes(p, c["KB"], c["TQ"], c["CB"], c["ROWS"], c["PAD"])
        return (Launch("conv_fwd", circular_grid(p, c), (circular_threads(c), 1, 1), smem, ("x", "w", "bias", "y")),)

    def code_helpers(self) -> tuple:
        return (circular_smem_bytes, circular_threads, circular_grid, phase_len, pragma_unroll)


CIRCULAR = Formulation(NAME, (CircularConvFwd(),))
