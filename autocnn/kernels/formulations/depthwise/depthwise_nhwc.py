"""depthwise in NHWC (channels last; the kernels in depthwise_nhwc_<op>.cuh.j2): what decides their
code and launches, which the formulation's classes hand over to where a problem is NHWC.

conv_fwd and conv_bwd_data: a thread DW_CV consecutive channels (conv_fwd: filters, of K; conv_bwd_data:
input channels, of C) at DW_OPT consecutive positions of a row, channel-fastest across DW_THREADS
threads, so each access is a coalesced channel run, moved as vectors where DW_CV divides the channel
count (cores/channels_last.py: any count works, a partial last run element by element); the other
operand's runs are vectors too where the channel multiplier is 1. Nothing is staged: the filters are
K x R x S numbers read through the read-only cache. conv_wgrad: DW_SPLIT blocks along the N*P*Q
positions for DW_CPB filters each, a thread per (filter, taps) with adjacent threads on adjacent
channels, its FP32 partial sums reduced in order by the NCHW kernels' second pass.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import FULL_UNROLL, choices_upto
from autocnn.kernels.formulations.cores.channels_last import run_choices, whole_runs
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import GRID_X_LIMIT, code_size_rule, grid_rule, threads_rule, workspace_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT

UNROLLS = (FULL_UNROLL, 1, 2, 4)
THREADS = (64, 128, 256)
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def row_channels(p: Any, op: str) -> int:
    """The channels conv_fwd's (K) or conv_bwd_data's (C) threads run along."""
    return p.K if op == "conv_fwd" else p.C


def row_positions(p: Any, op: str) -> tuple[int, int]:
    """The rows and columns of the map a row kernel writes (conv_fwd: P x Q, conv_bwd_data: H x W)."""
    return (p.P, p.Q) if op == "conv_fwd" else (p.H, p.W)


def row_items(p: Any, op: str, c: Config) -> int:
    """Threads of a row kernel: a channel run at DW_OPT positions of a row each."""
    rows, cols = row_positions(p, op)
    return p.N * rows * cdiv(cols, c["DW_OPT"]) * cdiv(row_channels(p, op), c["DW_CV"])


def row_params(p: Any, op: str) -> list[Param]:
    return [
        Param("DW_CV", run_choices(row_channels(p, op)), "consecutive channels per thread (NHWC)"),
        Param("DW_OPT", (1, 2, 4), "consecutive positions of a row per thread"),
        Param("DW_THREADS", THREADS, "threads per block"),
        Param("DW_UNROLL", UNROLLS, "unrolling of the loop over a filter row's taps (0: complete)"),
    ]


def row_constraints(p: Any, op: str, limits: DeviceLimits) -> list[Constraint]:
    return [
        threads_rule(limits, ("DW_THREADS",), lambda t: t),
        Constraint(("DW_CV", "DW_OPT", "DW_THREADS"),
                   lambda v, o, t: None if cdiv(row_items(p, op, {"DW_CV": v, "DW_OPT": o}), t) <= GRID_X_LIMIT
                   else "too many blocks"),
        code_size_rule(("DW_CV", "DW_OPT", "DW_UNROLL"),
                       lambda v, o, u: v * o * p.S * (1 if u == 1 else p.S if u == FULL_UNROLL else u)),
    ]


def row_defaults(p: Any, op: str, name: str) -> list[dict[str, Any]]:
    """Whole (vector) runs of the widest width first, then one channel a thread."""
    channels = row_channels(p, op)
    runs = [v for v in sorted(run_choices(channels), reverse=True) if v > 1 and whole_runs(channels, v)]
    unroll = FULL_UNROLL if p.S <= 7 else 1
    return [{"formulation": name, "DW_CV": v, "DW_OPT": opt, "DW_THREADS": 128, "DW_UNROLL": unroll}
            for v in (*runs, 1) for opt in (2, 1)]


def row_grid(p: Any, op: str, c: Config) -> tuple[int, int, int]:
    return (cdiv(row_items(p, op, c), c["DW_THREADS"]), 1, 1)


def wgrad_params(p: Any) -> list[Param]:
    return [
        Param("DW_CPB", choices_upto((1, 2, 4, 8, 16, 32), next_pow2(p.K)), "filters per block (NHWC)"),
        Param("DW_THREADS", THREADS, "threads per block (each sums one filter's taps)"),
        Param("DW_SPLIT", tuple(v for v in SPLITS if v == 1 or v <= p.N * p.P * p.Q),
              "blocks along the reduction, whose FP32 partial sums a second kernel adds in order"),
    ]


def wgrad_taps(p: Any, CPB: int, threads: int) -> int:
    """Filter taps one thread of conv_wgrad sums."""
    return cdiv(p.R * p.S, threads // CPB)


def wgrad_constraints(p: Any, limits: DeviceLimits) -> list[Constraint]:
    return [
        Constraint(("DW_CPB", "DW_THREADS"), lambda cpb, t: None if cpb <= t
                   else f"DW_CPB={cpb} filters need at least as many threads ({t})"),
        Constraint(("DW_CPB", "DW_THREADS"), lambda cpb, t: None if cpb > t or wgrad_taps(p, cpb, t) <= 32
                   else f"{wgrad_taps(p, cpb, t)} filter taps per thread exceed 32 (registers)"),
        grid_rule(("DW_CPB",), lambda cpb: cdiv(p.K, cpb), "y"),
        workspace_rule(limits.workspace_bytes, ("DW_SPLIT",),
                       lambda split: WORKSPACE_ELEMENT.size * split * p.K * (p.R * p.S + 1)),
    ]


def wgrad_defaults(p: Any, name: str) -> list[dict[str, Any]]:
    return [{"formulation": name, "DW_CPB": cpb, "DW_THREADS": threads, "DW_SPLIT": split}
            for cpb, threads, split in ((32, 256, 64), (8, 128, 32), (4, 64, 8), (1, 64, 1))]
