"""avgpool_fwd (averaging) and avgpool_bwd (supersampling): the problems' operations.

Each has one formulation, formulations/window_gather/ (so their configs name none).
"""
from __future__ import annotations

from autocnn.kernels.operation import Operation
from autocnn.kernels.problem import AvgPoolBwdProblem, AvgPoolFwdProblem
from autocnn.precision import KernelTypes, precision_of


def _pool_flops(p) -> int:
    return p.N * p.C * p.P * p.Q * p.window[0] * p.window[1]


def _pool_bytes(p) -> int:
    t = KernelTypes.of(precision_of(p))   # x and y (dy and dx: stored alike)
    return t.x.size * p.N * p.C * p.H * p.W + t.y.size * p.N * p.C * p.P * p.Q


class AvgPoolFwd(Operation):
    name = "avgpool_fwd"
    family = "avgpool_fwd"
    problem_type = AvgPoolFwdProblem
    inputs = ("x",)
    outputs = ("y",)

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

    def flops(self, p: AvgPoolBwdProblem) -> int:
        return _pool_flops(p)

    def min_bytes(self, p: AvgPoolBwdProblem) -> int:
        return _pool_bytes(p)
