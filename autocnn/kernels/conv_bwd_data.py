"""conv_bwd_data: the gradient with respect to the convolution's input.

The outputs are split into stride phases (kernels/geometry.py: stride_phases), each a dense stride-1
correlation of dY with a flipped sub-filter, with no work on the "holes". Every formulation
(formulations/: "direct" tiling, "igemm" implicit GEMM, and "gather" for few input channels) runs
the phases as blocks of one launch; the op template defines them for all.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Sequence

from autocnn.kernels.geometry import StridePhase, stride_phases
from autocnn.kernels.operation import Operation
from autocnn.kernels.problem import ConvBwdDataProblem
from autocnn.precision import KernelTypes


class ConvBwdData(Operation):
    name = "conv_bwd_data"
    family = "conv_bwd_data"
    problem_type = ConvBwdDataProblem
    inputs = ("dy", "w")
    outputs = ("dx",)

    def default_candidates(self, problem: ConvBwdDataProblem) -> Sequence[dict[str, Any]]:
        if problem.depthwise:
            # depthwise's direct kernels first (one channel a filter leaves a GEMM no channels to
            # reduce over); igemm's GEMM per group, which serves them too, follows.
            return self.candidates(problem, "depthwise") + self.candidates_besides(problem, ("depthwise",))
        # Per stride phase the direct core is dense; it won on strided, large-filter and few-channel
        # shapes on an H200, the GEMM core on wide stride-1 layers.
        direct = self.candidates(problem, "direct")
        gemm = self.candidates(problem, "igemm")
        gather = self.candidates(problem, "gather")
        prefer_direct = problem.C <= 32 or max(problem.stride) > 1 or problem.R >= 7
        ordered = direct + gemm if prefer_direct else gemm[:-1] + direct + gemm[-1:]
        others = self.candidates_besides(problem, ("direct", "igemm", "gather"))
        # The gather's default beat the others' on an H200 on small maps with few channels and
        # at most 25 taps a phase (1.3-7x: LeNet, chellapilla06, convnet18's late layers), and lost
        # on large maps (scherer10) and large filters (kriz09).
        if problem.precision.sixteen_bit:
            # 16-bit operands go to the tensor cores as stored (tc's m16n8k16); the SIMT cores follow.
            tc = self.candidates(problem, "tc")
            return tc + ordered + gather + [c for c in others if c not in tc]
        taps = max(ph.Ra * ph.Sb for ph in stride_phases(problem))
        if problem.C <= 32 and taps <= 25 and problem.H * problem.W <= 32 * 32:
            return gather + ordered + others
        return ordered + gather + others

    def _problem_context(self, problem: ConvBwdDataProblem) -> dict[str, Any]:
        return {"phases": [asdict(ph) for ph in stride_phases(problem)]}

    def _codegen_helpers(self) -> tuple:
        return (stride_phases, StridePhase)

    def flops(self, p: ConvBwdDataProblem) -> int:
        return 2 * p.macs

    def min_bytes(self, p: ConvBwdDataProblem) -> int:
        t = KernelTypes.of(p.precision)
        return (t.dy.size * p.N * p.K * p.P * p.Q + t.w.size * p.K * (p.C // p.groups) * p.R * p.S
                + t.dx.size * p.N * p.C * p.H * p.W)
