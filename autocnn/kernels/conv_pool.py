"""Convolution fused with averaging (Mamalet et al.'s fusion, cited by seed 002).

conv_pool_fwd: y = avgpool(act(conv(x, w) + b)) in one kernel, without the full-size
intermediate; with ``keep_activation`` (training) it also writes a = act(conv(x, w) + b), which
the backward needs. Its formulations: "igemm_pool" (the implicit-GEMM core with a pooling
epilogue; any window) and "direct_pool" (the direct core; windows that do not overlap, strides
that divide its tiles).

The backward is split, not fused into the convolutions: conv_pool_dz forms
dZ = act'(a) * supersample(dy_pooled) in one memory-bound pass (supersampling and the activation
gradient fused), and the existing conv_bwd_data and conv_wgrad (every formulation, tuned records
and all) take dZ as their dY. Why: dZ feeds two convolutions, so forming it inside each of them
would read ``a`` and gather the pooled gradient twice, and again for every reuse of an element in
their operand loads; only the implicit GEMM's operand gathers could form it at all (the direct,
Winograd, tensor-core, gather and rows kernels read a plain tensor), so a fused pair would give up
the backward convolutions' other formulations and their records. Against the unfused pair
(avgpool_bwd, then the activation gradient) it saves a launch and two of four full-size passes.

Importing this module registers the problem types and operations (kernels/__init__.py does).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from autocnn.errors import InvalidProblemError
from autocnn.kernels import reference
from autocnn.kernels.conv_fwd import ConvFwd
from autocnn.kernels.formulations.act_gather import ACT_GATHER
from autocnn.kernels.formulations.direct_pool import DIRECT_POOL
from autocnn.kernels.formulations.igemm_pool import IGEMM_POOL, MAX_BLOCK_CELLS
from autocnn.kernels.formulations.pool_blocks import rectangle
from autocnn.kernels.operation import Operation
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


class ConvPoolFwd(ConvFwd):
    """conv_pool_fwd: conv_fwd's op template (constants, activation) with a pooling epilogue."""

    name = "conv_pool_fwd"
    family = "conv_pool_fwd"
    problem_type = ConvPoolFwdProblem
    inputs = ("x", "w", "bias")
    outputs = ("y", "a")
    # The op template includes conv_fwd's; the formulations include the pooling epilogue.
    shared_templates = ("_common.cuh.j2", "conv_fwd.cu.j2", "_conv_pool.cuh.j2", "_pool_window.cuh.j2")

    def default_candidates(self, problem: ConvPoolFwdProblem) -> Sequence[dict[str, Any]]:
        # As conv_fwd: the direct core for few input channels, the GEMM core otherwise; the GEMM's
        # last candidate fits every problem (the direct core does not serve overlapping windows).
        direct = self.candidates(problem, "direct_pool")
        gemm = self.candidates(problem, "igemm_pool")
        return direct + gemm if problem.C <= 4 else gemm[:-1] + direct + gemm[-1:]

    def plan(self, problem: ConvPoolFwdProblem, config):
        plan = super().plan(problem, config)
        return dataclasses.replace(plan, outputs=tuple(problem.output_shapes()))

    def flops(self, p: ConvPoolFwdProblem) -> int:
        return 2 * p.macs + p.N * p.K * p.PP * p.QQ * p.pool_window[0] * p.pool_window[1]

    def min_bytes(self, p: ConvPoolFwdProblem) -> int:
        n = p.N * p.C * p.H * p.W + p.K * p.C * p.R * p.S + p.N * p.K * p.PP * p.QQ + (p.K if p.bias else 0)
        return 4 * (n + (p.N * p.K * p.P * p.Q if p.keep_activation else 0))


class ConvPoolDz(Operation):
    """conv_pool_dz: supersampling and the activation gradient in one gather per position."""

    name = "conv_pool_dz"
    family = "conv_pool_dz"
    problem_type = ConvPoolDzProblem
    inputs = ("dy", "a")
    outputs = ("dz",)
    shared_templates = ("_common.cuh.j2", "avgpool_bwd.cu.j2", "_pool_window.cuh.j2")

    def _problem_context(self, problem: ConvPoolDzProblem) -> dict[str, Any]:
        return {"act_code": ACTIVATIONS.index(problem.activation)}

    def _codegen_helpers(self) -> tuple:
        return (ACTIVATIONS,)

    def flops(self, p: ConvPoolDzProblem) -> int:
        return p.N * p.C * p.P * p.Q * p.window[0] * p.window[1] + 3 * p.N * p.C * p.H * p.W

    def min_bytes(self, p: ConvPoolDzProblem) -> int:
        full = p.N * p.C * p.H * p.W
        return 4 * (p.N * p.C * p.P * p.Q + full * (3 if p.activation != "none" else 2) - full)


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


def _register() -> None:
    from autocnn.kernels import register_operation

    register_operation(ConvPoolFwd((IGEMM_POOL, DIRECT_POOL)))
    register_operation(ConvPoolDz((ACT_GATHER,)))


_register()
