"""Randomly drawn convolution layers, for benchmarks of shapes no record covers (quick tuning).

Sizes are drawn log-uniformly over what CNN layers use (batch 1-256, 1-512 channels, maps of
4-128 pixels a side, filters of 1-7 taps a side with some non-square ones, stride 1 or 2, padding
"same" or none), so small and large layers, pointwise and wide filters all occur. A draw the
problem classes refuse (padding wider than the filter, too many elements) is drawn again. A layer
(``draw_layer``) is one geometry for all three convolutions, which ``layer_problem`` turns into
each one's problem.
"""
from __future__ import annotations

import math
import random
from typing import Any, Iterator, Sequence

from autocnn.dispatch.quick import UNSEEN_SOURCES
from autocnn.precision import DEFAULT_PRECISION, PRECISION_NAMES, Precision
from autocnn.errors import InvalidProblemError
from autocnn.kernels import problem_from_dict

CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
FILTERS = ((1, 1), (3, 3), (3, 3), (5, 5), (7, 7), (5, 3), (3, 1), (1, 7))
MAX_ELEMENTS = 2**26   # per tensor: keeps one layer's float64 verification under a second or so


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def draw_layer(rng: random.Random) -> dict[str, Any]:
    """One random convolution layer (see the module docstring) that all of CONV_OPS take: its
    geometry as a problem's fields, without the operation and the precision."""
    while True:
        r, s = rng.choice(FILTERS)
        h = _log_uniform(rng, 4, 128)
        w = max(1, int(round(h * rng.choice((1.0, 1.0, 0.75, 1.25)))))
        same = rng.random() < 0.7
        layer = {"N": _log_uniform(rng, 1, 256), "C": _log_uniform(rng, 1, 512), "H": h, "W": w,
                 "K": _log_uniform(rng, 4, 512), "R": r, "S": s,
                 "stride": [2, 2] if rng.random() < 0.25 else [1, 1],
                 "padding": [(r - 1) // 2, (s - 1) // 2, r // 2, s // 2] if same else [0, 0, 0, 0]}
        try:
            problems = [layer_problem(layer, op) for op in CONV_OPS]
        except InvalidProblemError:
            continue
        p = problems[0]
        if max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q) <= MAX_ELEMENTS:
            return layer


def layer_problem(layer: dict[str, Any], op: str, precision: Precision | str = DEFAULT_PRECISION) -> Any:
    """The problem of ``op`` on a layer of ``draw_layer``."""
    if op not in CONV_OPS:
        raise ValueError(f"op must be one of {', '.join(CONV_OPS)}, not {op!r}")
    return problem_from_dict({**layer, "op": op, "precision": precision})


def draw_conv(rng: random.Random, op: str, precision: Precision | str = DEFAULT_PRECISION) -> Any:
    """One random convolution problem of ``op`` (see the module docstring)."""
    if op not in CONV_OPS:
        raise ValueError(f"op must be one of {', '.join(CONV_OPS)}, not {op!r}")
    return layer_problem(draw_layer(rng), op, precision)


def unseen_problems(db: Any, device: Any, ops: tuple[str, ...], count: int, rng: random.Random,
                    precision: Precision | str = DEFAULT_PRECISION) -> Iterator[tuple[Any, Any]]:
    """``count`` random problems (ops in turn) that no record of this device's architecture covers
    (the lookup answers "nearest_shape" or "default"), each with its lookup result."""
    found = 0
    while found < count:
        problem = draw_conv(rng, ops[found % len(ops)], precision)
        looked = db.lookup(device, problem)
        if looked.source in UNSEEN_SOURCES:
            found += 1
            yield problem, looked


def unseen_layers(db: Any, device: Any, count: int, rng: random.Random,
                  precisions: Sequence[Precision | str] = PRECISION_NAMES) -> Iterator[dict[str, Any]]:
    """``count`` random layers of which no problem, of any of CONV_OPS in any of ``precisions``, has
    a record of this device's architecture (``db.tuned``: nothing is compiled to know). Which layers
    a seed gives does not depend on the ops or precisions a run measures, so a run split by them
    measures the same shapes."""
    found = 0
    while found < count:
        layer = draw_layer(rng)
        if all(db.tuned(device, layer_problem(layer, op, name)) is None for name in precisions for op in CONV_OPS):
            found += 1
            yield layer
