"""direct: tiled correlation (Krizhevsky 2009, Scherer et al. 2010), for conv_fwd and each stride
phase of conv_bwd_data.

A block stages an input patch with its halo and the filters of KB output channels in shared
memory, CB input channels at a time; each thread keeps KPT x PPT x QPT outputs in registers and
slides a register window along each input row. The core is _direct.cuh.j2, its parameters, rules
and defaults cores/direct_correlation.py (direct_pool runs it too); direct_<op>.cu.j2 is the glue
of each operation. The constraints are the ones the core's static_asserts and the device's limits
impose, plus pruning of tiles far larger than the problem (they only add idle threads).

NHWC problems (channels last) run register-tiled kernels of their own, channel-fastest with vector
channel runs (direct_nhwc.py says how, and what their parameters are), in every precision the NCHW
ones serve.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Formulation, pragma_unroll
from autocnn.kernels.formulations.cores.direct_correlation import (CorrelationEnvelope, DirectCorrelation,
                                                                   direct_smem_bytes, direct_threads)
from autocnn.kernels.geometry import cdiv, stride_phases
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch
from autocnn.layout import LAYOUTS

from . import direct_nhwc as nhwc

NAME = "direct"


class _Direct(DirectCorrelation):
    """The direct core's correlation in NCHW; direct_nhwc's kernels in NHWC."""

    formulation = NAME
    summary = "direct tiled correlation"
    layouts = LAYOUTS

    def params(self, p: Any) -> list[Param]:
        return nhwc.params(p, self.op) if p.layout.channels_last else super().params(p)

    def constraints(self, p: Any, limits: DeviceLimits) -> list[Constraint]:
        return nhwc.constraints(p, self.op, limits) if p.layout.channels_last else super().constraints(p, limits)

    def default_candidates(self, p: Any) -> list[dict[str, Any]]:
        return nhwc.default_candidates(p, self.op, NAME) if p.layout.channels_last else super().default_candidates(p)

    def context(self, p: Any, c: Config) -> dict[str, Any]:
        return {"UNROLL_S": pragma_unroll(c["DN_UNROLL"])} if p.layout.channels_last else super().context(p, c)

    def nhwc_launch(self, p: Any, c: Config, args: tuple[str, ...]) -> Launch:
        return Launch(self.op, nhwc.grid(p, self.op, c), (c["DN_THREADS"], 1, 1), 0, args)

    def code_helpers(self) -> tuple:
        return (*super().code_helpers(), nhwc.items, nhwc.grid, nhwc.owned, nhwc.channel_counts)


class DirectConvFwd(_Direct):
    op = "conv_fwd"
    templates = ("direct_conv_fwd.cu.j2", "_direct.cuh.j2", "direct_nhwc_conv_fwd.cuh.j2", "_channels_last.cuh.j2")

    def envelope(self, p: ConvFwdProblem) -> CorrelationEnvelope:
        return CorrelationEnvelope(CI=p.C, CO=p.K, OH=p.P, OW=p.Q, R=p.R, S=p.S, STH=p.stride[0],
                                   STW=p.stride[1], grid_z=p.N, stage_size=p.precision.accumulator.size)

    def launches(self, p: ConvFwdProblem, c: Config) -> tuple[Launch, ...]:
        if p.layout.channels_last:
            return (self.nhwc_launch(p, c, ("x", "w", "bias", "y")),)
        tiles = cdiv(p.P, c["TP"]) * cdiv(p.Q, c["TQ"])
        smem = direct_smem_bytes(self.envelope(p), c["KB"], c["TP"], c["TQ"], c["CB"], c["PAD"])
        return (Launch("conv_fwd", (tiles, cdiv(p.K, c["KB"]), p.N), (direct_threads(c), 1, 1), smem,
                       ("x", "w", "bias", "y")),)


class DirectConvBwdData(_Direct):
    """Each stride phase is a dense stride-1 correlation of dY with a flipped sub-filter (NCHW)."""

    op = "conv_bwd_data"
    templates = ("direct_conv_bwd_data.cu.j2", "_direct.cuh.j2", "direct_nhwc_conv_bwd_data.cuh.j2",
                 "_channels_last.cuh.j2")

    def envelope(self, p: ConvBwdDataProblem) -> CorrelationEnvelope:
        phases = stride_phases(p)
        return CorrelationEnvelope(CI=p.K, CO=p.C, OH=max(ph.Ha for ph in phases), OW=max(ph.Wb for ph in phases),
                                   R=max(1, max(ph.Ra for ph in phases)), S=max(1, max(ph.Sb for ph in phases)),
                                   STH=1, STW=1, grid_z=p.N * len(phases), stage_size=p.precision.accumulator.size)

    def launches(self, p: ConvBwdDataProblem, c: Config) -> tuple[Launch, ...]:
        if p.layout.channels_last:
            return (self.nhwc_launch(p, c, ("dy", "w", "dx")),)
        phases = stride_phases(p)
        tiles = max(cdiv(ph.Ha, c["TP"]) * cdiv(ph.Wb, c["TQ"]) for ph in phases)
        smem = direct_smem_bytes(self.envelope(p), c["KB"], c["TP"], c["TQ"], c["CB"], c["PAD"])
        grid = (tiles, cdiv(p.C, c["KB"]), p.N * len(phases))
        return (Launch("conv_bwd_data", grid, (direct_threads(c), 1, 1), smem, ("dy", "w", "dx")),)


DIRECT = Formulation(NAME, (DirectConvFwd(), DirectConvBwdData()))
