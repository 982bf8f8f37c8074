"""What the problem types share: the index limit, the element and activation names, the checks of
their fields (one integer, a pair, a padding), the extents their kernels index, and the dictionary a
problem is stored as (``problem_dict``).

The problem types live in kernels/problem.py (convolutions) and kernels/pool_problems.py (pooling);
kernels/problem_registry.py offers them by operation name.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from autocnn.errors import InvalidProblemError, ProblemTooLargeError
from autocnn.layout import DEFAULT_LAYOUT, LAYOUT_NAMES, Layout, layout_named
from autocnn.precision import DEFAULT_PRECISION

# Generated kernels index with 32-bit signed integers; every tensor (and every product the index
# arithmetic forms) must stay below this.
INDEX_LIMIT = 2**31 - 1
DTYPES = ("float32",)
ACTIVATIONS = ("none", "relu", "tanh", "logistic")


def pair_field(op: str, name: str, value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        vals = tuple(value)
    else:
        vals = (value,)
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2:
        raise InvalidProblemError(op, name, value, "one integer or two (height, width)")
    for v in vals:
        check_int(op, name, v, minimum=1)
    return vals  # type: ignore[return-value]


def padding_field(op: str, value: Any) -> tuple[int, int, int, int]:
    if isinstance(value, (list, tuple)):
        vals = tuple(value)
    else:
        vals = (value,)
    if len(vals) == 1:
        vals = vals * 4
    elif len(vals) == 2:  # (height, width) as in most frameworks
        vals = (vals[0], vals[1], vals[0], vals[1])
    if len(vals) != 4:
        raise InvalidProblemError(
            op, "padding", value, "one integer, two (height, width) or four (top, left, bottom, right)")
    for v in vals:
        check_int(op, "padding", v, minimum=0)
    return vals  # type: ignore[return-value]


def check_int(op: str, name: str, value: Any, minimum: int) -> None:
    # bool is an int in Python; a shape field given True is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidProblemError(op, name, value, f"an integer >= {minimum}")
    if value < minimum:
        raise InvalidProblemError(op, name, value, f"an integer >= {minimum}")


def conv_index_extents(N: Any, C: Any, H: Any, W: Any, K: Any, R: Any, S: Any, P: Any, Q: Any,
                       groups: int = 1) -> dict[str, tuple]:
    """What a convolution's kernels index, by name: each must stay within INDEX_LIMIT elements (filters and
    a group's unrolled input hold C/groups channels). Plain arithmetic: autocnn.torch evaluates it on a trace."""
    cg, per = (C, "C") if groups == 1 else (C // groups, "C/groups")
    return {"input N*C*H*W": (N, C, H, W), f"filters K*{per}*R*S": (K, cg, R, S), "output N*K*P*Q": (N, K, P, Q),
            f"unrolled input N*P*Q*{per}*R*S": (N, P, Q, cg, R, S)}


def pool_index_extents(N: Any, C: Any, H: Any, W: Any, P: Any, Q: Any) -> dict[str, tuple]:
    """As conv_index_extents, for average pooling."""
    return {"input N*C*H*W": (N, C, H, W), "output N*C*P*Q": (N, C, P, Q)}


def element_count(shape: tuple) -> Any:
    # By hand rather than math.prod: the sizes may be a torch.compile trace's symbolic ones.
    count = 1
    for size in shape:
        count = count * size
    return count


def beyond_index_limit(extents: Mapping[str, tuple]) -> bool:
    """Whether any extent exceeds INDEX_LIMIT."""
    beyond = False
    for shape in extents.values():
        beyond = beyond or element_count(shape) > INDEX_LIMIT
    return beyond


def check_elements(op: str, what: str, shape: tuple[int, ...]) -> None:
    count = element_count(shape)
    if count > INDEX_LIMIT:
        raise ProblemTooLargeError(
            op, what, "x".join(map(str, shape)),
            f"at most {INDEX_LIMIT} elements ({count} given): kernels index with 32-bit integers")


def problem_dict(problem: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``problem`` as stored (a record's key, an Optuna study's name): its op and every field, tuples
    as lists, the precision by name. The default precision and every field at its value in
    ``defaults`` are left out, so that records made before a field existed keep their keys."""
    out: dict[str, Any] = {"op": problem.op}
    for f in dataclasses.fields(problem):
        v = getattr(problem, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    if problem.precision is DEFAULT_PRECISION:
        del out["precision"]
    else:
        out["precision"] = problem.precision.name
    # Likewise the default layout: records made before layouts existed keep their keys.
    if problem.layout is DEFAULT_LAYOUT:
        del out["layout"]
    else:
        out["layout"] = problem.layout.name
    for name, value in defaults.items():
        if getattr(problem, name) == value:
            del out[name]
    return out


def checked_layout(problem: Any, value: Any) -> Layout:
    """The Layout ``value`` names for ``problem``: one of LAYOUT_NAMES, and NCHW alone where the
    problem's operation has no other layout (``takes_layout``)."""
    layout = layout_named(value, problem.op)
    if layout is not DEFAULT_LAYOUT and not problem.takes_layout:
        raise InvalidProblemError(problem.op, "layout", layout.name,
                                  f"only {DEFAULT_LAYOUT.name}: {problem.op} has no {layout.name} form "
                                  f"(the layouts are {', '.join(LAYOUT_NAMES)}; run its operations apart)")
    return layout


def layout_string(problem: Any) -> str:
    """The layout's part of a shape string: nothing for the default, so existing keys stay."""
    return "" if problem.layout is DEFAULT_LAYOUT else f",layout={problem.layout.name}"
