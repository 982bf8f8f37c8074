"""How the report names and orders kernels: problem keys, the operations' order and seed-shape names."""
from __future__ import annotations

import json
from typing import Any


def problem_key(problem_dict: dict[str, Any]) -> str:
    return json.dumps(problem_dict, sort_keys=True, separators=(",", ":"))


def op_order(op: str) -> int:
    from autocnn.kernels import OPERATIONS

    names = list(OPERATIONS)
    return names.index(op) if op in names else len(names)


_SEED_NAMES: dict[tuple[str, str], tuple[int, str]] | None = None


def precision_of(problem: Any) -> str:
    """A problem's precision as the report shows it: fp32 or tf32, "-" for pooling (it has none)."""
    return str(getattr(problem, "precision", "-"))


def shown_precision(label: str) -> Any:
    """The Precision a report row's label names; None for pooling's "-"."""
    from autocnn.precision import precision_named

    return None if label == "-" else precision_named(label)


def shows_tf32(label: str) -> bool:
    """Whether a row's precision label names a precision of TF32 products ("" and "-" name none)."""
    shown = shown_precision(label) if label else None
    return shown is not None and shown.tf32


def precision_suffix(problem: Any) -> str:
    """What a label adds for a problem that is not at the default precision: " · tf32"."""
    from autocnn.precision import DEFAULT_PRECISION

    precision = getattr(problem, "precision", DEFAULT_PRECISION)
    return "" if precision is DEFAULT_PRECISION else f" · {precision}"


def seed_name(op: str, problem: Any) -> tuple[int, str] | None:
    """(position, name) of the seed shape this problem is, at any precision, or None."""
    global _SEED_NAMES
    if precision_suffix(problem):
        import dataclasses

        from autocnn.precision import DEFAULT_PRECISION

        problem = dataclasses.replace(problem, precision=DEFAULT_PRECISION)
    if _SEED_NAMES is None:
        from autocnn.kernels import OPERATIONS
        from autocnn.kernels.suite import seed_problems

        _SEED_NAMES = {}
        for o in OPERATIONS:
            for i, (name, p) in enumerate(seed_problems(o)):
                _SEED_NAMES[(o, problem_key(p.to_dict()))] = (i, name)
    return _SEED_NAMES.get((op, problem_key(problem.to_dict())))
