"""depthwise: the convolutions whose every input channel is its own group (groups == C, with K = m*C
filters, m per channel: MobileNet's, ConvNeXt's and RepLKNet's layers), at any stride and dilation,
for conv_fwd, conv_bwd_data and conv_wgrad.

With one input channel per filter there is no channel reduction for a GEMM to tile: each output is
R*S products, so the kernels are direct and bound by memory. conv_fwd and conv_bwd_data: a block is a
TH x TW tile of output rows of one image and CPB channels; it stages the input tile with its halo
(conv_bwd_data: the dY tile its gather reads) and the channels' filters in shared memory, and each
thread keeps OPT outputs of a row in registers, sliding along the staged row. conv_bwd_data gathers
through the stride with a divisibility test per tap (no phase split). conv_wgrad is a reduction over
N*P*Q per filter tap: SPLIT blocks along it each sum their share of TH x TW output tiles for CPB
filters (a thread per filter tap, the tiles staged), write FP32 partial sums into a workspace, and a
second kernel sums the splits in a fixed order (as igemm's two_pass does), then rounds once.
Products are FP32 in every precision: tf32 computes as fp32 here, and bf16 and fp16 widen each
element on load (_common_elements.cuh.j2) and round each output once.

Parameters: DW_TH, DW_TW (the output tile), DW_CPB (channels, or conv_wgrad's filters, per block), DW_OPT
(outputs per thread along a row), DW_UNROLL (the tap loop's unrolling; conv_wgrad's: the tile row's),
and conv_wgrad's DW_THREADS and DW_SPLIT (named apart from other formulations' parameters, whose choices would merge). Untimed: the GPU tests verify it, tuning records will say
where it wins.

NHWC problems (channels last) run kernels of their own, channel-fastest with vector channel runs
(depthwise_nhwc.py says how, and what their parameters are), in every precision the NCHW ones serve.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import (FULL_UNROLL, Buffers, Formulation, OpFormulation, choices_upto,
                                               grouping_text, pragma_unroll)
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import GRID_YZ_LIMIT, code_size_rule, grid_rule, smem_rule, threads_rule, workspace_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch
from autocnn.layout import LAYOUTS

from . import depthwise_nhwc as nhwc

NAME = "depthwise"
REDUCE_THREADS = 256
UNROLLS = (FULL_UNROLL, 1, 2, 4)


def input_tile(p: Any, TH: int, TW: int) -> tuple[int, int]:
    """Rows and columns of input that a TH x TW tile of outputs reads (its halo included)."""
    return ((TH - 1) * p.stride[0] + (p.R - 1) * p.dilation[0] + 1,
            (TW - 1) * p.stride[1] + (p.S - 1) * p.dilation[1] + 1)


def gradient_tile(p: Any, TH: int, TW: int) -> tuple[int, int]:
    """Rows and columns of dY that conv_bwd_data's TH x TW tile of dX gathers from (a bound: the tile's
    first row need not fall on a stride's phase)."""
    return ((TH - 1 + (p.R - 1) * p.dilation[0]) // p.stride[0] + 2,
            (TW - 1 + (p.S - 1) * p.dilation[1]) // p.stride[1] + 2)


def row_threads(TH: int, TW: int, OPT: int, CPB: int) -> int:
    return CPB * TH * (TW // OPT)


def _refuse_unless_depthwise(problem: Any) -> str | None:
    if getattr(problem, "depthwise", False):
        return None
    return (f"{NAME} computes depthwise convolutions only (groups == C, each input channel its own group; "
            f"{grouping_text(problem)} with C={problem.C} given)")


class _Depthwise(OpFormulation):
    formulation = NAME
    summary = "direct depthwise (groups == C)"
    layouts = LAYOUTS

    def grouping_refusal(self, problem: Any) -> str | None:
        return _refuse_unless_depthwise(problem)

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        # NHWC's conv_wgrad unrolls no loop of its own choosing (it has no DW_UNROLL).
        unroll = config.as_dict().get("DW_UNROLL")
        return {"unroll": "" if unroll is None else pragma_unroll(unroll), "threads": self.threads(problem, config)}

    def threads(self, problem: Any, config: Config) -> int:
        raise NotImplementedError

    def code_helpers(self) -> tuple:
        return (input_tile, gradient_tile, row_threads, nhwc.row_items, nhwc.row_channels, nhwc.row_positions,
                nhwc.row_grid)


class _RowTiles(_Depthwise):
    """conv_fwd and conv_bwd_data: a block a tile of output rows of one image and CPB channels."""

    def out_hw(self, p: Any) -> tuple[int, int]:
        raise NotImplementedError

    def staged_tile(self, p: Any, TH: int, TW: int) -> tuple[int, int]:
        raise NotImplementedError

    def params(self, p: Any) -> list[Param]:
        if p.layout.channels_last:
            return nhwc.row_params(p, self.op)
        oh, ow = self.out_hw(p)
        return [
            Param("DW_TH", choices_upto((1, 2, 4, 8, 16), next_pow2(oh)), "output rows per block"),
            Param("DW_TW", choices_upto((4, 8, 16, 32, 64), next_pow2(ow)), "output columns per block"),
            Param("DW_OPT", (1, 2, 4, 8), "outputs per thread along a row (the staged row reused across taps)"),
            Param("DW_CPB", choices_upto((1, 2, 4, 8, 16, 32), next_pow2(p.C)), "channels per block"),
            Param("DW_UNROLL", UNROLLS, "unrolling of the loop over a filter row's taps (0: complete)"),
        ]

    def smem_bytes(self, p: Any, TH: int, TW: int, CPB: int) -> int:
        th, tw = self.staged_tile(p, TH, TW)
        return p.precision.accumulator.size * CPB * (th * tw + (p.K // p.C) * p.R * p.S)

    def constraints(self, p: Any, limits: DeviceLimits) -> list[Constraint]:
        if p.layout.channels_last:
            return nhwc.row_constraints(p, self.op, limits)
        oh, ow = self.out_hw(p)
        return [
            Constraint(("DW_TW", "DW_OPT"), lambda tw, opt: None if tw % opt == 0 else f"DW_OPT={opt} does not divide DW_TW={tw}"),
            threads_rule(limits, ("DW_TH", "DW_TW", "DW_OPT", "DW_CPB"), row_threads),
            smem_rule(limits, ("DW_TH", "DW_TW", "DW_CPB"), lambda th, tw, cpb: self.smem_bytes(p, th, tw, cpb)),
            grid_rule(("DW_CPB",), lambda cpb: cdiv(p.C, cpb), "y"),
            Constraint(("DW_TH", "DW_TW"), lambda th, tw: None if cdiv(oh, th) * cdiv(ow, tw) < 2**31 else "too many tiles"),
            Constraint(("DW_CPB",), lambda _cpb: None if p.N <= GRID_YZ_LIMIT
                       else f"N={p.N} images exceed {GRID_YZ_LIMIT} blocks along z"),
            code_size_rule(("DW_OPT", "DW_UNROLL"), lambda opt, u: opt * p.S * (p.R if u == FULL_UNROLL else 1)),
        ]

    def default_candidates(self, p: Any) -> list[dict[str, Any]]:
        if p.layout.channels_last:
            return nhwc.row_defaults(p, self.op, NAME)
        out = []
        for th, tw, opt, cpb in ((4, 32, 4, 4), (8, 16, 2, 2), (8, 8, 2, 4), (4, 8, 1, 1), (1, 4, 1, 8), (1, 4, 4, 32)):
            out.append({"formulation": NAME, "DW_TH": th, "DW_TW": tw, "DW_OPT": opt, "DW_CPB": cpb, "DW_UNROLL": FULL_UNROLL if p.S <= 7 else 1})
        return out

    def threads(self, p: Any, c: Config) -> int:
        if p.layout.channels_last:
            return c["DW_THREADS"]
        return row_threads(c["DW_TH"], c["DW_TW"], c["DW_OPT"], c["DW_CPB"])

    def shared_bytes(self, p: Any, c: Config) -> int:
        # The NHWC kernels stage nothing.
        return 0 if p.layout.channels_last else self.smem_bytes(p, c["DW_TH"], c["DW_TW"], c["DW_CPB"])

    def grid(self, p: Any, c: Config) -> tuple[int, int, int]:
        if p.layout.channels_last:
            return nhwc.row_grid(p, self.op, c)
        oh, ow = self.out_hw(p)
        return (cdiv(oh, c["DW_TH"]) * cdiv(ow, c["DW_TW"]), cdiv(p.C, c["DW_CPB"]), p.N)


class DepthwiseConvFwd(_RowTiles):
    op = "conv_fwd"
    templates = ("depthwise_conv_fwd.cu.j2", "_depthwise.cuh.j2", "depthwise_nhwc_conv_fwd.cuh.j2", "_channels_last.cuh.j2")

    def out_hw(self, p: Any) -> tuple[int, int]:
        return p.P, p.Q

    def staged_tile(self, p: Any, TH: int, TW: int) -> tuple[int, int]:
        return input_tile(p, TH, TW)

    def launches(self, p: Any, c: Config) -> tuple[Launch, ...]:
        return (Launch("conv_fwd", self.grid(p, c), (self.threads(p, c), 1, 1), self.shared_bytes(p, c),
                       ("x", "w", "bias", "y")),)


class DepthwiseConvBwdData(_RowTiles):
    op = "conv_bwd_data"
    templates = ("depthwise_conv_bwd_data.cu.j2", "_depthwise.cuh.j2", "depthwise_nhwc_conv_bwd_data.cuh.j2",
                 "_channels_last.cuh.j2")

    def out_hw(self, p: Any) -> tuple[int, int]:
        return p.H, p.W

    def staged_tile(self, p: Any, TH: int, TW: int) -> tuple[int, int]:
        return gradient_tile(p, TH, TW)

    def launches(self, p: Any, c: Config) -> tuple[Launch, ...]:
        return (Launch("conv_bwd_data", self.grid(p, c), (self.threads(p, c), 1, 1), self.shared_bytes(p, c),
                       ("dy", "w", "dx")),)


def wgrad_items(p: Any, TH: int, TW: int) -> int:
    """The output tiles conv_wgrad's reduction runs over: every image's P x Q in TH x TW tiles."""
    return p.N * cdiv(p.P, TH) * cdiv(p.Q, TW)


class DepthwiseConvWgrad(_Depthwise):
    op = "conv_wgrad"
    templates = ("depthwise_conv_wgrad.cu.j2", "_depthwise.cuh.j2", "depthwise_nhwc_conv_wgrad.cuh.j2")

    def params(self, p: Any) -> list[Param]:
        if p.layout.channels_last:
            return nhwc.wgrad_params(p)
        return [
            Param("DW_TH", choices_upto((1, 2, 4, 8, 16), next_pow2(p.P)), "output rows per staged tile"),
            Param("DW_TW", choices_upto((4, 8, 16, 32, 64), next_pow2(p.Q)), "output columns per staged tile"),
            Param("DW_CPB", choices_upto((1, 2, 4, 8, 16, 32), next_pow2(p.K)), "filters per block"),
            Param("DW_THREADS", (64, 128, 256), "threads per block (each sums some filters' taps)"),
            Param("DW_SPLIT", tuple(v for v in (1, 2, 4, 8, 16, 32, 64, 128, 256) if v == 1 or v <= p.N * p.P * p.Q),
                  "blocks along the reduction, whose FP32 partial sums a second kernel adds in order"),
            Param("DW_UNROLL", UNROLLS, "unrolling of the loop over a tile row (0: complete)"),
        ]

    def smem_bytes(self, p: Any, TH: int, TW: int, CPB: int) -> int:
        ih, iw = input_tile(p, TH, TW)
        return p.precision.accumulator.size * CPB * (ih * iw + TH * TW)

    def constraints(self, p: Any, limits: DeviceLimits) -> list[Constraint]:
        if p.layout.channels_last:
            return nhwc.wgrad_constraints(p, limits)
        return [
            smem_rule(limits, ("DW_TH", "DW_TW", "DW_CPB"), lambda th, tw, cpb: self.smem_bytes(p, th, tw, cpb)),
            Constraint(("DW_CPB", "DW_THREADS"), lambda cpb, t: None if cdiv(cpb * p.R * p.S, t) <= 32
                       else f"{cdiv(cpb * p.R * p.S, t)} filter taps per thread exceed 32 (registers)"),
            Constraint(("DW_TH", "DW_TW", "DW_SPLIT"), lambda th, tw, split: None if split == 1 or split <= wgrad_items(p, th, tw)
                       else f"DW_SPLIT={split} exceeds the {wgrad_items(p, th, tw)} output tiles it splits"),
            grid_rule(("DW_CPB",), lambda cpb: cdiv(p.K, cpb), "y"),
            workspace_rule(limits.workspace_bytes, ("DW_SPLIT",),
                           lambda split: WORKSPACE_ELEMENT.size * split * p.K * (p.R * p.S + 1)),
            code_size_rule(("DW_TW", "DW_UNROLL"), lambda tw, u: tw if u == FULL_UNROLL else u),
        ]

    def default_candidates(self, p: Any) -> list[dict[str, Any]]:
        if p.layout.channels_last:
            return nhwc.wgrad_defaults(p, NAME)
        out = []
        for th, tw, cpb, threads, split in ((8, 32, 8, 128, 64), (8, 8, 4, 64, 32), (4, 8, 1, 64, 8), (1, 4, 1, 64, 1)):
            out.append({"formulation": NAME, "DW_TH": th, "DW_TW": tw, "DW_CPB": cpb, "DW_THREADS": threads, "DW_SPLIT": split,
                        "DW_UNROLL": 4})
        return out

    def threads(self, p: Any, c: Config) -> int:
        return c["DW_THREADS"]

    def launches(self, p: Any, c: Config) -> tuple[Launch, ...]:
        # The NHWC kernel stages nothing.
        smem = 0 if p.layout.channels_last else self.smem_bytes(p, c["DW_TH"], c["DW_TW"], c["DW_CPB"])
        partial = Launch("conv_wgrad", (c["DW_SPLIT"], cdiv(p.K, c["DW_CPB"]), 1), (c["DW_THREADS"], 1, 1), smem,
                         ("x", "dy", "ws", "ws_bias"))
        n = p.K * p.R * p.S + p.K
        reduce = Launch("depthwise_wgrad_reduce", (cdiv(n, REDUCE_THREADS), 1, 1), (REDUCE_THREADS, 1, 1), 0,
                        ("ws", "ws_bias", "dw", "db"))
        return partial, reduce

    def buffers(self, p: Any, c: Config) -> Buffers:
        # Every split writes all of its slice (zeros where it had no tile), so nothing is zeroed first.
        return (), (("ws", c["DW_SPLIT"] * p.K * p.R * p.S), ("ws_bias", c["DW_SPLIT"] * p.K))

    def code_helpers(self) -> tuple:
        return (*super().code_helpers(), wgrad_items, REDUCE_THREADS)


DEPTHWISE = Formulation(NAME, (DepthwiseConvFwd(), DepthwiseConvBwdData(), DepthwiseConvWgrad()))
