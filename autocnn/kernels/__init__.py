"""The five operations: problems, their formulations (search spaces, launch geometry, templates), references."""
from __future__ import annotations

from autocnn.kernels.problem import (  # noqa: F401
    ACTIVATIONS,
    OP_NAMES,
    PROBLEM_TYPES,
    ReferenceProblem,
    AvgPoolBwdProblem,
    AvgPoolFwdProblem,
    ConvBwdDataProblem,
    ConvFwdProblem,
    ConvProblem,
    ConvWgradProblem,
    PoolProblem,
    parse_shape,
    problem_from_dict,
    problem_type,
    register_problem_type,
)

from autocnn.kernels.avgpool import AvgPoolBwd, AvgPoolFwd
from autocnn.kernels.operation import KernelPlan, Launch, Operation
from autocnn.kernels.conv_bwd_data import ConvBwdData
from autocnn.kernels.conv_fwd import ConvFwd
from autocnn.kernels.conv_wgrad import ConvWgrad
from autocnn.kernels.formulations import REGISTRY

# Each operation composes the formulations of the registry that serve it.
OPERATIONS: dict[str, Operation] = {
    op.name: op for op in (ConvFwd(REGISTRY), ConvBwdData(REGISTRY), ConvWgrad(REGISTRY),
                           AvgPoolFwd(REGISTRY), AvgPoolBwd(REGISTRY))
}


def register_operation(operation: Operation) -> Operation:
    """Offer an operation beyond the first five (its module calls this when kernels/__init__.py
    imports it, after registering its problem type): `autocnn tune --ops`, the tuner, lookups and
    the database then know it like any other."""
    if operation.name in OPERATIONS:
        raise ValueError(f"operation {operation.name!r} is registered already")
    if operation.name not in PROBLEM_TYPES:
        raise ValueError(f"operation {operation.name!r} has no registered problem type "
                         "(kernels.problem.register_problem_type)")
    OPERATIONS[operation.name] = operation
    return operation


def get_operation(name: str) -> Operation:
    from autocnn.errors import InvalidProblemError

    try:
        return OPERATIONS[name]
    except KeyError:
        raise InvalidProblemError("", "op", name, f"one of {', '.join(OPERATIONS)}") from None


def operation_for(problem) -> Operation:
    return get_operation(problem.op)


# Operations added after the first five register themselves when their modules are imported here
# (each module: its problem types, its Operation, its reference), after OPERATIONS exists.
import autocnn.kernels.conv_bwd_fused  # noqa: E402,F401  Scherer's one-pass backward (dx, dw, db)
import autocnn.kernels.conv_pool  # noqa: E402,F401  convolution fused with averaging, and its backward
import autocnn.kernels.sep_conv  # noqa: E402,F401  separable convolutions (1D filters from the batched SVD)
