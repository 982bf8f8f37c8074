"""igemm: implicit GEMM (Chellapilla et al.'s unrolled convolution, without materialising the unrolled
matrix), for the three convolutions.

conv_fwd: M = N*P*Q output pixels, N = K filters, a reduction over C*R*S. conv_bwd_data: one GEMM per
stride phase. conv_wgrad: M = K, N = C*R*S and a reduction over N*P*Q terms split over SPLITK blocks,
whose partial sums meet by "atomic" (atomicAdd into the zeroed output; a single split stores
directly) or "two_pass" (partials in a workspace, summed in a fixed order by a second kernel):
the two values of conv_wgrad's "formulation" parameter this formulation answers to.

Channel groups and dilation, for all three (any groups dividing C and K, depthwise included; any
dilation; every precision): a GEMM per group over its CG = C/groups channels and KG = K/groups
filters (conv_fwd: M = N*P*Q, N = KG, a reduction over CG*R*S; conv_bwd_data: N = CG, a reduction
over KG times the phase's taps; conv_wgrad: M = KG, N = CG*R*S), batched over the groups through the
grid: conv_fwd's blocks along z are the groups, conv_bwd_data's are group * phases + phase, and
conv_wgrad's along x group * (filter tiles of a group) + tile (its z holds the splits). Each block
adds its group's offset (channel g*CG, filter g*KG) to the operands' row indices and the epilogue's,
so the index maps change only in the per-group sizes and in the taps, which are the dilation apart.
conv_bwd_data of a dilated layer keeps the stride phases and takes, in each, the taps whose dilated
offset falls on it (geometry.tap_phases: a step of SH / gcd(SH, dilation) between them), so that
every phase stays a dense GEMM; a phase that no tap reaches is written as zeros. The tiles are held to the per-group
GEMM (its envelope), so that no config tiles past a group. The code of a dense, undilated problem
is rendered as it was (_conv_groups.cuh.j2).

The core is _igemm.cuh.j2 (cores/igemm_gemm.py: its parameters, rules and defaults);
igemm_<op>.cu.j2 holds each operation's operand gathers and epilogue, and conv_wgrad's two_pass
sums its splits by the second pass of cores/workspaces.py.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, pragma_unroll
from autocnn.kernels.formulations.cores.igemm_gemm import (CORE_TEMPLATES, ConvIgemm, GemmEnvelope, IgemmGemm,
                                                           igemm_constraints, igemm_params, igemm_smem_bytes,
                                                           igemm_threads)
from autocnn.kernels.formulations.cores.workspaces import REDUCE_THREADS, wgrad_reduce_launch
from autocnn.kernels.geometry import cdiv, next_pow2, tap_phases, tap_steps
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem
from autocnn.kernels.rules import GRID_X_LIMIT, GRID_YZ_LIMIT, grid_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch

NAME = "igemm"
ATOMIC = "atomic"
TWO_PASS = "two_pass"

SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServesGroups:
    """Any channel groups (C and K divisible by groups, which the problem checks) and any dilation:
    nothing of either is refused (the module docstring says how)."""

    def grouping_refusal(self, problem: Any) -> str | None:
        return None


def group_grid_rule(axis: str, blocks: int) -> list[Constraint]:
    """A grouped or dilated problem's blocks along the grid axis that batches its groups, within the
    grid's limit there (none for a dense, undilated problem, whose space stays as it was)."""
    limit = GRID_X_LIMIT if axis == "x" else GRID_YZ_LIMIT
    if blocks <= limit:
        return []
    return [grid_rule(("BM",), lambda bm: blocks, axis)]


class IgemmConvFwd(ServesGroups, ConvIgemm):
    formulation = NAME
    op = "conv_fwd"
    summary = "implicit GEMM"
    templates = ("igemm_conv_fwd.cu.j2", *CORE_TEMPLATES, "_conv_fwd_operands.cuh.j2", "_operand_access.cuh.j2",
                 "_conv_groups.cuh.j2")
    pad_b = 4

    def envelope(self, p: ConvFwdProblem) -> GemmEnvelope:
        """One group's GEMM (the whole problem's where groups = 1); the groups are blocks along z."""
        return GemmEnvelope(GM=p.N * p.P * p.Q, GN=p.K // p.groups, GK=p.C // p.groups * p.R * p.S,
                            stage_size=p.precision.accumulator.size, grid_z=p.groups)

    def constraints(self, problem: ConvFwdProblem, limits: DeviceLimits) -> list[Constraint]:
        return super().constraints(problem, limits) + group_grid_rule("z", problem.groups)

    def code_helpers(self) -> tuple:
        return (*super().code_helpers(), type(self).envelope)

    def launches(self, p: ConvFwdProblem, c: Config) -> tuple[Launch, ...]:
        smem = igemm_smem_bytes(p.precision.accumulator.size, c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (cdiv(p.N * p.P * p.Q, c["BM"]), cdiv(p.K // p.groups, c["BN"]), p.groups)
        return (Launch("conv_fwd", grid, (igemm_threads(c), 1, 1), smem, ("x", "w", "bias", "y")),)


class IgemmConvBwdData(ServesGroups, ConvIgemm):
    """One GEMM per stride phase (and group): the phases are blocks along z of one launch."""

    formulation = NAME
    op = "conv_bwd_data"
    summary = "implicit GEMM"
    templates = ("igemm_conv_bwd_data.cu.j2", *CORE_TEMPLATES, "_bwd_data_phases.cuh.j2", "_bwd_data_operands.cuh.j2",
                 "_operand_access.cuh.j2", "_conv_groups.cuh.j2")

    def envelope(self, p: ConvBwdDataProblem) -> GemmEnvelope:
        """The largest phase's GEMM of one group; the phases of every group are blocks along z."""
        phases = tap_phases(p)
        return GemmEnvelope(GM=max(p.N * ph.Ha * ph.Wb for ph in phases), GN=p.C // p.groups,
                            GK=max(1, max(p.K // p.groups * ph.Ra * ph.Sb for ph in phases)),
                            stage_size=p.precision.accumulator.size, grid_z=len(phases) * p.groups)

    def constraints(self, problem: ConvBwdDataProblem, limits: DeviceLimits) -> list[Constraint]:
        return super().constraints(problem, limits) + group_grid_rule("z", self.envelope(problem).grid_z)

    def context(self, problem: ConvBwdDataProblem, config: Config) -> dict[str, Any]:
        # The phases with the taps that reach them through the dilation (_bwd_data_phases.cuh.j2
        # renders them for a grouped or dilated problem, the op's own "phases" for the others).
        return {**super().context(problem, config), "tap_phases": tap_phases(problem), "tap_steps": tap_steps(problem)}

    def launches(self, p: ConvBwdDataProblem, c: Config) -> tuple[Launch, ...]:
        phases = tap_phases(p)
        smem = igemm_smem_bytes(p.precision.accumulator.size, c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (max(cdiv(p.N * ph.Ha * ph.Wb, c["BM"]) for ph in phases), cdiv(p.C // p.groups, c["BN"]),
                len(phases) * p.groups)
        return (Launch("conv_bwd_data", grid, (igemm_threads(c), 1, 1), smem, ("dy", "w", "dx")),)

    def code_helpers(self) -> tuple:
        return (*super().code_helpers(), type(self).envelope, tap_phases, tap_steps, group_grid_rule)


class IgemmConvWgrad(ServesGroups, IgemmGemm):
    """The reduction over N*P*Q split over SPLITK blocks; the config's "formulation" says how the
    splits' partial sums meet (ATOMIC or TWO_PASS). The bias gradient is the row sum of the dY tiles.
    A group's GEMM is M = K/groups filters by N = C/groups*R*S weights; the groups are blocks along x."""

    formulation = NAME
    op = "conv_wgrad"
    summary = "implicit GEMM with split partial sums combined by atomics or by a second pass"
    templates = ("igemm_conv_wgrad.cu.j2", *CORE_TEMPLATES, "_conv_wgrad_operands.cuh.j2", "_operand_access.cuh.j2",
                 "igemm_conv_wgrad_reduce.cu.j2", "_conv_groups.cuh.j2")

    @property
    def names(self) -> tuple[str, ...]:
        return (ATOMIC, TWO_PASS)

    def envelope(self, p: ConvWgradProblem) -> GemmEnvelope:
        """One group's GEMM (the whole problem's where groups = 1)."""
        return GemmEnvelope(GM=p.K // p.groups, GN=p.C // p.groups * p.R * p.S, GK=p.N * p.P * p.Q,
                            stage_size=p.precision.accumulator.size)

    def params(self, problem: ConvWgradProblem) -> list[Param]:
        return [Param("SPLITK", SPLITS, "blocks sharing one output tile's reduction"),
                *igemm_params((16, 32, 64, 128), (16, 32, 64, 128), (8, 16, 32), self.envelope(problem))]

    def constraints(self, problem: ConvWgradProblem, limits: DeviceLimits) -> list[Constraint]:
        env = self.envelope(problem)
        # One split's partial sums, of every group.
        split_bytes = WORKSPACE_ELEMENT.size * problem.groups * (env.GM * env.GN + env.GM)
        return igemm_constraints(env, limits, min_bm=16, min_bn=16, min_bk=8) + group_grid_rule(
            "x", problem.groups * cdiv(env.GM, 16)) + [
            Constraint(("formulation", "SPLITK"),
                       lambda f, s: None if f == ATOMIC or s >= 2 else "two_pass needs SPLITK >= 2"),
            Constraint(("SPLITK", "BK"),
                       lambda s, bk: None if s <= max(1, cdiv(env.GK, bk))
                       else f"SPLITK={s} exceeds the {cdiv(env.GK, bk)} reduction steps"),
            Constraint(("SPLITK",), lambda s: None if s <= GRID_YZ_LIMIT else "too many splits"),
            Constraint(("formulation", "SPLITK"),
                       lambda f, s: None if f == ATOMIC or s * split_bytes <= limits.workspace_bytes
                       else f"the two-pass workspace exceeds the workspace limit of {limits.workspace_bytes} bytes"),
            # Partial sums of 16-bit gradients stay FP32 (the workspace); atomics would round each one.
            Constraint(("formulation", "SPLITK"),
                       lambda f, s: None if f == TWO_PASS or s == 1 or not problem.precision.sixteen_bit
                       else f"a {problem.precision} weight gradient split over SPLITK={s} blocks adds its partial "
                            f"sums in the FP32 workspace: two_pass, or atomic with SPLITK=1"),
        ]

    def default_candidates(self, problem: ConvWgradProblem) -> list[dict[str, Any]]:
        env = self.envelope(problem)
        bm = max(16, min(64, next_pow2(env.GM)))
        bn = max(16, min(64, next_pow2(env.GN)))
        tm, tn = (4 if bm >= 32 else 2), (4 if bn >= 32 else 2)
        tiles = problem.groups * cdiv(env.GM, bm) * cdiv(env.GN, bn)
        # About two blocks per multiprocessor of a large GPU, each split keeping >= 16 steps of 16.
        want = max(1, min(2 * 132 // max(1, tiles), cdiv(env.GK, 16 * 16)))
        split = max(s for s in SPLITS if s <= want)
        # 16-bit gradients meet their split sums in the FP32 workspace (two_pass): atomics would round each.
        combine = TWO_PASS if problem.precision.sixteen_bit and split >= 2 else ATOMIC
        gemm = {"formulation": combine, "PAD_A": 1, "PAD_B": 1, "UNROLL_K": 0}
        return [
            {**gemm, "SPLITK": split, "BM": bm, "BN": bn, "BK": 16, "TM": tm, "TN": tn},
            {**gemm, "SPLITK": split, "BM": 32, "BN": 32, "BK": 16, "TM": 2, "TN": 4},
            {**gemm, "formulation": ATOMIC, "SPLITK": 1, "BM": 16, "BN": 16, "BK": 8, "TM": 2, "TN": 2},
        ]

    def launches(self, p: ConvWgradProblem, c: Config) -> tuple[Launch, ...]:
        env = self.envelope(p)
        smem = igemm_smem_bytes(p.precision.accumulator.size, c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (p.groups * cdiv(env.GM, c["BM"]), cdiv(env.GN, c["BN"]), c["SPLITK"])
        main = Launch("conv_wgrad", grid, (igemm_threads(c), 1, 1), smem, ("x", "dy", "dw", "db", "ws", "ws_bias"))
        if c["formulation"] == TWO_PASS:
            return (main, wgrad_reduce_launch(p))
        return (main,)

    def buffers(self, p: ConvWgradProblem, c: Config) -> Buffers:
        if c["formulation"] == TWO_PASS:
            env = self.envelope(p)
            splits = c["SPLITK"] * p.groups
            return (), (("ws", splits * env.GM * env.GN), ("ws_bias", splits * env.GM))
        if c["SPLITK"] > 1:
            return ("dw", "db"), ()
        return (), ()

    def code_helpers(self) -> tuple:
        return (type(self).envelope, GemmEnvelope, igemm_smem_bytes, igemm_threads, pragma_unroll, group_grid_rule,
                wgrad_reduce_launch, REDUCE_THREADS, ATOMIC, TWO_PASS)


IGEMM = Formulation(NAME, (IgemmConvFwd(), IgemmConvBwdData(), IgemmConvWgrad()))
