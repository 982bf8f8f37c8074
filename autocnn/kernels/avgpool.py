"""avgpool_fwd (averaging) and avgpool_bwd (supersampling): memory-bound gathers.

Both are judged by bandwidth, so the parameters are about bytes in flight: threads per block,
outputs per thread along a row, items per thread, and vector width where alignment is provable.
"""
from __future__ import annotations

from typing import Any, Sequence

from autocnn.device import DeviceLimits
from autocnn.kernels.space import Config, Constraint, Param, SearchSpace
from autocnn.kernels.operation import GRID_X_LIMIT, Launch, Operation, cdiv, next_pow2, threads_rule
from autocnn.kernels.problem import AvgPoolBwdProblem, AvgPoolFwdProblem

THREADS = (64, 128, 256, 512)
ITEMS = (1, 2, 4)


def _pool_flops(p) -> int:
    return p.N * p.C * p.P * p.Q * p.window[0] * p.window[1]


def _pool_bytes(p) -> int:
    return 4 * (p.N * p.C * p.H * p.W + p.N * p.C * p.P * p.Q)


class AvgPoolFwd(Operation):
    name = "avgpool_fwd"
    family = "avgpool_fwd"
    problem_type = AvgPoolFwdProblem
    inputs = ("x",)
    outputs = ("y",)

    def space(self, problem: AvgPoolFwdProblem, limits: DeviceLimits) -> SearchSpace:
        self.check_problem(problem)
        p = problem
        sw, kw = p.stride[1], p.window[1]
        # Vector loads need an unpadded row whose length the width divides; where that fails for
        # every config, the width is not offered at all (otherwise most proposals are infeasible).
        vecs = tuple(v for v in (1, 2, 4) if v == 1 or (not any(p.padding) and p.W % v == 0))
        params = [
            Param("THREADS", THREADS, "threads per block"),
            Param("QPT", (1, 2, 4, 8), "consecutive outputs of a row per thread"),
            Param("IPT", ITEMS, "items per thread"),
            Param("VEC", vecs, "vector width of input loads"),
        ]

        def vector_ok(qpt, vec):
            if vec == 1:
                return None
            span = (qpt - 1) * sw + kw
            if any(p.padding):
                return "vector loads need a problem without padding"
            if p.W % vec or (qpt * sw) % vec or span % vec or p.Q % qpt:
                return f"VEC={vec} loads would be misaligned for this row layout"
            return None

        constraints = [
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
        return SearchSpace(self.name, params, constraints)

    def default_candidates(self, problem: AvgPoolFwdProblem) -> Sequence[dict[str, Any]]:
        return [
            {"THREADS": 256, "QPT": 4, "IPT": 1, "VEC": 4},
            {"THREADS": 256, "QPT": 2, "IPT": 1, "VEC": 2},
            {"THREADS": 256, "QPT": 1, "IPT": 1, "VEC": 1},
        ]

    def _launches(self, p: AvgPoolFwdProblem, c: Config) -> tuple[Launch, ...]:
        items = p.N * p.C * p.P * cdiv(p.Q, c["QPT"])
        grid = (cdiv(items, c["THREADS"] * c["IPT"]), 1, 1)
        return (Launch("avgpool_fwd", grid, (c["THREADS"], 1, 1), 0, ("x", "y")),)

    def flops(self, p: AvgPoolFwdProblem) -> int:
        return _pool_flops(p)

    def min_bytes(self, p: AvgPoolFwdProblem) -> int:
        return _pool_bytes(p)


class AvgPoolBwd(Operation):
    name = "avgpool_bwd"
    family = "avgpool_bwd"
    problem_type = AvgPoolBwdProblem
    inputs = ("dy",)
    outputs = ("dx",)

    def space(self, problem: AvgPoolBwdProblem, limits: DeviceLimits) -> SearchSpace:
        self.check_problem(problem)
        p = problem
        params = [
            Param("THREADS", THREADS, "threads per block"),
            Param("WPT", (1, 2, 4, 8), "consecutive input-gradient values of a row per thread"),
            Param("IPT", ITEMS, "items per thread"),
        ]
        constraints = [
            threads_rule(limits, ("THREADS",), lambda t: t),
            Constraint(("WPT",), lambda w: None if w <= max(1, next_pow2(p.W))
                       else f"WPT={w} exceeds the {p.W} values of a row"),
            Constraint(("THREADS", "WPT", "IPT"),
                       lambda t, w, i: None if cdiv(p.N * p.C * p.H * cdiv(p.W, w), t * i) <= GRID_X_LIMIT
                       else "too many blocks"),
        ]
        return SearchSpace(self.name, params, constraints)

    def default_candidates(self, problem: AvgPoolBwdProblem) -> Sequence[dict[str, Any]]:
        return [
            {"THREADS": 256, "WPT": 4, "IPT": 1},
            {"THREADS": 256, "WPT": 2, "IPT": 1},
            {"THREADS": 256, "WPT": 1, "IPT": 1},
        ]

    def _launches(self, p: AvgPoolBwdProblem, c: Config) -> tuple[Launch, ...]:
        items = p.N * p.C * p.H * cdiv(p.W, c["WPT"])
        grid = (cdiv(items, c["THREADS"] * c["IPT"]), 1, 1)
        return (Launch("avgpool_bwd", grid, (c["THREADS"], 1, 1), 0, ("dy", "dx")),)

    def flops(self, p: AvgPoolBwdProblem) -> int:
        return _pool_flops(p)

    def min_bytes(self, p: AvgPoolBwdProblem) -> int:
        return _pool_bytes(p)
