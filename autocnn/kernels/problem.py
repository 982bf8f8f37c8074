"""Layer shapes: one frozen, validated dataclass per operation.

A problem is everything the generated code is specialised on. Construction validates every field,
so an object that exists is a shape some kernel can compute; a bad shape raises
InvalidProblemError naming the field, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Protocol, runtime_checkable

from autocnn.errors import InvalidProblemError, ProblemTooLargeError
from autocnn.precision import (DEFAULT_PRECISION, PRECISION_NAMES, PRECISIONS, Precision, precision_named,
                               without_products)

# Generated kernels index with 32-bit signed integers; every tensor (and every product the index
# arithmetic forms) must stay below this.
INDEX_LIMIT = 2**31 - 1
DTYPES = ("float32",)
# What a convolution's result must be as accurate as: a Precision (autocnn/precision.py, where the
# bounds are set); a problem given a name holds the Precision it stands for.
# Pooling forms no products, so a precision that only says how products are formed (tf32) means
# nothing there: its precisions are these (without_products maps the others onto them).
POOL_PRECISIONS: tuple[Precision, ...] = tuple(p for p in PRECISIONS if without_products(p) is p)
ACTIVATIONS = ("none", "relu", "tanh", "logistic")


def _pair(op: str, name: str, value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        vals = tuple(value)
    else:
        vals = (value,)
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2:
        raise InvalidProblemError(op, name, value, "one integer or two (height, width)")
    for v in vals:
        _check_int(op, name, v, minimum=1)
    return vals  # type: ignore[return-value]


def _padding(op: str, value: Any) -> tuple[int, int, int, int]:
    if isinstance(value, (list, tuple)):
        vals = tuple(value)
    else:
        vals = (value,)
    if len(vals) == 1:
        vals = vals * 4
    elif len(vals) == 2:  # (height, width) as in most frameworks
        vals = (vals[0], vals[1], vals[0], vals[1])
    if len(vals) != 4:
        raise InvalidProblemError(
            op, "padding", value, "one integer, two (height, width) or four (top, left, bottom, right)")
    for v in vals:
        _check_int(op, "padding", v, minimum=0)
    return vals  # type: ignore[return-value]


def _check_int(op: str, name: str, value: Any, minimum: int) -> None:
    # bool is an int in Python; a shape field given True is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidProblemError(op, name, value, f"an integer >= {minimum}")
    if value < minimum:
        raise InvalidProblemError(op, name, value, f"an integer >= {minimum}")


def conv_index_extents(N: Any, C: Any, H: Any, W: Any, K: Any, R: Any, S: Any, P: Any, Q: Any,
                       groups: int = 1) -> dict[str, tuple]:
    """What a convolution's kernels index, by name: each must stay within INDEX_LIMIT elements (filters and
    a group's unrolled input hold C/groups channels). Plain arithmetic: autocnn.torch evaluates it on a trace."""
    cg, per = (C, "C") if groups == 1 else (C // groups, "C/groups")
    return {"input N*C*H*W": (N, C, H, W), f"filters K*{per}*R*S": (K, cg, R, S), "output N*K*P*Q": (N, K, P, Q),
            f"unrolled input N*P*Q*{per}*R*S": (N, P, Q, cg, R, S)}


def pool_index_extents(N: Any, C: Any, H: Any, W: Any, P: Any, Q: Any) -> dict[str, tuple]:
    """As conv_index_extents, for average pooling."""
    return {"input N*C*H*W": (N, C, H, W), "output N*C*P*Q": (N, C, P, Q)}


def _elements(shape: tuple) -> Any:
    # By hand rather than math.prod: the sizes may be a torch.compile trace's symbolic ones.
    count = 1
    for size in shape:
        count = count * size
    return count


def beyond_index_limit(extents: Mapping[str, tuple]) -> bool:
    """Whether any extent exceeds INDEX_LIMIT."""
    beyond = False
    for shape in extents.values():
        beyond = beyond or _elements(shape) > INDEX_LIMIT
    return beyond


def _check_elements(op: str, what: str, shape: tuple[int, ...]) -> None:
    count = _elements(shape)
    if count > INDEX_LIMIT:
        raise ProblemTooLargeError(
            op, what, "x".join(map(str, shape)),
            f"at most {INDEX_LIMIT} elements ({count} given): kernels index with 32-bit integers")


@dataclass(frozen=True)
class ConvProblem:
    """Geometry shared by the three convolution operations (forward, backward-data, weight gradient).

    X is N x C x H x W, the filters K x C/groups x R x S, Y is N x K x P x Q with
    P = (H + pad_top + pad_bottom - ((R - 1) * dilation_h + 1)) // stride_h + 1 (and likewise Q).
    ``groups`` splits the channels into that many groups, filter k reading only group
    k // (K/groups) of the input (groups == C == K: depthwise); ``dilation`` spaces the filter's taps.
    Both at their defaults (1, (1, 1)) are left out of to_dict, shape_string and geometry, so a dense,
    undilated problem keeps the keys it had before they existed.
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

    op: ClassVar[str] = "conv"
    # Whether the operation has a grouped or dilated form (the fused ones have none).
    takes_grouping: ClassVar[bool] = True

    def __post_init__(self) -> None:
        op = self.op
        for name in ("N", "C", "H", "W", "K", "R", "S"):
            _check_int(op, name, getattr(self, name), minimum=1)
        object.__setattr__(self, "stride", _pair(op, "stride", self.stride))
        object.__setattr__(self, "padding", _padding(op, self.padding))
        if self.dtype not in DTYPES:
            raise InvalidProblemError(op, "dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        object.__setattr__(self, "precision", precision_named(self.precision, op))
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
            _check_elements(op, what, shape)

    def _check_grouping(self) -> None:
        op = self.op
        _check_int(op, "groups", self.groups, minimum=1)
        object.__setattr__(self, "dilation", _pair(op, "dilation", self.dilation))
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
        # Only where they are not the default: the problems with no grouped form (fused, separable)
        # take this geometry too.
        return {**out, **self._grouping_fields()}

    def _grouping_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.groups != 1:
            out["groups"] = self.groups
        if self.dilation != (1, 1):
            out["dilation"] = self.dilation
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        # The default precision is left out, so that records made before precision existed keep
        # their keys (and Optuna their study names); a tf32 problem always says so.
        if self.precision is DEFAULT_PRECISION:
            del out["precision"]
        else:
            out["precision"] = self.precision.name
        # Likewise groups and dilation at their defaults: dense records keep their keys.
        for name, value in (("groups", 1), ("dilation", (1, 1))):
            if getattr(self, name) == value:
                del out[name]
        return out

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
        text += self._epilogue_string()
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


@dataclass(frozen=True)
class PoolProblem:
    """Average pooling geometry: X is N x C x H x W, Y is N x C x P x Q.

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

    op: ClassVar[str] = "pool"

    def __post_init__(self) -> None:
        op = self.op
        for name in ("N", "C", "H", "W"):
            _check_int(op, name, getattr(self, name), minimum=1)
        object.__setattr__(self, "window", _pair(op, "window", self.window))
        stride = self.window if self.stride is None else self.stride
        object.__setattr__(self, "stride", _pair(op, "stride", stride))
        object.__setattr__(self, "padding", _padding(op, self.padding))
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
            _check_elements(op, what, shape)

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
                "dtype": self.dtype, "precision": self.precision}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        # As a convolution's: the default precision is left out, so that records made before pooling
        # had a precision keep their keys.
        if self.precision is DEFAULT_PRECISION:
            del out["precision"]
        else:
            out["precision"] = self.precision.name
        return out

    def shape_string(self) -> str:
        kh, kw = self.window
        sh, sw = self.stride
        win = f"{kh}" if kh == kw else f"{kh},{kw}"
        stride = f"{sh}" if sh == sw else f"{sh},{sw}"
        pad = str(self.padding[0]) if len(set(self.padding)) == 1 else ",".join(map(str, self.padding))
        text = f"N={self.N},C={self.C},H={self.H},W={self.W},window={win},stride={stride},pad={pad}"
        text += "" if self.count_pad else ",count_pad=0"
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


Problem = ConvProblem | PoolProblem


def precision_label(problem: Any) -> str:
    """A problem's precision as tables and listings print it: its name, and "-" for a pooling problem
    in float32, which fp32 and tf32 runs share (pooling forms no products)."""
    precision = getattr(problem, "precision", DEFAULT_PRECISION)
    return "-" if isinstance(problem, PoolProblem) and precision is DEFAULT_PRECISION else precision.name

PROBLEM_TYPES: dict[str, type] = {
    "conv_fwd": ConvFwdProblem,
    "conv_bwd_data": ConvBwdDataProblem,
    "conv_wgrad": ConvWgradProblem,
    "avgpool_fwd": AvgPoolFwdProblem,
    "avgpool_bwd": AvgPoolBwdProblem,
}
# The five operations of the design card; operations added later (kernels/sep_conv.py, ...)
# register their problem types with register_problem_type and appear in PROBLEM_TYPES only.
OP_NAMES = tuple(PROBLEM_TYPES)


@runtime_checkable
class ReferenceProblem(Protocol):
    """A problem type that carries its own float64 reference (kernels/reference.py dispatches to
    these methods): an operation added after the first five keeps its tensors' names and shapes,
    its reference and its reduction lengths beside its problem, in its own module, instead of a
    branch in each function of reference.py."""

    op: ClassVar[str]

    def input_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def output_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]: ...

    def reduction_length(self, output_name: str) -> int: ...


def register_problem_type(cls: type) -> type:
    """Offer a problem type under its ``op`` name (problem_type, problem_from_dict, parse_shape,
    the tuning database). Its op name must be new; a problem type outside the first five must
    implement ReferenceProblem, so that verification knows its reference. Usable as a decorator."""
    op = getattr(cls, "op", None)
    if not isinstance(op, str) or not op:
        raise ValueError(f"{cls.__name__} has no op name")
    if PROBLEM_TYPES.get(op, cls) is not cls:
        raise ValueError(f"operation {op!r} is registered already, by {PROBLEM_TYPES[op].__name__}")
    missing = [m for m in ("input_shapes", "output_shapes", "reference", "reduction_length")
               if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"{cls.__name__} lacks the ReferenceProblem methods {', '.join(missing)}")
    PROBLEM_TYPES[op] = cls
    return cls


def problem_type(op: str) -> type:
    try:
        return PROBLEM_TYPES[op]
    except KeyError:
        raise InvalidProblemError("", "op", op, f"one of {', '.join(PROBLEM_TYPES)}") from None


def problem_from_dict(data: Mapping[str, Any]) -> Any:
    """Rebuild a problem from ``to_dict`` output (as stored in the tuning database)."""
    if not isinstance(data, Mapping) or "op" not in data:
        raise InvalidProblemError("", "problem", data, "a mapping with an 'op' key")
    cls = problem_type(data["op"])
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - {"op"})
    if unknown:
        raise InvalidProblemError(data["op"], unknown[0], data[unknown[0]],
                                  f"fields are {', '.join(sorted(names))}")
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k != "op"}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a missing required field
        raise InvalidProblemError(data["op"], "fields", sorted(data), str(exc)) from None


_SHAPE_ALIASES = {"pad": "padding", "act": "activation", "k": "K", "n": "N", "c": "C", "h": "H",
                  "w": "W", "r": "R", "s": "S", "win": "window"}


def parse_shape(op: str, text: str) -> Any:
    """Parse the command line's shape syntax, e.g. ``N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3``.

    Bare numbers after a key continue that key's list, so ``pad=4,4,3,3`` is one field.
    """
    cls = problem_type(op)
    fields: dict[str, list[str]] = {}
    current: str | None = None
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if "=" in token:
            key, _, value = token.partition("=")
            key = key.strip()
            key = _SHAPE_ALIASES.get(key, key)
            if key in fields:
                raise InvalidProblemError(op, key, text, "each field once")
            fields[key] = [value.strip()]
            current = key
        elif current is None:
            raise InvalidProblemError(op, "shape", text, "comma-separated key=value pairs, e.g. N=128,C=3")
        else:
            fields[current].append(token)
    # A field's annotation says how its numbers are read: a tuple (stride, padding, window,
    # pool_window, ...), a flag written 0 or 1 (bias, count_pad, keep_activation), else one integer.
    kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    names = set(kinds)
    kwargs: dict[str, Any] = {}
    for key, values in fields.items():
        if key not in names:
            raise InvalidProblemError(op, key, ",".join(values), f"fields are {', '.join(sorted(names))}")
        if key in ("activation", "dtype", "precision"):
            kwargs[key] = values[0]
            continue
        try:
            nums = [int(v) for v in values]
        except ValueError:
            raise InvalidProblemError(op, key, ",".join(values), "integers") from None
        if kinds[key] == "bool":
            if nums[0] not in (0, 1) or len(nums) != 1:
                raise InvalidProblemError(op, key, ",".join(values), "0 or 1")
            kwargs[key] = bool(nums[0])
        elif kinds[key].startswith("tuple"):
            kwargs[key] = tuple(nums)
        else:
            if len(nums) != 1:
                raise InvalidProblemError(op, key, ",".join(values), "one integer")
            kwargs[key] = nums[0]
    try:
        return cls(**kwargs)
    except TypeError as exc:
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [r for r in required if r not in kwargs]
        raise InvalidProblemError(op, "shape", text, f"missing {', '.join(missing)}") from exc
