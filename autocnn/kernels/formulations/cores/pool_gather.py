"""The gather per input position that a pooling's backward is: avgpool_bwd's (window_gather) and
conv_pool_dz's (act_gather, which reads the activation beside it). Memory-bound, so its parameters
are about bytes in flight: threads per block, values of a row per thread, items per thread (THREADS
and ITEMS, whose choices window_gather's avgpool_fwd offers too).
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import OpFormulation
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import GRID_X_LIMIT, threads_rule
from autocnn.kernels.space import Constraint, Param

THREADS = (64, 128, 256, 512)
ITEMS = (1, 2, 4)


class PoolGatherBwd(OpFormulation):
    """A gather per input position of a pooling's backward: its parameters, constraints and
    defaults, which depend on the pooling geometry only (the launch is each formulation's)."""

    def params(self, p: Any) -> list[Param]:
        return [
            Param("THREADS", THREADS, "threads per block"),
            Param("WPT", (1, 2, 4, 8), "consecutive input-gradient values of a row per thread"),
            Param("IPT", ITEMS, "items per thread"),
        ]

    def constraints(self, p: Any, limits: DeviceLimits) -> list[Constraint]:
        return [
            threads_rule(limits, ("THREADS",), lambda t: t),
            Constraint(("WPT",), lambda w: None if w <= max(1, next_pow2(p.W))
                       else f"WPT={w} exceeds the {p.W} values of a row"),
            Constraint(("THREADS", "WPT", "IPT"),
                       lambda t, w, i: None if cdiv(p.N * p.C * p.H * cdiv(p.W, w), t * i) <= GRID_X_LIMIT
                       else "too many blocks"),
        ]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        return [
            {"THREADS": 256, "WPT": 4, "IPT": 1},
            {"THREADS": 256, "WPT": 2, "IPT": 1},
            {"THREADS": 256, "WPT": 1, "IPT": 1},
        ]
