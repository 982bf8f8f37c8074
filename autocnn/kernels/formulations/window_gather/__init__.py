"""window_gather: average pooling as memory-bound gathers over windows, the one formulation of
avgpool_fwd (averaging) and avgpool_bwd (supersampling).

Both are judged by bandwidth, so the parameters are about bytes in flight: threads per block,
values per thread along a row, items per thread, and vector width where alignment is provable.
avgpool_fwd: each thread QPT outputs of a row, each window row read as one register span, so
overlapping windows reuse loaded values. avgpool_bwd: a gather per input position (no atomics),
WPT values of a row per thread (cores/pool_gather.py, which act_gather shares). Kernels:
window_gather_<op>.cu.j2.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Formulation, OpFormulation
from autocnn.kernels.formulations.cores.pool_gather import ITEMS, THREADS, PoolGatherBwd
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.problem import AvgPoolBwdProblem, AvgPoolFwdProblem
from autocnn.kernels.rules import GRID_X_LIMIT, threads_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch

NAME = "window_gather"


class WindowGatherFwd(OpFormulation):
    formulation = NAME
    op = "avgpool_fwd"
    summary = "a gather with register row spans"
    templates = ("window_gather_avgpool_fwd.cu.j2", "_window_gather.cuh.j2")

    def params(self, p: AvgPoolFwdProblem) -> list[Param]:
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
        return [
            {"THREADS": 256, "QPT": 4, "IPT": 1, "VEC": 4},
            {"THREADS": 256, "QPT": 2, "IPT": 1, "VEC": 2},
            {"THREADS": 256, "QPT": 1, "IPT": 1, "VEC": 1},
        ]

    def launches(self, p: AvgPoolFwdProblem, c: Config) -> tuple[Launch, ...]:
        items = p.N * p.C * p.P * cdiv(p.Q, c["QPT"])
        grid = (cdiv(items, c["THREADS"] * c["IPT"]), 1, 1)
        return (Launch("avgpool_fwd", grid, (c["THREADS"], 1, 1), 0, ("x", "y")),)


class WindowGatherBwd(PoolGatherBwd):
    formulation = NAME
    op = "avgpool_bwd"
    summary = "a gather per input position, no atomics"
    templates = ("window_gather_avgpool_bwd.cu.j2", "_window_gather.cuh.j2")

    def launches(self, p: AvgPoolBwdProblem, c: Config) -> tuple[Launch, ...]:
        items = p.N * p.C * p.H * cdiv(p.W, c["WPT"])
        grid = (cdiv(items, c["THREADS"] * c["IPT"]), 1, 1)
        return (Launch("avgpool_bwd", grid, (c["THREADS"], 1, 1), 0, ("dy", "dx")),)


WINDOW_GATHER = Formulation(NAME, (WindowGatherFwd(), WindowGatherBwd()))
