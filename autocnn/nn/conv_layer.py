"""The convolution layer, Conv2d: forward, backward-data and weight-gradient kernels, each a
ConvProblem at the layer's precision; or, with ``separable=``, the separable operations on
low-rank factors of its filters (autocnn.separable)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from autocnn.errors import InvalidProblemError
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem
from autocnn.precision import DEFAULT_PRECISION
from autocnn.nn.backend import Array, Backend, KernelProblem
from autocnn.nn.layer_base import (OwnPrecision, Shape, WeightedLayer, check_activation, check_groups, check_int,
                                   check_pair, check_padding, check_precision, init_weights)
from autocnn.separable.execution import make_execution, separable_problems
from autocnn.separable.rank import RankChoice, energy_rank
from autocnn.separable.setting import OFF, SeparableSetting, ineligibility, parse_separable
from autocnn.separable.svd import SvdReport, SvdSettings


class Conv2d(OwnPrecision, WeightedLayer):
    """2-D convolution with fused bias and activation: y = act(conv(x, W) + b).

    ``padding``: an int, (height, width) or (top, left, bottom, right) (asymmetric padding, as
    an even filter needs to keep the size: 8x8 with (4, 4, 3, 3)).

    ``groups``: split the channels into that many groups, as torch.nn.Conv2d does: filter k reads
    only the in_channels/groups channels of group k // (out_channels/groups), so the weights are
    (out_channels, in_channels/groups, R, S); both channel counts must be multiples of it.
    groups == in_channels is a depthwise convolution (out_channels = m * in_channels: m filters a
    channel). ``dilation``: an int or (height, width), the spacing of the filter's taps (a 3x3
    filter dilated by 2 spans 5x5; padding must be smaller than that span). Both are fields of the
    layer's three kernel problems, so tuning, lookups and dispatch see them (the depthwise, igemm
    and tc formulations serve them); a grouped or dilated layer is never separable and runs no
    fused kernel (conv_bwd_fused, conv_pool: dense problems only).

    ``precision``: what this layer's three convolutions (forward, backward-data, weight gradient)
    must be as accurate as on a GPU. None (the default) takes the model's (``Sequential(...,
    precision=)``, itself "fp32" unless told otherwise); "fp32", "tf32", "bf16" or "fp16"
    overrides it for this layer only. "fp32" is FP32-accurate whatever kernel runs; "tf32" lets
    tensor cores round the operands to TF32 (faster, with a looser bound). "bf16" and "fp16" are
    mixed precision (autocnn.nn.mixed_precision): the layer's input, output and their gradients
    are 16-bit tensors, its kernels read 16-bit copies of the FP32 master weights and sum in FP32,
    and its weight gradients reach the FP32 gradients before the optimizer. The layer's kernel
    problems carry the effective precision (``precision``), so tuning, lookups and dispatch use
    the records of it. The numpy backend computes fp32 and tf32 in the model's dtype (float32 or
    float64) either way, and emulates bf16 and fp16: every tensor such a layer writes is rounded
    to the 16-bit type, as the GPU stores it. A 16-bit layer is not separable (the factors are
    float32) and runs no fused kernel.

    ``separable``: replace each filter W[k, c] by a rank-r approximation W_eff = sum_j u_j v_j^T
    (autocnn.separable.setting lists the values: None takes the model's, ``Sequential(...,
    separable=)``, off unless told; False keeps this layer 2D; True or 1 is rank 1, the seed's
    setting; an integer is that rank; "energy" or a share in (0, 1] is the smallest rank keeping
    that share (default 0.9) of the layer's filter energy, chosen once from the weights of the
    first build). Needs stride 1 and a filter of at least 2x2. Each forward pass first factors the
    current filters with the batched power-method SVD (``svd``: its SvdSettings, tolerance 1e-6 and
    a cap of 100 iterations by default), warm-started from the previous pass's vectors, then runs
    the separable forward (sep_conv_fwd); backward-data runs sep_conv_bwd_data on the same factors.
    The update: the separable weight gradient gives gu = G v_j and gv = u_j^T G (G the 2D gradient
    with respect to W_eff), and the layer's weight gradient is G projected onto the tangent space
    of rank-r matrices at W_eff (autocnn.separable.projection), built from gu, gv, u and v alone.
    The optimizer updates the full 2D filters W with it, and the next forward pass factors them
    again, as in the seed. Why the projection: it is the part of G that a rank-r filter can follow
    to first order, it is the exact gradient with respect to W wherever W has rank r, and it keeps
    the 2D filters from drifting in directions the approximation discards. ``svd_report()`` tells
    the last factorisation's iterations and capped filters.
    """

    trainable = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, bias: bool = True,
                 activation: str = "none", name: str | None = None, precision: str | None = None,
                 separable: Any = None, svd: SvdSettings | None = None, groups: int = 1,
                 dilation: int | Sequence[int] = 1) -> None:
        super().__init__(name)
        owner = "Conv2d" if name is None else f"Conv2d {name!r}"
        self.precision_override = check_precision(owner, precision, inherit=True)
        self.separable_override = parse_separable(owner, separable, inherit=True)
        self._model_separable: SeparableSetting = OFF
        if svd is not None and not isinstance(svd, SvdSettings):
            raise TypeError(f"{owner}: svd must be an autocnn.separable.SvdSettings, got {svd!r}")
        self.svd_settings = svd or SvdSettings()
        self.rank_choice: RankChoice | None = None   # the energy rule's choice, once made
        self._rank: int | None = None
        self._initial: dict[str, np.ndarray] | None = None
        self._separable: Any = None
        self._fused_backward: Any = None   # a ConvBwdFusedProblem where the backend said it is faster
        self._pool_forward: Any = None     # (ConvPoolFwdProblem, the AvgPool2d after it), nn.layer_fusion
        self._dz_from_pool = False         # the AvgPool2d after it hands back dL/dz (conv_pool_dz)
        self._model_precision = DEFAULT_PRECISION
        self.in_channels = check_int(owner, "in_channels", in_channels, 1)
        self.out_channels = check_int(owner, "out_channels", out_channels, 1)
        self.kernel_size = check_pair(owner, "kernel_size", kernel_size)
        self.stride = check_pair(owner, "stride", stride)
        self.padding = check_padding(owner, padding)
        self.groups = check_groups(owner, groups, self.in_channels, self.out_channels)
        self.dilation = check_pair(owner, "dilation", dilation)
        if not isinstance(bias, bool):
            raise ValueError(f"{owner}: bias must be True or False, got {bias!r}")
        self.use_bias = bias
        self.activation = check_activation(owner, activation)
        pt, pl, pb, pr = self.padding
        # The kernels assume every window touches the image; padding of a whole filter size would not.
        span_h, span_w = self.filter_extent
        if max(pt, pb) >= span_h or max(pl, pr) >= span_w:
            spans = "" if self.dilation == (1, 1) else f" (dilated by {self.dilation}: it spans {span_h}x{span_w})"
            raise ValueError(f"{owner}: padding {self.padding} must be smaller than the kernel "
                             f"{self.kernel_size}{spans} on every side")
        if self.separable_override is not None and self.separable_override.enabled:
            reason = self.separable_ineligibility(self.separable_override)
            if reason:
                raise ValueError(f"{owner}: separable={separable!r} needs a dense, undilated layer (groups=1, "
                                 f"dilation=1) of stride 1 and a filter of at least 2x2 (and a rank of at most "
                                 f"min(R, S)); this layer has {reason}")
        self._x: Array | None = None

    def config_text(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        if self.stride != (1, 1):
            text += f", stride={self.stride}"
        if any(self.padding):
            text += f", padding={self.padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        text += self._epilogue_text()
        if self.separable_override is not None:
            text += f", separable={self.separable_override.value()!r}"
        return text + self.precision_text()

    # -- separable filters ------------------------------------------------------------------------
    @property
    def separable(self) -> SeparableSetting:
        """The separable setting in force: the layer's own, else the model's where this layer is
        eligible (``separable_ineligibility``), else off."""
        if self.separable_override is not None:
            return self.separable_override
        if self.separable_ineligibility(self._model_separable) is None:
            return self._model_separable
        return OFF

    def separable_ineligibility(self, setting: SeparableSetting) -> str | None:
        """Why ``setting`` cannot apply to this layer (None when it can, or when it is off)."""
        if not setting.enabled:
            return None
        if self.grouped_or_dilated:
            # The separable operations factor dense, undilated filters only.
            what = [f"groups={self.groups}"] * (self.groups != 1) + [f"dilation={self.dilation}"] * (
                self.dilation != (1, 1))
            return f"{', '.join(what)} (separable kernels run dense, undilated filters)"
        return ineligibility(setting, self.kernel_size, self.stride)

    @property
    def grouped_or_dilated(self) -> bool:
        """Whether the layer has channel groups or dilated taps (no separable or fused form then)."""
        return self.groups != 1 or self.dilation != (1, 1)

    @property
    def filter_extent(self) -> tuple[int, int]:
        """The rows and columns of input one (dilated) filter window spans."""
        (R, S), (dh, dw) = self.kernel_size, self.dilation
        return ((R - 1) * dh + 1, (S - 1) * dw + 1)

    def use_model_separable(self, setting: SeparableSetting) -> None:
        """Told the model's separable setting (by Sequential, before the next build)."""
        if setting != self._model_separable and self.separable_override is None:
            self._rank, self.rank_choice = None, None
        self._model_separable = setting

    @property
    def separable_rank(self) -> int | None:
        """The rank the separable layer runs at (None when it is 2D, or energy-chosen and not built)."""
        setting = self.separable
        if not setting.enabled:
            return None
        return setting.rank if setting.rank is not None else self._rank

    def _choose_rank(self, weights: np.ndarray) -> None:
        self.rank_choice = energy_rank(weights, self.separable.energy_share)
        self._rank = self.rank_choice.rank

    def build(self, input_shape: Sequence[int], batch_size: int, backend: Backend,
              rng: np.random.Generator) -> Shape:
        setting = self.separable
        if setting.energy_share is not None and self._rank is None:
            # The energy rule needs weights before the problems are made: the first build's
            # initial weights (kept for init_params), or the weights the layer already has.
            if self._params:
                self._choose_rank(backend.to_numpy(self._params["weight"]))
            else:
                self._initial = self._init_host(rng)
                self._choose_rank(self._initial["weight"])
        return super().build(input_shape, batch_size, backend, rng)

    def svd_report(self) -> SvdReport | None:
        """The last factorisation's iterations and capped filters (None before the first forward
        pass, or for a 2D layer). On a GPU this waits for the device."""
        return None if self._separable is None else self._separable.report()

    def factors(self) -> tuple[Array, Array] | None:
        """The last factorisation's (u [K,C,r,R], v [K,C,r,S]) buffers, live; None for a 2D layer."""
        return None if self._separable is None else (self._separable.u, self._separable.v)

    def factor_gradients(self) -> tuple[Array, Array] | None:
        """The last backward pass's (gu, gv), the loss's gradients with respect to u and v."""
        return None if self._separable is None else (self._separable.gu, self._separable.gv)

    @property
    def fusions(self) -> tuple[str, ...]:
        """The fused kernels this layer runs, chosen at build where tuned faster: "conv_bwd_fused",
        "conv_pool_fwd" (with the averaging after it), "conv_pool_dz" (its activation gradient
        formed by the averaging's backward)."""
        return tuple(name for name, on in (("conv_bwd_fused", self._fused_backward is not None),
                                           ("conv_pool_fwd", self._pool_forward is not None),
                                           ("conv_pool_dz", self._dz_from_pool)) if on)

    @property
    def fused_backward(self) -> bool:
        """Whether the backward runs as one conv_bwd_fused kernel (chosen at build where the backend's
        tuning records show it faster than conv_bwd_data + conv_wgrad)."""
        return self._fused_backward is not None

    @property
    def separable_update_route(self) -> str | None:
        """How the separable layer's weight gradient runs ("factored": sep_conv_wgrad; "dense": the 2D
        conv_wgrad, then factor gradients from it), measured at build on the GPU; None when 2D."""
        return None if self._separable is None else self._separable.route

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3 or input_shape[0] != self.in_channels:
            raise self._shape_error(f"({self.in_channels}, H, W)", input_shape)
        try:
            p = self._fwd_problem(input_shape, 1)
        except InvalidProblemError as exc:
            raise self._problem_error(exc, input_shape) from exc
        return (self.out_channels, p.P, p.Q)

    def param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {"weight": (self.out_channels, self.in_channels // self.groups,
                                               *self.kernel_size)}
        if self.use_bias:
            shapes["bias"] = (self.out_channels,)
        return shapes

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self._initial is not None:   # drawn by build for the energy rule
            params, self._initial = self._initial, None
            return params
        return self._init_host(rng)

    def _init_host(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        R, S = self.kernel_size
        shapes = self.param_shapes()
        # A filter reads its group's channels, and an input channel feeds its group's filters.
        params = {"weight": init_weights(rng, shapes["weight"], self.in_channels // self.groups * R * S,
                                         self.out_channels // self.groups * R * S, self.activation)}
        if self.use_bias:
            params["bias"] = np.zeros(shapes["bias"])
        return params

    def _fwd_problem(self, input_shape: Shape, batch_size: int) -> ConvFwdProblem:
        C, H, W = input_shape
        R, S = self.kernel_size
        return ConvFwdProblem(N=batch_size, C=C, H=H, W=W, K=self.out_channels, R=R, S=S,
                              stride=self.stride, padding=self.padding, bias=self.use_bias,
                              activation=self.activation, precision=self.precision, groups=self.groups,
                              dilation=self.dilation)

    def make_problems(self, input_shape: Shape, batch_size: int) -> list[KernelProblem]:
        fwd = self._fwd_problem(input_shape, batch_size)
        if self.separable.enabled and fwd.precision.sixteen_bit:
            raise ValueError(f"{self.describe()}: a separable layer runs float32 factors; precision "
                             f"{fwd.precision.name} needs a 2D layer (separable=False), or give the layer "
                             f"precision='fp32' or 'tf32'")
        if self.separable.enabled:
            rank = self.separable_rank
            if rank is None:
                raise RuntimeError(f"{self.describe()}: the energy-chosen rank is chosen from the weights when "
                                   f"the layer is first built; build the model before asking for its problems")
            return separable_problems(fwd, rank, self.needs_input_grad)
        problems: list[KernelProblem] = [fwd]
        if self.needs_input_grad:
            problems.append(fwd.with_op("conv_bwd_data"))
        problems.append(fwd.with_op("conv_wgrad", bias=self.use_bias))
        return problems

    def alternative_problems(self, input_shape: Shape, batch_size: int) -> list[KernelProblem]:
        """The one-pass backward (conv_bwd_fused: dX, dW and db from one read of dY, Scherer et al.)
        of a 2D layer that needs its input gradient: tuned beside the layer's own problems, and run
        instead of conv_bwd_data + conv_wgrad where the backend finds it tuned faster."""
        if (self.separable.enabled or not self.needs_input_grad or self.precision.sixteen_bit
                or self.grouped_or_dilated):
            return []   # conv_bwd_fused is dense, undilated and float32
        from autocnn.kernels.conv_bwd_fused import ConvBwdFusedProblem

        return [ConvBwdFusedProblem(**self._fwd_problem(input_shape, batch_size).geometry(), bias=self.use_bias)]

    def replaced_by(self, alternative: KernelProblem) -> list[KernelProblem]:
        """The built layer's conv_bwd_data and conv_wgrad, which its one-pass backward replaces."""
        self._require_built()
        return [p for p in self._problems if p.op in ("conv_bwd_data", "conv_wgrad")]

    def use_alternative(self, alternative: KernelProblem) -> None:
        """Run the backward as one conv_bwd_fused (``alternative``); the split pair is not prepared
        then, its kernels would never run."""
        split = self.replaced_by(alternative)
        self._fused_backward = alternative
        self._problems = [p for p in self._problems if p not in split] + [alternative]

    @property
    def forward_problem(self) -> ConvFwdProblem:
        return self._by_type(ConvFwdProblem)

    @property
    def backward_data_problem(self) -> ConvBwdDataProblem | None:
        return self._by_type(ConvBwdDataProblem, required=False)

    @property
    def wgrad_problem(self) -> ConvWgradProblem:
        return self._by_type(ConvWgradProblem)

    def _by_type(self, cls: type, required: bool = True) -> Any:
        self._require_built()
        for p in self._problems:
            if type(p) is cls:
                return p
        if required:
            raise RuntimeError(f"{self.describe()} has no {cls.__name__}")
        return None

    def _allocate(self, backend: Backend, batch_size: int) -> None:
        assert self.output_shape is not None and self.input_shape is not None
        self._y = self._zeros(backend, (batch_size, *self.output_shape))
        # dL/dz (before the activation) needs its own buffer unless the activation is the identity.
        self._dz = self._zeros(backend, self._y.shape) if self.activation != "none" else None
        self._dx = self._zeros(backend, (batch_size, *self.input_shape)) if self.needs_input_grad else None
        self._x = None
        rank = self.separable_rank
        old = self._separable
        self._separable = None
        self._fused_backward = None     # fusions: chosen by the model after every build (nn.layer_fusion)
        self._pool_forward = None
        self._dz_from_pool = False
        if rank is not None:
            fwd = self._fwd_problem(self.input_shape, batch_size)
            self._separable = make_execution(backend, fwd, self._problems, rank, self.svd_settings)
            if old is not None and old.rank == rank:
                backend.copy_into(self._separable.v, old.v)   # keep the warm start across rebuilds

    def forward(self, x: Array) -> Array:
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        self._x = x  # kept (not copied) for the weight gradient: the buffer lives until the next step
        if self._separable is not None:
            # The filters changed since the last pass (an update, a load): factor them again.
            self._separable.factorize(self._params["weight"])
            self._separable.forward(x, self._params.get("bias"), self._y)
            return self._y
        if self._pool_forward is not None:
            # The pooled output goes straight to the pooling layer's buffer; a (kept here) is what
            # the pooling layer then takes as its input and the backward reads.
            problem, pool = self._pool_forward
            backend.conv_pool_fwd(problem, x, self._kernel_param("weight"), self._kernel_param("bias"),
                                  pool.output_buffer, self._y)
            return self._y
        backend.conv_fwd(self.forward_problem, x, self._kernel_param("weight"), self._kernel_param("bias"), self._y)
        return self._y

    @property
    def output_buffer(self) -> Array:
        """The buffer forward() returns: a, the activation's output (the backward reads it)."""
        self._require_built()
        return self._y

    def fuse_pool_forward(self, problem: Any, pool: Any) -> None:
        """Run this layer's forward and the averaging after it as one conv_pool_fwd (``problem``,
        keep_activation) into ``pool``'s output (nn.layer_fusion, at build)."""
        self._require_built()
        pool.take_output_from(self)
        self._pool_forward = (problem, pool)
        self._problems = [problem if p.op == "conv_fwd" else p for p in self._problems]

    def take_dz_from_pool(self) -> None:
        """The AvgPool2d after this layer hands back dL/dz (through this layer's activation already)."""
        self._require_built()
        self._dz_from_pool = True

    def backward(self, dy: Array) -> Array | None:
        backend = self._require_built()
        if self._dz_from_pool:
            if self._x is None:
                raise RuntimeError(f"{self.describe()}: backward called before forward")
            self._check_batch("gradient (through the activation)", dy, self.output_shape)  # type: ignore[arg-type]
            dz = dy
        else:
            dz = self._through_activation(dy)
        # The weight gradient may run beside the input gradient and the layers below (on a GPU).
        if self._separable is not None:
            with backend.parameter_gradients():
                self._separable.weight_gradient(self._x, dz, self._grads["weight"], self._grads.get("bias"))
            if not self.needs_input_grad:
                return None
            self._separable.backward_data(dz, self._dx)
            return self._dx
        if self._fused_backward is not None:
            # One kernel writes dX (on the critical path) and dW: it runs on the main stream.
            backend.conv_bwd_fused(self._fused_backward, self._x, dz, self._kernel_param("weight"), self._dx,
                                   self._kernel_grad("weight"), self._kernel_grad("bias"))
            return self._dx
        with backend.parameter_gradients():
            backend.conv_wgrad(self.wgrad_problem, self._x, dz, self._kernel_grad("weight"), self._kernel_grad("bias"))
        if not self.needs_input_grad:
            return None
        backend.conv_bwd_data(self.backward_data_problem, dz, self._kernel_param("weight"), self._dx)
        return self._dx
