"""The pooling layer, AvgPool2d (its kernels sum in FP32; its precision is its tensors' storage)."""
from __future__ import annotations

from typing import Any, Sequence

from autocnn.errors import InvalidProblemError
from autocnn.kernels.problem import AvgPoolFwdProblem
from autocnn.nn.backend import Array, Backend, KernelProblem
from autocnn.nn.layer_base import Layer, OwnPrecision, Shape, check_padding, check_pair, check_precision
from autocnn.precision import DEFAULT_PRECISION, Precision, without_products


class AvgPool2d(OwnPrecision, Layer):
    """Average pooling over ``window`` (stride defaults to the window: non-overlapping).

    ``count_pad``: True divides by the full window size everywhere (PyTorch's
    count_include_pad); False divides by the positions inside the image only.

    ``precision``: None (the default) takes the model's; a precision overrides it for this layer.
    Pooling forms no products, so fp32 and tf32 are the same here (float32 tensors); at bf16 and
    fp16 the layer's tensors are 16-bit (its kernels sum in FP32 and round each output once), as
    the convolutions around it in a mixed-precision model (autocnn.nn.mixed_precision).
    """

    def __init__(self, window: int | Sequence[int], stride: int | Sequence[int] | None = None,
                 padding: int | Sequence[int] = 0, count_pad: bool = True, name: str | None = None,
                 precision: str | None = None) -> None:
        super().__init__(name)
        owner = "AvgPool2d"
        self.precision_override = check_precision(owner, precision, inherit=True)
        self._model_precision: Precision = DEFAULT_PRECISION
        self.window = check_pair(owner, "window", window)
        self.stride = self.window if stride is None else check_pair(owner, "stride", stride)
        self.padding = check_padding(owner, padding)
        if not isinstance(count_pad, bool):
            raise ValueError(f"{owner}: count_pad must be True or False, got {count_pad!r}")
        self.count_pad = count_pad
        self._fwd: AvgPoolFwdProblem | None = None
        self._bwd: Any = None              # avgpool_bwd, when the layer needs its input gradient
        self._output_from: Any = None      # the Conv2d whose fused forward writes this layer's output
        self._dz_fusion: Any = None        # (ConvPoolDzProblem, the Conv2d before it), nn.layer_fusion
        kh, kw = self.window
        pt, pl, pb, pr = self.padding
        if max(pt, pb) >= kh or max(pl, pr) >= kw:
            raise ValueError(f"{owner}: padding {self.padding} must be smaller than the window "
                             f"{self.window} on every side")

    def config_text(self) -> str:
        text = f"window={self.window}"
        if self.stride != self.window:
            text += f", stride={self.stride}"
        if any(self.padding):
            text += f", padding={self.padding}"
        if not self.count_pad:
            text += ", count_pad=False"
        return text + self.precision_text()

    def _fwd_problem(self, input_shape: Shape, batch_size: int) -> AvgPoolFwdProblem:
        C, H, W = input_shape
        return AvgPoolFwdProblem(N=batch_size, C=C, H=H, W=W, window=self.window, stride=self.stride,
                                 padding=self.padding, count_pad=self.count_pad,
                                 precision=without_products(self.precision))

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise self._shape_error("(C, H, W)", input_shape)
        try:
            p = self._fwd_problem(input_shape, 1)
        except InvalidProblemError as exc:
            raise self._problem_error(exc, input_shape) from exc
        return (input_shape[0], p.P, p.Q)

    def make_problems(self, input_shape: Shape, batch_size: int) -> list[KernelProblem]:
        fwd = self._fwd_problem(input_shape, batch_size)
        # Without a trainable layer before it, nothing needs the pooled input's gradient.
        return [fwd, fwd.with_op("avgpool_bwd")] if self.needs_input_grad else [fwd]

    def _allocate(self, backend: Backend, batch_size: int) -> None:
        self._y = self._zeros(backend, (batch_size, *self.output_shape))  # type: ignore[misc]
        self._dx = self._zeros(backend, (batch_size, *self.input_shape)) if self.needs_input_grad else None  # type: ignore[misc]
        # make_problems' list, kept by name: a fusion (nn.layer_fusion) replaces entries of _problems.
        self._fwd, self._bwd = (*self._problems, None)[:2]
        self._output_from = None
        self._dz_fusion = None

    @property
    def forward_problem(self) -> AvgPoolFwdProblem:
        self._require_built()
        return self._fwd

    @property
    def backward_problem(self) -> Any:
        """The avgpool_bwd problem (None when nothing needs this layer's input gradient)."""
        self._require_built()
        return self._bwd

    @property
    def output_buffer(self) -> Array:
        """The buffer forward() returns (a fused convolution before this layer writes it)."""
        self._require_built()
        return self._y

    def take_output_from(self, conv: Any) -> None:
        """The convolution before this layer computes its output too (conv_pool_fwd, at build)."""
        self._require_built()
        self._output_from = conv
        self._problems = [p for p in self._problems if p.op != "avgpool_fwd"]

    def fuse_activation_gradient(self, problem: Any, conv: Any) -> None:
        """Run this layer's backward and the activation gradient of ``conv`` before it as one
        conv_pool_dz (``problem``), handing ``conv`` dL/dz (at build)."""
        self._require_built()
        conv.take_dz_from_pool()
        self._dz_fusion = (problem, conv)
        self._problems = [problem if p.op == "avgpool_bwd" else p for p in self._problems]

    def forward(self, x: Array) -> Array:
        backend = self._require_built()
        self._check_batch("input", x, self.input_shape)  # type: ignore[arg-type]
        if self._output_from is not None:
            # Already written by the convolution's fused forward, from the activation x it kept.
            if x is not self._output_from.output_buffer:
                raise RuntimeError(f"{self.describe()}: its output is computed by {self._output_from.describe()}'s "
                                   f"fused forward, so its input must be that layer's output")
            return self._y
        backend.avgpool_fwd(self._fwd, x, self._y)
        return self._y

    def backward(self, dy: Array) -> Array | None:
        backend = self._require_built()
        self._check_batch("output gradient", dy, self.output_shape)  # type: ignore[arg-type]
        if not self.needs_input_grad:
            return None
        if self._dz_fusion is not None:
            problem, conv = self._dz_fusion
            backend.conv_pool_dz(problem, dy, conv.output_buffer, self._dx)
            return self._dx
        backend.avgpool_bwd(self._bwd, dy, self._dx)
        return self._dx
