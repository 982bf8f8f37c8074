"""Mixed precision in the training library, as automatic mixed precision (AMP) does it.

A model whose convolutions, pooling and Dense layers run at bf16 or fp16 keeps its parameters,
their gradients and the optimizer's state in FP32 (the master copies, in the ParameterArena) and
gives its 16-bit kernels (and cuBLAS GemmEx) 16-bit tensors:

* ``SixteenBitCopies``: a 16-bit mirror of the arena's parameters and one of its gradients. Each
  step casts the master weights into the mirror once (one pass over the arena; on a GPU one
  kernel), the 16-bit layers' kernels read their weights from there and write their weight
  gradients there, and after the backward pass one pass accumulates those into the FP32
  gradients (dividing out the loss scale) before the optimizer runs.
* ``Boundary``: where a layer takes its input in another element type than the layer before it
  gives (the float32 input batch into a 16-bit convolution, a 16-bit layer into one set to fp32,
  16-bit logits into the FP32 loss): a cast of the activations forward and of the gradient back,
  each into a buffer of its own.
* ``LossScaler``: fp16's dynamic loss scaling, as torch.cuda.amp.GradScaler: the gradient entering
  the 16-bit layers is multiplied by the scale (2^16 at first) and the gradients leaving them are
  divided by it; a step whose gradients hold an Inf or NaN is skipped (the optimizer updates
  nothing, its step count stays) and the scale halved; after ``growth_interval`` (2000) clean steps
  in a row it doubles. Its state lives on the device and every decision is taken there, so the
  whole step, the skip included, stays one CUDA graph with nothing read back by the host. bfloat16
  has float32's exponent range: bf16 models have no scaler.

FP32 layers (any layer set to fp32 or tf32 in a 16-bit model) see true (unscaled) gradients: the
scale applies only inside the 16-bit layers. Their weight gradients are 16-bit (as the kernels
write them, and as autocast's are), so at fp16 a weight gradient summed over a large batch can
overflow where an activation gradient does not: the scaler then settles lower. A model's 16-bit
layers share one 16-bit precision (bf16 or fp16, not both).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from autocnn.precision import FLOAT16, FLOAT32, ElementType

Array = Any


class ScaleUse(enum.Enum):
    """What a cast does with the loss scale (the numbers the kernels switch on)."""

    KEEP = 0         # activations forward, and every cast without a scaler
    SCALE_UP = 1     # an FP32 gradient into 16-bit layers: times the scale
    SCALE_DOWN = 2   # a 16-bit gradient out of them: divided by the scale


# The slots of the loss scaler's state (float32, on the backend's device).
SCALE, CLEAN_STEPS, FOUND, SKIPPED = 0, 1, 2, 3
STATE_SLOTS = 4


@dataclass(frozen=True)
class LossScaling:
    """Dynamic loss scaling's settings (torch.cuda.amp.GradScaler's defaults)."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        checks = (("init_scale", self.init_scale, math.isfinite(self.init_scale) and self.init_scale > 0,
                   "a finite number > 0"),
                  ("growth_factor", self.growth_factor, self.growth_factor > 1, "a number > 1"),
                  ("backoff_factor", self.backoff_factor, 0 < self.backoff_factor < 1, "a number in (0, 1)"),
                  ("growth_interval", self.growth_interval,
                   isinstance(self.growth_interval, int) and not isinstance(self.growth_interval, bool)
                   and 1 <= self.growth_interval < 2 ** 24, "an integer in [1, 2^24)"))
        for name, value, ok, allowed in checks:
            if not ok:
                raise ValueError(f"LossScaling: {name} must be {allowed}, got {value!r}")


class LossScaler:
    """fp16's dynamic loss scale, its state on the backend's device (see the module docstring).

    ``state`` holds [scale, clean steps in a row, a non-finite gradient found this step, the last
    step skipped]; ``found_flag`` is the third slot as a one-element array, what the optimizer
    reads to skip its update. Reading ``scale`` or ``last_step_skipped`` waits for the device."""

    def __init__(self, backend: Any, settings: LossScaling = LossScaling()) -> None:
        self.settings = settings
        self.backend = backend
        self.state: Array = backend.zeros((STATE_SLOTS,), dtype=np.float32)
        backend.upload(np.array([settings.init_scale, 0, 0, 0], dtype=np.float32), self.state)
        self.found_flag: Array = self.state[FOUND:FOUND + 1]

    def __repr__(self) -> str:
        return f"LossScaler(scale={self.scale:g}, {self.settings})"

    def _values(self) -> np.ndarray:
        return self.backend.to_numpy(self.state)

    @property
    def scale(self) -> float:
        return float(self._values()[SCALE])

    @property
    def clean_steps(self) -> int:
        return int(self._values()[CLEAN_STEPS])

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last step's gradients held an Inf or NaN (its update skipped, the scale cut)."""
        return bool(self._values()[SKIPPED])

    def update(self) -> None:
        """After the optimizer: cut the scale on a flagged step, grow it after enough clean ones."""
        self.backend.loss_scale_update(self.state, self.settings)

    def forget_found(self) -> None:
        """Clear this step's flag without an update (gradients computed without an optimizer step)."""
        self.backend.upload(np.zeros(1, dtype=np.float32), self.found_flag)


@dataclass
class Boundary:
    """A change of element type before layer ``index`` (``index`` == the number of layers: before
    the loss): the forward cast into ``forward`` (what layer ``index`` reads) and, where a gradient
    flows back, the cast of it into ``backward`` (what the layer before receives)."""

    index: int
    before: ElementType
    after: ElementType
    forward: Array
    backward: Array | None

    @property
    def backward_use(self) -> ScaleUse:
        # The gradient flows from `after` into `before`: into 16 bits it is scaled up, out of them down.
        return ScaleUse.SCALE_UP if self.before.size == 2 else ScaleUse.SCALE_DOWN


def layer_elements(layers: Sequence[Any], input_element: ElementType = FLOAT32) -> list[ElementType]:
    """The element type each layer stores its input and output in (``Layer.takes_element``), from
    the float32 input batch on; ValueError where the 16-bit layers would mix bf16 and fp16."""
    elements, arriving = [], input_element
    for layer in layers:
        arriving = layer.takes_element(arriving)
        elements.append(arriving)
    sixteen = sorted({e.name for e in elements if e.size == 2})
    if len(sixteen) > 1:
        named = ", ".join(f"{layer.name} {e.name}" for layer, e in zip(layers, elements) if e.size == 2)
        raise ValueError(f"a model's 16-bit layers share one 16-bit precision (bf16 or fp16); these mix "
                         f"{' and '.join(sixteen)}: {named}")
    return elements


def sixteen_bit_element(elements: Sequence[ElementType]) -> ElementType | None:
    """The model's 16-bit element type, None when every layer is FP32."""
    return next((e for e in elements if e.size == 2), None)


def needs_loss_scaling(element: ElementType | None) -> bool:
    """fp16's range (6e-5 to 65504) loses small gradients and overflows large ones; bf16's is float32's."""
    return element == FLOAT16


def make_boundaries(layers: Sequence[Any], elements: Sequence[ElementType], input_shape: tuple[int, ...],
                    output_shapes: Sequence[tuple[int, ...]], batch_size: int, backend: Any) -> dict[int, Boundary]:
    """The boundaries of a model: before each layer whose element differs from what arrives, and
    before the loss (FP32) when the last layer is 16-bit; their buffers at ``batch_size``."""
    boundaries: dict[int, Boundary] = {}
    arriving, shape = FLOAT32, input_shape
    for index, element in enumerate([*elements, FLOAT32]):
        if element != arriving:
            takes_grad = index == len(layers) or layers[index].needs_input_grad
            boundaries[index] = Boundary(
                index, arriving, element,
                forward=backend.zeros((batch_size, *shape), dtype=backend.storage_dtype(element)),
                backward=backend.zeros((batch_size, *shape), dtype=backend.storage_dtype(arriving))
                if takes_grad else None)
        if index < len(layers):
            arriving, shape = element, output_shapes[index]
    return boundaries


def _runs(slots: Sequence[Any]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged [lo, hi) element ranges of arena slots."""
    merged: list[list[int]] = []
    for lo, hi in sorted((s.offset, s.offset + s.size) for s in slots):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


class SixteenBitCopies:
    """The 16-bit mirror of a ParameterArena's parameters and gradients for a model's 16-bit layers
    (see the module docstring). The mirrors span the whole arena, so that the weights' cast is one
    pass; only the 16-bit layers' ranges (``runs``) are read back into the FP32 gradients."""

    def __init__(self, arena: Any, layers: Sequence[Any], element: ElementType, backend: Any) -> None:
        if element.size != 2:
            raise ValueError(f"SixteenBitCopies: {element.name} is not a 16-bit type")
        self.arena, self.element, self.backend = arena, element, backend
        dtype = backend.storage_dtype(element)
        self.weights: Array = backend.zeros((arena.size,), dtype=dtype)
        self.grads: Array = backend.zeros((arena.size,), dtype=dtype)
        slots = []
        for layer in layers:
            names = [f"{layer.name}.{k}" for k in layer._params]
            if layer.element == element and names:
                slots += [arena.slots[n] for n in names]
                layer.use_kernel_tensors({k: arena.view(n, self.weights) for k, n in zip(layer._params, names)},
                                         {k: arena.view(n, self.grads) for k, n in zip(layer._params, names)})
            else:
                layer.use_kernel_tensors(None, None)
        self.runs = _runs(slots)

    def cast_weights(self) -> None:
        """The master weights into the 16-bit mirror (once a step, before the forward pass)."""
        self.backend.cast(self.arena.params, FLOAT32, self.weights, self.element, None, ScaleUse.KEEP)

    def gradients_to_fp32(self, scaler: LossScaler | None) -> None:
        """The 16-bit layers' weight gradients into the FP32 gradients, the loss scale divided out;
        with a scaler, a non-finite value anywhere in the gradients flags the step."""
        self.backend.gradients_to_fp32(self.arena.grads, self.grads, self.element, self.runs,
                                       None if scaler is None else scaler.state)
