"""Typed failures. Every failure autocnn reports has a class a program can branch on.

Callers never recognise a failure by matching message text: they read ``failure_class``.
The message is for people and says what was wrong and what is allowed.
"""
from __future__ import annotations

from enum import Enum
from typing import Any


class FailureClass(str, Enum):
    INVALID_PROBLEM = "invalid_problem"
    INVALID_CONFIG = "invalid_config"
    INFEASIBLE = "infeasible"
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"
    TIMEOUT = "timeout"
    WRONG_RESULT = "wrong_result"
    DEVICE_ERROR = "device_error"
    # What a command needs around it (a writable directory, a reachable storage, a backend) is
    # missing: nothing about a problem or a config, found before any work starts.
    ENVIRONMENT = "environment"


class AutocnnError(Exception):
    """Base of every error autocnn raises on purpose."""

    failure_class: FailureClass = FailureClass.DEVICE_ERROR

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.failure_class.value, "message": str(self)}


class InvalidProblemError(AutocnnError, ValueError):
    """A layer shape that no kernel can compute: names the field, the value and what is allowed."""

    failure_class = FailureClass.INVALID_PROBLEM

    def __init__(self, op: str, field: str, value: Any, allowed: str):
        self.op, self.field, self.value, self.allowed = op, field, value, allowed
        # No operation to name (the op itself is the bad field): the message starts at the field,
        # so that the command line's "autocnn: " prefix is not followed by a second one.
        super().__init__(f"{op + ': ' if op else ''}{field}={value!r} is not allowed: {allowed}")


class ProblemTooLargeError(InvalidProblemError):
    """A layer valid in itself but larger than autocnn's kernels can address: a tensor, or the unrolled
    input of a convolution, of more elements than a 32-bit index reaches. autocnn.torch's layers run
    PyTorch's operator for it instead (with a warning); elsewhere it is refused like any bad shape."""


class InvalidConfigError(AutocnnError, ValueError):
    """A config that is not a point of its search space (unknown or missing parameter, value not offered)."""

    failure_class = FailureClass.INVALID_CONFIG

    def __init__(self, op: str, param: str, value: Any, allowed: str):
        self.op, self.param, self.value, self.allowed = op, param, value, allowed
        super().__init__(f"{op} config: {param}={value!r} is not allowed: {allowed}")


class InfeasibleConfigError(AutocnnError):
    """A valid point of the space that this problem or device cannot run (static limits, ptxas report)."""

    failure_class = FailureClass.INFEASIBLE

    def __init__(self, op: str, reasons: list[str]):
        self.op, self.reasons = op, list(reasons)
        super().__init__(f"{op} config is infeasible: " + "; ".join(self.reasons))


class CompileError(AutocnnError):
    """The CUDA compiler rejected a rendered kernel; carries the config and the compiler's log."""

    failure_class = FailureClass.COMPILE_ERROR

    def __init__(self, message: str, log: str = "", config: Any = None):
        self.log, self.config = log, config
        text = message if not log else f"{message}\n{log.strip()[:4000]}"
        super().__init__(text)


class LaunchError(AutocnnError):
    """The launch was refused (resources, grid limits) without breaking the CUDA context."""

    failure_class = FailureClass.LAUNCH_ERROR


class KernelTimeoutError(AutocnnError):
    """A variant ran past its time limit; its worker was stopped."""

    failure_class = FailureClass.TIMEOUT


class WrongResultError(AutocnnError):
    """A variant computed something other than the float64 reference."""

    failure_class = FailureClass.WRONG_RESULT

    def __init__(self, message: str, rel_error: float = float("nan"), bound: float = float("nan")):
        self.rel_error, self.bound = rel_error, bound
        super().__init__(message)


class DeviceError(AutocnnError):
    """The CUDA context broke (illegal address, unspecified launch failure) or no device is usable."""

    failure_class = FailureClass.DEVICE_ERROR


class EnvironmentCheckError(AutocnnError):
    """A directory that cannot be written, a storage that cannot be reached, a backend that is not
    installed: one sentence naming the path or URL and what to do (``autocnn.preflight``)."""

    failure_class = FailureClass.ENVIRONMENT


ERROR_BY_CLASS: dict[FailureClass, type[AutocnnError]] = {
    FailureClass.INVALID_PROBLEM: InvalidProblemError,
    FailureClass.INVALID_CONFIG: InvalidConfigError,
    FailureClass.INFEASIBLE: InfeasibleConfigError,
    FailureClass.COMPILE_ERROR: CompileError,
    FailureClass.LAUNCH_ERROR: LaunchError,
    FailureClass.TIMEOUT: KernelTimeoutError,
    FailureClass.WRONG_RESULT: WrongResultError,
    FailureClass.DEVICE_ERROR: DeviceError,
    FailureClass.ENVIRONMENT: EnvironmentCheckError,
}
