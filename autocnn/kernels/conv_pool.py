"""Convolution fused with averaging (Mamalet et al.'s fusion, cited by seed 002).

conv_pool_fwd: y = avgpool(act(conv(x, w) + b)) in one kernel, without the full-size
intermediate; with ``keep_activation`` (training) it also writes a = act(conv(x, w) + b), which
the backward needs. Its formulations: "igemm_pool" (the implicit-GEMM core with a pooling
epilogue; any window) and "direct_pool" (the direct core; windows that do not overlap, strides
that divide its tiles).

The backward is split, not fused into the convolutions: conv_pool_dz forms
dZ = act'(a) * supersample(dy_pooled) in one memory-bound pass (supersampling and the activation
gradient fused), and the existing conv_bwd_data and conv_wgrad (every formulation, tuned records
and all) take dZ as their dY. Why: dZ feeds two convolutions, so forming it inside each of them
would read ``a`` and gather the pooled gradient twice, and again for every reuse of an element in
their operand loads; only the implicit GEMM's operand gathers could form it at all (the direct,
Winograd, tensor-core, gather and rows kernels read a plain tensor), so a fused pair would give up
the backward convolutions' other formulations and their records. Against the unfused pair
(avgpool_bwd, then the activation gradient) it saves a launch and two of four full-size passes.

The problem types, and the seed and odd problems, are in kernels/conv_pool_problems.py; the
operations compose the formulations kernels/registry.py gives them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from autocnn.kernels.conv_fwd import ConvFwd
from autocnn.kernels.conv_pool_problems import ConvPoolDzProblem, ConvPoolFwdProblem
from autocnn.kernels.operation import Operation
from autocnn.kernels.problem import ACTIVATIONS
from autocnn.precision import KernelTypes, precision_of


class ConvPoolFwd(ConvFwd):
    """conv_pool_fwd: conv_fwd's op template (constants, activation) with a pooling epilogue."""

    name = "conv_pool_fwd"
    family = "conv_pool_fwd"
    problem_type = ConvPoolFwdProblem
    inputs = ("x", "w", "bias")
    outputs = ("y", "a")
    # The op template includes conv_fwd's; the formulations include the pooling epilogue.
    shared_templates = ("_common.cuh.j2", "_common_elements.cuh.j2", "_problem_constants.cuh.j2", "conv_fwd.cu.j2",
                        "_conv_pool.cuh.j2", "_pool_window.cuh.j2")

    def default_candidates(self, problem: ConvPoolFwdProblem) -> Sequence[dict[str, Any]]:
        # As conv_fwd: the direct core for few input channels, the GEMM core otherwise; the GEMM's
        # last candidate fits every problem (the direct core does not serve overlapping windows).
        direct = self.candidates(problem, "direct_pool")
        gemm = self.candidates(problem, "igemm_pool")
        return direct + gemm if problem.C <= 4 else gemm[:-1] + direct + gemm[-1:]

    def plan(self, problem: ConvPoolFwdProblem, config):
        plan = super().plan(problem, config)
        return dataclasses.replace(plan, outputs=tuple(problem.output_shapes()))

    def flops(self, p: ConvPoolFwdProblem) -> int:
        return 2 * p.macs + p.N * p.K * p.PP * p.QQ * p.pool_window[0] * p.pool_window[1]

    def min_bytes(self, p: ConvPoolFwdProblem) -> int:
        t = KernelTypes.of(p.precision)   # the kept activation is the convolution's output
        return (t.x.size * p.N * p.C * p.H * p.W + t.w.size * (p.K * p.C * p.R * p.S + (p.K if p.bias else 0))
                + t.y.size * (p.N * p.K * p.PP * p.QQ + (p.N * p.K * p.P * p.Q if p.keep_activation else 0)))


class ConvPoolDz(Operation):
    """conv_pool_dz: supersampling and the activation gradient in one gather per position."""

    name = "conv_pool_dz"
    family = "conv_pool_dz"
    problem_type = ConvPoolDzProblem
    inputs = ("dy", "a")
    outputs = ("dz",)
    shared_templates = ("_common.cuh.j2", "_common_elements.cuh.j2", "_problem_constants.cuh.j2", "avgpool_bwd.cu.j2",
                        "_pool_window.cuh.j2")

    def _problem_context(self, problem: ConvPoolDzProblem) -> dict[str, Any]:
        return {"act_code": ACTIVATIONS.index(problem.activation)}

    def _codegen_helpers(self) -> tuple:
        return (ACTIVATIONS,)

    def flops(self, p: ConvPoolDzProblem) -> int:
        return p.N * p.C * p.P * p.Q * p.window[0] * p.window[1] + 3 * p.N * p.C * p.H * p.W

    def min_bytes(self, p: ConvPoolDzProblem) -> int:
        t = KernelTypes.of(precision_of(p))   # dY of the pooled map, the activation, dZ
        full = p.N * p.C * p.H * p.W
        return t.dy.size * p.N * p.C * p.P * p.Q + (t.y.size if p.activation != "none" else 0) * full + t.dy.size * full
