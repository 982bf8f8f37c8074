"""Average pooling problems: averaging (avgpool_fwd) and supersampling (avgpool_bwd).

Frozen, validated dataclasses as the convolutions' (kernels/problem.py, which offers these too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autocnn.errors import InvalidProblemError
from autocnn.kernels.problem_fields import (DTYPES, check_elements, check_int, checked_layout, layout_string,
                                            padding_field, pair_field, pool_index_extents, problem_dict)
from autocnn.layout import DEFAULT_LAYOUT, Layout
from autocnn.kernels.problem_registry import PROBLEM_TYPES
from autocnn.precision import DEFAULT_PRECISION, PRECISIONS, Precision, precision_named, without_products

# Pooling forms no products, so a precision that only says how products are formed (tf32) means
# nothing there: its precisions are these (without_products maps the others onto them).
POOL_PRECISIONS: tuple[Precision, ...] = tuple(p for p in PRECISIONS if without_products(p) is p)


@dataclass(frozen=True)
class PoolProblem:
    """Average pooling geometry: X is N x C x H x W, Y is N x C x P x Q.

    ``layout`` orders x and y in memory (NCHW, the default, or NHWC; autocnn/layout.py).
    ``count_pad`` says whether padded positions count in the divisor (True: always kh*kw, as
    PyTorch's count_include_pad; False: only the positions inside the image). ``precision`` is the
    storage of x and y (fp32, bf16 or fp16; the sums run in FP32 in each): one of POOL_PRECISIONS.
    """

    N: int
    C: int
    H: int
    W: int
    window: tuple[int, int] = (2, 2)
    stride: tuple[int, int] | None = None
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    count_pad: bool = True
    dtype: str = "float32"
    precision: Precision = DEFAULT_PRECISION   # a name ("bf16") is taken for its Precision
    layout: Layout = DEFAULT_LAYOUT            # a name ("nhwc") is taken for its Layout

    op: ClassVar[str] = "pool"
    # Whether the operation has a layout other than NCHW (conv_pool_dz has none).
    takes_layout: ClassVar[bool] = True

    def __post_init__(self) -> None:
        op = self.op
        for name in ("N", "C", "H", "W"):
            check_int(op, name, getattr(self, name), minimum=1)
        object.__setattr__(self, "window", pair_field(op, "window", self.window))
        stride = self.window if self.stride is None else self.stride
        object.__setattr__(self, "stride", pair_field(op, "stride", stride))
        object.__setattr__(self, "padding", padding_field(op, self.padding))
        if not isinstance(self.count_pad, bool):
            raise InvalidProblemError(op, "count_pad", self.count_pad, "true or false")
        if self.dtype not in DTYPES:
            raise InvalidProblemError(op, "dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        precision = precision_named(self.precision, op)
        if precision not in POOL_PRECISIONS:
            raise InvalidProblemError(op, "precision", precision.name,
                                      f"one of {', '.join(p.name for p in POOL_PRECISIONS)} (pooling forms no "
                                      f"products, so {precision.name} is {without_products(precision).name} there)")
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "layout", checked_layout(self, self.layout))
        kh, kw = self.window
        pt, pl, pb, pr = self.padding
        if pt >= kh or pb >= kh:
            raise InvalidProblemError(op, "padding", self.padding,
                                      f"top and bottom padding smaller than the window height {kh}")
        if pl >= kw or pr >= kw:
            raise InvalidProblemError(op, "padding", self.padding,
                                      f"left and right padding smaller than the window width {kw}")
        if self.H + pt + pb < kh:
            raise InvalidProblemError(op, "window", self.window,
                                      f"height at most the padded height {self.H + pt + pb}")
        if self.W + pl + pr < kw:
            raise InvalidProblemError(op, "window", self.window,
                                      f"width at most the padded width {self.W + pl + pr}")
        for what, shape in pool_index_extents(self.N, self.C, self.H, self.W, self.P, self.Q).items():
            check_elements(op, what, shape)

    @property
    def P(self) -> int:
        return (self.H + self.padding[0] + self.padding[2] - self.window[0]) // self.stride[0] + 1

    @property
    def Q(self) -> int:
        return (self.W + self.padding[1] + self.padding[3] - self.window[1]) // self.stride[1] + 1

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.C, self.H, self.W)

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.C, self.P, self.Q)

    def geometry(self) -> dict[str, Any]:
        return {"N": self.N, "C": self.C, "H": self.H, "W": self.W, "window": self.window,
                "stride": self.stride, "padding": self.padding, "count_pad": self.count_pad,
                "dtype": self.dtype, "precision": self.precision,
                **({} if self.layout is DEFAULT_LAYOUT else {"layout": self.layout})}

    def to_dict(self) -> dict[str, Any]:
        # As a convolution's: the default precision is left out, so that records made before pooling
        # had a precision keep their keys.
        return problem_dict(self, {})

    def shape_string(self) -> str:
        kh, kw = self.window
        sh, sw = self.stride
        win = f"{kh}" if kh == kw else f"{kh},{kw}"
        stride = f"{sh}" if sh == sw else f"{sh},{sw}"
        pad = str(self.padding[0]) if len(set(self.padding)) == 1 else ",".join(map(str, self.padding))
        text = f"N={self.N},C={self.C},H={self.H},W={self.W},window={win},stride={stride},pad={pad}"
        text += ("" if self.count_pad else ",count_pad=0") + layout_string(self)
        return text + ("" if self.precision is DEFAULT_PRECISION else f",precision={self.precision.name}")

    def with_op(self, op: str) -> "PoolProblem":
        cls = PROBLEM_TYPES[op]
        if not issubclass(cls, PoolProblem):
            raise InvalidProblemError(self.op, "op", op, "a pooling operation")
        return cls(**self.geometry())


@dataclass(frozen=True)
class AvgPoolFwdProblem(PoolProblem):
    """Averaging (the 2009 report's subsampling): each output is the mean of its window."""

    op: ClassVar[str] = "avgpool_fwd"


@dataclass(frozen=True)
class AvgPoolBwdProblem(PoolProblem):
    """Supersampling: each input position gathers the gradients of the windows that cover it."""

    op: ClassVar[str] = "avgpool_bwd"
