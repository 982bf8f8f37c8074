"""rows: conv_wgrad directly, for few filter weights (small K*C*R*S) and a long reduction, where GEMM
tiles sit mostly idle and staging an im2col tile costs an index computation per element.

Blocks stage whole output rows of dY with the input rows under them and loop over row slabs, each
thread an outer product of KPT filters by SPT taps; one atomic add per output per block. The
kernel is rows_conv_wgrad.cu.j2.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_with_own
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.problem import ConvWgradProblem
from autocnn.kernels.rules import GRID_YZ_LIMIT, sixteen_bit_rule, smem_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch

NAME = "rows"


def rows_threads(p: ConvWgradProblem, KT: int, KPT: int, CT: int, SPT: int, QSPLIT: int) -> int:
    """Threads of a "rows" block: every (filter group, channel, tap row, tap group) once per column
    group, rounded up to whole warps (the spare threads help staging)."""
    return cdiv((KT // KPT) * CT * p.R * cdiv(p.S, SPT) * QSPLIT, 32) * 32


def rows_smem_bytes(p: ConvWgradProblem, KT: int, KPT: int, CT: int, SPT: int, QSPLIT: int, ROWS: int) -> int:
    # The staged rows of dY and X, and later (the same memory) the column groups' partial sums.
    wsp = (p.Q - 1) * p.stride[1] + cdiv(p.S, SPT) * SPT
    stage = ROWS * KT * (p.Q + 1) + ROWS * CT * p.R * wsp
    sums = QSPLIT * KT * CT * p.R * cdiv(p.S, SPT) * SPT
    return p.precision.accumulator.size * max(stage, sums)


class RowsConvWgrad(OpFormulation):
    formulation = NAME
    op = "conv_wgrad"
    summary = "direct over staged rows"
    templates = ("rows_conv_wgrad.cu.j2",)

    def params(self, p: ConvWgradProblem) -> list[Param]:
        return [
            Param("KT", choices_with_own((1, 2, 4, 8, 16, 32), p.K), "filters per block"),
            Param("KPT", (1, 2, 4, 8), "filters per thread (dY values reused across taps)"),
            Param("CT", choices_with_own((1, 2, 4, 8), p.C, bound=8), "input channels per block"),
            Param("SPT", choices_with_own((1, 2, 4, 8), p.S), "filter taps along a row per thread (inputs reused across filters)"),
            Param("QSPLIT", tuple(v for v in (1, 2, 4, 8, 16, 32) if v <= max(1, next_pow2(p.Q))),
                  "thread groups splitting an output row's columns"),
            Param("ROWS", (1, 2, 4, 8), "output rows staged per step"),
            Param("BLOCKS", (128, 256, 512, 1024, 2048), "blocks along the reduction (each loops over row slabs)"),
            Param("UNROLL_Q", (1, 2, 4), "unrolling of the loop over output columns"),
        ]

    def constraints(self, p: ConvWgradProblem, limits: DeviceLimits) -> list[Constraint]:
        names = ("KT", "KPT", "CT", "SPT", "QSPLIT")
        return [
            sixteen_bit_rule(p, NAME, "KT", "every block adds its partial sums into dW with atomics, which at 16 bits "
                                            "would round each of them (igemm's two_pass keeps them in FP32)"),
            Constraint(("KT", "KPT"), lambda kt, kpt: None if kt % kpt == 0 else f"KPT={kpt} does not divide KT={kt}"),
            Constraint(("KPT", "SPT"), lambda kpt, spt: None if kpt * spt <= 64
                       else f"{kpt * spt} accumulators per thread exceed 64 (registers)"),
            Constraint(names, lambda *v: None if rows_threads(p, *v) <= limits.max_threads_per_block
                       else f"{rows_threads(p, *v)} threads per block exceed the limit of {limits.max_threads_per_block}"),
            Constraint(("KT",), lambda kt: None if cdiv(p.K, kt) <= GRID_YZ_LIMIT else "too many filter tiles"),
            Constraint(("CT",), lambda ct: None if cdiv(p.C, ct) <= GRID_YZ_LIMIT else "too many channel tiles"),
            smem_rule(limits, (*names, "ROWS"), lambda *v: rows_smem_bytes(p, *v)),
        ]

    def default_candidates(self, p: ConvWgradProblem) -> list[dict[str, Any]]:
        return [{"formulation": NAME, "KT": min(8, next_pow2(p.K)), "KPT": min(4, next_pow2(p.K)), "CT": 1,
                 "SPT": min(4, next_pow2(p.S)), "QSPLIT": 1, "ROWS": 1, "BLOCKS": 256, "UNROLL_Q": 1}]

    def context(self, problem: ConvWgradProblem, config: Config) -> dict[str, Any]:
        return {"UNROLL_Q": str(config["UNROLL_Q"])}

    def launches(self, p: ConvWgradProblem, c: Config) -> tuple[Launch, ...]:
        tiles = (c["KT"], c["KPT"], c["CT"], c["SPT"], c["QSPLIT"])
        grid = (min(cdiv(p.N * p.P, c["ROWS"]), c["BLOCKS"]), cdiv(p.K, c["KT"]), cdiv(p.C, c["CT"]))
        return (Launch("conv_wgrad", grid, (rows_threads(p, *tiles), 1, 1), rows_smem_bytes(p, *tiles, c["ROWS"]),
                       ("x", "dy", "dw", "db", "ws", "ws_bias")),)

    def buffers(self, p: ConvWgradProblem, c: Config) -> Buffers:
        # Every block adds its sums into dW and db.
        return ("dw", "db"), ()

    def code_helpers(self) -> tuple:
        return (rows_threads, rows_smem_bytes)


ROWS = Formulation(NAME, (RowsConvWgrad(),))
