"""direct in NHWC (channels last; the kernels in direct_nhwc_<op>.cuh.j2): what decides their code
and launches, which the formulation's classes hand over to where a problem is NHWC.

A thread owns a run of DN_KPT filters (conv_fwd; conv_bwd_data: DN_CPT input channels) at DN_QPT
consecutive positions of a row, channel-fastest across DN_THREADS threads, so its stores are
coalesced channel runs; it walks the reduction's channels DN_CV (conv_bwd_data: filters DN_KV) at
a time, each a run of the activation and, per owned channel, a run of the filter tap (KRSC: a
tap's channels adjacent), summing the products in registers. A run moves as vectors where its
width divides its channel count (cores/channels_last.py: any count works, a partial run element
by element). Nothing is staged in shared memory: the direct core's tiles (cores/_direct.cuh.j2)
read NCHW planes.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import FULL_UNROLL
from autocnn.kernels.formulations.cores.channels_last import run_choices, whole_runs
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.rules import GRID_X_LIMIT, code_size_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param

THREADS = (64, 128, 256)
UNROLLS = (1, FULL_UNROLL)
ACCUMULATORS = 64   # registers of sums per thread, as the direct core's limit


def owned(op: str) -> tuple[str, str]:
    """The parameters of the run a thread owns and of the run it walks the reduction by."""
    return ("DN_KPT", "DN_CV") if op == "conv_fwd" else ("DN_CPT", "DN_KV")


def channel_counts(p: Any, op: str) -> tuple[int, int]:
    """The channels a thread's own run is of, and those the reduction walks (conv_fwd: K and C)."""
    return (p.K, p.C) if op == "conv_fwd" else (p.C, p.K)


def items(p: Any, op: str, c: Config) -> int:
    """Threads of the launch: a run of owned channels at DN_QPT positions of a row each."""
    rows, cols = (p.P, p.Q) if op == "conv_fwd" else (p.H, p.W)
    own, _walk = owned(op)
    return p.N * rows * cdiv(cols, c["DN_QPT"]) * cdiv(channel_counts(p, op)[0], c[own])


def params(p: Any, op: str) -> list[Param]:
    own, walk = owned(op)
    mine, reduced = channel_counts(p, op)
    return [
        Param(own, run_choices(mine), "consecutive output channels per thread (NHWC)"),
        Param(walk, run_choices(reduced), "channels of the reduction per step, one run of each operand (NHWC)"),
        Param("DN_QPT", (1, 2, 4), "consecutive positions of a row per thread"),
        Param("DN_THREADS", THREADS, "threads per block"),
        Param("DN_UNROLL", UNROLLS, "unrolling of the loop over a filter row's taps (0: complete)"),
    ]


def constraints(p: Any, op: str, limits: DeviceLimits) -> list[Constraint]:
    own, walk = owned(op)
    return [
        threads_rule(limits, ("DN_THREADS",), lambda t: t),
        Constraint((own, walk, "DN_QPT"), lambda o, v, q: None if q * o + (q + o) * v <= 2 * ACCUMULATORS
                   else f"{q * o} sums and {(q + o) * v} loaded values per thread exceed {2 * ACCUMULATORS} (registers)"),
        Constraint((own, "DN_QPT", "DN_THREADS"),
                   lambda o, q, t: None if cdiv(items(p, op, {own: o, "DN_QPT": q}), t) <= GRID_X_LIMIT
                   else "too many blocks"),
        code_size_rule((own, walk, "DN_QPT", "DN_UNROLL"),
                       lambda o, v, q, u: o * v * q * (p.S if u == FULL_UNROLL else 1)),
    ]


def default_candidates(p: Any, op: str, name: str) -> list[dict[str, Any]]:
    """Whole (vector) runs of the widest width first, then one channel at a time."""
    own, walk = owned(op)
    mine, reduced = channel_counts(p, op)

    def widths(count: int) -> list[int]:
        return [v for v in sorted(run_choices(count), reverse=True) if whole_runs(count, v)]

    out = []
    for o in widths(mine)[:2]:
        for v in widths(reduced)[:2]:
            for q in (4, 2, 1):
                out.append({"formulation": name, own: o, walk: v, "DN_QPT": q, "DN_THREADS": 128, "DN_UNROLL": 1})
    return out


def grid(p: Any, op: str, c: Config) -> tuple[int, int, int]:
    return (cdiv(items(p, op, c), c["DN_THREADS"]), 1, 1)
