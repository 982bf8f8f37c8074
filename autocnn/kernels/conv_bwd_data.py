"""conv_bwd_data: the gradient with respect to the convolution's input.

The outputs are split into stride phases (a, b) = ((h + pad_top) % SH, (w + pad_left) % SW); in each
phase the contributing taps are r = a + SH*j, so the strided gather becomes a dense stride-1
correlation of dY with a flipped sub-filter, with no work on the "holes". Every formulation runs
the phases as blocks of one launch: the two shared cores (direct tiling, implicit GEMM) and
"gather", this family's own, for few input channels: a thread per output position with all of
the block's channels in registers, dY read through the L1 cache, the reduction over K split among
thread groups of the block.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from autocnn.device import DeviceLimits
from autocnn.kernels.space import Config, Constraint, Param, SearchSpace
from autocnn.kernels.operation import GRID_YZ_LIMIT, Launch, Operation, cdiv, next_pow2, smem_rule, threads_rule
from autocnn.kernels.conv_fwd import IGEMM_BK, IGEMM_BM, IGEMM_BN, unroll_context
from autocnn.kernels.problem import ConvBwdDataProblem
from autocnn.kernels.tiling import (FORMULATION_DIRECT, FORMULATION_IGEMM, CorrelationEnvelope, GemmEnvelope,
                     direct_constraints, direct_default_candidates, direct_params, direct_smem_bytes,
                     igemm_constraints, igemm_default_candidates, igemm_params, igemm_smem_bytes)


FORMULATION_GATHER = "gather"


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


def gather_envelope(p: ConvBwdDataProblem, phases: list[StridePhase]) -> tuple[int, int]:
    """(the most output positions of a phase, the most filter taps of a phase)."""
    return max(p.N * ph.Ha * ph.Wb for ph in phases), max(ph.Ra * ph.Sb for ph in phases)


def gather_smem_bytes(taps: int, POS: int, CPB: int, KSPLIT: int, KSTAGE: int) -> int:
    # The staged filter channels, and later (the same memory) the groups' partial sums.
    return 4 * max(KSTAGE * taps * CPB, POS * CPB * KSPLIT if KSPLIT > 1 else 0)


def gather_params(p: ConvBwdDataProblem, positions: int) -> list[Param]:
    cond = (("formulation", (FORMULATION_GATHER,)),)
    pos = tuple(v for v in (32, 64, 128, 256) if v <= max(32, next_pow2(positions)))
    # Powers of two, and C itself when it is small and not one: C = 5 should not pay for 8.
    cpb = sorted({v for v in (1, 2, 4, 8, 16) if v <= max(1, next_pow2(p.C))} | ({p.C} if p.C <= 16 else set()))
    kstage = tuple(v for v in (4, 8, 16, 32) if v <= max(4, next_pow2(p.K)))
    return [
        Param("POS", pos, "output positions per block (one per thread of a group)", cond),
        Param("CPB", tuple(cpb), "input-gradient channels per block, all held by each thread", cond),
        Param("KSPLIT", (1, 2, 4, 8), "thread groups sharing the reduction over K", cond),
        Param("KSTAGE", kstage, "filter channels (of K) staged in shared memory per step", cond),
        Param("UNROLL_KS", (1, 2, 4), "unrolling of the loop over staged channels", cond),
    ]


def gather_constraints(p: ConvBwdDataProblem, phases: list[StridePhase], limits: DeviceLimits) -> list[Constraint]:
    positions, taps = gather_envelope(p, phases)
    rows = max(ph.Ra for ph in phases)
    cols = max(ph.Sb for ph in phases)
    return [
        # A thread keeps which filter rows and columns of its phase exist as 32-bit masks.
        Constraint(("formulation",), lambda f: None if f != FORMULATION_GATHER or (rows <= 32 and cols <= 32)
                   else f"the gather handles at most 32 filter rows and columns a stride phase, not {rows}x{cols}"),
        threads_rule(limits, ("POS", "KSPLIT"), lambda pos, ks: pos * ks),
        Constraint(("KSPLIT", "KSTAGE"), lambda ks, st: None if st % ks == 0
                   else f"KSPLIT={ks} does not divide KSTAGE={st}"),
        Constraint(("KSPLIT", "KSTAGE", "UNROLL_KS"), lambda ks, st, u: None if u <= st // ks
                   else f"UNROLL_KS={u} exceeds the {st // ks} staged channels of a group"),
        Constraint(("KSPLIT",), lambda ks: None if ks <= max(1, next_pow2(p.K))
                   else f"KSPLIT={ks} exceeds the {p.K} channels of the reduction"),
        Constraint(("CPB", "UNROLL_KS"), lambda cpb, u: None if u * taps * cpb <= 8192
                   else "the unrolled loop body exceeds 8192 multiply-adds (code size)"),
        Constraint(("CPB",), lambda cpb: None if cdiv(p.C, cpb) <= GRID_YZ_LIMIT
                   else f"{cdiv(p.C, cpb)} blocks along y exceed {GRID_YZ_LIMIT}"),
        smem_rule(limits, ("POS", "CPB", "KSPLIT", "KSTAGE"),
                  lambda pos, cpb, ks, st: gather_smem_bytes(taps, pos, cpb, ks, st)),
    ]


def gather_default_candidates(p: ConvBwdDataProblem) -> list[dict[str, Any]]:
    cpb = p.C if p.C <= 16 else 16
    split = 4 if p.K >= 16 else 1
    return [{"formulation": FORMULATION_GATHER, "POS": 64, "CPB": cpb, "KSPLIT": split, "KSTAGE": 16,
             "UNROLL_KS": 1},
            {"formulation": FORMULATION_GATHER, "POS": 32, "CPB": min(cpb, 4), "KSPLIT": 1, "KSTAGE": 4,
             "UNROLL_KS": 1}]


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
        params = [Param("formulation", (FORMULATION_DIRECT, FORMULATION_IGEMM, FORMULATION_GATHER),
                        "direct tiled correlation, implicit GEMM, or a gather per output position; per stride phase")]
        params += direct_params(correlation_envelope(problem, phases), direct)
        params += igemm_params(IGEMM_BM, IGEMM_BN, IGEMM_BK, gemm_envelope(problem, phases), igemm)
        params += gather_params(problem, gather_envelope(problem, phases)[0])
        constraints = direct_constraints(correlation_envelope(problem, phases), limits)
        constraints += igemm_constraints(gemm_envelope(problem, phases), limits, min_bm=32, min_bn=16, min_bk=4)
        constraints += gather_constraints(problem, phases, limits)
        return SearchSpace(self.name, params, constraints)

    def default_candidates(self, problem: ConvBwdDataProblem) -> Sequence[dict[str, Any]]:
        # Per stride phase the direct core is dense; it won on strided, large-filter and few-channel
        # shapes on an H200, the GEMM core on wide stride-1 layers.
        phases = stride_phases(problem)
        direct = direct_default_candidates(correlation_envelope(problem, phases))
        gemm = igemm_default_candidates(gemm_envelope(problem, phases), pad_b=0)
        prefer_direct = problem.C <= 32 or max(problem.stride) > 1 or problem.R >= 7
        ordered = direct + gemm if prefer_direct else gemm[:-1] + direct + gemm[-1:]
        # The gather's default beat the others' on an H200 on small maps with few channels and
        # at most 25 taps a phase (1.3-7x: LeNet, chellapilla06, convnet18's late layers), and lost
        # on large maps (scherer10) and large filters (kriz09).
        _, taps = gather_envelope(problem, phases)
        if problem.C <= 32 and taps <= 25 and problem.H * problem.W <= 32 * 32:
            return gather_default_candidates(problem) + ordered
        return ordered + gather_default_candidates(problem)

    def _context(self, problem: ConvBwdDataProblem, config: Config) -> dict[str, Any]:
        context = {"phases": [asdict(ph) for ph in stride_phases(problem)], **unroll_context(config)}
        if config["formulation"] == FORMULATION_GATHER:
            context["UNROLL_KS"] = str(config["UNROLL_KS"])
        return context

    def _launches(self, p: ConvBwdDataProblem, c: Config) -> tuple[Launch, ...]:
        phases = stride_phases(p)
        args = ("dy", "w", "dx")
        if c["formulation"] == FORMULATION_GATHER:
            positions, taps = gather_envelope(p, phases)
            grid = (cdiv(positions, c["POS"]), cdiv(p.C, c["CPB"]), len(phases))
            smem = gather_smem_bytes(taps, c["POS"], c["CPB"], c["KSPLIT"], c["KSTAGE"])
            return (Launch("conv_bwd_data", grid, (c["POS"] * c["KSPLIT"], 1, 1), smem, args),)
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
                direct_smem_bytes, igemm_smem_bytes, gather_envelope, gather_smem_bytes)

    def flops(self, p: ConvBwdDataProblem) -> int:
        return 2 * p.macs

    def min_bytes(self, p: ConvBwdDataProblem) -> int:
        return 4 * (p.N * p.K * p.P * p.Q + p.K * p.C * p.R * p.S + p.N * p.C * p.H * p.W)
