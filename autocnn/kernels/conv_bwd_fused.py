"""conv_bwd_fused: a convolution's whole backward in one operation, as Scherer, Schulz & Behnke (2010)
do it: the next layer's error signal dY is loaded once and from it both the weight gradients (and
bias gradient) and the error pushed back to the source map are computed.

    inputs  x (N,C,H,W), dy (N,K,P,Q), w (K,C,R,S)
    outputs dx (N,C,H,W) = conv_bwd_data(dy, w), dw (K,C,R,S) = conv_wgrad(x, dy), db (K,) with bias

It is a problem type of its own (keyed in the tuning database like any other problem), so a
training step can use it wherever it is tuned faster than conv_bwd_data and conv_wgrad together.
Its formulation is "circular_bwd" (formulations/circular_bwd/); the op template is
templates/conv_bwd_fused.cu.j2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from autocnn.errors import InvalidProblemError
from autocnn.kernels.operation import Operation
from autocnn.kernels.problem import ConvProblem, register_problem_type
from autocnn.precision import KernelTypes


def _require_bool(op: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidProblemError(op, name, value, "true or false")


@dataclass(frozen=True)
class ConvBwdFusedProblem(ConvProblem):
    """dX, dW (and db with ``bias``, which is on by default as for conv_wgrad) from X, dY and W in
    one pass over dY."""

    bias: bool = True
    op: ClassVar[str] = "conv_bwd_fused"
    takes_grouping: ClassVar[bool] = False
    takes_layout: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _require_bool(self.op, "bias", self.bias)

    def _epilogue_string(self) -> str:
        # Shape strings name the bias only when it is off, as conv_wgrad's do.
        return ",bias=0" if not self.bias else ""

    # -- ReferenceProblem ------------------------------------------------------------------------
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"x": self.x_shape, "dy": self.y_shape, "w": self.w_shape}

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"dx": self.x_shape, "dw": self.w_shape, **({"db": (self.K,)} if self.bias else {})}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The two existing references, in the inputs' dtype and array module."""
        from autocnn.kernels import reference

        geo = {"stride": self.stride, "padding": self.padding}
        dx = reference.conv_bwd_data(inputs["dy"], inputs["w"], input_hw=(self.H, self.W), **geo)
        dw, db = reference.conv_wgrad(inputs["x"], inputs["dy"], kernel_hw=(self.R, self.S), bias=self.bias, **geo)
        return {"dx": dx, "dw": dw, **({"db": db} if self.bias else {})}

    def reduction_length(self, output_name: str) -> int:
        """dx sums as conv_bwd_data's does, dw and db as conv_wgrad's."""
        sh, sw = self.stride
        if output_name == "dx":
            return math.ceil(self.R / sh) * math.ceil(self.S / sw) * self.K
        if output_name in self.output_shapes():
            return self.N * self.P * self.Q
        raise InvalidProblemError(self.op, "output_name", output_name, f"one of {', '.join(self.output_shapes())}")


register_problem_type(ConvBwdFusedProblem)


class ConvBwdFused(Operation):
    name = "conv_bwd_fused"
    family = "conv_bwd_fused"
    problem_type = ConvBwdFusedProblem
    inputs = ("x", "dy", "w")
    outputs = ("dx", "dw", "db")

    def flops(self, p: ConvBwdFusedProblem) -> int:
        return 4 * p.macs     # conv_bwd_data's and conv_wgrad's

    def min_bytes(self, p: ConvBwdFusedProblem) -> int:
        t = KernelTypes.of(p.precision)   # x and dx, dy, w and dw (and db)
        return ((t.x.size + t.dx.size) * p.N * p.C * p.H * p.W + t.dy.size * p.N * p.K * p.P * p.Q
                + (t.w.size + t.dw.size) * p.K * p.C * p.R * p.S + (t.dw.size * p.K if p.bias else 0))
