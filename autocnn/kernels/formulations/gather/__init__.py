"""gather: conv_bwd_data for few input channels, where tiles of the direct and GEMM cores sit mostly idle.

A thread per output position of a stride phase holds all of the block's CPB channels in registers,
so each dY value it reads (through the L1 cache) serves CPB multiply-adds; the filter taps come
through shared memory; KSPLIT thread groups of a block share the reduction over K and add their
partial sums in shared memory. The kernel is gather_conv_bwd_data.cu.j2.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Formulation, OpFormulation
from autocnn.kernels.geometry import StridePhase, cdiv, next_pow2, stride_phases
from autocnn.kernels.problem import ConvBwdDataProblem
from autocnn.kernels.rules import code_size_rule, grid_rule, sixteen_bit_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch

NAME = "gather"


def gather_envelope(p: ConvBwdDataProblem, phases: list[StridePhase]) -> tuple[int, int]:
    """(the most output positions of a phase, the most filter taps of a phase)."""
    return max(p.N * ph.Ha * ph.Wb for ph in phases), max(ph.Ra * ph.Sb for ph in phases)


def gather_smem_bytes(stage_size: int, taps: int, POS: int, CPB: int, KSPLIT: int, KSTAGE: int) -> int:
    # The staged filter channels, and later (the same memory) the groups' partial sums: both in the
    # accumulator's type (stage_size bytes an element).
    return stage_size * max(KSTAGE * taps * CPB, POS * CPB * KSPLIT if KSPLIT > 1 else 0)


class GatherConvBwdData(OpFormulation):
    formulation = NAME
    op = "conv_bwd_data"
    summary = "a gather per output position"
    templates = ("gather_conv_bwd_data.cu.j2",)

    def params(self, p: ConvBwdDataProblem) -> list[Param]:
        positions, _ = gather_envelope(p, stride_phases(p))
        pos = tuple(v for v in (32, 64, 128, 256) if v <= max(32, next_pow2(positions)))
        # Powers of two, and C itself when it is small and not one: C = 5 should not pay for 8.
        cpb = sorted({v for v in (1, 2, 4, 8, 16) if v <= max(1, next_pow2(p.C))} | ({p.C} if p.C <= 16 else set()))
        kstage = tuple(v for v in (4, 8, 16, 32) if v <= max(4, next_pow2(p.K)))
        return [
            Param("POS", pos, "output positions per block (one per thread of a group)"),
            Param("CPB", tuple(cpb), "input-gradient channels per block, all held by each thread"),
            Param("KSPLIT", (1, 2, 4, 8), "thread groups sharing the reduction over K"),
            Param("KSTAGE", kstage, "filter channels (of K) staged in shared memory per step"),
            Param("UNROLL_KS", (1, 2, 4), "unrolling of the loop over staged channels"),
        ]

    def constraints(self, p: ConvBwdDataProblem, limits: DeviceLimits) -> list[Constraint]:
        phases = stride_phases(p)
        _, taps = gather_envelope(p, phases)
        rows = max(ph.Ra for ph in phases)
        cols = max(ph.Sb for ph in phases)
        return [
            sixteen_bit_rule(p, NAME, "POS", "its kernels read and write float32 tensors only; direct, igemm and tc "
                                             "compute bf16 and fp16"),
            # A thread keeps which filter rows and columns of its phase exist as 32-bit masks.
            Constraint(("formulation",), lambda f: None if f != NAME or (rows <= 32 and cols <= 32)
                       else f"the gather handles at most 32 filter rows and columns a stride phase, not {rows}x{cols}"),
            threads_rule(limits, ("POS", "KSPLIT"), lambda pos, ks: pos * ks),
            Constraint(("KSPLIT", "KSTAGE"), lambda ks, st: None if st % ks == 0
                       else f"KSPLIT={ks} does not divide KSTAGE={st}"),
            Constraint(("KSPLIT", "KSTAGE", "UNROLL_KS"), lambda ks, st, u: None if u <= st // ks
                       else f"UNROLL_KS={u} exceeds the {st // ks} staged channels of a group"),
            Constraint(("KSPLIT",), lambda ks: None if ks <= max(1, next_pow2(p.K))
                       else f"KSPLIT={ks} exceeds the {p.K} channels of the reduction"),
            code_size_rule(("CPB", "UNROLL_KS"), lambda cpb, u: u * taps * cpb, limit=8192),
            grid_rule(("CPB",), lambda cpb: cdiv(p.C, cpb)),
            smem_rule(limits, ("POS", "CPB", "KSPLIT", "KSTAGE"),
                      lambda pos, cpb, ks, st: gather_smem_bytes(p.precision.accumulator.size, taps, pos, cpb, ks, st)),
        ]

    def default_candidates(self, p: ConvBwdDataProblem) -> list[dict[str, Any]]:
        cpb = p.C if p.C <= 16 else 16
        split = 4 if p.K >= 16 else 1
        return [{"formulation": NAME, "POS": 64, "CPB": cpb, "KSPLIT": split, "KSTAGE": 16, "UNROLL_KS": 1},
                {"formulation": NAME, "POS": 32, "CPB": min(cpb, 4), "KSPLIT": 1, "KSTAGE": 4, "UNROLL_KS": 1}]

    def context(self, problem: ConvBwdDataProblem, config: Config) -> dict[str, Any]:
        return {"UNROLL_KS": str(config["UNROLL_KS"])}

    def launches(self, p: ConvBwdDataProblem, c: Config) -> tuple[Launch, ...]:
        phases = stride_phases(p)
        positions, taps = gather_envelope(p, phases)
        grid = (cdiv(positions, c["POS"]), cdiv(p.C, c["CPB"]), len(phases))
        smem = gather_smem_bytes(p.precision.accumulator.size, taps, c["POS"], c["CPB"], c["KSPLIT"], c["KSTAGE"])
        return (Launch("conv_bwd_data", grid, (c["POS"] * c["KSPLIT"], 1, 1), smem, ("dy", "w", "dx")),)

    def code_helpers(self) -> tuple:
        return (gather_envelope, gather_smem_bytes)


GATHER = Formulation(NAME, (GatherConvBwdData(),))
