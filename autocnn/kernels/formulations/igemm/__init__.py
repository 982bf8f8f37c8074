"""igemm: implicit GEMM (Chellapilla et al.'s unrolled convolution, without materialising the unrolled
matrix), for the three convolutions.

conv_fwd: M = N*P*Q output pixels, N = K filters, a reduction over C*R*S. conv_bwd_data: one GEMM per
stride phase. conv_wgrad: M = K, N = C*R*S and a reduction over N*P*Q terms split over SPLITK blocks,
whose partial sums meet by "atomic" (atomicAdd into the zeroed output; a single split stores
directly) or "two_pass" (partials in a workspace, summed in a fixed order by a second kernel):
the two values of conv_wgrad's "formulation" parameter this formulation answers to.

The core is _igemm.cuh.j2; igemm_<op>.cu.j2 holds each operation's operand gathers and epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DEFAULT_WORKSPACE_BYTES, DeviceLimits
from autocnn.kernels.formulations.base import (FULL_UNROLL, Buffers, Formulation, OpFormulation, choices_upto,
                                               pragma_unroll)
from autocnn.kernels.geometry import cdiv, next_pow2, stride_phases
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem
from autocnn.kernels.rules import GRID_YZ_LIMIT, at_most, grid_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch

NAME = "igemm"
ATOMIC = "atomic"
TWO_PASS = "two_pass"

CONV_BM = (32, 64, 128, 256)
CONV_BN = (16, 32, 64, 128)
CONV_BK = (4, 8, 16, 32)
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The default workspace limit (device.DEFAULT_WORKSPACE_BYTES): the budget the formulations' default
# candidates are sized for. Constraints hold configs to limits.workspace_bytes, the limit in force.
WORKSPACE_LIMIT_BYTES = DEFAULT_WORKSPACE_BYTES
REDUCE_THREADS = 256


@dataclass(frozen=True)
class GemmEnvelope:
    GM: int
    GN: int
    GK: int
    stage_size: int      # bytes of a staged element: the core stages in the accumulator's type
    grid_z: int = 1


def igemm_params(bm: tuple[int, ...], bn: tuple[int, ...], bk: tuple[int, ...], env: GemmEnvelope) -> list[Param]:
    bm = choices_upto(bm, max(bm[0], next_pow2(env.GM)))
    bn = choices_upto(bn, max(bn[0], next_pow2(env.GN)))
    bk = choices_upto(bk, max(bk[0], next_pow2(env.GK)))
    return [
        Param("BM", bm, "GEMM rows per block"),
        Param("BN", bn, "GEMM columns per block"),
        Param("BK", bk, "reduction step staged in shared memory"),
        Param("TM", choices_upto((2, 4, 8), max(bm)), "GEMM rows per thread"),
        Param("TN", choices_upto((2, 4, 8), max(bn)), "GEMM columns per thread"),
        Param("PAD_A", (0, 1, 4), "floats of padding per shared-memory row of A (bank conflicts)"),
        Param("PAD_B", (0, 1, 4), "floats of padding per shared-memory row of B (bank conflicts)"),
        Param("UNROLL_K", (1, 2, 4, FULL_UNROLL), "unrolling of the inner reduction loop (0: complete)"),
    ]


def igemm_smem_bytes(stage_size: int, BM: int, BN: int, BK: int, PAD_A: int, PAD_B: int) -> int:
    return stage_size * 2 * BK * (BM + PAD_A + BN + PAD_B)


def igemm_threads(c: Config) -> int:
    return (c["BM"] // c["TM"]) * (c["BN"] // c["TN"])


def igemm_constraints(env: GemmEnvelope, limits: DeviceLimits, min_bm: int, min_bn: int,
                      min_bk: int) -> list[Constraint]:
    def threads(bm, tm, bn, tn):
        return (bm // tm) * (bn // tn)

    def even_loads(bm, tm, bn, tn, bk):
        n = threads(bm, tm, bn, tn)
        if (bm * bk) % n or (bn * bk) % n:
            return f"a {bm}x{bk} / {bn}x{bk} tile does not split evenly over {n} threads"
        return None

    def registers(bm, tm, bn, tn, bk):
        n = threads(bm, tm, bn, tn)
        la, lb = bm * bk // n, bn * bk // n
        estimate = tm * tn + tm + tn + 6 * la + 4 * lb + 16
        return None if estimate <= 224 else f"about {estimate} registers per thread (limit 224)"

    return [
        Constraint(("BM", "TM"), lambda bm, tm: None if bm % tm == 0 else f"TM={tm} does not divide BM={bm}"),
        Constraint(("BN", "TN"), lambda bn, tn: None if bn % tn == 0 else f"TN={tn} does not divide BN={bn}"),
        at_most("BM", max(min_bm, next_pow2(env.GM)), f"only {env.GM} GEMM rows"),
        at_most("BN", max(min_bn, next_pow2(env.GN)), f"only {env.GN} GEMM columns"),
        at_most("BK", max(min_bk, next_pow2(env.GK)), f"a reduction of only {env.GK} terms"),
        threads_rule(limits, ("BM", "TM", "BN", "TN"), threads),
        Constraint(("BM", "TM", "BN", "TN", "BK"), even_loads),
        Constraint(("TM", "TN"), lambda tm, tn: None if tm * tn <= 64
                   else f"{tm * tn} accumulators per thread exceed 64 (registers)"),
        Constraint(("BM", "TM", "BN", "TN", "BK"), registers),
        smem_rule(limits, ("BM", "BN", "BK", "PAD_A", "PAD_B"), lambda *v: igemm_smem_bytes(env.stage_size, *v)),
        Constraint(("BK", "UNROLL_K"), lambda bk, u: None if u <= bk else f"UNROLL_K={u} exceeds BK={bk}"),
        grid_rule(("BN",), lambda bn: -(-env.GN // bn)),
    ]


def igemm_default_candidates(env: GemmEnvelope, pad_b: int) -> list[dict]:
    """Implicit-GEMM configs in order of preference, sized to the GEMM's columns; the last fits any problem."""
    gemm = {"formulation": NAME, "PAD_A": 0, "PAD_B": pad_b, "UNROLL_K": 0}
    bn = max(16, min(64, next_pow2(env.GN)))
    tn = 4 if bn >= 32 else 2
    return [
        {**gemm, "BM": 128, "BN": bn, "BK": 8, "TM": 8, "TN": tn},
        {**gemm, "BM": 64, "BN": bn, "BK": 8, "TM": 4, "TN": tn},
        {**gemm, "BM": 64, "BN": 32, "BK": 8, "TM": 4, "TN": 4},
        {**gemm, "BM": 32, "BN": 16, "BK": 4, "TM": 2, "TN": 4, "PAD_B": 0},
    ]


class _Igemm(OpFormulation):
    formulation = NAME
    summary = "implicit GEMM"

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        return {"UNROLL_K": pragma_unroll(config["UNROLL_K"])}


class ConvIgemm(_Igemm):
    """conv_fwd and conv_bwd_data: the same tiles over their own GEMM views."""

    pad_b = 0    # the default candidates' padding of B

    def envelope(self, problem: Any) -> GemmEnvelope:
        raise NotImplementedError

    def params(self, problem: Any) -> list[Param]:
        return igemm_params(CONV_BM, CONV_BN, CONV_BK, self.envelope(problem))

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        return igemm_constraints(self.envelope(problem), limits, min_bm=32, min_bn=16, min_bk=4)

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        return igemm_default_candidates(self.envelope(problem), pad_b=self.pad_b)

    def code_helpers(self) -> tuple:
        return (igemm_smem_bytes, igemm_threads, pragma_unroll)


class IgemmConvFwd(ConvIgemm):
    op = "conv_fwd"
    templates = ("igemm_conv_fwd.cu.j2", "_igemm.cuh.j2", "_gemm_row_sums.cuh.j2", "_conv_fwd_operands.cuh.j2",
                 "_operand_access.cuh.j2")
    pad_b = 4

    def envelope(self, p: ConvFwdProblem) -> GemmEnvelope:
        return GemmEnvelope(GM=p.N * p.P * p.Q, GN=p.K, GK=p.C * p.R * p.S, stage_size=p.precision.accumulator.size)

    def launches(self, p: ConvFwdProblem, c: Config) -> tuple[Launch, ...]:
        smem = igemm_smem_bytes(p.precision.accumulator.size, c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (cdiv(p.N * p.P * p.Q, c["BM"]), cdiv(p.K, c["BN"]), 1)
        return (Launch("conv_fwd", grid, (igemm_threads(c), 1, 1), smem, ("x", "w", "bias", "y")),)


class IgemmConvBwdData(ConvIgemm):
    """One GEMM per stride phase: the phases are blocks along z of one launch."""

    op = "conv_bwd_data"
    templates = ("igemm_conv_bwd_data.cu.j2", "_igemm.cuh.j2", "_gemm_row_sums.cuh.j2", "_bwd_data_phases.cuh.j2",
                 "_bwd_data_operands.cuh.j2", "_operand_access.cuh.j2")

    def envelope(self, p: ConvBwdDataProblem) -> GemmEnvelope:
        phases = stride_phases(p)
        return GemmEnvelope(GM=max(p.N * ph.Ha * ph.Wb for ph in phases), GN=p.C,
                            GK=max(1, max(p.K * ph.Ra * ph.Sb for ph in phases)), stage_size=p.precision.accumulator.size,
                            grid_z=len(phases))

    def launches(self, p: ConvBwdDataProblem, c: Config) -> tuple[Launch, ...]:
        phases = stride_phases(p)
        smem = igemm_smem_bytes(p.precision.accumulator.size, c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (max(cdiv(p.N * ph.Ha * ph.Wb, c["BM"]) for ph in phases), cdiv(p.C, c["BN"]), len(phases))
        return (Launch("conv_bwd_data", grid, (igemm_threads(c), 1, 1), smem, ("dy", "w", "dx")),)


class IgemmConvWgrad(_Igemm):
    """The reduction over N*P*Q split over SPLITK blocks; the config's "formulation" says how the
    splits' partial sums meet (ATOMIC or TWO_PASS). The bias gradient is the row sum of the dY tiles."""

    op = "conv_wgrad"
    summary = "implicit GEMM with split partial sums combined by atomics or by a second pass"
    templates = ("igemm_conv_wgrad.cu.j2", "_igemm.cuh.j2", "_gemm_row_sums.cuh.j2", "_conv_wgrad_operands.cuh.j2",
                 "_operand_access.cuh.j2", "igemm_conv_wgrad_reduce.cu.j2")

    @property
    def names(self) -> tuple[str, ...]:
        return (ATOMIC, TWO_PASS)

    def envelope(self, p: ConvWgradProblem) -> GemmEnvelope:
        return GemmEnvelope(GM=p.K, GN=p.C * p.R * p.S, GK=p.N * p.P * p.Q, stage_size=p.precision.accumulator.size)

    def params(self, problem: ConvWgradProblem) -> list[Param]:
        return [Param("SPLITK", SPLITS, "blocks sharing one output tile's reduction"),
                *igemm_params((16, 32, 64, 128), (16, 32, 64, 128), (8, 16, 32), self.envelope(problem))]

    def constraints(self, problem: ConvWgradProblem, limits: DeviceLimits) -> list[Constraint]:
        env = self.envelope(problem)
        split_bytes = WORKSPACE_ELEMENT.size * (env.GM * env.GN + env.GM)   # one split's partial sums
        return igemm_constraints(env, limits, min_bm=16, min_bn=16, min_bk=8) + [
            Constraint(("formulation", "SPLITK"),
                       lambda f, s: None if f == ATOMIC or s >= 2 else "two_pass needs SPLITK >= 2"),
            Constraint(("SPLITK", "BK"),
                       lambda s, bk: None if s <= max(1, cdiv(env.GK, bk))
                       else f"SPLITK={s} exceeds the {cdiv(env.GK, bk)} reduction steps"),
            Constraint(("SPLITK",), lambda s: None if s <= GRID_YZ_LIMIT else "too many splits"),
            Constraint(("formulation", "SPLITK"),
                       lambda f, s: None if f == ATOMIC or s * split_bytes <= limits.workspace_bytes
                       else f"the two-pass workspace exceeds the workspace limit of {limits.workspace_bytes} bytes"),
        ]

    def default_candidates(self, problem: ConvWgradProblem) -> list[dict[str, Any]]:
        env = self.envelope(problem)
        bm = max(16, min(64, next_pow2(env.GM)))
        bn = max(16, min(64, next_pow2(env.GN)))
        tm, tn = (4 if bm >= 32 else 2), (4 if bn >= 32 else 2)
        tiles = cdiv(env.GM, bm) * cdiv(env.GN, bn)
        # About two blocks per multiprocessor of a large GPU, each split keeping >= 16 steps of 16.
        want = max(1, min(2 * 132 // max(1, tiles), cdiv(env.GK, 16 * 16)))
        split = max(s for s in SPLITS if s <= want)
        gemm = {"formulation": ATOMIC, "PAD_A": 1, "PAD_B": 1, "UNROLL_K": 0}
        return [
            {**gemm, "SPLITK": split, "BM": bm, "BN": bn, "BK": 16, "TM": tm, "TN": tn},
            {**gemm, "SPLITK": split, "BM": 32, "BN": 32, "BK": 16, "TM": 2, "TN": 4},
            {**gemm, "SPLITK": 1, "BM": 16, "BN": 16, "BK": 8, "TM": 2, "TN": 2},
        ]

    def launches(self, p: ConvWgradProblem, c: Config) -> tuple[Launch, ...]:
        env = self.envelope(p)
        smem = igemm_smem_bytes(p.precision.accumulator.size, c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (cdiv(env.GM, c["BM"]), cdiv(env.GN, c["BN"]), c["SPLITK"])
        main = Launch("conv_wgrad", grid, (igemm_threads(c), 1, 1), smem, ("x", "dy", "dw", "db", "ws", "ws_bias"))
        if c["formulation"] == TWO_PASS:
            return (main, wgrad_reduce_launch(p))
        return (main,)

    def buffers(self, p: ConvWgradProblem, c: Config) -> Buffers:
        if c["formulation"] == TWO_PASS:
            env = self.envelope(p)
            return (), (("ws", c["SPLITK"] * env.GM * env.GN), ("ws_bias", c["SPLITK"] * env.GM))
        if c["SPLITK"] > 1:
            return ("dw", "db"), ()
        return (), ()

    def code_helpers(self) -> tuple:
        return (type(self).envelope, GemmEnvelope, igemm_smem_bytes, igemm_threads, pragma_unroll,
                wgrad_reduce_launch, REDUCE_THREADS, ATOMIC, TWO_PASS)


def wgrad_reduce_launch(p: ConvWgradProblem) -> Launch:
    """The second pass of a two-pass combine (igemm_conv_wgrad_reduce.cu.j2): a fixed-order sum of
    the splits' partial sums of dW and db."""
    n = p.K * p.C * p.R * p.S + p.K
    return Launch("conv_wgrad_reduce", (cdiv(n, REDUCE_THREADS), 1, 1), (REDUCE_THREADS, 1, 1), 0,
                  ("ws", "ws_bias", "dw", "db"))


IGEMM = Formulation(NAME, (IgemmConvFwd(), IgemmConvBwdData(), IgemmConvWgrad()))
