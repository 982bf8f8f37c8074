"""PyTorch's memory formats as autocnn's layouts: which layout a call's tensors are in, its outputs'.

A 4-D tensor contiguous in ``torch.channels_last`` holds an NHWC array (autocnn.layout.NHWC), and a
channels_last K x C/groups x R x S weight is exactly KRSC in memory; a contiguous one holds NCHW
(KCRS). Where a tensor is both (a size-1 channel axis, or a 1 x 1 image, makes the two orders one
memory) either layout reads it right, and its strides say which PyTorch takes it for, as
``suggest_memory_format`` reads them: outputs then follow PyTorch.

A call is NHWC where any of its 4-D tensors is channels_last (``call_layout``), as PyTorch's
convolution runs channels_last when its input or its weight suggests it; a tensor of the other
format is brought to the call's layout with one copy (``arranged``), never read in the wrong order;
one contiguous in neither (a strided view) is refused with what to call. Outputs are allocated in
the call's layout (``empty``), by the real operators and the fake ones alike, so a torch.compile
trace sees the strides a run makes, and the autograd backward hands its gradients over in the
forward's layout (``as_layout``), which PyTorch's would have.

Everything here reads tensor attributes only (contiguity, sizes, strides), which torch.compile
turns into guards, so a compiled forward stays one graph.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from autocnn.layout import DEFAULT_LAYOUT, NCHW, NHWC, Layout


def memory_format(layout: Layout) -> torch.memory_format:
    """PyTorch's memory format of a 4-D tensor in ``layout``."""
    return torch.channels_last if layout.channels_last else torch.contiguous_format


def _strides_suggest_channels_last(sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """Whether PyTorch takes a 4-D tensor of these strides for channels_last (c10's
    is_channels_last_strides_2d_s4): the axes' strides grow in the order C, W, H, N, where a size-1
    axis' stride still counts, which is what tells the two orders apart when the memory is one."""
    if strides[1] == 0:
        return False
    smallest = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < smallest:
            return False
        if d == 0 and smallest == strides[1]:   # N x 1 x 1 x 1 with equal strides: NCHW, PyTorch's default
            return False
        smallest = strides[d] * sizes[d] if sizes[d] > 1 else strides[d]
    return True


def tensor_layout(t: torch.Tensor) -> Layout | None:
    """The layout a 4-D tensor's memory is in: NCHW where it is contiguous, NHWC where it is contiguous
    in channels_last, where both the one its strides suggest (see the module's docstring); None where
    it is neither (a strided or broadcast view). A tensor of other dimensions is NCHW where contiguous
    (the operators then refuse its shape)."""
    plain = t.is_contiguous()
    if t.dim() != 4:
        return NCHW if plain else None
    last = t.is_contiguous(memory_format=torch.channels_last)
    if plain and last:
        return NHWC if _strides_suggest_channels_last(t.shape, t.stride()) else NCHW
    if last:
        return NHWC
    if plain:
        return NCHW
    return None


def call_layout(where: str, tensors: dict[str, torch.Tensor | None]) -> Layout:
    """The layout of one call over these 4-D tensors (None entries skipped): NHWC where any of them is
    channels_last, NCHW otherwise; ValueError naming a tensor contiguous in neither."""
    channels_last = False
    for name, t in tensors.items():
        if t is None:
            continue
        layout = tensor_layout(t)
        if layout is None:
            raise ValueError(f"{where}: {name} (shape {tuple(t.shape)}, strides {tuple(t.stride())}) is contiguous "
                             f"neither as NCHW nor as channels_last (NHWC); call .contiguous() or "
                             f".contiguous(memory_format=torch.channels_last) first")
        channels_last = channels_last or layout.channels_last
    return NHWC if channels_last else NCHW


def in_either_layout(t: torch.Tensor) -> bool:
    """Whether a tensor is contiguous as NCHW or, a 4-D one, as channels_last (what a call can take)."""
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))


def arranged(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """A tensor that ``call_layout`` passed, in ``layout``'s memory: itself, or one copy of another layout's."""
    fmt = memory_format(layout)
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def as_layout(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Any 4-D tensor (an incoming gradient: broadcast, strided, of either layout) in ``layout``, with the
    strides that say so, so that a call on it takes ``layout``: itself where it is, else one copy."""
    return t if tensor_layout(t) == layout else t.clone(memory_format=memory_format(layout))


def memory_view(t: torch.Tensor, layout: Layout, *, filters: bool = False) -> torch.Tensor:
    """A tensor in ``layout``'s memory viewed as that array (NHWC: N x H x W x C, C-contiguous): the
    buffer a generated kernel of a ``layout`` problem reads or writes. No copy."""
    return t.permute(layout.memory_axes(filters=filters))


def empty(like: torch.Tensor, shape: Sequence[Any], layout: Layout) -> torch.Tensor:
    """An output of logical ``shape`` in ``layout``'s memory, of ``like``'s dtype and device."""
    if len(shape) != 4:
        return like.new_empty(shape)
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=memory_format(layout))


def model_layout(model: nn.Module) -> Layout:
    """NHWC where every 4-D parameter of ``model`` is channels_last (``model.to(memory_format=
    torch.channels_last)`` makes them so), else NCHW: the layout convert takes a pooling layer's
    input to have, since it has no weight of its own to say."""
    layouts = [tensor_layout(p) for p in model.parameters()
               if not isinstance(p, nn.parameter.UninitializedParameter) and p.dim() == 4]
    if layouts and all(layout is not None and layout.channels_last for layout in layouts):
        return NHWC
    return DEFAULT_LAYOUT
