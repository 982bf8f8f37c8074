"""direct: tiled correlation (Krizhevsky 2009, Scherer et al. 2010), for conv_fwd and each stride
phase of conv_bwd_data.

A block stages an input patch with its halo and the filters of KB output channels in shared
memory, CB input channels at a time; each thread keeps KPT x PPT x QPT outputs in registers and
slides a register window along each input row. The core is _direct.cuh.j2, its parameters, rules
and defaults cores/direct_correlation.py (direct_pool runs it too); direct_<op>.cu.j2 is the glue
of each operation. The constraints are the ones the core's static_asserts and the device's limits
impose, plus pruning of tiles far larger than the problem (they only add idle threads).
"""
from __future__ import annotations

from autocnn.kernels.formulations.base import Formulation
from autocnn.kernels.formulations.cores.direct_correlation import (CorrelationEnvelope, DirectCorrelation,
                                                                   direct_smem_bytes, direct_threads)
from autocnn.kernels.geometry import cdiv, stride_phases
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem
from autocnn.kernels.space import Config
from autocnn.kernels.steps import Launch

NAME = "direct"


class DirectConvFwd(DirectCorrelation):
    formulation = NAME
    op = "conv_fwd"
    summary = "direct tiled correlation"
    templates = ("direct_conv_fwd.cu.j2", "_direct.cuh.j2")

    def envelope(self, p: ConvFwdProblem) -> CorrelationEnvelope:
        return CorrelationEnvelope(CI=p.C, CO=p.K, OH=p.P, OW=p.Q, R=p.R, S=p.S, STH=p.stride[0],
                                   STW=p.stride[1], grid_z=p.N, stage_size=p.precision.accumulator.size)

    def launches(self, p: ConvFwdProblem, c: Config) -> tuple[Launch, ...]:
        tiles = cdiv(p.P, c["TP"]) * cdiv(p.Q, c["TQ"])
        smem = direct_smem_bytes(self.envelope(p), c["KB"], c["TP"], c["TQ"], c["CB"], c["PAD"])
        return (Launch("conv_fwd", (tiles, cdiv(p.K, c["KB"]), p.N), (direct_threads(c), 1, 1), smem,
                       ("x", "w", "bias", "y")),)


class DirectConvBwdData(DirectCorrelation):
    """Each stride phase is a dense stride-1 correlation of dY with a flipped sub-filter."""

    formulation = NAME
    op = "conv_bwd_data"
    summary = "direct tiled correlation"
    templates = ("direct_conv_bwd_data.cu.j2", "_direct.cuh.j2")

    def envelope(self, p: ConvBwdDataProblem) -> CorrelationEnvelope:
        phases = stride_phases(p)
        return CorrelationEnvelope(CI=p.K, CO=p.C, OH=max(ph.Ha for ph in phases), OW=max(ph.Wb for ph in phases),
                                   R=max(1, max(ph.Ra for ph in phases)), S=max(1, max(ph.Sb for ph in phases)),
                                   STH=1, STW=1, grid_z=p.N * len(phases), stage_size=p.precision.accumulator.size)

    def launches(self, p: ConvBwdDataProblem, c: Config) -> tuple[Launch, ...]:
        phases = stride_phases(p)
        tiles = max(cdiv(ph.Ha, c["TP"]) * cdiv(ph.Wb, c["TQ"]) for ph in phases)
        smem = direct_smem_bytes(self.envelope(p), c["KB"], c["TP"], c["TQ"], c["CB"], c["PAD"])
        grid = (tiles, cdiv(p.C, c["KB"]), p.N * len(phases))
        return (Launch("conv_bwd_data", grid, (direct_threads(c), 1, 1), smem, ("dy", "w", "dx")),)


DIRECT = Formulation(NAME, (DirectConvFwd(), DirectConvBwdData()))
