"""Randomly drawn convolution layers, for benchmarks of shapes no record covers (quick tuning).

Sizes are drawn log-uniformly over what CNN layers use (batch 1-256, 1-512 channels, maps of
4-128 pixels a side, filters of 1-7 taps a side with some non-square ones, stride 1 or 2, padding
"same" or none), so small and large layers, pointwise and wide filters all occur. A draw the
problem classes refuse (padding wider than the filter, too many elements) is drawn again.
"""
from __future__ import annotations

import math
import random
from typing import Any, Iterator

from autocnn.precision import DEFAULT_PRECISION, Precision
from autocnn.errors import InvalidProblemError
from autocnn.kernels import problem_from_dict

CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
FILTERS = ((1, 1), (3, 3), (3, 3), (5, 5), (7, 7), (5, 3), (3, 1), (1, 7))
MAX_ELEMENTS = 2**26   # per tensor: keeps one layer's float64 verification under a second or so


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def draw_conv(rng: random.Random, op: str, precision: Precision | str = DEFAULT_PRECISION) -> Any:
    """One random convolution problem of ``op`` (see the module docstring)."""
    if op not in CONV_OPS:
        raise ValueError(f"op must be one of {', '.join(CONV_OPS)}, not {op!r}")
    while True:
        r, s = rng.choice(FILTERS)
        h = _log_uniform(rng, 4, 128)
        w = max(1, int(round(h * rng.choice((1.0, 1.0, 0.75, 1.25)))))
        same = rng.random() < 0.7
        data = {"op": op, "N": _log_uniform(rng, 1, 256), "C": _log_uniform(rng, 1, 512), "H": h, "W": w,
                "K": _log_uniform(rng, 4, 512), "R": r, "S": s,
                "stride": [2, 2] if rng.random() < 0.25 else [1, 1],
                "padding": [(r - 1) // 2, (s - 1) // 2, r // 2, s // 2] if same else [0, 0, 0, 0],
                "precision": precision}
        try:
            problem = problem_from_dict(data)
        except InvalidProblemError:
            continue
        sizes = (problem.N * problem.C * problem.H * problem.W, problem.N * problem.K * problem.P * problem.Q)
        if max(sizes) <= MAX_ELEMENTS:
            return problem


def unseen_problems(db: Any, device: Any, ops: tuple[str, ...], count: int, rng: random.Random,
                    precision: Precision | str = DEFAULT_PRECISION) -> Iterator[tuple[Any, Any]]:
    """``count`` random problems (ops in turn) that no record of this device's architecture covers
    (the lookup answers "nearest_shape" or "default"), each with its lookup result."""
    found = 0
    while found < count:
        problem = draw_conv(rng, ops[found % len(ops)], precision)
        looked = db.lookup(device, problem)
        if looked.source in ("nearest_shape", "default"):
            found += 1
            yield problem, looked
