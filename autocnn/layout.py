"""Layouts: the order in which a problem's tensors hold their axes in memory.

A layout is a value of type ``Layout``, one per name (``LAYOUTS``), as a precision is one
``Precision``: problems, records and the command line hold these values, and every question about
a layout (its axis orders, how to reach NCHW from it and back) is asked of one rather than
answered by comparing names. ``layout_named`` turns a name into its Layout at the door (the
command line, ``ConvProblem(layout="nhwc")``, a stored record), with an error naming the allowed
ones.

- ``nchw`` (the default): activations N x C x H x W, filters K x C x R x S (KCRS), C-contiguous.
- ``nhwc`` (channels last): activations N x H x W x C, filters K x R x S x C (KRSC), C-contiguous:
  the channels of one pixel are adjacent, as PyTorch's ``channels_last`` and cuDNN's NHWC hold them.

A problem's sizes (N, C, H, W, K, R, S, P, Q) and its ``x_shape`` / ``w_shape`` / ``y_shape`` are
logical, the same in every layout; the arrays a kernel reads and writes, and the ones verification
builds, are in the problem's layout (``activation_shape``, ``filter_shape``). The float64
references compute in NCHW: ``to_nchw`` / ``from_nchw`` move an array between the two.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.named_values import NamedValues


@dataclass(frozen=True, eq=False)
class Layout:
    """One memory order: its name, the order of an activation tensor's axes and of a filter's."""

    name: str
    activation_axes: str    # "NCHW" or "NHWC": the axes of x, y and their gradients, slowest first
    filter_axes: str        # "KCRS" or "KRSC": the axes of w and dw, slowest first
    summary: str

    @property
    def label(self) -> str:
        """As tables and messages print it: the activation axes ("NHWC")."""
        return self.activation_axes

    @property
    def channels_last(self) -> bool:
        """Whether the channels of one pixel are adjacent in memory."""
        return self.activation_axes.endswith("C")

    # -- shapes in memory ----------------------------------------------------------------------
    def activation_shape(self, logical: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """The array shape of an activation tensor whose logical (N, C, H, W) shape is ``logical``."""
        return tuple(logical[i] for i in self._activation_order)   # type: ignore[return-value]

    def filter_shape(self, logical: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """The array shape of a filter tensor whose logical (K, C, R, S) shape is ``logical``."""
        return tuple(logical[i] for i in self._filter_order)   # type: ignore[return-value]

    # -- moving arrays (NumPy or CuPy) ---------------------------------------------------------
    def to_nchw(self, array: Any, *, filters: bool = False) -> Any:
        """An array of this layout as NCHW (KCRS for ``filters``), C-contiguous."""
        order = self._filter_order if filters else self._activation_order
        inverse = tuple(order.index(i) for i in range(4))
        return _contiguous(array.transpose(inverse))

    def from_nchw(self, array: Any, *, filters: bool = False) -> Any:
        """An NCHW (KCRS for ``filters``) array in this layout, C-contiguous."""
        return _contiguous(array.transpose(self._filter_order if filters else self._activation_order))

    def memory_axes(self, *, filters: bool = False) -> tuple[int, ...]:
        """The logical axes (NCHW's, KCRS's for ``filters``) in this layout's memory order, slowest
        first: the permutation that views a logically indexed tensor in memory order (a PyTorch
        channels_last tensor permuted by NHWC's (0, 2, 3, 1) is its NHWC array, C-contiguous)."""
        return self._filter_order if filters else self._activation_order

    @property
    def _activation_order(self) -> tuple[int, ...]:
        return tuple("NCHW".index(a) for a in self.activation_axes)

    @property
    def _filter_order(self) -> tuple[int, ...]:
        return tuple("KCRS".index(a) for a in self.filter_axes)

    # -- one object per layout -----------------------------------------------------------------
    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return repr(self.name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Layout):
            return self.name == other.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __reduce__(self) -> tuple[Any, tuple[str]]:   # one object per layout, also across processes
        return (_defined, (self.name,))


def _contiguous(array: Any) -> Any:
    # NumPy's and CuPy's arrays both copy so: the transposed view, once, into the new order.
    return array.copy(order="C")


NCHW = Layout("nchw", "NCHW", "KCRS", "channels second: each channel a contiguous H x W plane (the default)")
NHWC = Layout("nhwc", "NHWC", "KRSC", "channels last: a pixel's channels adjacent (PyTorch's channels_last)")
LAYOUTS: tuple[Layout, ...] = (NCHW, NHWC)
LAYOUT_NAMES: tuple[str, ...] = tuple(layout.name for layout in LAYOUTS)
DEFAULT_LAYOUT = NCHW
_BY_NAME = NamedValues(Layout, LAYOUTS)


def layout_named(value: Any, where: str = "autocnn", field: str = "layout") -> Layout:
    """The Layout a name (or a Layout) stands for; InvalidProblemError naming the allowed ones
    otherwise. ``where`` and ``field`` say whose value it was, for the message."""
    return _BY_NAME.named(value, where, field)


def _defined(name: str) -> Layout:
    """The one object of a defined layout (what unpickling asks for)."""
    return _BY_NAME[name]


def layout_of(problem: Any) -> Layout:
    """A problem's layout; NCHW for one that has none."""
    return getattr(problem, "layout", DEFAULT_LAYOUT)
