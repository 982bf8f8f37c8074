"""Sequential: a stack of layers trained with softmax cross-entropy.

The model is built for one batch size (``build``): every layer allocates its buffers and kernel
problems for it, and the backend is told all the problems up front (``Backend.prepare``), so a
GPU backend can pick and compile its kernels before the first step. Every step then runs at
exactly that batch size: a short last batch is padded with zero images whose weight is 0, so
they count for nothing in the loss, the gradients and the metrics.

Asking for another batch size (``build(n)``, ``fit(batch_size=n)``, ``evaluate(..., n)``)
rebuilds the buffers and problems; parameters, their gradients and the optimizer state stay.
The first build moves every parameter into one flat buffer and every gradient into another (a
ParameterArena), so an optimizer updates the whole model in one pass.

The model's jobs live in one module each, mixed into Sequential here: training_step (the
step, captured as a CUDA graph where the backend can, and StepResult), staging (the input
buffers), fitting (fit, evaluate, predict, History), model_kernels (problems, tune,
dispatch_report) and parameter_files (save, load).
"""
from __future__ import annotations

import collections
import warnings
from typing import Any, Sequence

import numpy as np

from autocnn.dispatch.kernels import KernelDispatch
from autocnn.nn.arena import ParameterArena
from autocnn.nn.backend import Array, Backend, CapturedStep
from autocnn.nn.backend_choice import get_backend
from autocnn.nn.fitting import FitLoop
from autocnn.precision import DEFAULT_PRECISION
from autocnn.nn.layer_base import check_precision
from autocnn.nn.layer_fusion import choose_fusions
from autocnn.nn.layers import Layer
from autocnn.nn.losses import Accuracy, SoftmaxCrossEntropy
from autocnn.nn.mixed_precision import (Boundary, LossScaler, LossScaling, SixteenBitCopies, layer_elements,
                                        make_boundaries, needs_loss_scaling, sixteen_bit_element)
from autocnn.nn.model_kernels import ModelKernels
from autocnn.nn.optim import Optimizer
from autocnn.nn.parameter_files import ParameterFiles
from autocnn.nn.staging import BatchStaging
from autocnn.nn.text_table import format_table
from autocnn.nn.training_step import TrainingStep, metric_views
from autocnn.nn.validation import check_batch_size
from autocnn.separable.setting import SeparableSetting, parse_separable
from autocnn.dispatch.quick import check_autotune


class Sequential(TrainingStep, FitLoop, BatchStaging, ModelKernels, ParameterFiles):
    """Layers applied in order; the last one must output one score per class (logits).

    ``backend``: "numpy", "cuda" or a Backend instance. ``dtype``: float32 by default (float64 on
    the numpy backend for gradient checks). ``seed`` makes the initial weights and the shuffling
    reproducible.

    ``precision``: what the model's convolutions must be as accurate as on a GPU, "fp32" (the
    default: FP32-accurate, whatever kernel runs) or "tf32" (tensor cores may round operands to
    TF32: faster, with a looser error bound), or mixed precision, "bf16" or "fp16"
    (autocnn.nn.mixed_precision): convolutions and pooling on 16-bit tensors, summing in FP32,
    while parameters, gradients and the optimizer's state stay FP32 (each step casts the weights
    into 16-bit copies for the kernels and brings the weight gradients back), and the loss in FP32;
    fp16 with dynamic loss scaling (``loss_scaler``; ``loss_scaling`` sets it), bf16 without. It
    is the model's setting for every Conv2d and AvgPool2d that does not set its own
    (``Conv2d(..., precision="fp32")`` keeps a layer in fp32 in a tf32 or bf16 model), and may be
    changed later (``model.precision = "tf32"``; a built model is built again, keeping its
    weights). Building, fitting, tuning (``tune``), ``problems`` and the dispatch report all use
    it: each convolution's kernel problems carry their layer's precision, so tuning and lookups
    use the records of that precision. Dense layers take it too (``Dense(..., precision=)``): FP32
    SGEMM at fp32 and tf32, cuBLAS GemmEx on 16-bit operands at bf16 and fp16; the loss is FP32
    whatever the last layer's. The numpy backend computes fp32 and tf32 in ``dtype``
    (float32 or float64), and emulates bf16 and fp16: every tensor a 16-bit layer writes is
    rounded to its 16-bit type, so a CPU run follows the same steps and roundings as the GPU's.

    ``autotune``: what building on the cuda backend does for a kernel problem that no tuning record
    covers (as ``torch.backends.cudnn.benchmark`` does for new shapes): "quick" (the default)
    measures a handful of candidate configs in about 2 s per problem and keeps the fastest verified
    one in the tuning database as a record marked quick, which a later full tuning (``tune``,
    ``autocnn tune``) replaces; "full" runs the tuner with a small trial budget; "off" runs the
    looked-up config (nearest tuned shape or heuristic default) untuned. None keeps the backend's
    setting: $AUTOCNN_AUTOTUNE, else "quick". It may be changed later (``model.autotune = "off"``)
    and applies to the problems prepared after. The numpy backend runs no generated kernels: there
    it is checked and kept, and changes nothing.

    ``separable``: separable filters for every eligible Conv2d (stride 1, a filter of at least
    2x2, and at a fixed rank at most min(R, S)) that does not set its own ``separable=``: False or
    None (the default) off, True or 1 rank 1 (the seed's setting), an integer that rank, "energy"
    or a share in (0, 1] the energy-chosen rank (see Conv2d). Ineligible layers stay 2D and are
    named in one warning. It may be changed later (``model.separable = "energy"``; a built model
    is built again, keeping its weights).

    ``fuse``: whether building may run a fused kernel in place of the kernels it replaces (a
    convolution's one-pass backward, conv_bwd_fused; a convolution fused with the averaging after
    it, conv_pool_fwd and conv_pool_dz; nn.layer_fusion) where the backend's tuning records show it
    faster. True by default; False keeps every layer on its own kernels (to compare, or to rule a
    fused kernel out). Changing it rebuilds a built model, keeping its weights.
    """

    def __init__(self, layers: Sequence[Layer], input_shape: Sequence[int], backend: str | Backend = "numpy",
                 seed: int | None = None, dtype: Any = None, precision: str = DEFAULT_PRECISION,
                 autotune: str | None = None, separable: Any = None, fuse: bool = True,
                 loss_scaling: LossScaling | None = None) -> None:
        if not isinstance(fuse, bool):
            raise TypeError(f"Sequential: fuse must be True or False, got {fuse!r}")
        layers = list(layers)
        if not layers:
            raise ValueError("Sequential needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"layer {i} is {layer!r}, not an autocnn.nn Layer")
            if layer._model is not None or layers.index(layer) != i:
                raise ValueError(f"layer {i} ({layer!r}) already belongs to a model: create a new layer "
                                 f"(layers own their buffers)")
        try:
            self.input_shape = tuple(int(s) for s in input_shape)
        except (TypeError, ValueError):
            raise ValueError(f"input_shape must be a tuple of positive integers, got {input_shape!r}") from None
        if not self.input_shape or any(s < 1 for s in self.input_shape):
            raise ValueError(f"input_shape must be a tuple of positive integers, got {input_shape!r}")
        self.layers = layers
        if loss_scaling is not None and not isinstance(loss_scaling, LossScaling):
            raise TypeError(f"Sequential: loss_scaling must be an autocnn.nn.mixed_precision.LossScaling, "
                            f"got {loss_scaling!r}")
        self.loss_scaling = loss_scaling or LossScaling()
        if autotune is not None:
            check_autotune(autotune)   # before a backend (and a GPU) is started
        self._name_layers()
        # The precisions too: the model's and the layers' (bf16 and fp16 layers do not mix).
        for layer in layers:
            layer.use_model_precision(check_precision("Sequential", precision))
        layer_elements(layers)
        self.backend: Backend = get_backend(backend, dtype=dtype)
        self._autotune: str | None = None
        if autotune is not None:
            self.autotune = autotune
        self.dtype = self.backend.dtype
        self.seed = seed
        init_seed, shuffle_seed = np.random.SeedSequence(seed).spawn(2)
        self._init_rng = np.random.default_rng(init_seed)
        self._shuffle_rng = np.random.default_rng(shuffle_seed)

        # A layer needs dL/dx only if some layer before it has parameters to train.
        trainable_before = False
        for layer in layers:
            layer.needs_input_grad = trainable_before
            trainable_before = trainable_before or layer.trainable
        self.layer_output_shapes = self._infer_shapes()
        self.output_shape = self.layer_output_shapes[-1]
        if len(self.output_shape) != 1:
            raise ValueError(f"the last layer must output one score per class, shape (classes,); "
                             f"{layers[-1].describe()} outputs {self.output_shape}: end the model with "
                             f"Flatten() and Dense(features, classes)")
        self.num_classes = self.output_shape[0]
        for layer in layers:
            layer._model = self
        self.loss = SoftmaxCrossEntropy()
        self.metric = Accuracy()
        self._weights_n: int | None = None  # the weight buffer holds n ones, then zeros (None: other)
        self.optimizer: Optimizer | None = None
        self.batch_size: int | None = None
        self._fuse = fuse
        self.precision = precision   # after batch_size: setting it rebuilds a built model
        self._use_separable(separable, stacklevel=4)   # the warning points at the caller of Sequential()
        self.dispatch: list[KernelDispatch] = []
        self._pending_params: dict[int, dict[str, np.ndarray]] = {}
        self._arena: ParameterArena | None = None
        # Whether training steps are captured and replayed as CUDA graphs where the backend can.
        self.use_graphs = True
        self._build_count = 0
        self._graph: CapturedStep | None = None
        self._graph_key: tuple[Any, ...] | None = None
        self._eager_key: tuple[Any, ...] | None = None  # the last key that ran an eager (warm-up) step
        self._ready_key: tuple[Any, ...] | None = None  # the last key _ready_optimizer checked
        # Mixed precision (set by build): the 16-bit copies of the parameters, the element-type
        # boundaries between layers, and fp16's loss scaler (kept across rebuilds).
        self._sixteen: SixteenBitCopies | None = None
        self._boundaries: dict[int, Boundary] = {}
        self._loss_scaler: LossScaler | None = None
        self._scaling = False

    # -- description ---------------------------------------------------------------------------
    def _name_layers(self) -> None:
        counts: collections.Counter[str] = collections.Counter()
        for layer in self.layers:
            kind = type(layer).__name__.lower()
            counts[kind] += 1
            if layer.name is None:
                layer.name = f"{kind}_{counts[kind]}"
        names = [layer.name for layer in self.layers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"layer names must be unique; repeated: {', '.join(map(str, duplicates))}")

    def _infer_shapes(self) -> list[tuple[int, ...]]:
        shapes = []
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.compute_output_shape(shape)
            shapes.append(shape)
        return shapes

    def __repr__(self) -> str:
        return (f"Sequential({len(self.layers)} layers, input {self.input_shape}, {self.num_classes} classes, "
                f"backend={self.backend.name}, dtype={self.dtype.name}, precision={self.precision.name!r})")

    @property
    def loss_scaler(self) -> LossScaler | None:
        """fp16's dynamic loss scaler, while the built model has fp16 layers; None otherwise."""
        return self._loss_scaler if self._scaling else None

    @property
    def precision(self) -> str:
        """The model's precision: "fp32", "tf32", "bf16" or "fp16" (see the class docstring)."""
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        precision = check_precision("Sequential", value)
        for layer in self.layers:
            layer.use_model_precision(precision)
        try:
            layer_elements(self.layers)   # bf16 and fp16 layers do not mix: refused here, not at the build
        except ValueError:
            for layer in self.layers:
                layer.use_model_precision(getattr(self, "_precision", precision))
            raise
        self._precision = precision
        if self.batch_size is not None:
            self._rebuild()   # the layers' problems change: the backend must choose their kernels again

    @property
    def fuse(self) -> bool:
        """Whether building may use fused kernels where they are tuned faster (see the class docstring)."""
        return self._fuse

    @fuse.setter
    def fuse(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"Sequential.fuse must be True or False, got {value!r}")
        changed, self._fuse = value != self._fuse, value
        if changed and self.batch_size is not None:
            self._rebuild()

    @property
    def separable(self) -> SeparableSetting:
        """The model's separable setting (see the class docstring); layers may override it."""
        return self._separable

    @separable.setter
    def separable(self, value: Any) -> None:
        self._use_separable(value, stacklevel=3)

    def _use_separable(self, value: Any, stacklevel: int) -> None:
        setting = parse_separable("Sequential", value)
        skipped = []
        for layer in self.layers:
            use = getattr(layer, "use_model_separable", None)
            if use is None:
                continue
            use(setting)
            reason = layer.separable_ineligibility(setting)
            if reason and layer.separable_override is None:
                skipped.append(f"{layer.name} ({reason})")
        if skipped:
            warnings.warn(f"separable={setting.value()!r} leaves {len(skipped)} convolution layer(s) 2D: "
                          f"{'; '.join(skipped)}", UserWarning, stacklevel=stacklevel)
        changed = getattr(self, "_separable", None) not in (None, setting)
        self._separable = setting
        if changed and self.batch_size is not None:
            self._rebuild()

    @property
    def autotune(self) -> str | None:
        """"off", "quick" or "full" (see the class docstring); None on a backend without tuning
        when none was asked for."""
        return getattr(self.backend, "autotune", self._autotune)

    @autotune.setter
    def autotune(self, value: str) -> None:
        self._autotune = check_autotune(value)
        if hasattr(self.backend, "autotune"):
            self.backend.autotune = self._autotune

    def summary(self) -> str:
        """A table of the layers: name, configuration, output shape and parameter count."""
        rows = [("layer", "configuration", "output", "params")]
        total = 0
        for layer, shape in zip(self.layers, self.layer_output_shapes):
            count = sum(int(np.prod(s)) for s in layer.param_shapes().values())
            total += count
            rows.append((str(layer.name), repr(layer), "x".join(map(str, shape)), f"{count:,}"))
        text = format_table(rows)
        return (f"{text}\ninput {'x'.join(map(str, self.input_shape))}, {total:,} parameters, "
                f"precision {self.precision}")

    @property
    def built(self) -> bool:
        return self.batch_size is not None

    # -- building ------------------------------------------------------------------------------
    def build(self, batch_size: int, verbose: bool = False) -> "Sequential":
        """Allocate every buffer for ``batch_size`` and let the backend prepare every kernel problem.

        ``verbose`` prints the dispatch report (which kernel runs each layer's operations).
        """
        batch_size = check_batch_size(batch_size)
        if self.batch_size == batch_size:
            if verbose:
                print(self.dispatch_report())
            return self
        self.batch_size = None  # until the rebuild has finished: a failed one leaves the model unbuilt
        elements = layer_elements(self.layers)   # before any buffer: bf16 and fp16 layers do not mix
        for layer, element in zip(self.layers, elements):
            layer.element = element
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.build(shape, batch_size, self.backend, self._init_rng)
        be = self.backend
        if self._arena is None:
            self._arena = ParameterArena.gather(self.layers, be)
        self._apply_pending_params()
        sixteen = sixteen_bit_element(elements)
        self._sixteen = (SixteenBitCopies(self._arena, self.layers, sixteen, be)
                         if sixteen is not None and self._arena is not None else None)
        if self._sixteen is None:
            for layer in self.layers:
                layer.use_kernel_tensors(None, None)
        self._boundaries = make_boundaries(self.layers, elements, self.input_shape, self.layer_output_shapes,
                                           batch_size, be)
        self._scaling = needs_loss_scaling(sixteen)
        if self._scaling and self._loss_scaler is None:
            self._loss_scaler = LossScaler(be, self.loss_scaling)
        self._x_buf = be.zeros((batch_size, *self.input_shape))
        self._labels_buf = be.zeros((batch_size,), dtype=np.int64)
        self._weights_buf = be.zeros((batch_size,))
        self._weights_n = None
        self._dlogits = be.zeros((batch_size, self.num_classes))
        # Where every training step leaves its loss and accuracy (a graphed step writes only here).
        # Both in one 16-byte buffer (loss as the first float32, accuracy as the second float64),
        # so that a StepResult takes its values with a single copy.
        self._step_metrics = be.zeros((2,), dtype=np.float64)
        self._step_loss, self._step_acc = metric_views(self._step_metrics, self.dtype)
        self._graph = None  # captured on the buffers just replaced
        self._build_count += 1
        # Fused kernels, where they are tuned faster (nn.layer_fusion): chosen now, so that only the
        # kernels that will run are prepared.
        if self._fuse:
            choose_fusions(self.layers, be, batch_size)
        problems = self._collect_problems(layer.problems() for layer in self.layers)
        dispatch = list(be.prepare(problems))
        if len(dispatch) != len(problems) or not all(isinstance(d, KernelDispatch) for d in dispatch):
            raise TypeError(f"{be!r}.prepare must return one KernelDispatch per problem "
                            f"({len(problems)}), got {len(dispatch)} items")
        self.dispatch = dispatch
        self.batch_size = batch_size
        if verbose:
            print(self.dispatch_report())
        return self

    def _rebuild(self) -> None:
        """Build again at the built batch size (problems and kernels chosen anew, weights kept)."""
        size, self.batch_size = self._require_built(), None
        self.build(size)

    def _require_built(self) -> int:
        if self.batch_size is None:
            raise RuntimeError("the model is not built: call build(batch_size) or fit(...) first")
        return self.batch_size

    # -- parameters ----------------------------------------------------------------------------
    def params(self) -> dict[str, Array]:
        """Every parameter by qualified name ("conv2d_1.weight"), as backend arrays (live, not copies)."""
        return {f"{layer.name}.{k}": v for layer in self.layers for k, v in layer.params().items()}

    def grads(self) -> dict[str, Array]:
        return {f"{layer.name}.{k}": v for layer in self.layers for k, v in layer.grads().items()}

    def get_weights(self) -> dict[str, np.ndarray]:
        """Host copies of every parameter."""
        self._require_built()
        return {k: self.backend.to_numpy(v).copy() for k, v in self.params().items()}
