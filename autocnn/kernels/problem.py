"""Layer shapes: one frozen, validated dataclass per operation.

A problem is everything the generated code is specialised on. Construction validates every field,
so an object that exists is a shape some kernel can compute; a bad shape raises
InvalidProblemError naming the field, the value and what is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autocnn.errors import InvalidProblemError
# What the problem types share, the pooling problems and the registry have modules of their own;
# their names are offered here too, where every caller has always found them.
from autocnn.kernels.pool_problems import (  # noqa: F401
    POOL_PRECISIONS, AvgPoolBwdProblem, AvgPoolFwdProblem, PoolProblem)
from autocnn.kernels.problem_fields import (  # noqa: F401
    ACTIVATIONS, DTYPES, INDEX_LIMIT, beyond_index_limit, check_elements, check_int, checked_layout,
    conv_index_extents, layout_string, padding_field, pair_field, pool_index_extents, problem_dict)
from autocnn.layout import DEFAULT_LAYOUT, Layout
from autocnn.kernels.problem_registry import (  # noqa: F401
    PROBLEM_TYPES, ReferenceProblem, parse_shape, problem_from_dict, problem_type, register_problem_type)
# What a convolution's result must be as accurate as: a Precision (autocnn/precision.py, where the
# bounds are set); a problem given a name holds the Precision it stands for.
from autocnn.precision import (  # noqa: F401
    DEFAULT_PRECISION, PRECISION_NAMES, PRECISIONS, Precision, precision_named, without_products)


@dataclass(frozen=True)
class ConvProblem:
    """Geometry shared by the three convolution operations (forward, backward-data, weight gradient).

    X is N x C x H x W, the filters K x C/groups x R x S, Y is N x K x P x Q with
    P = (H + pad_top + pad_bottom - ((R - 1) * dilation_h + 1)) // stride_h + 1 (and likewise Q).
    ``groups`` splits the channels into that many groups, filter k reading only group
    k // (K/groups) of the input (groups == C == K: depthwise); ``dilation`` spaces the filter's taps.
    Both at their defaults (1, (1, 1)) are left out of to_dict, shape_string and geometry, so a dense,
    undilated problem keeps the keys it had before they existed. ``layout`` orders the tensors in
    memory (NCHW with KCRS filters, the default and likewise left out, or NHWC with KRSC;
    autocnn/layout.py); the sizes and x_shape, w_shape, y_shape are logical, the same in both.
    """

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dtype: str = "float32"
    precision: Precision = DEFAULT_PRECISION   # a name ("tf32") is taken for its Precision
    groups: int = 1
    dilation: tuple[int, int] = (1, 1)
    layout: Layout = DEFAULT_LAYOUT            # a name ("nhwc") is taken for its Layout

    op: ClassVar[str] = "conv"
    # Whether the operation has a grouped or dilated form (the fused ones have none).
    takes_grouping: ClassVar[bool] = True
    # Whether it has a layout other than NCHW (the fused and separable ones have none).
    takes_layout: ClassVar[bool] = True

    def __post_init__(self) -> None:
        op = self.op
        for name in ("N", "C", "H", "W", "K", "R", "S"):
            check_int(op, name, getattr(self, name), minimum=1)
        object.__setattr__(self, "stride", pair_field(op, "stride", self.stride))
        object.__setattr__(self, "padding", padding_field(op, self.padding))
        if self.dtype not in DTYPES:
            raise InvalidProblemError(op, "dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        object.__setattr__(self, "precision", precision_named(self.precision, op))
        object.__setattr__(self, "layout", checked_layout(self, self.layout))
        self._check_grouping()
        pt, pl, pb, pr = self.padding
        extent_h, extent_w = self.filter_extent
        # A side padded by the whole (dilated) filter would hold output rows that read only zeros.
        if pt >= extent_h or pb >= extent_h:
            raise InvalidProblemError(
                op, "padding", self.padding,
                f"top and bottom padding smaller than the filter height R={self.R}" + self._dilated_text(0))
        if pl >= extent_w or pr >= extent_w:
            raise InvalidProblemError(
                op, "padding", self.padding,
                f"left and right padding smaller than the filter width S={self.S}" + self._dilated_text(1))
        if self.H + pt + pb < extent_h:
            raise InvalidProblemError(
                op, "R", self.R, f"at most the padded height H+pad_top+pad_bottom={self.H + pt + pb}"
                + self._dilated_text(0))
        if self.W + pl + pr < extent_w:
            raise InvalidProblemError(
                op, "S", self.S, f"at most the padded width W+pad_left+pad_right={self.W + pl + pr}"
                + self._dilated_text(1))
        for what, shape in conv_index_extents(self.N, self.C, self.H, self.W, self.K, self.R, self.S,
                                              self.P, self.Q, self.groups).items():
            check_elements(op, what, shape)

    def _check_grouping(self) -> None:
        op = self.op
        check_int(op, "groups", self.groups, minimum=1)
        object.__setattr__(self, "dilation", pair_field(op, "dilation", self.dilation))
        if not self.takes_grouping and self.grouped_or_dilated:
            field_name, value = ("groups", self.groups) if self.groups != 1 else ("dilation", self.dilation)
            raise InvalidProblemError(op, field_name, value,
                                      f"only {1 if field_name == 'groups' else (1, 1)}: {op} has no grouped or dilated "
                                      "form (run its convolutions apart)")
        for name in ("C", "K"):
            if getattr(self, name) % self.groups:
                raise InvalidProblemError(op, "groups", self.groups,
                                          f"a divisor of {name}={getattr(self, name)} (each group takes "
                                          f"{name}/groups channels)")

    def _dilated_text(self, axis: int) -> str:
        if self.dilation[axis] == 1:
            return ""
        size = (self.R, self.S)[axis]
        return f" (dilated by {self.dilation[axis]}, the filter spans {self.filter_extent[axis]})" if size > 1 else ""

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def grouped_or_dilated(self) -> bool:
        return self.groups != 1 or self.dilation != (1, 1)

    @property
    def depthwise(self) -> bool:
        """Each channel its own group (groups == C), with K = m*C filters: m per channel."""
        return self.groups == self.C and self.groups > 1

    @property
    def filter_extent(self) -> tuple[int, int]:
        """The rows and columns of input one (dilated) filter window spans."""
        return ((self.R - 1) * self.dilation[0] + 1, (self.S - 1) * self.dilation[1] + 1)

    @property
    def P(self) -> int:
        return (self.H + self.padding[0] + self.padding[2] - self.filter_extent[0]) // self.stride[0] + 1

    @property
    def Q(self) -> int:
        return (self.W + self.padding[1] + self.padding[3] - self.filter_extent[1]) // self.stride[1] + 1

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.C, self.H, self.W)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.K, self.C // self.groups, self.R, self.S)

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.K, self.P, self.Q)

    @property
    def macs(self) -> int:
        """Multiply-adds of the direct convolution (the same count for all three operations)."""
        return self.N * self.K * self.P * self.Q * (self.C // self.groups) * self.R * self.S

    # -- conversions ---------------------------------------------------------------------------
    def geometry(self) -> dict[str, Any]:
        out = {
            "N": self.N, "C": self.C, "H": self.H, "W": self.W, "K": self.K, "R": self.R, "S": self.S,
            "stride": self.stride, "padding": self.padding, "dtype": self.dtype, "precision": self.precision,
        }
        # Only where they are not the default: the problems with no grouped form or other layout
        # (fused, separable) take this geometry too.
        return {**out, **self._grouping_fields()}

    def _grouping_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.groups != 1:
            out["groups"] = self.groups
        if self.dilation != (1, 1):
            out["dilation"] = self.dilation
        if self.layout is not DEFAULT_LAYOUT:
            out["layout"] = self.layout
        return out

    def to_dict(self) -> dict[str, Any]:
        # The default precision is left out, so that records made before precision existed keep
        # their keys (and Optuna their study names); a tf32 problem always says so. Likewise groups
        # and dilation at their defaults: dense records keep their keys.
        return problem_dict(self, {"groups": 1, "dilation": (1, 1)})

    def shape_string(self) -> str:
        sh, sw = self.stride
        stride = f"{sh}" if sh == sw else f"{sh},{sw}"
        pad = ",".join(map(str, self.padding))
        if len(set(self.padding)) == 1:
            pad = str(self.padding[0])
        text = (f"N={self.N},C={self.C},H={self.H},W={self.W},K={self.K},R={self.R},S={self.S},"
                f"stride={stride},pad={pad}")
        if self.groups != 1:
            text += f",groups={self.groups}"
        if self.dilation != (1, 1):
            dh, dw = self.dilation
            text += f",dilation={dh}" if dh == dw else f",dilation={dh},{dw}"
        text += self._epilogue_string() + layout_string(self)
        return text + ("" if self.precision is DEFAULT_PRECISION else f",precision={self.precision.name}")

    def _epilogue_string(self) -> str:
        return ""

    def with_op(self, op: str, **extra: Any) -> "ConvProblem":
        """The same geometry as another convolution operation (a layer needs all three)."""
        cls = PROBLEM_TYPES[op]
        if not issubclass(cls, ConvProblem):
            raise InvalidProblemError(self.op, "op", op, "a convolution operation")
        return cls(**self.geometry(), **extra)


@dataclass(frozen=True)
class ConvFwdProblem(ConvProblem):
    """Y = act(conv(X, W) + b): the forward convolution with an optional fused bias and activation."""

    bias: bool = False
    activation: str = "none"
    op: ClassVar[str] = "conv_fwd"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.bias, bool):
            raise InvalidProblemError(self.op, "bias", self.bias, "true or false")
        if self.activation not in ACTIVATIONS:
            raise InvalidProblemError(self.op, "activation", self.activation,
                                      f"one of {', '.join(ACTIVATIONS)}")

    def _epilogue_string(self) -> str:
        text = ""
        if self.bias:
            text += ",bias=1"
        if self.activation != "none":
            text += f",act={self.activation}"
        return text


@dataclass(frozen=True)
class ConvBwdDataProblem(ConvProblem):
    """dX from dY and W: the error pushed back through the convolution."""

    op: ClassVar[str] = "conv_bwd_data"


@dataclass(frozen=True)
class ConvWgradProblem(ConvProblem):
    """dW (and, with bias, db) from X and dY: a reduction over N*P*Q terms per weight."""

    bias: bool = True
    op: ClassVar[str] = "conv_wgrad"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.bias, bool):
            raise InvalidProblemError(self.op, "bias", self.bias, "true or false")

    def _epilogue_string(self) -> str:
        return "" if self.bias else ",bias=0"


Problem = ConvProblem | PoolProblem


def precision_label(problem: Any) -> str:
    """A problem's precision as tables and listings print it: its name, and "-" for a pooling problem
    in float32, which fp32 and tf32 runs share (pooling forms no products)."""
    precision = getattr(problem, "precision", DEFAULT_PRECISION)
    return "-" if isinstance(problem, PoolProblem) and precision is DEFAULT_PRECISION else precision.name


# The registry's first entries, in the design card's order (OP_NAMES).
PROBLEM_TYPES.update({
    "conv_fwd": ConvFwdProblem,
    "conv_bwd_data": ConvBwdDataProblem,
    "conv_wgrad": ConvWgradProblem,
    "avgpool_fwd": AvgPoolFwdProblem,
    "avgpool_bwd": AvgPoolBwdProblem,
})
# The five operations of the design card; operations added later (kernels/sep_conv.py, ...)
# register their problem types with register_problem_type and appear in PROBLEM_TYPES only.
OP_NAMES = tuple(PROBLEM_TYPES)
