"""Every operation, each composing the formulations of its registry (formulations/__init__.py).

OPERATIONS is the one place operations are offered: `autocnn tune --ops`, the tuner, lookups and
the database know the operations it holds, in its order. An operation added later gets its module
under kernels/ (its problem types registered with kernels.problem.register_problem_type, its
Operation, its reference, and seed_problems / odd_problems beside the problem types for the suite)
and one entry here.
"""
from __future__ import annotations

from autocnn.errors import InvalidProblemError
from autocnn.kernels.avgpool import AvgPoolBwd, AvgPoolFwd
from autocnn.kernels.conv_bwd_data import ConvBwdData
from autocnn.kernels.conv_bwd_fused import ConvBwdFused
from autocnn.kernels.conv_fwd import ConvFwd
from autocnn.kernels.conv_pool import ConvPoolDz, ConvPoolFwd
from autocnn.kernels.conv_wgrad import ConvWgrad
from autocnn.kernels.formulations import CONV_POOL, REGISTRY, SEPARABLE
from autocnn.kernels.operation import Operation
from autocnn.kernels.sep_conv import SepConvBwdData, SepConvFwd, SepConvWgrad

OPERATIONS: dict[str, Operation] = {
    op.name: op for op in (
        # The five operations of the seed.
        ConvFwd(REGISTRY), ConvBwdData(REGISTRY), ConvWgrad(REGISTRY), AvgPoolFwd(REGISTRY), AvgPoolBwd(REGISTRY),
        # Scherer's one-pass backward (dx, dw, db).
        ConvBwdFused(REGISTRY),
        # Convolution fused with averaging, and its backward's first step.
        ConvPoolFwd(CONV_POOL), ConvPoolDz(CONV_POOL),
        # Separable convolutions (1D filters from the batched SVD).
        SepConvFwd(SEPARABLE), SepConvBwdData(SEPARABLE), SepConvWgrad(SEPARABLE),
    )
}


def get_operation(name: str) -> Operation:
    try:
        return OPERATIONS[name]
    except KeyError:
        raise InvalidProblemError("", "op", name, f"one of {', '.join(OPERATIONS)}") from None


def operation_for(problem) -> Operation:
    return get_operation(problem.op)
