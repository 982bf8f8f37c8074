"""What the separable formulations of sep_conv_fwd and sep_conv_bwd_data share: the correlation both
operations are, and the output tiling of their blocks.

Both operations compute one separable correlation (templates/_sep_corr.cuh.j2 renders it):

    out[n][co][oh][ow] = epilogue( sum_{ci, j, y, x} U(co,ci,j,y) V(co,ci,j,x) in[n][ci][oh+y+OFFH][ow+x+OFFW] )

(zero outside ``in``). Forward: in = x, CI = C, CO = K, U = u, V = v, OFFH = -pad_top. Backward-data:
in = dy, CI = K, CO = C, OH x OW = H x W, U and V the 1D filters flipped (the flipped 2D filter of
a rank-r filter is the sum of outer products of the flipped 1D filters), OFFH = pad_top - (R - 1).

A block computes a TP x TQ tile of outputs for KB output maps, KPT x PPT x QPT of them per thread
(threads: KB/KPT x TP/PPT x TQ/QPT), reducing over all CI input maps and all ranks itself: no
atomics. Blocks are numbered along x only (image, output-map block, tile), so no grid dimension
limit binds any problem a 32-bit index can address.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import choices_upto
from autocnn.kernels.formulations.cores.direct_correlation import output_tile_params
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import GRID_X_LIMIT, at_most, threads_rule
from autocnn.kernels.space import Config, Constraint, Param

# Registers a thread may plan on for its arrays (of 255), and what addresses and loop state take besides.
REGISTER_BUDGET = 200
REGISTER_OVERHEAD = 32
TILE_PARAMS = ("KB", "KPT", "TP", "PPT", "TQ", "QPT")


@dataclass(frozen=True)
class SepCorrelation:
    """The separable correlation an operation is (see the module docstring)."""

    N: int
    CI: int
    CO: int
    IH: int
    IW: int
    OH: int
    OW: int
    R: int
    S: int
    RANK: int
    OFFH: int
    OFFW: int
    flip: bool            # bwd_data: U, V are the 1D filters flipped, with K and C swapped
    in_name: str          # the plan buffer read
    out_name: str         # the plan buffer written
    bias: bool            # a bias is added to the output (the forward)
    bias_arg: bool        # the kernel takes a bias argument (the forward, with or without one)
    stage_size: int       # bytes of a staged element or intermediate sum: the accumulator's type


def correlation(p: Any) -> SepCorrelation:
    if p.op == "sep_conv_fwd":
        return SepCorrelation(N=p.N, CI=p.C, CO=p.K, IH=p.H, IW=p.W, OH=p.P, OW=p.Q, R=p.R, S=p.S,
                              RANK=p.rank, OFFH=-p.padding[0], OFFW=-p.padding[1], flip=False,
                              in_name="x", out_name="y", bias=p.bias, bias_arg=True,
                              stage_size=p.precision.accumulator.size)
    if p.op == "sep_conv_bwd_data":
        return SepCorrelation(N=p.N, CI=p.K, CO=p.C, IH=p.P, IW=p.Q, OH=p.H, OW=p.W, R=p.R, S=p.S,
                              RANK=p.rank, OFFH=p.padding[0] - (p.R - 1), OFFW=p.padding[1] - (p.S - 1),
                              flip=True, in_name="dy", out_name="dx", bias=False, bias_arg=False,
                              stage_size=p.precision.accumulator.size)
    raise ValueError(f"{p.op} is not a separable correlation (sep_conv_fwd or sep_conv_bwd_data)")


def io_args(g: SepCorrelation) -> tuple[str, ...]:
    """The kernel arguments of a single-kernel plan: input, u, v, (bias), output."""
    return (g.in_name, "u", "v", *(("bias",) if g.bias_arg else ()), g.out_name)


# -- the output tiling shared by every fwd/bwd_data formulation --------------------------------------

def kb_cap(g: SepCorrelation) -> int:
    return max(4, next_pow2(g.CO))


def tp_cap(g: SepCorrelation) -> int:
    return max(4, next_pow2(g.OH))


def tq_cap(g: SepCorrelation) -> int:
    return max(8, next_pow2(g.OW))


def cb_cap(g: SepCorrelation) -> int:
    return max(1, next_pow2(g.CI))


def tile_params(g: SepCorrelation) -> list[Param]:
    """KB, KPT, TP, TQ, PPT, QPT, CB: tiles larger than the problem are left out of the choices (they
    would only add idle threads), except that a 4 x 8 tile of 4 maps is always offered."""
    return output_tile_params(choices_upto((1, 2, 4, 8, 16, 32, 64), kb_cap(g)),
                              choices_upto((1, 2, 4, 8, 16, 32), tp_cap(g)),
                              choices_upto((4, 8, 16, 32, 64), tq_cap(g)),
                              choices_upto((1, 2, 4, 8, 16), cb_cap(g)))


def tile_threads(c: Config | dict) -> int:
    return (c["KB"] // c["KPT"]) * (c["TP"] // c["PPT"]) * (c["TQ"] // c["QPT"])


def threads_of(kb: int, kpt: int, tp: int, ppt: int, tq: int, qpt: int) -> int:
    """tile_threads of TILE_PARAMS' values, in that order."""
    return (kb // kpt) * (tp // ppt) * (tq // qpt)


def tile_blocks(g: SepCorrelation, c: Config | dict, images: int | None = None) -> int:
    """Blocks of one launch over ``images`` images (all by default)."""
    n = g.N if images is None else images
    return n * cdiv(g.CO, c["KB"]) * cdiv(g.OH, c["TP"]) * cdiv(g.OW, c["TQ"])


def tile_constraints(g: SepCorrelation, limits: DeviceLimits) -> list[Constraint]:
    return [
        Constraint(("KB", "KPT"), lambda kb, kpt: None if kb % kpt == 0 else f"KPT={kpt} does not divide KB={kb}"),
        Constraint(("TP", "PPT"), lambda tp, ppt: None if tp % ppt == 0 else f"PPT={ppt} does not divide TP={tp}"),
        Constraint(("TQ", "QPT"), lambda tq, qpt: None if tq % qpt == 0 else f"QPT={qpt} does not divide TQ={tq}"),
        at_most("KB", kb_cap(g), f"only {g.CO} output maps"),
        at_most("TP", tp_cap(g), f"only {g.OH} output rows"),
        at_most("TQ", tq_cap(g), f"only {g.OW} output columns"),
        at_most("CB", cb_cap(g), f"only {g.CI} input maps"),
        threads_rule(limits, TILE_PARAMS, threads_of),
        Constraint(("KPT", "PPT", "QPT"), lambda kpt, ppt, qpt: None if kpt * ppt * qpt <= 64
                   else f"{kpt * ppt * qpt} accumulators per thread exceed 64 (registers)"),
        Constraint(("KB", "TP", "TQ"), lambda kb, tp, tq: None
                   if tile_blocks(g, {"KB": kb, "TP": tp, "TQ": tq}) <= GRID_X_LIMIT
                   else "more blocks than a grid holds"),
    ]


def taps_floats(g: SepCorrelation, channels: int, maps: int, taps: int) -> int:
    """Shared floats of staged filter taps: ``taps`` of each (channel, map, rank), rounded to 4."""
    return (channels * maps * g.RANK * taps + 3) // 4 * 4


def register_limit(limits: DeviceLimits, params: tuple[str, ...], count, threads, what: str) -> Constraint:
    """The registers a thread's arrays take (``count``, from the params) plus REGISTER_OVERHEAD
    within REGISTER_BUDGET and within the share of the register file a full block leaves each thread
    (``threads``, from the same params): __launch_bounds__ makes ptxas spill beyond that share."""
    def check(*values):
        n = count(*values) + REGISTER_OVERHEAD
        share = min(limits.max_regs_per_thread, limits.regs_per_sm // max(1, threads(*values)))
        if n > REGISTER_BUDGET + REGISTER_OVERHEAD:
            return f"about {n} registers per thread for {what}, more than {REGISTER_BUDGET + REGISTER_OVERHEAD} (spills)"
        if n > share:
            return f"about {n} registers per thread for {what}, more than the {share} a block of {threads(*values)} threads leaves each"
        return None
    return Constraint(params, check)


def horizontal_registers(S: int, KPT: int, PPT: int, QPT: int) -> int:
    """Accumulators, one tap row and the row window a horizontal pass keeps in registers (the
    horizontal passes of sep_onepass and sep_twopass)."""
    return KPT * PPT * QPT + S + (QPT + S - 1)


def fit_registers(tile: dict[str, int], arrays: int) -> dict[str, int] | None:
    """The tile with fewer output maps per block until a thread's ``arrays`` registers fit the share
    of a 65536-register file its block leaves it (register_limit's rule), or None."""
    tile = dict(tile)
    while arrays + REGISTER_OVERHEAD > min(255, 65536 // tile_threads(tile)) and tile["KB"] > tile["KPT"]:
        tile["KB"] //= 2
    ok = arrays <= REGISTER_BUDGET and arrays + REGISTER_OVERHEAD <= min(255, 65536 // tile_threads(tile))
    return tile if ok and tile_threads(tile) >= 32 else None


def fallback_tile(g: SepCorrelation) -> dict[str, int]:
    """A tile every problem fits: one output map per block, 4 x 8 outputs, one per thread (32 threads)."""
    return {"KB": 1, "KPT": 1, "TP": 4, "TQ": 8, "PPT": 1, "QPT": 1, "CB": 1}


def preferred_tiles(g: SepCorrelation) -> list[dict[str, int]]:
    """Tiles in order of preference for the defaults: several output maps per block (the staged
    input is reused across them) and a few outputs per thread, no larger than the problem."""
    kb = min(16, kb_cap(g))
    cb = min(4, cb_cap(g))
    out = []
    for tp, ppt, tq, qpt in ((8, 2, 32, 4), (8, 2, 16, 2), (4, 1, 16, 2), (4, 1, 8, 1)):
        tp, tq = min(tp, tp_cap(g)), min(tq, tq_cap(g))
        ppt, qpt = min(ppt, tp), min(qpt, tq)
        kpt = 4 if kb >= 8 else 1
        tile = {"KB": kb, "KPT": kpt, "TP": tp, "TQ": tq, "PPT": ppt, "QPT": qpt, "CB": cb}
        if 32 <= tile_threads(tile) <= 1024 and tile not in out:
            out.append(tile)
    return out
