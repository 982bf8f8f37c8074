"""act_gather: conv_pool_dz (supersampling fused with the activation gradient) as a gather per
position of the convolution's output map, avgpool_bwd's window_gather with A read beside it.

Memory-bound like avgpool_bwd, so it takes the parameters (threads per block, values of a row per
thread, items per thread) and constraints window_gather's avgpool_bwd takes (cores/pool_gather.py),
which depend on the pooling geometry only.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Formulation
from autocnn.kernels.formulations.cores.pool_gather import PoolGatherBwd
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.rules import sixteen_bit_rule
from autocnn.kernels.space import Config, Constraint
from autocnn.kernels.steps import Launch

NAME = "act_gather"


class ActGatherDz(PoolGatherBwd):
    formulation = NAME
    op = "conv_pool_dz"
    summary = "a gather per position of the pooled gradient, times the activation's gradient"
    templates = ("act_gather_conv_pool_dz.cu.j2",)

    def constraints(self, p: Any, limits: DeviceLimits) -> list[Constraint]:
        return [*super().constraints(p, limits),
                sixteen_bit_rule(p, NAME, "THREADS", "its gathers read and write float32 tensors only")]

    def launches(self, p: Any, c: Config) -> tuple[Launch, ...]:
        items = p.N * p.C * p.H * cdiv(p.W, c["WPT"])
        grid = (cdiv(items, c["THREADS"] * c["IPT"]), 1, 1)
        return (Launch("conv_pool_dz", grid, (c["THREADS"], 1, 1), 0, ("dy", "a", "dz")),)


ACT_GATHER = Formulation(NAME, (ActGatherDz(),))
