"""conv_fwd: the forward convolution with fused bias and activation.

Two formulations: "direct" (tiled correlation, several filters per block, register windows) and
"igemm" (implicit GEMM: M = N*P*Q output pixels, N = K filters, reduction over C*R*S).
"""
from __future__ import annotations

from typing import Any, Sequence

from autocnn.device import DeviceLimits
from autocnn.kernels.space import Config, Param, SearchSpace
from autocnn.kernels.operation import Launch, Operation, cdiv
from autocnn.kernels.problem import ACTIVATIONS, ConvFwdProblem
from autocnn.kernels.tiling import (FORMULATION_DIRECT, FORMULATION_IGEMM, CorrelationEnvelope, GemmEnvelope,
                     direct_constraints, direct_default_candidates, direct_params, direct_smem_bytes,
                     igemm_constraints, igemm_default_candidates, igemm_params, igemm_smem_bytes)

IGEMM_BM = (32, 64, 128, 256)
IGEMM_BN = (16, 32, 64, 128)
IGEMM_BK = (4, 8, 16, 32)


def correlation_envelope(p: ConvFwdProblem) -> CorrelationEnvelope:
    return CorrelationEnvelope(CI=p.C, CO=p.K, OH=p.P, OW=p.Q, R=p.R, S=p.S, STH=p.stride[0],
                               STW=p.stride[1], grid_z=p.N)


def gemm_envelope(p: ConvFwdProblem) -> GemmEnvelope:
    return GemmEnvelope(GM=p.N * p.P * p.Q, GN=p.K, GK=p.C * p.R * p.S)


class ConvFwd(Operation):
    name = "conv_fwd"
    family = "conv_fwd"
    problem_type = ConvFwdProblem
    inputs = ("x", "w", "bias")
    outputs = ("y",)

    def space(self, problem: ConvFwdProblem, limits: DeviceLimits) -> SearchSpace:
        self.check_problem(problem)
        direct = ("formulation", (FORMULATION_DIRECT,))
        igemm = ("formulation", (FORMULATION_IGEMM,))
        params = [Param("formulation", (FORMULATION_DIRECT, FORMULATION_IGEMM),
                        "direct tiled correlation or implicit GEMM")]
        params += direct_params(correlation_envelope(problem), direct)
        params += igemm_params(IGEMM_BM, IGEMM_BN, IGEMM_BK, gemm_envelope(problem), igemm)
        constraints = direct_constraints(correlation_envelope(problem), limits)
        constraints += igemm_constraints(gemm_envelope(problem), limits, min_bm=32, min_bn=16, min_bk=4)
        return SearchSpace(self.name, params, constraints)

    def default_candidates(self, problem: ConvFwdProblem) -> Sequence[dict[str, Any]]:
        # Few input channels make a short GEMM reduction, where the direct core's reuse of staged
        # input across filters wins (measured on an H200: scherer10_l1, convnet18_c1, chellapilla06_c1).
        direct = direct_default_candidates(correlation_envelope(problem))
        gemm = igemm_default_candidates(gemm_envelope(problem), pad_b=4)
        return direct + gemm if problem.C <= 4 else gemm[:-1] + direct + gemm[-1:]

    def _context(self, problem: ConvFwdProblem, config: Config) -> dict[str, Any]:
        return {"act_code": ACTIVATIONS.index(problem.activation), **unroll_context(config)}

    def _launches(self, p: ConvFwdProblem, c: Config) -> tuple[Launch, ...]:
        args = ("x", "w", "bias", "y")
        if c["formulation"] == FORMULATION_DIRECT:
            tiles = cdiv(p.P, c["TP"]) * cdiv(p.Q, c["TQ"])
            threads = (c["KB"] // c["KPT"]) * (c["TP"] // c["PPT"]) * (c["TQ"] // c["QPT"])
            smem = direct_smem_bytes(correlation_envelope(p), c["KB"], c["TP"], c["TQ"], c["CB"], c["PAD"])
            return (Launch("conv_fwd", (tiles, cdiv(p.K, c["KB"]), p.N), (threads, 1, 1), smem, args),)
        threads = (c["BM"] // c["TM"]) * (c["BN"] // c["TN"])
        smem = igemm_smem_bytes(c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (cdiv(p.N * p.P * p.Q, c["BM"]), cdiv(p.K, c["BN"]), 1)
        return (Launch("conv_fwd", grid, (threads, 1, 1), smem, args),)

    def _codegen_helpers(self) -> tuple:
        return (ACTIVATIONS, unroll_context, direct_smem_bytes, igemm_smem_bytes, correlation_envelope,
                CorrelationEnvelope)

    def flops(self, p: ConvFwdProblem) -> int:
        return 2 * p.macs

    def min_bytes(self, p: ConvFwdProblem) -> int:
        n = p.N * p.C * p.H * p.W + p.K * p.C * p.R * p.S + p.N * p.K * p.P * p.Q
        return 4 * (n + (p.K if p.bias else 0))


def unroll_context(config: Config) -> dict[str, str]:
    """Unroll parameters as pragma arguments: 0 renders as a complete unroll."""
    out = {}
    for name in ("UNROLL_R", "UNROLL_K"):
        if name in config:
            v = config[name]
            out[name] = "" if v == 0 else str(v)
    out["UNROLL_C"] = "1"
    return out
