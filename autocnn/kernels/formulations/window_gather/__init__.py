"""window_gather: average pooling as memory-bound gathers over windows, the one formulation of
avgpool_fwd (averaging) and avgpool_bwd (supersampling).

Both are judged by bandwidth, so the parameters are about bytes in flight: threads per block,
values per thread along a row, items per thread, and vector width where alignment is provable.
avgpool_fwd: each thread QPT outputs of a row, each window row read as one register span, so
overlapping windows reuse loaded values. avgpool_bwd: a gather per input position (no atomics),
WPT values of a row per thread (cores/pool_gather.py, which act_gather shares). Kernels:
window_gather_<op>.cu.j2.

Both serve NHWC problems too (window_gather_nhwc_<op>.cuh.j2): there a thread owns CPT consecutive
channels of one output (avgpool_fwd) or input (avgpool_bwd) pixel, channel-fastest across the
threads, so each window position is one coalesced channel run, moved as vectors where CPT divides C
(cores/channels_last.py: any channel count works, a partial last run element by element).
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Formulation, OpFormulation
from autocnn.kernels.formulations.cores.channels_last import run_choices, whole_runs
from autocnn.kernels.formulations.cores.pool_gather import ITEMS, THREADS, PoolGatherBwd
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.problem import AvgPoolBwdProblem, AvgPoolFwdProblem
from autocnn.kernels.rules import GRID_X_LIMIT, threads_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch
from autocnn.layout import LAYOUTS

# Every formulation's templates name the channels-last helpers both kernels include in NHWC.
CHANNELS_LAST = "_channels_last.cuh.j2"


def nhwc_params(p: Any) -> list[Param]:
    """NHWC's parameters: the block, the channels a thread owns, the items it takes."""
    return [Param("THREADS", THREADS, "threads per block"),
            Param("CPT", run_choices(p.C), "consecutive channels of a pixel per thread (NHWC)"),
            Param("IPT", ITEMS, "items per thread")]


def nhwc_constraints(p: Any, limits: DeviceLimits, pixels: int) -> list[Constraint]:
    """NHWC's rules: the block size, and the grid of ``pixels`` pixels' channel runs."""
    return [
        threads_rule(limits, ("THREADS",), lambda t: t),
        Constraint(("THREADS", "CPT", "IPT"),
                   lambda t, v, i: None if cdiv(pixels * cdiv(p.C, v), t * i) <= GRID_X_LIMIT else "too many blocks"),
    ]


def nhwc_defaults(p: Any) -> list[dict[str, Any]]:
    """Whole (vector) runs of the widest width first, then one channel a thread."""
    runs = [v for v in sorted(run_choices(p.C), reverse=True) if v > 1 and whole_runs(p.C, v)]
    return [{"THREADS": 256, "CPT": v, "IPT": 1} for v in (*runs, 1)]


def nhwc_items(p: Any, c: Config, pixels: int) -> int:
    return pixels * cdiv(p.C, c["CPT"])

NAME = "window_gather"


class WindowGatherFwd(OpFormulation):
    formulation = NAME
    op = "avgpool_fwd"
    summary = "a gather with register row spans"
    templates = ("window_gather_avgpool_fwd.cu.j2", "_window_gather.cuh.j2", "window_gather_nhwc_avgpool_fwd.cuh.j2",
                 CHANNELS_LAST)
    layouts = LAYOUTS

    def params(self, p: AvgPoolFwdProblem) -> list[Param]:
        if p.layout.channels_last:
            return nhwc_params(p)
        # Vector loads need an unpadded row whose length the width divides; where that fails for
        # every config, the width is not offered at all (otherwise most proposals are infeasible).
        vecs = tuple(v for v in (1, 2, 4) if v == 1 or (not any(p.padding) and p.W % v == 0))
        return [
            Param("THREADS", THREADS, "threads per block"),
            Param("QPT", (1, 2, 4, 8), "consecutive outputs of a row per thread"),
            Param("IPT", ITEMS, "items per thread"),
            Param("VEC", vecs, "vector width of input loads"),
        ]

    def constraints(self, p: AvgPoolFwdProblem, limits: DeviceLimits) -> list[Constraint]:
        if p.layout.channels_last:
            return nhwc_constraints(p, limits, p.N * p.P * p.Q)
        sw, kw = p.stride[1], p.window[1]

        def vector_ok(qpt, vec):
            if vec == 1:
                return None
            span = (qpt - 1) * sw + kw
            if any(p.padding):
                return "vector loads need a problem without padding"
            if p.W % vec or (qpt * sw) % vec or span % vec or p.Q % qpt:
                return f"VEC={vec} loads would be misaligned for this row layout"
            return None

        return [
            threads_rule(limits, ("THREADS",), lambda t: t),
            Constraint(("QPT",), lambda q: None if q <= max(1, next_pow2(p.Q))
                       else f"QPT={q} exceeds the {p.Q} outputs of a row"),
            Constraint(("QPT",), lambda q: None if (q - 1) * sw + kw <= 96
                       else "the row span per thread exceeds 96 floats (registers)"),
            Constraint(("QPT", "VEC"), vector_ok),
            Constraint(("THREADS", "QPT", "IPT"),
                       lambda t, q, i: None if cdiv(p.N * p.C * p.P * cdiv(p.Q, q), t * i) <= GRID_X_LIMIT
                       else "too many blocks"),
        ]

    def default_candidates(self, problem: AvgPoolFwdProblem) -> list[dict[str, Any]]:
        if problem.layout.channels_last:
            return nhwc_defaults(problem)
        return [
            {"THREADS": 256, "QPT": 4, "IPT": 1, "VEC": 4},
            {"THREADS": 256, "QPT": 2, "IPT": 1, "VEC": 2},
            {"THREADS": 256, "QPT": 1, "IPT": 1, "VEC": 1},
        ]

    def launches(self, p: AvgPoolFwdProblem, c: Config) -> tuple[Launch, ...]:
        items = nhwc_items(p, c, p.N * p.P * p.Q) if p.layout.channels_last else p.N * p.C * p.P * cdiv(p.Q, c["QPT"])
        grid = (cdiv(items, c["THREADS"] * c["IPT"]), 1, 1)
        return (Launch("avgpool_fwd", grid, (c["THREADS"], 1, 1), 0, ("x", "y")),)

    def code_helpers(self) -> tuple:
        return (nhwc_items,)


class WindowGatherBwd(PoolGatherBwd):
    formulation = NAME
    op = "avgpool_bwd"
    summary = "a gather per input position, no atomics"
    templates = ("window_gather_avgpool_bwd.cu.j2", "_window_gather.cuh.j2", "window_gather_nhwc_avgpool_bwd.cuh.j2",
                 CHANNELS_LAST)
    layouts = LAYOUTS

    def params(self, p: AvgPoolBwdProblem) -> list[Param]:
        return nhwc_params(p) if p.layout.channels_last else super().params(p)

    def constraints(self, p: AvgPoolBwdProblem, limits: DeviceLimits) -> list[Constraint]:
        return nhwc_constraints(p, limits, p.N * p.H * p.W) if p.layout.channels_last else super().constraints(p, limits)

    def default_candidates(self, problem: AvgPoolBwdProblem) -> list[dict[str, Any]]:
        return nhwc_defaults(problem) if problem.layout.channels_last else super().default_candidates(problem)

    def launches(self, p: AvgPoolBwdProblem, c: Config) -> tuple[Launch, ...]:
        items = nhwc_items(p, c, p.N * p.H * p.W) if p.layout.channels_last else p.N * p.C * p.H * cdiv(p.W, c["WPT"])
        grid = (cdiv(items, c["THREADS"] * c["IPT"]), 1, 1)
        return (Launch("avgpool_bwd", grid, (c["THREADS"], 1, 1), 0, ("dy", "dx")),)

    def code_helpers(self) -> tuple:
        return (nhwc_items,)


WINDOW_GATHER = Formulation(NAME, (WindowGatherFwd(), WindowGatherBwd()))
