"""circular_bwd: conv_bwd_fused (kernels/conv_bwd_fused.py) in one kernel, as Scherer, Schulz & Behnke
(2010) do the backward pass: each block loads a row of the next layer's error signal dY once and
from it computes both the weight-gradient partial sums (in registers, phase A) and the error
"pushed" back to the source map, accumulated in a second shared-memory circular buffer (phase B,
bank-conflict free), while the source rows slide through the first one (circular_rows.py).

The paper's kernel: one source map (CB=1), eight target maps (KB=8), 512 threads, one per element
of the eight 8x8 filters (KPT=SPT=1). Searched here: target maps and source maps per block, the
filters and taps a thread's weight gradients cover (outputs per thread), the output columns and
rows a block covers, the rows in the source buffer, how many threads share a row's positions in
phase B, padding, unrolling, and how the blocks' partial weight gradients meet: "atomic"
(atomicAdd into the zeroed dW and db) or "two_pass" (partial sums in a workspace, added in a
fixed order by conv_bwd_fused_reduce). dX is always accumulated atomically into the zeroed dX:
blocks of other target maps and the halos of neighbouring blocks add to the same pixels.
The template is circular_bwd_conv_bwd_fused.cu.j2.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_upto
from autocnn.kernels.formulations.cores.circular_rows import MINB_CHOICES, minb_rule, phase_len
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import GRID_X_LIMIT, GRID_YZ_LIMIT, at_most, grid_rule, sixteen_bit_rule, smem_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch

if TYPE_CHECKING:
    from autocnn.kernels.conv_bwd_fused import ConvBwdFusedProblem

NAME = "circular_bwd"
ATOMIC = "atomic"
TWO_PASS = "two_pass"
REDUCE_THREADS = 256


def bwd_threads(p: "ConvBwdFusedProblem", KB: int, KPT: int, SPT: int, CB: int, MSPLIT: int) -> int:
    """Whole warps covering both phases: phase A's (KB/KPT) * CB * R * ceil(S/SPT) weight-gradient
    threads and phase B's CB * R * min(SW, S) * MSPLIT error threads."""
    a = (KB // KPT) * CB * p.R * cdiv(p.S, SPT)
    b = CB * p.R * min(p.stride[1], p.S) * MSPLIT
    return cdiv(max(a, b), 32) * 32


def bwd_smem_bytes(p: "ConvBwdFusedProblem", KB: int, CB: int, TQ: int, ROWS: int, PAD: int) -> int:
    sw = p.stride[1]
    umax = cdiv(p.S, sw)
    dy = ((TQ + 2 * (umax - 1)) * KB + 3) // 4 * 4      # aligned like the template's DY_FLOATS
    ldm = phase_len(TQ, p.S, sw) + PAD
    return p.precision.accumulator.size * (dy + CB * ROWS * sw * ldm + CB * p.R * sw * ldm)


def bwd_grid(p: "ConvBwdFusedProblem", c: Config) -> tuple[int, int, int]:
    return (cdiv(p.Q, c["TQ"]) * cdiv(p.P, c["PBLK"]), cdiv(p.K, c["KB"]) * cdiv(p.C, c["CB"]), p.N)


def bwd_parts(p: "ConvBwdFusedProblem", c: Config) -> int:
    """Blocks whose partial weight gradients meet: one per image, row block and column strip."""
    return p.N * cdiv(p.P, c["PBLK"]) * cdiv(p.Q, c["TQ"])


def bwd_reduce_launch(p: "ConvBwdFusedProblem") -> Launch:
    n = p.K * p.C * p.R * p.S + p.K
    return Launch("conv_bwd_fused_reduce", (cdiv(n, REDUCE_THREADS), 1, 1), (REDUCE_THREADS, 1, 1), 0,
                  ("ws", "ws_bias", "dw", "db"))


class CircularBwdConvBwdFused(OpFormulation):
    formulation = NAME
    op = "conv_bwd_fused"
    summary = "one pass over dY: weight gradients and the pushed-back error from one load (Scherer et al. 2010)"
    templates = ("circular_bwd_conv_bwd_fused.cu.j2", "circular_rows.cuh.j2")

    def params(self, p: "ConvBwdFusedProblem") -> list[Param]:
        sh = p.stride[0]
        return [
            Param("KB", choices_upto((1, 2, 4, 8, 16, 32), max(1, next_pow2(p.K))), "target maps per block"),
            Param("KPT", (1, 2, 4, 8), "target maps per thread of the weight gradients"),
            Param("SPT", choices_upto((1, 2, 4, 8), max(1, next_pow2(p.S))), "filter taps along a row per thread of the weight gradients"),
            Param("CB", choices_upto((1, 2, 4, 8, 16), max(1, next_pow2(p.C))), "source maps per block"),
            Param("TQ", choices_upto((8, 16, 32, 64, 128), max(8, next_pow2(p.Q))), "output columns per block"),
            Param("ROWS", tuple(sorted({p.R, p.R + max(1, sh // 2), p.R + sh, p.R + 2 * sh})),
                  "source rows held in the circular buffer (at least R; R + SH loads every row while a step computes)"),
            Param("PBLK", choices_upto((4, 8, 16, 32, 64, 128, 256), max(4, next_pow2(p.P))), "output rows one block slides down"),
            Param("MSPLIT", (1, 2, 4, 8, 16, 32), "threads sharing one accumulator row's positions (phase B)"),
            Param("PAD", (0, 1, 2), "floats of padding per shared-memory row (bank conflicts)"),
            Param("UNROLL_Q", (1, 2, 4), "unrolling of the weight-gradient loop over a row's columns"),
            Param("COMBINE", (ATOMIC, TWO_PASS), "how the blocks' partial weight gradients meet"),
            Param("MINB", MINB_CHOICES, "blocks per multiprocessor ptxas keeps registers for (__launch_bounds__)"),
        ]

    def constraints(self, p: "ConvBwdFusedProblem", limits: DeviceLimits) -> list[Constraint]:
        umax = cdiv(p.S, p.stride[1])

        def threads(kb, kpt, spt, cb, ms):
            n = bwd_threads(p, kb, kpt, spt, cb, ms)
            return None if n <= limits.max_threads_per_block else \
                f"{n} threads per block exceed the limit of {limits.max_threads_per_block}"

        def workspace(combine, tq, pblk):
            if combine != TWO_PASS:
                return None
            parts = p.N * cdiv(p.P, pblk) * cdiv(p.Q, tq)
            b = WORKSPACE_ELEMENT.size * parts * (p.K * p.C * p.R * p.S + p.K)
            return None if b <= limits.workspace_bytes else \
                f"the two-pass workspace ({b} bytes) exceeds the workspace limit of {limits.workspace_bytes} bytes"

        return [
            sixteen_bit_rule(p, NAME, "KB", "its kernels read and write float32 tensors only"),
            Constraint(("KB", "KPT"), lambda kb, kpt: None if kb % kpt == 0 else f"KPT={kpt} does not divide KB={kb}"),
            at_most("KB", max(1, next_pow2(p.K)), f"only {p.K} target maps"),
            at_most("CB", max(1, next_pow2(p.C)), f"only {p.C} source maps"),
            at_most("TQ", max(8, next_pow2(p.Q)), f"only {p.Q} output columns"),
            at_most("PBLK", max(4, next_pow2(p.P)), f"only {p.P} output rows"),
            at_most("SPT", max(1, next_pow2(p.S)), f"only {p.S} taps a row"),
            Constraint(("MSPLIT", "TQ"), lambda ms, tq: None if ms <= tq + umax - 1
                       else f"MSPLIT={ms} exceeds the {tq + umax - 1} positions of an accumulator row"),
            Constraint(("KB", "KPT", "SPT", "CB", "MSPLIT"), threads),
            minb_rule(lambda *v: bwd_threads(p, *v), ("KB", "KPT", "SPT", "CB", "MSPLIT")),
            Constraint(("KPT", "SPT"), lambda kpt, spt: None if kpt * spt <= 32
                       else f"{kpt * spt} weight-gradient accumulators per thread exceed 32 (registers)"),
            Constraint(("KB",), lambda kb: None if kb * umax <= 64
                       else f"{kb * umax} filter taps held in registers (KB x ceil(S/SW)) exceed 64"),
            smem_rule(limits, ("KB", "CB", "TQ", "ROWS", "PAD"),
                      lambda kb, cb, tq, rows, pad: bwd_smem_bytes(p, kb, cb, tq, rows, pad)),
            grid_rule(("KB", "CB"), lambda kb, cb: cdiv(p.K, kb) * cdiv(p.C, cb)),
            Constraint(("TQ", "PBLK"), lambda tq, pb: None if cdiv(p.Q, tq) * cdiv(p.P, pb) <= GRID_X_LIMIT
                       else "too many blocks along x"),
            Constraint(("KB",), lambda kb: None if p.N <= GRID_YZ_LIMIT
                       else f"{p.N} images exceed {GRID_YZ_LIMIT} blocks along z"),
            Constraint(("COMBINE", "TQ", "PBLK"), workspace),
        ]

    def default_candidates(self, p: "ConvBwdFusedProblem") -> list[dict[str, Any]]:
        """Register-tiled weight gradients over eight target maps, then the paper's own layout (one
        thread per filter element of one source map), then a small one that fits any problem."""
        kb = min(8, max(1, next_pow2(p.K)))
        tq = max(8, min(32, next_pow2(p.Q)))
        spt = min(4, max(1, next_pow2(p.S)))
        cb = min(4, max(1, next_pow2(p.C)))
        # Phase B's threads as many as phase A's and at least 128, so neither phase leaves most of
        # the block idle.
        a_threads = (kb // min(4, kb)) * cb * p.R * cdiv(p.S, spt)
        row_threads = cb * p.R * min(p.stride[1], p.S)
        msplit = next((m for m in (1, 2, 4, 8, 16, 32) if row_threads * m >= max(a_threads, 128)), 32)
        rows = max(4, next_pow2(p.P))     # PBLK's bound
        base = {"ROWS": p.R + p.stride[0], "PAD": 1, "UNROLL_Q": 2, "COMBINE": ATOMIC, "MINB": 1}
        return [
            {**base, "KB": kb, "KPT": min(4, kb), "SPT": spt, "CB": cb, "TQ": tq, "PBLK": min(16, rows),
             "MSPLIT": msplit},
            {**base, "KB": kb, "KPT": 1, "SPT": 1, "CB": 1, "TQ": tq, "PBLK": min(32, rows), "MSPLIT": 2},
            {**base, "KB": 1, "KPT": 1, "SPT": 1, "CB": 1, "TQ": 8, "PBLK": 4, "MSPLIT": 1, "ROWS": p.R, "PAD": 0,
             "UNROLL_Q": 1},
        ]

    def context(self, problem: "ConvBwdFusedProblem", config: Config) -> dict[str, Any]:
        return {"reduce_threads": REDUCE_THREADS}

    def launches(self, p: "ConvBwdFusedProblem", c: Config) -> tuple[Launch, ...]:
        threads = bwd_threads(p, c["KB"], c["KPT"], c["SPT"], c["CB"], c["MSPLIT"])
        smem = bwd_smem_bytes(p, c["KB"], c["CB"], c["TQ"], c["ROWS"], c["PAD"])
        main = Launch("conv_bwd_fused", bwd_grid(p, c), (threads, 1, 1), smem,
                      ("x", "dy", "w", "dx", "dw", "db", "ws", "ws_bias"))
        return (main, bwd_reduce_launch(p)) if c["COMBINE"] == TWO_PASS else (main,)

    def buffers(self, p: "ConvBwdFusedProblem", c: Config) -> Buffers:
        if c["COMBINE"] == TWO_PASS:
            parts = bwd_parts(p, c)
            return ("dx",), (("ws", parts * p.K * p.C * p.R * p.S), ("ws_bias", parts * p.K))
        return ("dx", "dw", "db"), ()

    def code_helpers(self) -> tuple:
        return (bwd_threads, bwd_smem_bytes, bwd_grid, bwd_parts, bwd_reduce_launch, phase_len,
                REDUCE_THREADS, ATOMIC, TWO_PASS)


CIRCULAR_BWD = Formulation(NAME, (CircularBwdConvBwdFused(),))
