"""The direct tiled correlation core (_direct.cuh.j2) and what the formulations that run it share:
direct's conv_fwd and conv_bwd_data (each stride phase) and direct_pool's fused convolution and
averaging; its output tiling (``output_tile_params``) is the separable formulations' too
(sep_geometry.py).

A block stages an input patch with its halo and the filters of KB output channels in shared
memory, CB input channels at a time, in the accumulator's type; each thread keeps KPT x PPT x QPT
outputs in registers and slides a register window along each input row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import FULL_UNROLL, OpFormulation, choices_upto, pragma_unroll
from autocnn.kernels.geometry import next_pow2
from autocnn.kernels.rules import GRID_YZ_LIMIT, at_most, code_size_rule, grid_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param


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
    stage_size: int      # bytes of a staged element: the core stages in the accumulator's type


def output_tile_params(kb: tuple[int, ...], tp: tuple[int, ...], tq: tuple[int, ...],
                       cb: tuple[int, ...]) -> list[Param]:
    """KB, KPT, TP, TQ, PPT, QPT, CB of a register-tiled correlation: the block's tile of output maps,
    rows and columns (choices given), each thread's share of it (choices up to the block's), and the
    input maps staged per step. The direct core's, and the separable formulations' (sep_geometry)."""
    return [
        Param("KB", kb, "output maps per block (target maps per block)"),
        Param("KPT", choices_upto((1, 2, 4, 8), max(kb)), "output maps per thread"),
        Param("TP", tp, "output rows per block"),
        Param("TQ", tq, "output columns per block"),
        Param("PPT", choices_upto((1, 2, 4), max(tp)), "output rows per thread"),
        Param("QPT", choices_upto((1, 2, 4, 8), max(tq)), "output columns per thread (register window along a row)"),
        Param("CB", cb, "input maps staged in shared memory per step"),
    ]


def direct_params(env: CorrelationEnvelope) -> list[Param]:
    # Tiles larger than the problem only add idle threads; leaving them out of the choices (rather
    # than rejecting them later) keeps random and TPE proposals mostly feasible on small layers.
    return [
        *output_tile_params(choices_upto((4, 8, 16, 32, 64), max(4, next_pow2(env.CO))),
                            choices_upto((1, 2, 4, 8, 16, 32), max(1, next_pow2(env.OH))),
                            choices_upto((4, 8, 16, 32, 64), max(4, next_pow2(env.OW))),
                            choices_upto((1, 2, 4, 8, 16), max(1, next_pow2(env.CI)))),
        Param("PAD", (0, 1, 2), "floats of padding per shared-memory input row (bank conflicts)"),
        Param("UNROLL_R", (1, FULL_UNROLL), "unrolling of the filter-row loop (0: complete)"),
    ]


def direct_smem_bytes(env: CorrelationEnvelope, KB: int, TP: int, TQ: int, CB: int, PAD: int) -> int:
    iht = (TP - 1) * env.STH + env.R
    iwt = (TQ - 1) * env.STW + env.S
    in_floats = (CB * iht * (iwt + PAD) + 3) // 4 * 4   # aligned like the template's IN_FLOATS
    return env.stage_size * (in_floats + CB * env.R * env.S * KB)


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
        code_size_rule(("KPT", "PPT", "QPT", "UNROLL_R"),
                       lambda kpt, ppt, qpt, ur: kpt * ppt * qpt * env.S * (env.R if ur == FULL_UNROLL else 1)),
        smem_rule(limits, ("KB", "TP", "TQ", "CB", "PAD"),
                  lambda kb, tp, tq, cb, pad: direct_smem_bytes(env, kb, tp, tq, cb, pad)),
        grid_rule(("KB",), lambda kb: -(-env.CO // kb)),
        Constraint(("KB",), lambda kb: None if env.grid_z <= GRID_YZ_LIMIT
                   else f"{env.grid_z} blocks along z exceed {GRID_YZ_LIMIT} (batch too large for direct)"),
    ]


def direct_default_candidates(env: CorrelationEnvelope, formulation: str) -> list[dict]:
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
            out.append({"formulation": formulation, "KB": kb, "KPT": kpt, "TP": tp, "TQ": tq,
                        "PPT": ppt, "QPT": qpt, "CB": min(4, max(1, next_pow2(env.CI))), "PAD": 1,
                        "UNROLL_R": 1})
    return out


def direct_threads(c: Config) -> int:
    return (c["KB"] // c["KPT"]) * (c["TP"] // c["PPT"]) * (c["TQ"] // c["QPT"])


class DirectCorrelation(OpFormulation):
    """What the kernels on the direct core share; each says how its correlation looks."""

    def envelope(self, problem: Any) -> CorrelationEnvelope:
        raise NotImplementedError

    def params(self, problem: Any) -> list[Param]:
        return direct_params(self.envelope(problem))

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        return direct_constraints(self.envelope(problem), limits)

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        return direct_default_candidates(self.envelope(problem), self.formulation)

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        return {"UNROLL_R": pragma_unroll(config["UNROLL_R"]), "UNROLL_C": "1"}

    def code_helpers(self) -> tuple:
        return (type(self).envelope, CorrelationEnvelope, direct_smem_bytes, direct_threads, pragma_unroll)
