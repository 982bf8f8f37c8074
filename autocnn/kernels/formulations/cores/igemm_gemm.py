"""The SIMT implicit-GEMM core (_igemm.cuh.j2) and what the formulations that run it share: igemm's
three convolutions and igemm_pool's fused convolution and averaging.

The core computes C[M][N] = sum_k A[m][k] B[k][n] in BM x BN x BK block tiles, TM x TN outputs a
thread, staging A and B in the accumulator's type in double-buffered shared memory with PAD_A /
PAD_B floats of padding a row. ``GemmEnvelope`` is the GEMM an op's glue presents to it; the rules
and defaults below are the core's; ``ConvIgemm`` is the base of the formulations whose GEMM is
conv_fwd's or conv_bwd_data's view.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import FULL_UNROLL, OpFormulation, choices_upto, pragma_unroll
from autocnn.kernels.geometry import next_pow2
from autocnn.kernels.rules import at_most, grid_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param

CONV_BM = (32, 64, 128, 256)
CONV_BN = (16, 32, 64, 128)
CONV_BK = (4, 8, 16, 32)
# The core's templates, which every formulation running it lists (its fingerprint).
CORE_TEMPLATES = ("_igemm.cuh.j2", "_gemm_row_sums.cuh.j2")


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


def igemm_default_candidates(env: GemmEnvelope, pad_b: int, formulation: str) -> list[dict]:
    """Implicit-GEMM configs in order of preference, sized to the GEMM's columns; the last fits any problem."""
    gemm = {"formulation": formulation, "PAD_A": 0, "PAD_B": pad_b, "UNROLL_K": 0}
    bn = max(16, min(64, next_pow2(env.GN)))
    tn = 4 if bn >= 32 else 2
    return [
        {**gemm, "BM": 128, "BN": bn, "BK": 8, "TM": 8, "TN": tn},
        {**gemm, "BM": 64, "BN": bn, "BK": 8, "TM": 4, "TN": tn},
        {**gemm, "BM": 64, "BN": 32, "BK": 8, "TM": 4, "TN": 4},
        {**gemm, "BM": 32, "BN": 16, "BK": 4, "TM": 2, "TN": 4, "PAD_B": 0},
    ]


class IgemmGemm(OpFormulation):
    """An op's GEMM on the core: the core's own template variables."""

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        return {"UNROLL_K": pragma_unroll(config["UNROLL_K"])}


class ConvIgemm(IgemmGemm):
    """conv_fwd's and conv_bwd_data's GEMM views (and igemm_pool's, conv_fwd's over pooling windows):
    the same tiles, each over its own envelope."""

    pad_b = 0    # the default candidates' padding of B

    def envelope(self, problem: Any) -> GemmEnvelope:
        raise NotImplementedError

    def params(self, problem: Any) -> list[Param]:
        return igemm_params(CONV_BM, CONV_BN, CONV_BK, self.envelope(problem))

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        return igemm_constraints(self.envelope(problem), limits, min_bm=32, min_bn=16, min_bk=4)

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        return igemm_default_candidates(self.envelope(problem), pad_b=self.pad_b, formulation=self.formulation)

    def code_helpers(self) -> tuple:
        return (igemm_smem_bytes, igemm_threads, pragma_unroll)
