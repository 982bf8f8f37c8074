"""The problem types of convolution fused with averaging (kernels/conv_pool.py has their operations).

conv_pool_fwd: y = avgpool(act(conv(x, w) + b)), with ``keep_activation`` (training) also
a = act(conv(x, w) + b); conv_pool_dz: dZ = act'(a) * supersample(dy_pooled). Each type carries
its float64 reference, and this module its seed and odd problems (kernels.suite reads them here,
beside the types). They live apart from the operations so that the formulations, which take them
as their problems, and the operations, which compose those formulations, import them without
importing each other.

Importing this module registers the problem types (kernels/problem.py: register_problem_type).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from autocnn.errors import InvalidProblemError
from autocnn.kernels import reference
from autocnn.kernels.formulations.cores.pool_blocks import MAX_BLOCK_CELLS, rectangle
from autocnn.kernels.problem import (ACTIVATIONS, AvgPoolFwdProblem, ConvFwdProblem, PoolProblem,
                                     register_problem_type)

_POOL_FIELDS = {"window": "pool_window", "stride": "pool_stride", "padding": "pool_padding"}


@register_problem_type
@dataclass(frozen=True)
class ConvPoolFwdProblem(ConvFwdProblem):
    """A convolution (with bias and activation) followed by average pooling of its P x Q output.

    The pooling fields are PoolProblem's (pool_stride defaults to the window); the pooled map is
    PP x QQ. ``keep_activation`` also writes the full-size activation ``a`` (training)."""

    pool_window: tuple[int, int] = (2, 2)
    pool_stride: tuple[int, int] | None = None
    pool_padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    count_pad: bool = True
    keep_activation: bool = False
    op: ClassVar[str] = "conv_pool_fwd"
    takes_grouping: ClassVar[bool] = False
    takes_layout: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.keep_activation, bool):
            raise InvalidProblemError(self.op, "keep_activation", self.keep_activation, "true or false")
        try:
            pool = AvgPoolFwdProblem(N=self.N, C=self.K, H=self.P, W=self.Q, window=self.pool_window,
                                     stride=self.pool_stride, padding=self.pool_padding,
                                     count_pad=self.count_pad)
        except InvalidProblemError as exc:
            raise InvalidProblemError(
                self.op, _POOL_FIELDS.get(exc.field, exc.field), exc.value,
                f"{exc.allowed} (the pooling runs over the convolution's {self.P}x{self.Q} output)") from None
        object.__setattr__(self, "pool_window", pool.window)
        object.__setattr__(self, "pool_stride", pool.stride)
        object.__setattr__(self, "pool_padding", pool.padding)
        ch, cw = rectangle(self, 1, 1)
        if ch * cw > MAX_BLOCK_CELLS:
            raise InvalidProblemError(
                self.op, "pool_window", self.pool_window,
                f"windows whose block needs at most {MAX_BLOCK_CELLS} convolution outputs ({ch}x{cw} here): "
                "run conv_fwd then avgpool_fwd for larger ones")

    @property
    def PP(self) -> int:
        return self.pool.P

    @property
    def QQ(self) -> int:
        return self.pool.Q

    @property
    def pool(self) -> AvgPoolFwdProblem:
        """The averaging of the convolution's output, as the unfused avgpool_fwd problem."""
        return AvgPoolFwdProblem(N=self.N, C=self.K, H=self.P, W=self.Q, window=self.pool_window,
                                 stride=self.pool_stride, padding=self.pool_padding, count_pad=self.count_pad)

    @property
    def conv(self) -> ConvFwdProblem:
        """The convolution alone, as the unfused conv_fwd problem."""
        return ConvFwdProblem(**self.geometry(), bias=self.bias, activation=self.activation)

    @property
    def dz(self) -> "ConvPoolDzProblem":
        """The backward's first step: dZ from the pooled gradient and ``a``."""
        return ConvPoolDzProblem(**self.pool.geometry(), activation=self.activation)

    def _epilogue_string(self) -> str:
        kh, kw = self.pool_window
        sh, sw = self.pool_stride
        text = super()._epilogue_string() + f",pool_window={kh},{kw},pool_stride={sh},{sw}"
        if any(self.pool_padding):
            text += ",pool_padding=" + ",".join(map(str, self.pool_padding))
        text += "" if self.count_pad else ",count_pad=0"
        return text + (",keep_activation=1" if self.keep_activation else "")

    # -- ReferenceProblem ------------------------------------------------------------------------
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"x": self.x_shape, "w": self.w_shape, **({"bias": (self.K,)} if self.bias else {})}

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"y": self.pool.y_shape, **({"a": self.y_shape} if self.keep_activation else {})}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        a = reference.conv_fwd(inputs["x"], inputs["w"], bias=inputs.get("bias"), activation=self.activation,
                               stride=self.stride, padding=self.padding)
        y = reference.avgpool_fwd(a, window=self.pool_window, stride=self.pool_stride,
                                  padding=self.pool_padding, count_pad=self.count_pad)
        return {"y": y, **({"a": a} if self.keep_activation else {})}

    def reduction_length(self, output_name: str) -> int:
        terms = self.C * self.R * self.S
        return terms * self.pool_window[0] * self.pool_window[1] if output_name == "y" else terms


@register_problem_type
@dataclass(frozen=True)
class ConvPoolDzProblem(PoolProblem):
    """dZ = act'(a) * supersample(dy): the gradient at a convolution's pre-activation when an
    average pooling follows its activation. H x W is the convolution's output (a's map), dy the
    pooled gradient; ``a`` (the activation's output) is an input unless the activation is none."""

    activation: str = "none"
    op: ClassVar[str] = "conv_pool_dz"
    takes_layout: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.activation not in ACTIVATIONS:
            raise InvalidProblemError(self.op, "activation", self.activation, f"one of {', '.join(ACTIVATIONS)}")

    def shape_string(self) -> str:
        return super().shape_string() + ("" if self.activation == "none" else f",act={self.activation}")

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"dy": self.y_shape, **({"a": self.x_shape} if self.activation != "none" else {})}

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"dz": self.x_shape}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        g = reference.avgpool_bwd(inputs["dy"], input_hw=(self.H, self.W), window=self.window,
                                  stride=self.stride, padding=self.padding, count_pad=self.count_pad)
        if self.activation == "none":
            return {"dz": g}
        return {"dz": reference.activation_grad(inputs["a"], g, self.activation)}

    def reduction_length(self, output_name: str) -> int:
        return math.ceil(self.window[0] / self.stride[0]) * math.ceil(self.window[1] / self.stride[1])


def zoo_pairs(batch: int = 128, keep_activation: bool = False) -> list[tuple[str, ConvPoolFwdProblem]]:
    """The convolution -> activation -> AvgPool2d pairs of the zoo's networks (autocnn/nn/zoo.py)."""

    def pair(C, H, K, R, pad, act, window, stride=None, pool_pad=0, count_pad=True):
        return ConvPoolFwdProblem(N=batch, C=C, H=H, W=H, K=K, R=R, S=R, padding=pad, bias=True, activation=act,
                                  pool_window=window, pool_stride=stride, pool_padding=pool_pad,
                                  count_pad=count_pad, keep_activation=keep_activation)

    convnet = {"stride": 2, "pool_pad": 1, "count_pad": False}
    return [
        ("kriz09", pair(3, 32, 64, 8, (4, 4, 3, 3), "logistic", 4)),
        ("convnet18_1", pair(3, 32, 32, 5, 2, "relu", 3, **convnet)),
        ("convnet18_2", pair(32, 16, 32, 5, 2, "relu", 3, **convnet)),
        ("convnet18_3", pair(32, 8, 64, 5, 2, "relu", 3, **convnet)),
        ("lenet5_1", pair(1, 28, 6, 5, 2, "relu", 2)),
        ("lenet5_2", pair(6, 14, 16, 5, 0, "relu", 2)),
        ("vgg_cifar_1", pair(64, 32, 64, 3, 1, "relu", 2)),
        ("vgg_cifar_2", pair(128, 16, 128, 3, 1, "relu", 2)),
        ("vgg_cifar_3", pair(256, 8, 256, 3, 1, "relu", 2)),
    ]


def odd_pairs(keep_activation: bool = False) -> list[tuple[str, ConvPoolFwdProblem]]:
    """Shapes that divide nothing evenly: N=1/2/3, odd maps, asymmetric padding of the convolution
    and of the pooling, overlapping windows, count_pad False, windows that do not tile the map,
    gaps between windows, non-square windows, strided convolutions."""

    def pair(**fields):
        return ConvPoolFwdProblem(keep_activation=keep_activation, **fields)

    return [
        ("overlap_asym", pair(N=1, C=5, H=13, W=11, K=7, R=3, S=5, padding=(1, 2, 1, 2), bias=True, activation="tanh",
                              pool_window=3, pool_stride=2, pool_padding=(1, 0, 0, 1), count_pad=False)),
        ("untiled_stride3", pair(N=3, C=3, H=17, W=23, K=13, R=5, S=5, stride=3, padding=(2, 1, 0, 2),
                                 activation="relu", pool_window=2)),
        ("mixed_window", pair(N=3, C=7, H=9, W=31, K=10, R=4, S=3, stride=(2, 1), padding=(3, 0, 1, 2), bias=True,
                              activation="logistic", pool_window=(2, 3), pool_stride=(3, 2),
                              pool_padding=(1, 2, 0, 1), count_pad=False)),
        ("padded_nonoverlap", pair(N=3, C=4, H=12, W=10, K=5, R=3, S=3, padding=1, bias=True, activation="relu",
                                   pool_window=4, pool_padding=1, count_pad=False)),
        ("gaps", pair(N=2, C=3, H=10, W=10, K=4, R=3, S=3, activation="relu", pool_window=2, pool_stride=4)),
        ("big_filter_none", pair(N=1, C=1, H=15, W=15, K=9, R=7, S=7, stride=2, padding=(3, 3, 2, 2), bias=True,
                                 pool_window=3)),
    ]


def _as(op: str, pairs: list[tuple[str, ConvPoolFwdProblem]]) -> list[tuple[str, Any]]:
    if op == "conv_pool_fwd":
        return pairs
    if op == "conv_pool_dz":
        return [(name, p.dz) for name, p in pairs]
    raise ValueError(f"{op} is not an operation of kernels.conv_pool")


def seed_problems(op: str) -> list[tuple[str, Any]]:
    """The seed problems of this module's operations (for kernels.suite): the zoo's pairs, the
    forward with keep_activation (training), as the training step would run them."""
    return _as(op, zoo_pairs(128, keep_activation=op == "conv_pool_fwd"))


def odd_problems(op: str) -> list[tuple[str, Any]]:
    """The odd problems of this module's operations (for kernels.suite)."""
    return _as(op, odd_pairs(keep_activation=op == "conv_pool_fwd"))
