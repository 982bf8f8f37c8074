"""Precisions: what a convolution's elements are stored as, how its products are formed and summed,
and how accurate its result must be.

A precision is a value of type ``Precision``, one per name (``PRECISIONS``); problems, layers and
the benchmark hold these values, and every question about a precision is asked of one (its element
types, its tensor-core arithmetic, its error bound, the ceiling it is compared with) rather than
answered by comparing names. Names are what people type: ``precision_named`` turns one into its
Precision at the door (the command line, ``ConvProblem(precision="tf32")``, a stored record), with
an error naming the allowed ones.

- ``fp32`` (the default): FP32-accurate whatever kernel runs. SIMT kernels compute in FP32 FMA;
  tensor-core kernels split each FP32 operand into a TF32 part and the TF32 part of its remainder
  and sum three products a term (3xTF32), which keeps FP32's accuracy.
- ``tf32`` (opt-in): a kernel may round its operands to TF32 (10 of float32's 23 explicit mantissa
  bits) and form one tensor-core product a term; FP32 accumulation.

Both store float32 operands and outputs and accumulate in FP32.

- ``bf16`` and ``fp16`` (``BF16``, ``FP16``): 16-bit operands and outputs (bfloat16: 8 bits of
  significand, float16: 11), FP32 accumulation. A kernel widens each element to FP32 as it loads it
  (``__bfloat162float``, ``__half2float``), forms every product and sum in FP32, adds a bias in
  FP32 and rounds each output once, to nearest even, as it stores it (``__float2bfloat16_rn``,
  ``__float2half_rn``); partial sums that leave a kernel (a split reduction's workspace) stay FP32.
  Their inputs are exact in the float64 reference (it is computed from the 16-bit values
  themselves), and a product of two 16-bit values is exact in FP32, so what a kernel may lose is its
  FP32 sums and the one rounding of each output to 16 bits (``sixteen_bit_rounding``).
  fp16 overflows as cuDNN's FP16 output does: an output whose FP32 value rounds beyond the largest
  finite half (65504) is stored as +-Inf (round to nearest: from 65520 on), never clamped, and a NaN
  or Inf among the inputs reaches every output it touches. bfloat16 has float32's exponent range,
  so only a sum that overflows FP32 itself becomes Inf there.
  ``Precision.sixteen_bit`` says whether a precision stores 16-bit tensors; a formulation that
  cannot serve such a precision says so in its constraints (``kernels.rules.sixteen_bit_rule``).

The error bounds are set here and nowhere else (``Precision.error_bound``): verification
(``autocnn.measurement.measure``) asks them.

``PRECISIONS`` is what problems, records and the command line's tune, bench and db accept;
``FLOAT32_PRECISIONS`` the ones that store float32 tensors: autocnn.torch's layers take them as their
float32 tensors' precision (their 16-bit tensors compute at bf16 and fp16), and the training library
takes all four (bf16 and fp16 as mixed precision, autocnn.nn.mixed_precision).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from autocnn.named_values import NamedValues


@dataclass(frozen=True)
class ElementType:
    """How one element is stored: numpy's name for it, CUDA C++'s, and its size in bytes."""

    name: str
    c_type: str
    size: int

    def __str__(self) -> str:
        # Its C type: templates write {{ t.x }} where the element type belongs.
        return self.c_type


FLOAT32 = ElementType("float32", "float", 4)
BFLOAT16 = ElementType("bfloat16", "__nv_bfloat16", 2)
FLOAT16 = ElementType("float16", "__half", 2)


class TensorMath(enum.Enum):
    """How a tensor-core kernel forms each product of the reduction."""

    TF32X3 = "3xTF32"   # FP32 operands split into TF32 parts and remainders: three products a term
    TF32 = "TF32"       # operands rounded (or truncated) to TF32: one product a term
    BF16 = "BF16"       # bfloat16 operands as stored: one product a term, exact in FP32
    FP16 = "FP16"       # float16 operands as stored: one product a term, exact in FP32


# Relative error bounds at a reduction of BASE_TERMS terms; longer reductions scale by the square
# root of their length, as the rounding error of a sum of random-signed terms grows.
BASE_TERMS = 1024
FP32_BASE_BOUND = 1e-5
# TF32 rounding to nearest moves an operand by up to 2**-11 of itself, a product by up to about
# 2**-10. Over a sum of random-signed products the error relative to the result's norm is of the
# order of one product's RMS error (about 3e-4, measured on an H100); the bound allows four times
# the worst single-operand rounding.
TF32_BASE_BOUND = 4 * 2.0**-11
# Unit roundoff of round-to-nearest: half the distance from 1 to the next value.
BF16_UNIT_ROUNDOFF = 2.0**-8
FP16_UNIT_ROUNDOFF = 2.0**-11


def sixteen_bit_rounding(unit_roundoff: float) -> float:
    """What the 16-bit outputs of a precision of this unit roundoff u may lose to their rounding.

    Rounding an output to nearest moves it by at most u of itself, so the normwise error of the
    rounded outputs is at most u (about u / sqrt(3) on random data). A kernel that rounds one
    intermediate to 16 bits as well (a staged partial sum, a transformed tile) may lose about u
    more; twice u allows that and no more. It does not grow with the reduction: the sums run in
    FP32, whose own error (``base_bound``, FP32's) is what grows."""
    return 2 * unit_roundoff


@dataclass(frozen=True, eq=False)
class Precision:
    """One precision: storage, arithmetic, accuracy contract and the ceiling it is measured against.

    Precisions compare equal by name, to each other and to their name (so that ``model.precision
    == "tf32"`` reads as a user expects); autocnn's own code asks the fields instead, and a test
    keeps names out of its comparisons."""

    name: str
    x: ElementType             # activations and their gradients (x, dy, dx)
    w: ElementType             # filters and their gradients
    y: ElementType             # the convolution's output
    accumulator: ElementType   # partial sums
    tensor_math: TensorMath    # what a tensor-core kernel does for a product
    base_bound: float          # relative error the sums may show at BASE_TERMS terms
    peak: str                  # the measured ceiling a benchmark compares with (Ceilings' field)
    description: str
    output_rounding: float = 0.0   # relative error of storing the outputs (16-bit), whatever the length

    @property
    def tf32x3(self) -> bool:
        """Tensor-core kernels sum three TF32 products a term (FP32-accurate)."""
        return self.tensor_math is TensorMath.TF32X3

    @property
    def tf32(self) -> bool:
        """Tensor-core kernels (and cuBLAS, cuDNN) may round operands to TF32: one product a term."""
        return self.tensor_math is TensorMath.TF32

    @property
    def sixteen_bit(self) -> bool:
        """Operands and outputs are stored in 16 bits (bf16, fp16): kernels widen them to the
        accumulator's type on load and round once on store."""
        return any(e.size == 2 for e in (self.x, self.w, self.y))

    def error_bound(self, reduction_length: int) -> float:
        """The largest relative error ||out - ref|| / ||ref|| a kernel may show against the float64
        reference, for an output whose every element sums ``reduction_length`` terms: the base
        bound up to BASE_TERMS terms, growing with the square root of the length beyond, plus what
        storing the outputs loses (16-bit outputs), which does not grow."""
        return self.output_rounding + self.base_bound * math.sqrt(max(1.0, reduction_length / BASE_TERMS))

    def can_serve(self, other: "Precision") -> bool:
        """Whether a kernel made for ``self`` may run a problem of ``other``: its own, or any whose
        bound is at least as loose with the same element types (an fp32 config serves tf32)."""
        return self is other or (self.base_bound <= other.base_bound and self.output_rounding <= other.output_rounding
                                 and (self.x, self.w, self.y) == (other.x, other.w, other.y))

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        # As its name's: a problem's repr (which every generated source's header carries) reads
        # precision='tf32', as it did when the field held the name.
        return repr(self.name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Precision):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __lt__(self, other: "Precision") -> bool:   # the order of PRECISIONS
        return _ORDER.index(self) < _ORDER.index(other)

    def __reduce__(self) -> tuple[Any, tuple[str]]:   # one object per precision, also across processes
        return (_defined, (self.name,))


FP32 = Precision("fp32", FLOAT32, FLOAT32, FLOAT32, FLOAT32, TensorMath.TF32X3, FP32_BASE_BOUND, "sgemm_tflops",
                 "FP32-accurate whatever the kernel (tensor-core kernels use 3xTF32)")
TF32 = Precision("tf32", FLOAT32, FLOAT32, FLOAT32, FLOAT32, TensorMath.TF32, TF32_BASE_BOUND, "tf32_tflops",
                 "operands may be rounded to TF32, one tensor-core product a term (opt-in)")

BF16 = Precision("bf16", BFLOAT16, BFLOAT16, BFLOAT16, FLOAT32, TensorMath.BF16, FP32_BASE_BOUND, "bf16_tflops",
                 "bfloat16 operands and outputs on tensor cores, FP32 accumulation",
                 output_rounding=sixteen_bit_rounding(BF16_UNIT_ROUNDOFF))
FP16 = Precision("fp16", FLOAT16, FLOAT16, FLOAT16, FLOAT32, TensorMath.FP16, FP32_BASE_BOUND, "fp16_tflops",
                 "float16 operands and outputs on tensor cores, FP32 accumulation",
                 output_rounding=sixteen_bit_rounding(FP16_UNIT_ROUNDOFF))

PRECISIONS: tuple[Precision, ...] = (FP32, TF32, BF16, FP16)
PRECISION_NAMES: tuple[str, ...] = tuple(p.name for p in PRECISIONS)
# The precisions of float32 tensors: what autocnn.torch's precision argument is for.
FLOAT32_PRECISIONS: tuple[Precision, ...] = tuple(p for p in PRECISIONS if not p.sixteen_bit)
FLOAT32_PRECISION_NAMES: tuple[str, ...] = tuple(p.name for p in FLOAT32_PRECISIONS)
DEFAULT_PRECISION = FP32
_ORDER = PRECISIONS
_BY_NAME = NamedValues(Precision, PRECISIONS)


@dataclass(frozen=True)
class KernelTypes:
    """The element types a kernel template writes (``t`` in every template's context): each tensor
    of an operation by its role, and the accumulator. ``{{ t.x }}`` renders the C type,
    ``{{ t.x.size }}`` its size in bytes. Gradients are stored like what they are the gradients of."""

    x: ElementType      # activations (the convolution's input)
    w: ElementType      # filters
    y: ElementType      # the convolution's output
    dx: ElementType     # the input's gradient
    dw: ElementType     # the filters' gradient
    dy: ElementType     # the output's gradient
    acc: ElementType    # partial sums, and the values products are formed in

    @classmethod
    def of(cls, precision: "Precision") -> "KernelTypes":
        return cls(x=precision.x, w=precision.w, y=precision.y, dx=precision.x, dw=precision.w, dy=precision.x,
                   acc=precision.accumulator)

    def of_tensor(self, name: str) -> ElementType:
        """The element type of an operation's tensor by its buffer name: a role's (x, w, y, dx, dw,
        dy), the bias like the filters and its gradient like theirs; any other tensor of an
        activation's shape (a kept activation, dZ) like the activations."""
        role = {"bias": "w", "db": "dw"}.get(name, name)
        return getattr(self, role) if role in ("x", "w", "y", "dx", "dw", "dy") else self.x


def precision_named(value: Any, where: str = "autocnn", field: str = "precision") -> Precision:
    """The Precision a name (or a Precision) stands for; InvalidProblemError naming the allowed
    ones otherwise. ``where`` and ``field`` say whose value it was, for the message."""
    return _BY_NAME.named(value, where, field)


def _defined(name: str) -> Precision:
    """The one object of a defined precision (what unpickling asks for)."""
    return _BY_NAME[name]


def precision_of(problem: Any) -> Precision:
    """A problem's precision; FP32 for one that has none."""
    return getattr(problem, "precision", DEFAULT_PRECISION)


def without_products(precision: Precision) -> Precision:
    """The precision an operation that forms no products (pooling) runs at for ``precision``: its
    own, except tf32, which only says how products are formed, where it is fp32 (the same storage,
    FP32 sums)."""
    return FP32 if precision.tf32 else precision
