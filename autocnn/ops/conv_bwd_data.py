"""conv_bwd_data: the gradient with respect to the convolution's input.

The outputs are split into stride phases (a, b) = ((h + pad_top) % SH, (w + pad_left) % SW); in each
phase the contributing taps are r = a + SH*j, so the strided gather becomes a dense stride-1
correlation of dY with a flipped sub-filter, with no work on the "holes". Both cores (direct and
implicit GEMM) run the phases as blocks of one launch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from ..device import DeviceLimits
from ..space import Config, Param, SearchSpace
from .base import Launch, Operation, cdiv
from .conv_fwd import IGEMM_BK, IGEMM_BM, IGEMM_BN, unroll_context
from .problem import ConvBwdDataProblem
from .tiling import (FORMULATION_DIRECT, FORMULATION_IGEMM, CorrelationEnvelope, GemmEnvelope,
                     direct_constraints, direct_default_candidates, direct_params, direct_smem_bytes,
                     igemm_constraints, igemm_default_candidates, igemm_params, igemm_smem_bytes)


@dataclass(frozen=True)
class StridePhase:
    a: int      # (h + pad_top) mod SH of this phase's outputs
    b: int
    Ha: int     # outputs of the phase along h: h = a - PT + SH*(ilo + i), 0 <= i < Ha
    Wb: int
    ilo: int
    jlo: int
    Ra: int     # filter taps of the phase along r: r = a + SH*j, 0 <= j < Ra (0: the gradient is zero)
    Sb: int


def stride_phases(p: ConvBwdDataProblem) -> list[StridePhase]:
    sh, sw = p.stride
    pt, pl = p.padding[0], p.padding[1]
    phases = []
    for a in range(sh):
        ilo = -((a - pt) // sh)                 # ceil((pt - a) / sh): the first output row >= 0
        ihi = (p.H - 1 - a + pt) // sh
        ha = ihi - ilo + 1
        ra = -(-(p.R - a) // sh) if a < p.R else 0
        for b in range(sw):
            jlo = -((b - pl) // sw)
            jhi = (p.W - 1 - b + pl) // sw
            wb = jhi - jlo + 1
            sb = -(-(p.S - b) // sw) if b < p.S else 0
            if ha > 0 and wb > 0:
                phases.append(StridePhase(a, b, ha, wb, ilo, jlo, ra, sb))
    return phases


def correlation_envelope(p: ConvBwdDataProblem, phases: list[StridePhase]) -> CorrelationEnvelope:
    return CorrelationEnvelope(CI=p.K, CO=p.C, OH=max(ph.Ha for ph in phases), OW=max(ph.Wb for ph in phases),
                               R=max(1, max(ph.Ra for ph in phases)), S=max(1, max(ph.Sb for ph in phases)),
                               STH=1, STW=1, grid_z=p.N * len(phases))


def gemm_envelope(p: ConvBwdDataProblem, phases: list[StridePhase]) -> GemmEnvelope:
    return GemmEnvelope(GM=max(p.N * ph.Ha * ph.Wb for ph in phases), GN=p.C,
                        GK=max(1, max(p.K * ph.Ra * ph.Sb for ph in phases)), grid_z=len(phases))


class ConvBwdData(Operation):
    name = "conv_bwd_data"
    family = "conv_bwd_data"
    problem_type = ConvBwdDataProblem
    inputs = ("dy", "w")
    outputs = ("dx",)

    def space(self, problem: ConvBwdDataProblem, limits: DeviceLimits) -> SearchSpace:
        self.check_problem(problem)
        phases = stride_phases(problem)
        direct = ("formulation", (FORMULATION_DIRECT,))
        igemm = ("formulation", (FORMULATION_IGEMM,))
        params = [Param("formulation", (FORMULATION_DIRECT, FORMULATION_IGEMM),
                        "direct tiled correlation or implicit GEMM, per stride phase")]
        params += direct_params(correlation_envelope(problem, phases), direct)
        params += igemm_params(IGEMM_BM, IGEMM_BN, IGEMM_BK, gemm_envelope(problem, phases), igemm)
        constraints = direct_constraints(correlation_envelope(problem, phases), limits)
        constraints += igemm_constraints(gemm_envelope(problem, phases), limits, min_bm=32, min_bn=16, min_bk=4)
        return SearchSpace(self.name, params, constraints)

    def default_candidates(self, problem: ConvBwdDataProblem) -> Sequence[dict[str, Any]]:
        # Per stride phase the direct core is dense; it won on strided, large-filter and few-channel
        # shapes on an H200, the GEMM core on wide stride-1 layers.
        phases = stride_phases(problem)
        direct = direct_default_candidates(correlation_envelope(problem, phases))
        gemm = igemm_default_candidates(gemm_envelope(problem, phases), pad_b=0)
        prefer_direct = problem.C <= 32 or max(problem.stride) > 1 or problem.R >= 7
        return direct + gemm if prefer_direct else gemm[:-1] + direct + gemm[-1:]

    def _context(self, problem: ConvBwdDataProblem, config: Config) -> dict[str, Any]:
        return {"phases": [asdict(ph) for ph in stride_phases(problem)], **unroll_context(config)}

    def _launches(self, p: ConvBwdDataProblem, c: Config) -> tuple[Launch, ...]:
        phases = stride_phases(p)
        args = ("dy", "w", "dx")
        if c["formulation"] == FORMULATION_DIRECT:
            env = correlation_envelope(p, phases)
            tiles = max(cdiv(ph.Ha, c["TP"]) * cdiv(ph.Wb, c["TQ"]) for ph in phases)
            threads = (c["KB"] // c["KPT"]) * (c["TP"] // c["PPT"]) * (c["TQ"] // c["QPT"])
            smem = direct_smem_bytes(env, c["KB"], c["TP"], c["TQ"], c["CB"], c["PAD"])
            grid = (tiles, cdiv(p.C, c["KB"]), p.N * len(phases))
            return (Launch("conv_bwd_data", grid, (threads, 1, 1), smem, args),)
        threads = (c["BM"] // c["TM"]) * (c["BN"] // c["TN"])
        smem = igemm_smem_bytes(c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (max(cdiv(p.N * ph.Ha * ph.Wb, c["BM"]) for ph in phases), cdiv(p.C, c["BN"]), len(phases))
        return (Launch("conv_bwd_data", grid, (threads, 1, 1), smem, args),)

    def _codegen_helpers(self) -> tuple:
        return (stride_phases, StridePhase, correlation_envelope, CorrelationEnvelope, unroll_context,
                direct_smem_bytes, igemm_smem_bytes)

    def flops(self, p: ConvBwdDataProblem) -> int:
        return 2 * p.macs

    def min_bytes(self, p: ConvBwdDataProblem) -> int:
        return 4 * (p.N * p.K * p.P * p.Q + p.K * p.C * p.R * p.S + p.N * p.C * p.H * p.W)
