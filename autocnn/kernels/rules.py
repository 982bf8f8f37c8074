"""Constraints the formulations share: threads, shared memory, workspace, code size and grid
limits, the precisions a formulation cannot serve, and small rules over parameters (one divides
another, one stays under a bound)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from autocnn.device import DeviceLimits
from autocnn.kernels.space import Constraint
from autocnn.precision import precision_of

GRID_YZ_LIMIT = 65535
GRID_X_LIMIT = 2**31 - 1
# A kernel's static __shared__ arrays, on every architecture (more is dynamic, opted into per kernel).
STATIC_SMEM_LIMIT = 48 * 1024


def threads_rule(limits: DeviceLimits, params: tuple[str, ...], count, minimum: int = 32) -> Constraint:
    def check(*values):
        n = count(*values)
        if n > limits.max_threads_per_block:
            return f"{n} threads per block exceed the limit of {limits.max_threads_per_block}"
        if n < minimum:
            return f"{n} threads per block are fewer than {minimum}"
        if n % 32:
            return f"{n} threads per block are not a whole number of warps"
        return None
    return Constraint(params, check)


def smem_rule(limits: DeviceLimits, params: tuple[str, ...], nbytes) -> Constraint:
    def check(*values):
        b = nbytes(*values)
        if b > limits.max_smem_per_block:
            return f"{b} bytes of shared memory exceed the device's {limits.max_smem_per_block} per block"
        return None
    return Constraint(params, check)


def workspace_rule(limit_bytes: int, params: tuple[str, ...], nbytes) -> Constraint:
    """A formulation's workspace (bytes, from the problem and these parameters) within the limit."""
    def check(*values):
        b = nbytes(*values)
        if b > limit_bytes:
            return f"{b} bytes of workspace exceed the limit of {limit_bytes}"
        return None
    return Constraint(params, check)


# Multiply-adds one unrolled loop body may hold before code size (and compile time) runs away.
UNROLLED_FMA_LIMIT = 16384


def code_size_rule(params: tuple[str, ...], multiply_adds, limit: int = UNROLLED_FMA_LIMIT) -> Constraint:
    """The multiply-adds of a formulation's unrolled loop body (from these parameters) within ``limit``."""
    def check(*values):
        n = multiply_adds(*values)
        return None if n <= limit else \
            f"the unrolled loop body holds {n} multiply-adds, more than {limit} (code size)"
    return Constraint(params, check)


def grid_rule(params: tuple[str, ...], blocks, axis: str = "y") -> Constraint:
    """The blocks of a launch along ``axis`` (from these parameters) within the grid's limit there."""
    limit = GRID_X_LIMIT if axis == "x" else GRID_YZ_LIMIT

    def check(*values):
        n = blocks(*values)
        return None if n <= limit else f"{n} blocks along {axis} exceed {limit}"
    return Constraint(params, check)


@dataclass(frozen=True)
class Refusal(Constraint):
    """The rule of a formulation that cannot serve a problem at all (its precision): every config
    breaks it, for ``reason``; on a problem it serves, ``reason`` is None and every config meets it.
    The reason is there before any config is drawn (``refusal``), so a run can say, before it opens
    a GPU, that a held formulation cannot serve a problem, and why."""

    reason: str | None = None


def refusal(constraints: Sequence[Constraint]) -> str | None:
    """Why a formulation whose rules are ``constraints`` cannot serve the problem they were made
    for (a Refusal's reason), or None where it can."""
    return next((c.reason for c in constraints if isinstance(c, Refusal) and c.reason), None)


def sixteen_bit_rule(problem: Any, formulation: str, param: str, why: str) -> Refusal:
    """The rule of a formulation that cannot serve a precision of 16-bit tensors (bf16, fp16): on
    such a problem every config of it breaks the rule, whose reason names the formulation and says
    why, so a search space holds only the formulations that serve the problem's precision, and a
    ``--fix formulation=...`` that cannot serve it is refused with that reason. ``param`` is one of
    the formulation's own parameters that each of its configs sets (a rule is checked where all its
    parameters are set); on other problems the rule always holds."""
    precision = precision_of(problem)
    reason = f"{formulation} cannot compute {precision} (16-bit tensors): {why}" if precision.sixteen_bit else None
    return Refusal((param,), lambda _value: reason, reason)


def divides(a: str, b: str) -> Constraint:
    return Constraint((a, b), lambda x, y: None if y % x == 0 else f"{a}={x} does not divide {b}={y}")


def at_most(param: str, bound: int, why: str) -> Constraint:
    return Constraint((param,), lambda v: None if v <= bound else f"{param}={v} exceeds {bound} ({why})")


def arch_number(arch: str) -> int:
    digits = "".join(ch for ch in arch if ch.isdigit())
    return int(digits) if digits else 0
