"""conv_fwd: the forward convolution with fused bias and activation.

Its formulations (formulations/): "direct" (tiled correlation, several filters per block, register
windows) and "igemm" (implicit GEMM: M = N*P*Q output pixels, N = K filters, reduction over C*R*S).
"""
from __future__ import annotations

from typing import Any, Sequence

from autocnn.kernels.operation import Operation
from autocnn.kernels.problem import ACTIVATIONS, ConvFwdProblem
from autocnn.precision import KernelTypes


class ConvFwd(Operation):
    name = "conv_fwd"
    family = "conv_fwd"
    problem_type = ConvFwdProblem
    inputs = ("x", "w", "bias")
    outputs = ("y",)

    def default_candidates(self, problem: ConvFwdProblem) -> Sequence[dict[str, Any]]:
        if problem.depthwise:
            # depthwise's direct kernels first (one channel a filter leaves a GEMM no channels to
            # reduce over); igemm's GEMM per group, which serves them too, follows.
            return self.candidates(problem, "depthwise") + self.candidates_besides(problem, ("depthwise",))
        # Few input channels make a short GEMM reduction, where the direct core's reuse of staged
        # input across filters wins (measured on an H200: scherer10_l1, convnet18_c1, chellapilla06_c1).
        direct = self.candidates(problem, "direct")
        gemm = self.candidates(problem, "igemm")
        ordered = direct + gemm if problem.C <= 4 else gemm[:-1] + direct + gemm[-1:]
        if problem.precision.sixteen_bit:
            # 16-bit operands go to the tensor cores as stored (tc's m16n8k16); the SIMT cores follow.
            return self.candidates(problem, "tc") + ordered + self.candidates_besides(problem, ("direct", "igemm", "tc"))
        return ordered + self.candidates_besides(problem, ("direct", "igemm"))

    def _problem_context(self, problem: ConvFwdProblem) -> dict[str, Any]:
        return {"act_code": ACTIVATIONS.index(problem.activation)}

    def _codegen_helpers(self) -> tuple:
        return (ACTIVATIONS,)

    def flops(self, p: ConvFwdProblem) -> int:
        return 2 * p.macs

    def min_bytes(self, p: ConvFwdProblem) -> int:
        t = KernelTypes.of(p.precision)
        # The filters hold C/groups channels each.
        return (t.x.size * p.N * p.C * p.H * p.W
                + t.w.size * (p.K * (p.C // p.groups) * p.R * p.S + (p.K if p.bias else 0))
                + t.y.size * p.N * p.K * p.P * p.Q)
