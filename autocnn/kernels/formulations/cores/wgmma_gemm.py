"""The block GEMM on Hopper's warpgroup tensor cores (wgmma_mainloop.cuh.j2, wgmma_core.cuh.j2), and
what every formulation that runs it shares: the wgmma formulation's three ops, tma's backward-data
(its stages filled by a producer warp's bulk copies) and winograd's wgmma products (its parameters
named WGMMA_*).

Each stage holds BK = 32 floats of the reduction per row of both operands (128 bytes, one row of the
128-byte swizzle), aligned to 1024 bytes; fp32 is 3xTF32 (``split``), each operand staged as its
TF32 parts and the TF32 parts of the remainders. ``block_rules`` are the block's own constraints
(Hopper, accumulator registers, stages for a group in flight, threads and shared memory), named as
the formulation that runs it names its parameters (``BlockNames``); ``WgmmaGemm`` is the base of the
ops' GEMMs: their common parameters, constraints, defaults and workspaces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, OpFormulation
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import arch_number, at_most, grid_rule, sixteen_bit_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT
from autocnn.precision import FLOAT32


FORMULATION_WGMMA = "wgmma"
ARCH = 90           # wgmma exists on sm_90a only (Blackwell has other tensor-core instructions)
BK = 32             # floats of the reduction per stage: one 128-byte swizzle row
ALIGN_SLACK = 1024  # the swizzle needs 1024-byte aligned stages; the kernel aligns its dynamic smem
TMA_PRODUCER_THREADS = 32  # the tma formulation's producer warp, beside the warpgroups


def smem_bytes(wgs: int, wbn: int, stages: int, split: bool = False, a_regs: int = 0) -> int:
    """Shared memory of a block: the stages of both operands (twice: with split, their small parts
    too, except A's where A is split in registers), and the slack that aligns them to 1024 bytes."""
    a_parts = 2 if split and not a_regs else 1
    return FLOAT32.size * stages * (64 * wgs * a_parts + wbn * (2 if split else 1)) * BK + ALIGN_SLACK


def split(problem: Any) -> bool:
    """3xTF32 for fp32 problems: each operand is staged as its TF32 parts and the TF32 parts of the
    remainders, and every product is big*big + big*small + small*big."""
    return problem.precision.tf32x3


@dataclass(frozen=True)
class BlockNames:
    """What the block GEMM's parameters are called where it runs: the wgmma formulation's own
    names, or another formulation's (winograd's products: WGMMA_*), for the rules' messages."""
    wgs: str = "WGS"
    wbn: str = "WBN"
    stages: str = "WSTAGES"
    inflight: str = "INFLIGHT"


def block_rules(limits: DeviceLimits, split_: bool, names: BlockNames = BlockNames(),
                a_regs: str = "", tma: bool = False) -> list[Constraint]:
    """The rules of the block GEMM itself (wgmma_mainloop.cuh.j2), whoever runs it: Hopper; its
    accumulator registers (3xTF32 keeps each tile's partial sums beside the totals); a stage for a
    group of wgmmas in flight; stage copies that split evenly over the threads; threads and shared
    memory within the device's limits. a_regs names the parameter that splits A in registers
    (A_REGS), where the kernel has one. tma: the tma formulation's block (formulations/tma.py), whose
    stages a producer warp more fills by bulk copies (no copies to split over the threads; its own
    rule for its shared memory)."""
    n = names

    def arch(_):
        number = arch_number(limits.arch)
        return None if number == ARCH else f"wgmma runs on sm_{ARCH} (Hopper) only, not {limits.arch}"

    def partial_sums(wbn):
        return None if not split_ or wbn <= 128 else (
            f"{n.wbn}={wbn} with 3xTF32 holds {wbn} accumulator registers per thread (at most 128: fp32 keeps "
            "each tile's partial sums beside the totals)")

    def registers(wgs, wbn):
        # 512 threads get at most 128 registers each: the totals (and fp32's partial sums) fit in
        # half of them
        acc = wbn // 2 * (2 if split_ else 1)
        return None if wgs < 4 or acc <= 64 else (
            f"{n.wgs}=4 (512 threads, 128 registers each) with {n.wbn}={wbn} holds {acc} accumulator registers "
            "per thread (at most 64)")

    def pipelined(stages, inflight):
        # a group in flight holds one stage beyond the copies ahead, which need one at least
        return None if not inflight or stages >= 3 else (
            f"{n.inflight}=1 needs at least 3 stages (one for the copies ahead, one for the wgmmas in flight), "
            f"not {stages}")

    def even_copies(wgs, wbn):
        # every thread copies the same number of 16-byte chunks of a stage's B rows
        return None if (wbn * BK // 4) % (128 * wgs) == 0 else (
            f"{wbn} columns of {BK} floats do not split evenly over {128 * wgs} threads")

    rules = [Constraint((n.wgs,), arch),   # of the device, not of a parameter: any one carries it
             Constraint((n.wgs, n.wbn), registers),
             Constraint((n.stages, n.inflight), pipelined),
             Constraint((n.wbn,), partial_sums)]
    if tma:
        return [*rules, threads_rule(limits, (n.wgs,), lambda wgs: 128 * wgs + TMA_PRODUCER_THREADS)]
    return [*rules, Constraint((n.wgs, n.wbn), even_copies),
            threads_rule(limits, (n.wgs,), lambda wgs: 128 * wgs),
            smem_rule(limits, (n.wgs, n.wbn, n.stages, *((a_regs,) if a_regs else ())),
                      lambda wgs, wbn, st, a=0: smem_bytes(wgs, wbn, st, split_, a))]


class WgmmaGemm(OpFormulation):
    """What the ops' wgmma GEMMs share: the parameters and the rules of the block GEMM
    (wgmma_mainloop.cuh.j2). Each op says what its GEMM is: rows, columns (the wgmma's N), the
    channels its operands move in float4s, its staged workspaces and launches."""

    formulation = FORMULATION_WGMMA
    target_suffix = "a"

    def gemm_rows(self, problem: Any) -> int:        # the most rows one launch's GEMM has
        raise NotImplementedError

    def gemm_columns(self, problem: Any) -> tuple[int, str]:   # the GEMM's columns, and what they are
        raise NotImplementedError

    def vector_channels(self, problem: Any) -> tuple[int, str] | None:   # the channels of the float4 runs
        raise NotImplementedError

    def workspace_params(self, problem: Any) -> tuple[str, ...]:
        """The parameters the problem's staged workspaces depend on, passed to workspaces() in this
        order."""
        return ()

    def workspaces(self, problem: Any, *values: Any) -> tuple[tuple[str, int], ...]:
        raise NotImplementedError

    def params(self, problem: Any) -> list[Param]:
        # 32 and 16 columns (after the others: the first choices keep their order) serve GEMMs with
        # few columns, e.g. the backward-data of a layer with 16 input channels.
        return [
            # 4 (256 rows, after the others) halves the B tile's reads from L2 per output against 2:
            # the copies, not the tensor cores, bound the main loop (modern_14 on an H100: 66 of 74 us
            # with no wgmma at all)
            Param("WGS", (1, 2, 4), "warpgroups along the GEMM's rows (64 rows each)"),
            Param("WBN", (64, 128, 256, 32, 16), "GEMM columns per block: the wgmma's N"),
            Param("WSTAGES", (3, 4, 2, 5, 6), "shared-memory pipeline stages"),
            # 0 first: the loop that waits for each tile's wgmmas before the next (the code of configs
            # written before the parameter)
            Param("INFLIGHT", (0, 1), "groups of wgmmas left in flight across the next tile's barrier"),
        ]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p = problem
        gm = self.gemm_rows(p)
        gn, columns = self.gemm_columns(p)
        vector = self.vector_channels(p)

        def channels(_):
            if vector is None or vector[0] % 4 == 0:
                return None
            return f"the NHWC operands move in float4s: {vector[1]} must be a multiple of 4, not {vector[0]}"

        def addressable(_, *values):
            # the kernels index the staged copies with 32-bit ints
            need = sum(n for _, n in self.workspaces(p, *values))
            return None if need < 2 ** 31 else f"the staged copies hold {need} floats, past 32-bit indexing"

        def workspace(_, *values):
            need = WORKSPACE_ELEMENT.size * sum(n for _, n in self.workspaces(p, *values))
            return None if need <= limits.workspace_bytes else (
                f"the NHWC staging workspace ({need} bytes) exceeds the workspace limit of {limits.workspace_bytes} bytes")

        return [
            sixteen_bit_rule(p, self.formulation, "WGS", "its wgmma products take FP32 operands as TF32 (one product a "
                                                         "term, or 3xTF32), not BF16 or FP16 ones"),
            *self.block_constraints(p, limits),
            Constraint(("WGS",), channels),
            Constraint(("WBN", *self.workspace_params(p)), workspace),
            Constraint(("WBN", *self.workspace_params(p)), addressable),
            at_most("WBN", max(64, next_pow2(gn)), f"only {gn} {columns}"),
            Constraint(("WGS",), lambda wgs: None if wgs == 1 or 64 * wgs <= max(64, next_pow2(gm))
                       else f"only {gm} GEMM rows"),
            grid_rule(("WBN",), lambda wbn: cdiv(gn, wbn)),
        ]

    def block_constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        """The block GEMM's own rules (block_rules) for this op's kernel."""
        return block_rules(limits, split(problem),
                           a_regs="A_REGS" if "A_REGS" in {q.name for q in self.params(problem)} else "")

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        base = {"formulation": FORMULATION_WGMMA, "INFLIGHT": 0}
        out = [{**base, "WGS": 2, "WBN": 128, "WSTAGES": 3}, {**base, "WGS": 1, "WBN": 128, "WSTAGES": 3},
               {**base, "WGS": 1, "WBN": 64, "WSTAGES": 3}]
        narrow = max(16, next_pow2(self.gemm_columns(problem)[0]))
        if narrow < 64:   # few columns: first, a block as wide as the GEMM
            out.insert(0, {**base, "WGS": 1, "WBN": narrow, "WSTAGES": 4})
        return out

    def buffers(self, problem: Any, config: Config) -> Buffers:
        return (), self.workspaces(problem, *(config[name] for name in self.workspace_params(problem)))
