"""The operations: problems, their formulations (search spaces, launch geometry, templates), references.

The names a user of the package needs, from their homes: the problems (problem.py) and the
operations that tune and plan them (registry.py).
"""
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
from autocnn.kernels.registry import OPERATIONS, get_operation, operation_for  # noqa: F401
