"""sep_onepass: the seed's one-pass separable convolution, for sep_conv_fwd and sep_conv_bwd_data.

The block stages CB input maps of its output tile with the halo, and their 1D taps, in shared
memory. MC maps at a time, the vertical pass writes TP x (TQ+S-1) intermediates of every
(map, rank, output map) to shared memory, a barrier, and the horizontal pass filters them along
rows onto each thread's accumulators: both passes in one kernel, the intermediate never leaves
the multiprocessor. Its last default candidate is a 32-thread tile of one output map that every
problem fits.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import FULL_UNROLL, Formulation, OpFormulation, pragma_unroll
from autocnn.kernels.formulations.cores.sep_geometry import (TILE_PARAMS, SepCorrelation, correlation, fallback_tile,
                                                             fit_registers, horizontal_registers, io_args,
                                                             preferred_tiles, register_limit, taps_floats, threads_of,
                                                             tile_blocks, tile_constraints, tile_params, tile_threads)
from autocnn.kernels.rules import code_size_rule, sixteen_bit_rule, smem_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch

NAME = "sep_onepass"


def onepass_smem_bytes(g: SepCorrelation, KB: int, TP: int, TQ: int, CB: int, MC: int, PAD: int) -> int:
    ld = TQ + g.S - 1 + PAD
    xs = (CB * (TP + g.R - 1) * ld + 3) // 4 * 4
    return g.stage_size * (xs + taps_floats(g, CB, KB, g.R + g.S) + MC * g.RANK * KB * TP * ld)


def onepass_registers(g: SepCorrelation, KPT: int, PPT: int, QPT: int, VPT: int) -> int:
    """The horizontal pass's registers, and the vertical pass's VPT sums over a window of R+VPT-1."""
    return horizontal_registers(g.S, KPT, PPT, QPT) + 2 * VPT + g.R


class _SepOnepass(OpFormulation):
    formulation = NAME
    summary = "one-pass separable convolution (tile, halo and intermediate in shared memory)"
    templates = ("sep_onepass.cu.j2", "_sep_tile.cuh.j2")

    def params(self, problem: Any) -> list[Param]:
        return [*tile_params(correlation(problem)),
                Param("MC", (1, 2, 4, 8), "input maps whose intermediates are in shared memory at once"),
                Param("VPT", (1, 2, 4), "rows of one intermediate column per thread in the vertical pass"),
                Param("PAD", (0, 1, 2), "floats of padding per shared-memory row (bank conflicts)"),
                Param("UNROLL_Y", (1, FULL_UNROLL), "unrolling of the vertical taps loop (0: complete)"),
                Param("UNROLL_J", (1, FULL_UNROLL), "unrolling of the loop over ranks (0: complete)")]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        g = correlation(problem)
        return [
            sixteen_bit_rule(problem, NAME, "KB", "the separable factors (the batched SVD's) and its kernels are "
                                                  "float32"),
            *tile_constraints(g, limits),
            Constraint(("CB", "MC"), lambda cb, mc: None if cb % mc == 0 else f"MC={mc} does not divide CB={cb}"),
            Constraint(("TP", "VPT"), lambda tp, vpt: None if tp % vpt == 0 else f"VPT={vpt} does not divide TP={tp}"),
            register_limit(limits, (*TILE_PARAMS, "VPT"),
                           lambda kb, kpt, tp, ppt, tq, qpt, vpt: onepass_registers(g, kpt, ppt, qpt, vpt),
                           lambda *v: threads_of(*v[:6]), "the accumulators and row windows"),
            code_size_rule(("KPT", "PPT", "QPT", "UNROLL_J"),
                      lambda kpt, ppt, qpt, uj: kpt * ppt * qpt * g.S * (g.RANK if uj == FULL_UNROLL else 1)),
            smem_rule(limits, ("KB", "TP", "TQ", "CB", "MC", "PAD"),
                      lambda kb, tp, tq, cb, mc, pad: onepass_smem_bytes(g, kb, tp, tq, cb, mc, pad)),
        ]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        g = correlation(problem)
        extra = {"MC": 1, "VPT": 2, "PAD": 1, "UNROLL_Y": FULL_UNROLL, "UNROLL_J": 1}
        out = []
        for tile in preferred_tiles(g):
            vpt = min(2, tile["TP"])
            fitted = fit_registers(tile, onepass_registers(g, tile["KPT"], tile["PPT"], tile["QPT"], vpt))
            if fitted is not None and {"formulation": NAME, **fitted, **extra, "VPT": vpt} not in out:
                out.append({"formulation": NAME, **fitted, **extra, "VPT": vpt})
        # Last: a tile every problem fits (32 threads, one output map, one input map per step).
        return out + [{"formulation": NAME, **fallback_tile(g), **extra, "VPT": 1}]

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        return {"UNROLL_Y": pragma_unroll(config["UNROLL_Y"]), "UNROLL_J": pragma_unroll(config["UNROLL_J"])}

    def launches(self, problem: Any, c: Config) -> tuple[Launch, ...]:
        g = correlation(problem)
        smem = onepass_smem_bytes(g, c["KB"], c["TP"], c["TQ"], c["CB"], c["MC"], c["PAD"])
        return (Launch("sep_conv", (tile_blocks(g, c), 1, 1), (tile_threads(c), 1, 1), smem, io_args(g)),)

    def code_helpers(self) -> tuple:
        return (correlation, io_args, onepass_smem_bytes, taps_floats, tile_blocks, tile_threads, pragma_unroll)


class SepOnepassFwd(_SepOnepass):
    op = "sep_conv_fwd"


class SepOnepassBwdData(_SepOnepass):
    op = "sep_conv_bwd_data"


SEP_ONEPASS = Formulation(NAME, (SepOnepassFwd(), SepOnepassBwdData()))
