"""Problems, precisions and numbers as the command line reads and prints them: ``--shape`` with
``--precision`` and ``--layout``, a problem moved to a precision or a layout, table cells, and the help texts that name
networks and the workspace limit for several commands."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from autocnn.kernels.problem import PoolProblem, precision_label
from autocnn.layout import DEFAULT_LAYOUT, LAYOUT_NAMES, Layout, layout_named, layout_of
from autocnn.precision import Precision, precision_named, precision_of, without_products


def _precision_for(problem: Any, precision: Precision | str) -> Precision:
    """What ``precision`` is for this problem: its own, for a pooling problem without the part about
    products (tf32 is fp32 there: pooling forms none)."""
    precision = precision_named(precision)
    return without_products(precision) if isinstance(problem, PoolProblem) else precision


def at_precision(problem: Any, precision: Precision | str) -> Any:
    """The problem at this precision (a pooling problem at its storage's, as _precision_for says)."""
    precision = _precision_for(problem, precision)
    if hasattr(problem, "precision") and problem.precision is not precision:
        return dataclasses.replace(problem, precision=precision)
    return problem


def has_precision(problem: Any, precision: Precision | str) -> bool:
    return precision_of(problem) is _precision_for(problem, precision)


def takes_layout(problem: Any) -> bool:
    """Whether the problem's operation has layouts other than NCHW (the five do; the fused and
    separable ones have none)."""
    return getattr(problem, "takes_layout", False)


def at_layout(problem: Any, layout: Layout | str) -> Any:
    """The problem in this layout (ValueError for one whose operation has no other layout)."""
    layout = layout_named(layout, "--layout")
    if layout_of(problem) is layout:
        return problem
    if not takes_layout(problem):
        raise ValueError(f"--layout {layout.name}: {problem.op} has only the {DEFAULT_LAYOUT.name} layout")
    return dataclasses.replace(problem, layout=layout)


_PRECISION_IN_SHAPE = re.compile(r"(^|,)\s*precision\s*=")
_LAYOUT_IN_SHAPE = re.compile(r"(^|,)\s*layout\s*=")


def shape_problem(op: str, shape: str, flag: str | None, layout_flag: str | None = None) -> Any:
    """--op's problem from --shape, at the precision of --precision or of the shape string, in the
    layout of --layout or of the shape string (for each, not both unless they agree)."""
    from autocnn.kernels import parse_shape

    problem = parse_shape(op, shape)
    if layout_flag is not None:
        layout = layout_named(layout_flag, "--layout")
        if _LAYOUT_IN_SHAPE.search(shape) and layout_of(problem) is not layout:
            raise ValueError(f"--shape says layout={layout_of(problem).name} but --layout says {layout.name}: "
                             f"give one of them, or the same value in both")
        problem = at_layout(problem, layout)
    if flag is None:
        return problem
    if _PRECISION_IN_SHAPE.search(shape) and not has_precision(problem, precision_named(flag, "--precision")):
        raise ValueError(f"--shape says precision={problem.precision} but --precision says {flag}: "
                         f"give one of them, or the same value in both")
    return at_precision(problem, flag)


LAYOUT_HELP = (f"the tensors' memory order ({', '.join(LAYOUT_NAMES)}; default {DEFAULT_LAYOUT.name}): nchw "
               "with KCRS filters, or nhwc (channels last) with KRSC filters")


def precision_text(problem: Any) -> str:
    """A record's precision as db list and show print it (kernels.problem.precision_label: "-" for
    float32 pooling, which fp32 and tf32 runs share)."""
    return precision_label(problem)


def fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


WORKSPACE_HELP = ("the most scratch memory one kernel may use, e.g. 64MiB or 1GiB (default: "
                  "$AUTOCNN_WORKSPACE_LIMIT, else 256MiB; 0 allows only formulations without a workspace)")


def zoo_text() -> str:
    """The zoo's networks as --network's help names them (conv4 and vgg included)."""
    from autocnn.nn.zoo import NETWORKS

    return ", ".join(NETWORKS)
