"""sep_tiles: sep_conv_wgrad's formulation, gu and gv from x and dy by 1D passes that reuse the 1D
filters, never forming the 2D weight gradient (sep_tiles_wgrad.cu.j2 says how).

A block owns KB filters x CB input maps and a share of the N*P*Q reduction (SPLIT blocks per
(k, c) block, combined by "atomic" or "ordered"); per (k, c, j) one set of RSPLIT lanes computes
gv (x filtered by u along columns, correlated with dy along rows) and one gu (x filtered by v
along rows, correlated with dy along columns). db comes from conv_bias_grad (_bias_grad.cuh.j2).
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_upto, pragma_unroll
from autocnn.kernels.formulations.cores.sep_geometry import register_limit
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.problem import ConvWgradProblem
from autocnn.kernels.rules import GRID_X_LIMIT, at_most, code_size_rule, sixteen_bit_rule, smem_rule, workspace_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch

NAME = "sep_tiles"
ATOMIC, ORDERED = "atomic", "ordered"
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
REDUCE_THREADS = 256
BIAS_THREADS = 256
MAX_THREADS = 1024


def wgrad_threads(rank: int, KB: int, CB: int, RSPLIT: int) -> int:
    """A gv and a gu lane per (k, c, j) and row split, rounded up to whole warps."""
    return cdiv(2 * KB * CB * rank * RSPLIT, 32) * 32


def tiles(p: ConvWgradProblem, TP: int, TQ: int) -> int:
    return p.N * cdiv(p.P, TP) * cdiv(p.Q, TQ)


def wgrad_smem_bytes(p: Any, KB: int, CB: int, TP: int, TQ: int, RSPLIT: int, PAD: int) -> int:
    staged = CB * (TP + p.R - 1) * (TQ + p.S - 1 + PAD) + KB * TP * (TQ + PAD)
    reduced = wgrad_threads(p.rank, KB, CB, RSPLIT) * max(p.R, p.S)
    return p.precision.accumulator.size * max(staged, reduced)


def factor_elements(p: Any) -> int:
    return p.K * p.C * p.rank * (p.R + p.S)


def wgrad_registers(p: Any, TQ: int, UNROLL_ROWS: int = 1) -> int:
    """A gv lane's column row and a gu lane's filtered row (per row in flight), the taps and the sums."""
    return UNROLL_ROWS * ((TQ + p.S - 1) + TQ) + 2 * max(p.R, p.S)


class SepTilesWgrad(OpFormulation):
    formulation = NAME
    op = "sep_conv_wgrad"
    summary = "separable weight gradient: 1D filtering of x, correlated with dy, per (k, c, rank)"
    templates = ("sep_tiles_wgrad.cu.j2", "_bias_grad.cuh.j2")

    def params(self, p: Any) -> list[Param]:
        return [
            Param("KB", choices_upto((1, 2, 4, 8, 16), max(1, next_pow2(p.K))), "filters per block"),
            Param("CB", choices_upto((1, 2, 4, 8, 16), max(1, next_pow2(p.C))), "input maps per block"),
            Param("TP", choices_upto((1, 2, 4, 8, 16, 32), max(1, next_pow2(p.P))), "dy rows per staged tile"),
            Param("TQ", choices_upto((4, 8, 16, 32, 64), max(4, next_pow2(p.Q))), "dy columns per staged tile"),
            Param("RSPLIT", (1, 2, 4, 8, 16, 32), "lanes sharing one (k, c, rank) output, splitting the tile's rows"),
            Param("SPLIT", SPLITS, "blocks sharing one (k, c) block's N*P*Q reduction"),
            Param("COMBINE", (ATOMIC, ORDERED), "how the splits' sums meet: atomicAdd, or a workspace summed in order"),
            Param("PAD", (0, 1), "floats of padding per shared-memory row (bank conflicts)"),
            Param("UNROLL_ROWS", (1, 2), "unrolling of a lane's loop over the tile's rows"),
        ]

    def constraints(self, p: Any, limits: DeviceLimits) -> list[Constraint]:
        def threads(kb, cb, rsplit):
            n = wgrad_threads(p.rank, kb, cb, rsplit)
            return None if n <= min(MAX_THREADS, limits.max_threads_per_block) else \
                f"{n} threads per block exceed the limit of {min(MAX_THREADS, limits.max_threads_per_block)}"

        return [
            sixteen_bit_rule(p, NAME, "KB", "the separable factors (the batched SVD's) and their gradients are "
                                            "float32"),
            at_most("KB", max(1, next_pow2(p.K)), f"only {p.K} filters"),
            at_most("CB", max(1, next_pow2(p.C)), f"only {p.C} input maps"),
            at_most("TP", max(1, next_pow2(p.P)), f"only {p.P} output rows"),
            at_most("TQ", max(4, next_pow2(p.Q)), f"only {p.Q} output columns"),
            Constraint(("KB", "CB", "RSPLIT"), threads),
            Constraint(("TP", "RSPLIT"), lambda tp, rs: None if rs <= tp + p.R - 1
                       else f"RSPLIT={rs} exceeds the {tp + p.R - 1} rows a tile's lanes split"),
            Constraint(("TP", "TQ", "SPLIT"), lambda tp, tq, s: None if s <= tiles(p, tp, tq)
                       else f"SPLIT={s} exceeds the {tiles(p, tp, tq)} tiles of the reduction"),
            Constraint(("KB", "CB", "SPLIT"), lambda kb, cb, s: None
                       if cdiv(p.K, kb) * cdiv(p.C, cb) * s <= GRID_X_LIMIT else "more blocks than a grid holds"),
            Constraint(("SPLIT", "COMBINE"), lambda s, comb: None if comb == ATOMIC or s >= 2
                       else "COMBINE=ordered needs SPLIT >= 2"),
            workspace_rule(limits.workspace_bytes, ("SPLIT", "COMBINE"),
                           lambda s, comb: WORKSPACE_ELEMENT.size * s * factor_elements(p) if comb == ORDERED else 0),
            register_limit(limits, ("KB", "CB", "RSPLIT", "TQ", "UNROLL_ROWS"),
                           lambda kb, cb, rs, tq, ur: wgrad_registers(p, tq, ur),
                           lambda kb, cb, rs, tq, ur: wgrad_threads(p.rank, kb, cb, rs), "the filtered rows"),
            code_size_rule(("TQ",), lambda tq: (tq + p.S - 1) * p.R + tq * p.S + tq * p.R),
            smem_rule(limits, ("KB", "CB", "TP", "TQ", "RSPLIT", "PAD"),
                      lambda *v: wgrad_smem_bytes(p, *v)),
        ]

    def default_candidates(self, p: Any) -> list[dict[str, Any]]:
        kb_cap, cb_cap = max(1, next_pow2(p.K)), max(1, next_pow2(p.C))
        # 16 columns: with 32, two rows in flight took ptxas past 128 registers on 11x11 filters (sm_90).
        tp, tq = min(8, max(1, next_pow2(p.P))), min(16, max(4, next_pow2(p.Q)))
        while tq > 4 and 2 * wgrad_registers(p, tq) > 160:
            tq //= 2
        out = []
        for kb, cb, rsplit in ((8, 8, 1), (4, 4, 2), (4, 2, 4), (2, 2, 8)):
            kb, cb = min(kb, kb_cap), min(cb, cb_cap)
            rsplit = min(rsplit, tp + p.R - 1)
            if wgrad_threads(p.rank, kb, cb, rsplit) > 512:
                continue
            blocks = cdiv(p.K, kb) * cdiv(p.C, cb)
            # About two blocks per multiprocessor of a large GPU (132 SMs), each split several tiles long.
            want = max(1, min(264 // blocks, tiles(p, tp, tq) // 4))
            split = max(s for s in SPLITS if s <= want)
            cand = {"KB": kb, "CB": cb, "TP": tp, "TQ": tq, "RSPLIT": rsplit, "SPLIT": split,
                    "COMBINE": ATOMIC, "PAD": 1, "UNROLL_ROWS": 2}
            if cand not in out:
                out.append(cand)
        # Last: one (k, c) pair per block, one lane per output, no split: fits whenever the rank's
        # 2*rank lanes do (rank <= 512).
        return out + [{"KB": 1, "CB": 1, "TP": min(4, max(1, next_pow2(p.P))), "TQ": 4, "RSPLIT": 1,
                       "SPLIT": 1, "COMBINE": ATOMIC, "PAD": 0, "UNROLL_ROWS": 1}]

    def context(self, p: Any, config: Config) -> dict[str, Any]:
        return {"UNROLL_ROWS": pragma_unroll(config["UNROLL_ROWS"]), "reduce_threads": REDUCE_THREADS,
                "bias_grad_threads": BIAS_THREADS}

    def launches(self, p: Any, c: Config) -> tuple[Launch, ...]:
        blocks = cdiv(p.K, c["KB"]) * cdiv(p.C, c["CB"]) * c["SPLIT"]
        smem = wgrad_smem_bytes(p, c["KB"], c["CB"], c["TP"], c["TQ"], c["RSPLIT"], c["PAD"])
        steps = [Launch("sep_wgrad", (blocks, 1, 1), (wgrad_threads(p.rank, c["KB"], c["CB"], c["RSPLIT"]), 1, 1),
                        smem, ("x", "dy", "u", "v", "gu", "gv", "ws"))]
        if c["COMBINE"] == ORDERED:
            steps.append(Launch("sep_wgrad_reduce", (cdiv(factor_elements(p), REDUCE_THREADS), 1, 1),
                                (REDUCE_THREADS, 1, 1), 0, ("ws", "gu", "gv")))
        if p.bias:
            steps.append(Launch("conv_bias_grad", (p.K, 1, 1), (BIAS_THREADS, 1, 1), 0, ("dy", "db")))
        return tuple(steps)

    def buffers(self, p: Any, c: Config) -> Buffers:
        if c["COMBINE"] == ORDERED:
            return (), (("ws", c["SPLIT"] * factor_elements(p)),)
        if c["SPLIT"] > 1:
            return ("gu", "gv"), ()
        return (), ()

    def code_helpers(self) -> tuple:
        return (wgrad_threads, tiles, wgrad_smem_bytes, factor_elements, pragma_unroll, REDUCE_THREADS,
                BIAS_THREADS, ATOMIC, ORDERED)


SEP_TILES = Formulation(NAME, (SepTilesWgrad(),))
