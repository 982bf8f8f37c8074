"""Comparing two backends' backward passes at the same ReLU decisions (the zoo's GPU checks).

A ReLU input within rounding of zero is kept on one backend and cut on the other. The forward
values then differ by a rounding error, but the backward lets all of dL/dy through on one side and
nothing on the other: a whole gradient term. vgg_cifar at batch 6 has about a million ReLUs; the
numpy backend alone, float32 against float64, differs in its first layer's weight gradient by
1.5e-3 to 2.3e-3 in 4 of 12 seeds for that reason, with one decision differing each time (and by
4e-7 once it is taken over). Comparing backward passes means comparing them at the same decisions.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np


def relu_layers(model: Any) -> dict[str, Any]:
    return {layer.name: layer for layer in model.layers if getattr(layer, "activation", "none") == "relu"}


@contextlib.contextmanager
def relu_decisions_taken_from(reference: Any, model: Any, tol: float) -> Iterator[list[int]]:
    """Inside it, ``model``'s (a numpy backend's) backward takes every ReLU decision (y > 0) from
    ``reference``'s forward of the same batch, which has run already: its layers' output buffers
    hold that forward (a backward reads them and writes nothing there).

    Each decision taken over must be a rounding one: both outputs within ``tol`` of the layer's
    largest, or the forward passes themselves differ (an AssertionError says where). Every ReLU
    layer's backward must have been seen. Yields a one-item list: the number of decisions taken over.
    """
    from autocnn.nn import activations

    theirs_by_name, ours_by_name = relu_layers(reference), relu_layers(model)
    assert theirs_by_name.keys() == ours_by_name.keys()
    # Keyed by the buffer model's backward reads y from (the layer's own output buffer).
    theirs = {id(ours_by_name[n].output_buffer): (n, reference.backend.to_numpy(theirs_by_name[n].output_buffer))
              for n in ours_by_name}
    seen: set[str] = set()
    taken = [0]

    def reconciled(y: Any) -> Any:
        if id(y) not in theirs:
            return y
        name, other = theirs[id(y)]
        seen.add(name)
        differs = (y > 0) != (other > 0)
        if not differs.any():
            return y
        scale = max(float(np.abs(y).max()), 1e-30)
        worst = float(np.maximum(np.abs(y), np.abs(other))[differs].max())
        assert worst <= tol * scale, (f"{name}: a ReLU decision differs at an output of {worst:.3g} (the layer's "
                                      f"largest is {scale:.3g}): more than rounding")
        taken[0] += int(differs.sum())
        return np.where(differs, other, y)

    gradient, without_temporaries = activations.gradient, activations.gradient_without_temporaries

    def gradient_at(xp: Any, name: str, y: Any, dy: Any, out: Any) -> Any:
        return gradient(xp, name, reconciled(y) if name == "relu" else y, dy, out)

    def without_temporaries_at(xp: Any, name: str, y: Any, dy: Any, out: Any) -> Any:
        if name == "relu":
            # The same numbers as the buffered way (a mask times dy), from the decisions taken over.
            return gradient(xp, name, reconciled(y), dy, out)
        return without_temporaries(xp, name, y, dy, out)

    activations.gradient, activations.gradient_without_temporaries = gradient_at, without_temporaries_at
    try:
        yield taken
    finally:
        activations.gradient, activations.gradient_without_temporaries = gradient, without_temporaries
    assert seen == set(ours_by_name), f"ReLU layers whose backward was not seen: {sorted(set(ours_by_name) - seen)}"
