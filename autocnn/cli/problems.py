"""Problems, precisions and numbers as the command line reads and prints them: ``--shape`` with
``--precision``, a problem moved to a precision, table cells, and the help texts that name
networks and the workspace limit for several commands."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from autocnn.kernels.problem import ConvProblem
from autocnn.precision import Precision, precision_named


def at_precision(problem: Any, precision: Precision | str) -> Any:
    """The convolution problem at this precision; a pooling problem as it is (it has none)."""
    precision = precision_named(precision)
    if isinstance(problem, ConvProblem) and problem.precision is not precision:
        return dataclasses.replace(problem, precision=precision)
    return problem


def has_precision(problem: Any, precision: Precision | str) -> bool:
    return not isinstance(problem, ConvProblem) or problem.precision is precision_named(precision)


_PRECISION_IN_SHAPE = re.compile(r"(^|,)\s*precision\s*=")


def shape_problem(op: str, shape: str, flag: str | None) -> Any:
    """--op's problem from --shape, at the precision of --precision or of the shape string (not both,
    unless they agree)."""
    from autocnn.kernels import parse_shape

    problem = parse_shape(op, shape)
    if flag is None or not isinstance(problem, ConvProblem):
        return problem   # pooling has no precision: its kernels are the same at both
    if _PRECISION_IN_SHAPE.search(shape) and problem.precision is not precision_named(flag, "--precision"):
        raise ValueError(f"--shape says precision={problem.precision} but --precision says {flag}: "
                         f"give one of them, or the same value in both")
    return at_precision(problem, flag)


def precision_text(problem: Any) -> str:
    """A record's precision as db list and show print it ("-" for pooling, which has none)."""
    return problem.precision.name if isinstance(problem, ConvProblem) else "-"


def fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


WORKSPACE_HELP = ("the most scratch memory one kernel may use, e.g. 64MiB or 1GiB (default: "
                  "$AUTOCNN_WORKSPACE_LIMIT, else 256MiB; 0 allows only formulations without a workspace)")


def zoo_text() -> str:
    """The zoo's networks as --network's help names them (conv4 and vgg included)."""
    from autocnn.nn.zoo import NETWORKS

    return ", ".join(NETWORKS)
