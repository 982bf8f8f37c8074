"""sep_register: the seed's register-based separable convolution, for sep_conv_fwd and sep_conv_bwd_data.

Each thread holds the input its PPT x QPT outputs need, halo included ((PPT+R-1) x (QPT+S-1)
floats), in registers: the filter sizes are compile-time constants, as the seed's C++ templates
made them. Per input map it loads that window once and reuses it for its KPT output maps and every
rank. The block stages the 1D taps of CB input maps for its KB output maps in shared memory. Fast
for small filters; the window (and the halo work of the vertical pass) grows with the filter, so
ptxas's spills end it for large ones (the constraint below prunes the hopeless ones first).
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import FULL_UNROLL, Formulation, OpFormulation, pragma_unroll
from autocnn.kernels.formulations.cores.sep_geometry import (TILE_PARAMS, correlation, fit_registers, io_args,
                                                             preferred_tiles, register_limit, taps_floats, threads_of,
                                                             tile_blocks, tile_constraints, tile_params, tile_threads)
from autocnn.kernels.rules import code_size_rule, sixteen_bit_rule, smem_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch

NAME = "sep_register"


def register_floats(R: int, S: int, KPT: int, PPT: int, QPT: int) -> int:
    """Registers a thread's arrays take: window, vertical-pass columns, accumulators, taps."""
    xw = QPT + S - 1
    return (PPT + R - 1) * xw + PPT * xw + KPT * PPT * QPT + R + S


class _SepRegister(OpFormulation):
    formulation = NAME
    summary = "register-based separable convolution (tile and halo in registers)"
    templates = ("sep_register.cu.j2", "_sep_tile.cuh.j2")

    def params(self, problem: Any) -> list[Param]:
        return [*tile_params(correlation(problem)),
                Param("UNROLL_C", (1, 2, FULL_UNROLL), "unrolling of the loop over staged input maps (0: complete)"),
                Param("UNROLL_J", (1, FULL_UNROLL), "unrolling of the loop over ranks (0: complete)")]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        g = correlation(problem)
        return [
            sixteen_bit_rule(problem, NAME, "KB", "the separable factors (the batched SVD's) and its kernels are "
                                                  "float32"),
            *tile_constraints(g, limits),
            register_limit(limits, TILE_PARAMS,
                           lambda kb, kpt, tp, ppt, tq, qpt: register_floats(g.R, g.S, kpt, ppt, qpt), threads_of,
                           "the register window"),
            code_size_rule(("KPT", "PPT", "QPT", "CB", "UNROLL_C", "UNROLL_J"),
                      lambda kpt, ppt, qpt, cb, uc, uj: kpt * (ppt * (qpt + g.S - 1) * g.R + ppt * qpt * g.S)
                      * (cb if uc == FULL_UNROLL else uc) * (g.RANK if uj == FULL_UNROLL else 1)),
            Constraint(("CB", "UNROLL_C"), lambda cb, uc: None if uc <= cb else f"UNROLL_C={uc} exceeds CB={cb}"),
            smem_rule(limits, ("CB", "KB"), lambda cb, kb: g.stage_size * taps_floats(g, cb, kb, g.R + g.S)),
        ]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        g = correlation(problem)
        out: list[dict[str, Any]] = []
        for tile in preferred_tiles(g):
            # The window must stay in registers: fewer outputs per thread, and fewer threads per
            # block, as the filter grows.
            for ppt, qpt, kpt in ((tile["PPT"], tile["QPT"], tile["KPT"]), (1, min(2, tile["QPT"]), tile["KPT"]),
                                  (1, 1, tile["KPT"])):
                cand = fit_registers({**tile, "PPT": ppt, "QPT": qpt, "KPT": kpt},
                                     register_floats(g.R, g.S, kpt, ppt, qpt))
                if cand is not None:
                    config = {"formulation": NAME, **cand, "UNROLL_C": 1, "UNROLL_J": 1}
                    if config not in out:
                        out.append(config)
                    break
        return out

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        return {"UNROLL_C": pragma_unroll(config["UNROLL_C"]), "UNROLL_J": pragma_unroll(config["UNROLL_J"])}

    def launches(self, problem: Any, c: Config) -> tuple[Launch, ...]:
        g = correlation(problem)
        smem = g.stage_size * taps_floats(g, c["CB"], c["KB"], g.R + g.S)
        return (Launch("sep_conv", (tile_blocks(g, c), 1, 1), (tile_threads(c), 1, 1), smem, io_args(g)),)

    def code_helpers(self) -> tuple:
        return (correlation, io_args, taps_floats, tile_blocks, tile_threads, pragma_unroll)


class SepRegisterFwd(_SepRegister):
    op = "sep_conv_fwd"


class SepRegisterBwdData(_SepRegister):
    op = "sep_conv_bwd_data"


SEP_REGISTER = Formulation(NAME, (SepRegisterFwd(), SepRegisterBwdData()))
