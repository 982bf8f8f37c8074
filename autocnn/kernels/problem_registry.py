"""The problem types by operation name: the registry (``PROBLEM_TYPES``, ``register_problem_type``),
the protocol of a problem type that carries its own reference, and the two ways a problem is read
back: from its stored dictionary (``problem_from_dict``) and from the command line's shape syntax
(``parse_shape``).

kernels/problem.py enters the five operations of the design card first; operations added later
register theirs from their own modules.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Protocol, runtime_checkable

from autocnn.errors import InvalidProblemError

# Filled by kernels/problem.py (the five, in the design card's order) and register_problem_type.
PROBLEM_TYPES: dict[str, type] = {}


@runtime_checkable
class ReferenceProblem(Protocol):
    """A problem type that carries its own float64 reference (kernels/reference.py dispatches to
    these methods): an operation added after the first five keeps its tensors' names and shapes,
    its reference and its reduction lengths beside its problem, in its own module, instead of a
    branch in each function of reference.py."""

    op: ClassVar[str]

    def input_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def output_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]: ...

    def reduction_length(self, output_name: str) -> int: ...


def register_problem_type(cls: type) -> type:
    """Offer a problem type under its ``op`` name (problem_type, problem_from_dict, parse_shape,
    the tuning database). Its op name must be new; a problem type outside the first five must
    implement ReferenceProblem, so that verification knows its reference. Usable as a decorator."""
    op = getattr(cls, "op", None)
    if not isinstance(op, str) or not op:
        raise ValueError(f"{cls.__name__} has no op name")
    if PROBLEM_TYPES.get(op, cls) is not cls:
        raise ValueError(f"operation {op!r} is registered already, by {PROBLEM_TYPES[op].__name__}")
    missing = [m for m in ("input_shapes", "output_shapes", "reference", "reduction_length")
               if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"{cls.__name__} lacks the ReferenceProblem methods {', '.join(missing)}")
    PROBLEM_TYPES[op] = cls
    return cls


def problem_type(op: str) -> type:
    try:
        return PROBLEM_TYPES[op]
    except KeyError:
        raise InvalidProblemError("", "op", op, f"one of {', '.join(PROBLEM_TYPES)}") from None


def problem_from_dict(data: Mapping[str, Any]) -> Any:
    """Rebuild a problem from ``to_dict`` output (as stored in the tuning database)."""
    if not isinstance(data, Mapping) or "op" not in data:
        raise InvalidProblemError("", "problem", data, "a mapping with an 'op' key")
    cls = problem_type(data["op"])
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - {"op"})
    if unknown:
        raise InvalidProblemError(data["op"], unknown[0], data[unknown[0]],
                                  f"fields are {', '.join(sorted(names))}")
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k != "op"}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a missing required field
        raise InvalidProblemError(data["op"], "fields", sorted(data), str(exc)) from None


_SHAPE_ALIASES = {"pad": "padding", "act": "activation", "k": "K", "n": "N", "c": "C", "h": "H",
                  "w": "W", "r": "R", "s": "S", "win": "window"}


def parse_shape(op: str, text: str) -> Any:
    """Parse the command line's shape syntax, e.g. ``N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3``.

    Bare numbers after a key continue that key's list, so ``pad=4,4,3,3`` is one field.
    """
    cls = problem_type(op)
    fields: dict[str, list[str]] = {}
    current: str | None = None
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if "=" in token:
            key, _, value = token.partition("=")
            key = key.strip()
            key = _SHAPE_ALIASES.get(key, key)
            if key in fields:
                raise InvalidProblemError(op, key, text, "each field once")
            fields[key] = [value.strip()]
            current = key
        elif current is None:
            raise InvalidProblemError(op, "shape", text, "comma-separated key=value pairs, e.g. N=128,C=3")
        else:
            fields[current].append(token)
    # A field's annotation says how its numbers are read: a tuple (stride, padding, window,
    # pool_window, ...), a flag written 0 or 1 (bias, count_pad, keep_activation), else one integer.
    kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    names = set(kinds)
    kwargs: dict[str, Any] = {}
    for key, values in fields.items():
        if key not in names:
            raise InvalidProblemError(op, key, ",".join(values), f"fields are {', '.join(sorted(names))}")
        if key in ("activation", "dtype", "precision", "layout"):
            kwargs[key] = values[0]
            continue
        try:
            nums = [int(v) for v in values]
        except ValueError:
            raise InvalidProblemError(op, key, ",".join(values), "integers") from None
        if kinds[key] == "bool":
            if nums[0] not in (0, 1) or len(nums) != 1:
                raise InvalidProblemError(op, key, ",".join(values), "0 or 1")
            kwargs[key] = bool(nums[0])
        elif kinds[key].startswith("tuple"):
            kwargs[key] = tuple(nums)
        else:
            if len(nums) != 1:
                raise InvalidProblemError(op, key, ",".join(values), "one integer")
            kwargs[key] = nums[0]
    try:
        return cls(**kwargs)
    except TypeError as exc:
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [r for r in required if r not in kwargs]
        raise InvalidProblemError(op, "shape", text, f"missing {', '.join(missing)}") from exc
