"""conv_wgrad: weight (and bias) gradients, a reduction over N*P*Q terms per weight.

Its formulations (formulations/): the implicit GEMM (M = K, N = C*R*S) whose reduction is split
over SPLITK blocks, its partial sums combined by "atomic" or "two_pass" (the config's formulation
names which), "rows", direct over staged output rows for few filter weights, and "tc_rows", the same
staging with the products on tensor cores (after the others in the registry; see tc_rows.py).
"""
from __future__ import annotations

from typing import Any, Sequence

from autocnn.kernels.operation import Operation
from autocnn.kernels.problem import ConvWgradProblem
from autocnn.precision import KernelTypes


class ConvWgrad(Operation):
    name = "conv_wgrad"
    family = "conv_wgrad"
    problem_type = ConvWgradProblem
    inputs = ("x", "dy")
    outputs = ("dw", "db")

    def default_candidates(self, problem: ConvWgradProblem) -> Sequence[dict[str, Any]]:
        """The formulations in registration order (the GEMM's split-K candidates, then the rows
        formulation's); for 16-bit tensors tc's first, whose m16n8k16 mmas take them as stored (the
        SIMT GEMM follows); for a depthwise problem, depthwise's first."""
        if problem.depthwise:
            # depthwise's direct kernels first (one channel a filter leaves a GEMM no channels to
            # reduce over); igemm's GEMM per group, which serves them too, follows.
            return self.candidates(problem, "depthwise") + self.candidates_besides(problem, ("depthwise",))
        if problem.precision.sixteen_bit:
            return self.candidates(problem, "tc") + self.candidates_besides(problem, ("tc",))
        return super().default_candidates(problem)

    def flops(self, p: ConvWgradProblem) -> int:
        return 2 * p.macs

    def min_bytes(self, p: ConvWgradProblem) -> int:
        t = KernelTypes.of(p.precision)
        return (t.x.size * p.N * p.C * p.H * p.W + t.dy.size * p.N * p.K * p.P * p.Q
                + t.dw.size * (p.K * (p.C // p.groups) * p.R * p.S + (p.K if p.bias else 0)))   # C/groups a filter
