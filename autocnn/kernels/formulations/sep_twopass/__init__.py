"""sep_twopass: the seed's two-pass separable convolution, for sep_conv_fwd and sep_conv_bwd_data.

Two kernels per block of NB images: sep_vpass filters the input along columns with U into a
workspace Z[NB][CO][CI][RANK][OH][OW+S-1] (one intermediate map per (output map, input map, rank):
the 1D filters differ for every pair), sep_hpass filters Z along rows with V and sums over input
maps and ranks (plus the epilogue). Z is CO*CI*RANK maps per image, so the workspace is bounded by
blocking over images: NB images per pair of launches, NB chosen so that it stays within the
device's workspace limit (the default candidates within DEFAULT_WORKSPACE_BYTES); the plan's
workspace_bytes reports it. A problem whose single image already needs more has no two-pass config.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DEFAULT_WORKSPACE_BYTES, DeviceLimits
from autocnn.kernels.formulations.base import FULL_UNROLL, Formulation, OpFormulation, choices_upto, pragma_unroll
from autocnn.kernels.formulations.cores.sep_geometry import (TILE_PARAMS, SepCorrelation, correlation, fit_registers,
                                                             horizontal_registers, preferred_tiles, register_limit,
                                                             threads_of, tile_blocks, tile_constraints, tile_params,
                                                             tile_threads)
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.problem import INDEX_LIMIT
from autocnn.kernels.rules import code_size_rule, sixteen_bit_rule, smem_rule, threads_rule, workspace_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch

NAME = "sep_twopass"
WORKSPACE = "sep_z"
IMAGE_BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128)


def z_elements_per_image(g: SepCorrelation) -> int:
    return g.CO * g.CI * g.RANK * g.OH * (g.OW + g.S - 1)


def images_per_block(g: SepCorrelation, NB: int) -> int:
    return min(NB, g.N)


def vpass_smem_bytes(g: SepCorrelation, VKB: int, VCB: int, VTP: int, VTW: int) -> int:
    xs = (VCB * (VTP + g.R - 1) * VTW + 3) // 4 * 4
    return g.stage_size * (xs + VCB * VKB * g.RANK * g.R)


def hpass_smem_bytes(g: SepCorrelation, KB: int, TP: int, TQ: int, CB: int, PAD: int) -> int:
    zs = (CB * g.RANK * KB * TP * (TQ + g.S - 1 + PAD) + 3) // 4 * 4
    return g.stage_size * (zs + CB * KB * g.RANK * g.S)


def vpass_blocks(g: SepCorrelation, c: Config | dict, images: int) -> int:
    return (images * cdiv(g.CO, c["VKB"]) * cdiv(g.CI, c["VCB"]) * cdiv(g.OH, c["VTP"])
            * cdiv(g.OW + g.S - 1, c["VTW"]))


def image_blocks(g: SepCorrelation, NB: int) -> list[tuple[int, int]]:
    """(first image, images) of each pair of launches."""
    nb = images_per_block(g, NB)
    return [(n0, min(nb, g.N - n0)) for n0 in range(0, g.N, nb)]


class _SepTwopass(OpFormulation):
    formulation = NAME
    summary = "two-pass separable convolution (two kernels, the intermediate in a workspace)"
    templates = ("sep_twopass.cu.j2", "_sep_tile.cuh.j2")

    def params(self, problem: Any) -> list[Param]:
        g = correlation(problem)
        return [
            Param("NB", choices_upto(IMAGE_BLOCKS, next_pow2(g.N)), "images per pair of launches (bounds the workspace)"),
            Param("VKB", choices_upto((1, 2, 4, 8, 16), max(4, next_pow2(g.CO))), "output maps per vertical-pass block"),
            Param("VCB", choices_upto((1, 2, 4, 8), max(1, next_pow2(g.CI))), "input maps per vertical-pass block"),
            Param("VTP", choices_upto((4, 8, 16, 32), max(4, next_pow2(g.OH))), "rows per vertical-pass tile"),
            Param("VTW", choices_upto((16, 32, 64, 128), max(16, next_pow2(g.OW + g.S - 1))),
                  "columns per vertical-pass tile"),
            Param("VPT", (1, 2, 4), "rows of one intermediate column per thread in the vertical pass"),
            Param("VTHREADS", (64, 128, 256, 512), "threads of a vertical-pass block"),
            *tile_params(g),
            Param("PAD", (0, 1, 2), "floats of padding per shared-memory row (bank conflicts)"),
            Param("UNROLL_Y", (1, FULL_UNROLL), "unrolling of the vertical taps loop (0: complete)"),
            Param("UNROLL_J", (1, FULL_UNROLL), "unrolling of the loop over ranks (0: complete)"),
        ]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        g = correlation(problem)
        per_image = z_elements_per_image(g)
        return [
            sixteen_bit_rule(problem, NAME, "NB", "the separable factors (the batched SVD's) and its kernels are "
                                                  "float32"),
            *tile_constraints(g, limits),
            Constraint(("VTP", "VPT"), lambda vtp, vpt: None if vtp % vpt == 0 else f"VPT={vpt} does not divide VTP={vtp}"),
            threads_rule(limits, ("VTHREADS",), lambda n: n),
            workspace_rule(limits.workspace_bytes, ("NB",), lambda nb: WORKSPACE_ELEMENT.size * images_per_block(g, nb) * per_image),
            Constraint(("NB",), lambda nb: None if images_per_block(g, nb) * per_image <= INDEX_LIMIT
                       else "the intermediate exceeds 32-bit indexing"),
            register_limit(limits, TILE_PARAMS,
                           lambda kb, kpt, tp, ppt, tq, qpt: horizontal_registers(g.S, kpt, ppt, qpt), threads_of,
                           "the accumulators and row window"),
            code_size_rule(("KPT", "PPT", "QPT", "UNROLL_J"),
                      lambda kpt, ppt, qpt, uj: kpt * ppt * qpt * g.S * (g.RANK if uj == FULL_UNROLL else 1)),
            smem_rule(limits, ("VKB", "VCB", "VTP", "VTW"), lambda *v: vpass_smem_bytes(g, *v)),
            smem_rule(limits, ("KB", "TP", "TQ", "CB", "PAD"), lambda *v: hpass_smem_bytes(g, *v)),
        ]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        g = correlation(problem)
        per_image = WORKSPACE_ELEMENT.size * z_elements_per_image(g)
        fits = [nb for nb in IMAGE_BLOCKS if nb <= next_pow2(g.N) and nb * per_image <= DEFAULT_WORKSPACE_BYTES]
        if not fits:
            return []       # one image's intermediate exceeds the workspace limit
        vpass = {"NB": max(fits), "VKB": min(4, max(4, next_pow2(g.CO))), "VCB": 1,
                 "VTP": min(8, max(4, next_pow2(g.OH))), "VTW": min(32, max(16, next_pow2(g.OW + g.S - 1))),
                 "VPT": 2, "VTHREADS": 128}
        out = []
        for tile in preferred_tiles(g):
            fitted = fit_registers(tile, horizontal_registers(g.S, tile["KPT"], tile["PPT"], tile["QPT"]))
            config = {"formulation": NAME, **vpass, **(fitted or {}), "CB": min(2, tile["CB"]), "PAD": 1,
                      "UNROLL_Y": FULL_UNROLL, "UNROLL_J": 1}
            if fitted is not None and config not in out:
                out.append(config)
        return out

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        return {"UNROLL_Y": pragma_unroll(config["UNROLL_Y"]), "UNROLL_J": pragma_unroll(config["UNROLL_J"])}

    def launches(self, problem: Any, c: Config) -> tuple[Launch, ...]:
        g = correlation(problem)
        vsmem = vpass_smem_bytes(g, c["VKB"], c["VCB"], c["VTP"], c["VTW"])
        hsmem = hpass_smem_bytes(g, c["KB"], c["TP"], c["TQ"], c["CB"], c["PAD"])
        hargs = (WORKSPACE, "v", *(("bias",) if g.bias_arg else ()), g.out_name)
        steps: list[Launch] = []
        for n0, images in image_blocks(g, c["NB"]):
            steps.append(Launch("sep_vpass", (vpass_blocks(g, c, images), 1, 1), (c["VTHREADS"], 1, 1), vsmem,
                                (g.in_name, "u", WORKSPACE), (n0,)))
            steps.append(Launch("sep_hpass", (tile_blocks(g, c, images), 1, 1), (tile_threads(c), 1, 1), hsmem,
                                hargs, (n0,)))
        return tuple(steps)

    def buffers(self, problem: Any, c: Config):
        g = correlation(problem)
        return (), ((WORKSPACE, images_per_block(g, c["NB"]) * z_elements_per_image(g)),)

    def code_helpers(self) -> tuple:
        return (correlation, z_elements_per_image, images_per_block, image_blocks, vpass_smem_bytes,
                hpass_smem_bytes, vpass_blocks, tile_blocks, tile_threads, pragma_unroll, WORKSPACE)


class SepTwopassFwd(_SepTwopass):
    op = "sep_conv_fwd"


class SepTwopassBwdData(_SepTwopass):
    op = "sep_conv_bwd_data"


SEP_TWOPASS = Formulation(NAME, (SepTwopassFwd(), SepTwopassBwdData()))
