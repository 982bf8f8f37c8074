"""The five operations: problems, their formulations (search spaces, launch geometry, templates), references."""
from __future__ import annotations

from autocnn.kernels.problem import (  # noqa: F401
    ACTIVATIONS,
    OP_NAMES,
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


def get_operation(name: str) -> Operation:
    from autocnn.errors import InvalidProblemError

    try:
        return OPERATIONS[name]
    except KeyError:
        raise InvalidProblemError("autocnn", "op", name, f"one of {', '.join(OPERATIONS)}") from None


def operation_for(problem) -> Operation:
    return get_operation(problem.op)
