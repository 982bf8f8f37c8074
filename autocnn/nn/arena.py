"""ParameterArena: every parameter of a model in one flat buffer, every gradient in another.

The layers keep using their parameters and gradients as arrays of their own shapes; after
``ParameterArena.gather`` those arrays are views into the two flat buffers. An optimizer then
updates the whole model in one pass over the arena (on a GPU: one kernel launch instead of one
per parameter and operation), and its state can be laid out flat the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from autocnn.nn.backend import Array, Backend


@dataclass(frozen=True)
class ArenaSlot:
    """Where one parameter lives in the arena: its offset (in elements) and shape."""

    offset: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class ParameterArena:
    """Flat parameter and gradient buffers, and the named views the layers use."""

    def __init__(self, backend: Backend, shapes: Mapping[str, tuple[int, ...]]) -> None:
        if not shapes:
            raise ValueError("a ParameterArena needs at least one parameter")
        self.slots: dict[str, ArenaSlot] = {}
        offset = 0
        for name, shape in shapes.items():
            self.slots[name] = ArenaSlot(offset, tuple(int(s) for s in shape))
            offset += self.slots[name].size
        self.size = offset
        self.params: Array = backend.zeros((offset,))
        self.grads: Array = backend.zeros((offset,))
        self.param_views: dict[str, Array] = {n: self.view(n, self.params) for n in self.slots}
        self.grad_views: dict[str, Array] = {n: self.view(n, self.grads) for n in self.slots}

    def view(self, name: str, flat: Array) -> Array:
        """Parameter ``name``'s part of a flat array laid out like the arena (params, grads, state)."""
        slot = self.slots[name]
        return flat[slot.offset:slot.offset + slot.size].reshape(slot.shape)

    def holds(self, params: Mapping[str, Array]) -> bool:
        """Whether ``params`` are exactly this arena's parameter views (the same array objects)."""
        return len(params) == len(self.param_views) and all(
            self.param_views.get(name) is p for name, p in params.items())

    def holds_grads(self, grads: Mapping[str, Array]) -> bool:
        return len(grads) == len(self.grad_views) and all(
            self.grad_views.get(name) is g for name, g in grads.items())

    @classmethod
    def gather(cls, layers: Sequence[Any], backend: Backend) -> "ParameterArena | None":
        """Move the built layers' parameters and gradients into a new arena (values kept).

        Each layer's ``_params``/``_grads`` entries are replaced by views of the arena, named
        "<layer>.<param>" as Sequential.params() names them. None when no layer has parameters.
        """
        shapes = {f"{layer.name}.{k}": tuple(v.shape) for layer in layers for k, v in layer._params.items()}
        if not shapes:
            return None
        arena = cls(backend, shapes)
        xp = backend.xp
        for layer in layers:
            for k in list(layer._params):
                name = f"{layer.name}.{k}"
                xp.copyto(arena.param_views[name], layer._params[k])
                xp.copyto(arena.grad_views[name], layer._grads[k])
                layer._params[k] = arena.param_views[name]
                layer._grads[k] = arena.grad_views[name]
        return arena
