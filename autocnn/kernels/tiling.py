"""Parameters and static constraints of the two convolution cores (direct tiled, implicit GEMM).

conv_fwd and conv_bwd_data search both cores; conv_wgrad searches the GEMM core with a split
reduction. The constraints here are the ones the templates' static_asserts and the device's
limits impose, plus pruning of tiles far larger than the problem (they only add idle threads).
"""
from __future__ import annotations

from dataclasses import dataclass

from autocnn.device import DeviceLimits
from autocnn.kernels.space import Constraint, Param
from autocnn.kernels.operation import GRID_YZ_LIMIT, at_most, next_pow2, smem_rule, threads_rule

FORMULATION_DIRECT = "direct"
FORMULATION_IGEMM = "igemm"
FULL_UNROLL = 0   # an unroll value of 0 renders as a plain "#pragma unroll" (unroll completely)


@dataclass(frozen=True)
class CorrelationEnvelope:
    """The largest geometry among the correlations one kernel runs (one, or one per stride phase)."""

    CI: int
    CO: int
    OH: int
    OW: int
    R: int
    S: int
    STH: int
    STW: int
    grid_z: int          # blocks along z: images (times phases)


@dataclass(frozen=True)
class GemmEnvelope:
    GM: int
    GN: int
    GK: int
    grid_z: int = 1


def _upto(choices: tuple[int, ...], bound: int) -> tuple[int, ...]:
    """The choices not above ``bound`` (the smallest always stays)."""
    kept = tuple(c for c in choices if c <= bound)
    return kept or choices[:1]


def direct_params(env: CorrelationEnvelope, when: tuple[str, tuple] | None = None) -> list[Param]:
    # Tiles larger than the problem only add idle threads; leaving them out of the choices (rather
    # than rejecting them later) keeps random and TPE proposals mostly feasible on small layers.
    cond = (when,) if when else ()
    kb = _upto((4, 8, 16, 32, 64), max(4, next_pow2(env.CO)))
    tp = _upto((1, 2, 4, 8, 16, 32), max(1, next_pow2(env.OH)))
    tq = _upto((4, 8, 16, 32, 64), max(4, next_pow2(env.OW)))
    return [
        Param("KB", kb, "output channels per block (target maps per block)", cond),
        Param("KPT", _upto((1, 2, 4, 8), max(kb)), "output channels per thread", cond),
        Param("TP", tp, "output rows per block", cond),
        Param("TQ", tq, "output columns per block", cond),
        Param("PPT", _upto((1, 2, 4), max(tp)), "output rows per thread", cond),
        Param("QPT", _upto((1, 2, 4, 8), max(tq)), "output columns per thread (register window along a row)", cond),
        Param("CB", _upto((1, 2, 4, 8, 16), max(1, next_pow2(env.CI))),
              "input channels staged in shared memory per step", cond),
        Param("PAD", (0, 1, 2), "floats of padding per shared-memory input row (bank conflicts)", cond),
        Param("UNROLL_R", (1, FULL_UNROLL), "unrolling of the filter-row loop (0: complete)", cond),
    ]


def direct_smem_bytes(env: CorrelationEnvelope, KB: int, TP: int, TQ: int, CB: int, PAD: int) -> int:
    iht = (TP - 1) * env.STH + env.R
    iwt = (TQ - 1) * env.STW + env.S
    in_floats = (CB * iht * (iwt + PAD) + 3) // 4 * 4   # aligned like the template's IN_FLOATS
    return 4 * (in_floats + CB * env.R * env.S * KB)


def direct_constraints(env: CorrelationEnvelope, limits: DeviceLimits) -> list[Constraint]:
    return [
        Constraint(("KB", "KPT"), lambda kb, kpt: None if kb % kpt == 0 else f"KPT={kpt} does not divide KB={kb}"),
        Constraint(("TP", "PPT"), lambda tp, ppt: None if tp % ppt == 0 else f"PPT={ppt} does not divide TP={tp}"),
        Constraint(("TQ", "QPT"), lambda tq, qpt: None if tq % qpt == 0 else f"QPT={qpt} does not divide TQ={tq}"),
        at_most("KB", max(4, next_pow2(env.CO)), f"only {env.CO} output channels"),
        at_most("TP", max(1, next_pow2(env.OH)), f"only {env.OH} output rows"),
        at_most("TQ", max(4, next_pow2(env.OW)), f"only {env.OW} output columns"),
        at_most("CB", max(1, next_pow2(env.CI)), f"only {env.CI} input channels"),
        threads_rule(limits, ("KB", "KPT", "TP", "PPT", "TQ", "QPT"),
                     lambda kb, kpt, tp, ppt, tq, qpt: (kb // kpt) * (tp // ppt) * (tq // qpt)),
        Constraint(("KPT", "PPT", "QPT"),
                   lambda kpt, ppt, qpt: None if kpt * ppt * qpt <= 64
                   else f"{kpt * ppt * qpt} accumulators per thread exceed 64 (registers)"),
        Constraint(("QPT",), lambda qpt: None if (qpt - 1) * env.STW + env.S <= 48
                   else "the register window along a row exceeds 48 floats"),
        Constraint(("KPT", "PPT", "QPT", "UNROLL_R"),
                   lambda kpt, ppt, qpt, ur: None
                   if kpt * ppt * qpt * env.S * (env.R if ur == FULL_UNROLL else 1) <= 16384
                   else "the unrolled loop body exceeds 16384 multiply-adds (code size)"),
        smem_rule(limits, ("KB", "TP", "TQ", "CB", "PAD"),
                  lambda kb, tp, tq, cb, pad: direct_smem_bytes(env, kb, tp, tq, cb, pad)),
        Constraint(("KB",), lambda kb: None if -(-env.CO // kb) <= GRID_YZ_LIMIT
                   else f"{-(-env.CO // kb)} blocks along y exceed {GRID_YZ_LIMIT}"),
        Constraint(("KB",), lambda kb: None if env.grid_z <= GRID_YZ_LIMIT
                   else f"{env.grid_z} blocks along z exceed {GRID_YZ_LIMIT} (batch too large for direct)"),
    ]


def igemm_params(bm: tuple[int, ...], bn: tuple[int, ...], bk: tuple[int, ...], env: GemmEnvelope,
                 when: tuple[str, tuple] | None = None) -> list[Param]:
    cond = (when,) if when else ()
    bm = _upto(bm, max(bm[0], next_pow2(env.GM)))
    bn = _upto(bn, max(bn[0], next_pow2(env.GN)))
    bk = _upto(bk, max(bk[0], next_pow2(env.GK)))
    return [
        Param("BM", bm, "GEMM rows per block", cond),
        Param("BN", bn, "GEMM columns per block", cond),
        Param("BK", bk, "reduction step staged in shared memory", cond),
        Param("TM", _upto((2, 4, 8), max(bm)), "GEMM rows per thread", cond),
        Param("TN", _upto((2, 4, 8), max(bn)), "GEMM columns per thread", cond),
        Param("PAD_A", (0, 1, 4), "floats of padding per shared-memory row of A (bank conflicts)", cond),
        Param("PAD_B", (0, 1, 4), "floats of padding per shared-memory row of B (bank conflicts)", cond),
        Param("UNROLL_K", (1, 2, 4, FULL_UNROLL), "unrolling of the inner reduction loop (0: complete)", cond),
    ]


def igemm_smem_bytes(BM: int, BN: int, BK: int, PAD_A: int, PAD_B: int) -> int:
    return 4 * 2 * BK * (BM + PAD_A + BN + PAD_B)


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
        smem_rule(limits, ("BM", "BN", "BK", "PAD_A", "PAD_B"), igemm_smem_bytes),
        Constraint(("BK", "UNROLL_K"), lambda bk, u: None if u <= bk else f"UNROLL_K={u} exceeds BK={bk}"),
        Constraint(("BN",), lambda bn: None if -(-env.GN // bn) <= GRID_YZ_LIMIT
                   else f"{-(-env.GN // bn)} blocks along y exceed {GRID_YZ_LIMIT}"),
    ]


def direct_default_candidates(env: CorrelationEnvelope) -> list[dict]:
    """Direct-tiling configs in order of preference: several output channels and a 4x4-ish register
    tile per thread, block tiles no larger than the output."""
    kb = max(4, min(16, next_pow2(env.CO)))
    out = []
    for tp, ppt in ((8, 2), (4, 2), (2, 1), (1, 1)):
        for tq in (32, 16, 8, 4):
            if tq > max(4, next_pow2(env.OW)) or tp > max(1, next_pow2(env.OH)):
                continue
            qpt = min(4, tq)
            kpt = 4 if kb >= 8 else 2
            out.append({"formulation": FORMULATION_DIRECT, "KB": kb, "KPT": kpt, "TP": tp, "TQ": tq,
                        "PPT": ppt, "QPT": qpt, "CB": min(4, max(1, next_pow2(env.CI))), "PAD": 1,
                        "UNROLL_R": 1})
    return out


def igemm_default_candidates(env: GemmEnvelope, pad_b: int) -> list[dict]:
    """Implicit-GEMM configs in order of preference, sized to the GEMM's columns; the last fits any problem."""
    gemm = {"formulation": FORMULATION_IGEMM, "PAD_A": 0, "PAD_B": pad_b, "UNROLL_K": 0}
    bn = max(16, min(64, next_pow2(env.GN)))
    tn = 4 if bn >= 32 else 2
    return [
        {**gemm, "BM": 128, "BN": bn, "BK": 8, "TM": 8, "TN": tn},
        {**gemm, "BM": 64, "BN": bn, "BK": 8, "TM": 4, "TN": tn},
        {**gemm, "BM": 64, "BN": 32, "BK": 8, "TM": 4, "TN": 4},
        {**gemm, "BM": 32, "BN": 16, "BK": 4, "TM": 2, "TN": 4, "PAD_B": 0},
    ]
