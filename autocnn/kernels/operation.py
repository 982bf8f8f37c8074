"""What every operation provides, and the plan that turns (problem, config) into launches.

An operation module holds one step of the flow for one kernel family: its search space, its
heuristic default, and its launch geometry. The KernelPlan it returns is everything a runtime
needs: CUDA source, kernels in launch order with grid/block/shared memory and argument names,
buffers to zero first, and scratch workspaces.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from autocnn.kernels.codegen import code_source, render_family, template_fingerprint
from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels.space import Config, Constraint, SearchSpace

GRID_YZ_LIMIT = 65535
GRID_X_LIMIT = 2**31 - 1


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[str, ...]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class KernelPlan:
    op: str
    problem: Any
    config: Config
    source: str
    fingerprint: str
    launches: tuple[Launch, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    zero_first: tuple[str, ...] = ()
    workspaces: tuple[tuple[str, int], ...] = ()   # (name, float32 elements)

    @property
    def kernel_names(self) -> tuple[str, ...]:
        seen: list[str] = []
        for launch in self.launches:
            if launch.kernel not in seen:
                seen.append(launch.kernel)
        return tuple(seen)

    @property
    def max_shared_bytes(self) -> int:
        return max(launch.shared_bytes for launch in self.launches)


class Operation:
    """Base of the five operations; subclasses fill in the family-specific parts."""

    name: str = ""
    family: str = ""
    problem_type: type = object
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    # -- what subclasses provide ------------------------------------------------------------
    def space(self, problem: Any, limits: DeviceLimits) -> SearchSpace:
        raise NotImplementedError

    def default_candidates(self, problem: Any) -> Sequence[dict[str, Any]]:
        """Configs to try in order for the heuristic default; the last must fit every problem."""
        raise NotImplementedError

    def _context(self, problem: Any, config: Config) -> dict[str, Any]:
        """Template variables beyond the problem and the config."""
        return {}

    def _launches(self, problem: Any, config: Config) -> tuple[Launch, ...]:
        raise NotImplementedError

    def _buffers(self, problem: Any, config: Config) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
        """(buffers to zero before the first launch, workspaces)."""
        return (), ()

    def flops(self, problem: Any) -> int:
        raise NotImplementedError

    def min_bytes(self, problem: Any) -> int:
        """Bytes that must cross device memory at least once: each input read and each output written."""
        raise NotImplementedError

    # -- shared behaviour --------------------------------------------------------------------
    def check_problem(self, problem: Any) -> None:
        if not isinstance(problem, self.problem_type):
            raise TypeError(f"{self.name} takes a {self.problem_type.__name__}, not {type(problem).__name__}")

    def default_config(self, problem: Any, limits: DeviceLimits) -> Config:
        self.check_problem(problem)
        space = self.space(problem, limits)
        reasons: list[str] = []
        for candidate in self.default_candidates(problem):
            try:
                return space.validate(candidate)
            except InfeasibleConfigError as exc:
                reasons.extend(exc.reasons)
            except InvalidConfigError as exc:   # a tile the space leaves out for this problem
                reasons.append(str(exc))
        # Reaching this is a bug in the candidate list, which tests check for every seed shape.
        raise InfeasibleConfigError(self.name, ["no default candidate fits: " + "; ".join(reasons)])

    def _codegen_helpers(self) -> tuple:
        """Functions and constants, besides _context, _launches and _buffers, that decide the
        generated code or its launch (they are hashed into the fingerprint)."""
        return ()

    def fingerprint(self) -> str:
        parts = [self._context, self._launches, self._buffers, Operation.plan, *self._codegen_helpers()]
        return template_fingerprint(self.family, tuple(code_source(p) for p in parts))

    def plan(self, problem: Any, config: Config) -> KernelPlan:
        """Render the kernel for a validated config and describe how to launch it."""
        self.check_problem(problem)
        if config.op != self.name:
            raise ValueError(f"a {config.op} config cannot plan {self.name}")
        context = {
            "op": self.name, "family": self.family, "shape": problem.shape_string(),
            "config_text": str(config), "p": problem, "c": config.as_dict(),
        }
        # Config values are also top-level names: the shared cores are written in terms of them.
        context.update(config.as_dict())
        context.update(self._context(problem, config))
        launches = self._launches(problem, config)
        context["planned_threads"] = launches[0].threads
        context["planned_smem"] = max(launch.shared_bytes for launch in launches)
        fingerprint = self.fingerprint()
        source = render_family(self.family, context, fingerprint)
        zero, workspaces = self._buffers(problem, config)
        return KernelPlan(
            op=self.name, problem=problem, config=config, source=source, fingerprint=fingerprint,
            launches=launches, inputs=self.inputs, outputs=self.outputs,
            zero_first=zero, workspaces=workspaces,
        )


# -- constraints shared by the families -----------------------------------------------------

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


def divides(a: str, b: str) -> Constraint:
    return Constraint((a, b), lambda x, y: None if y % x == 0 else f"{a}={x} does not divide {b}={y}")


def at_most(param: str, bound: int, why: str) -> Constraint:
    return Constraint((param,), lambda v: None if v <= bound else f"{param}={v} exceeds {bound} ({why})")
