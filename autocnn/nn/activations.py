"""The activation functions and their gradients, element-wise over any numpy-compatible ``xp``.

This is the generic code behind ``Backend.activation`` and ``Backend.activation_grad`` (a GPU
backend replaces it with fused kernels). It imports nothing else of autocnn.nn, so the backend
interface and the layers written against it can both use it without importing each other.

Gradients are taken from the activation's OUTPUT y (what the forward pass keeps), not its input.
"""
from __future__ import annotations

from typing import Any

from autocnn.kernels.problem import ACTIVATIONS

Array = Any  # numpy.ndarray or cupy.ndarray

# The activations whose gradient ``gradient_without_temporaries`` computes in its output buffer.
BUFFERED = ("relu", "tanh", "logistic")


def _unknown(name: str) -> ValueError:
    return ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")


def forward(xp: Any, name: str, z: Array, out: Array) -> Array:
    """out = act(z); ``out`` may be ``z`` (in place)."""
    if name == "none":
        if out is not z:
            xp.copyto(out, z)
    elif name == "relu":
        xp.maximum(z, 0, out=out)
    elif name == "tanh":
        xp.tanh(z, out=out)
    elif name == "logistic":
        # exp(-|z|) never overflows: sigma(z) = 1/(1+e) for z >= 0 and e/(1+e) below 0.
        e = xp.exp(-xp.abs(z))
        numerator = xp.where(z >= 0, 1.0, e)
        e += 1.0
        xp.divide(numerator, e, out=out)
    else:
        raise _unknown(name)
    return out


def gradient(xp: Any, name: str, y: Array, dy: Array, out: Array) -> Array:
    """out = dL/dz given the activation's output y and dL/dy; ``out`` may be ``dy``."""
    if name == "none":
        if out is not dy:
            xp.copyto(out, dy)
    elif name == "relu":
        xp.multiply(dy, y > 0, out=out)
    elif name == "tanh":
        xp.multiply(dy, 1.0 - y * y, out=out)
    elif name == "logistic":
        xp.multiply(dy, y * (1.0 - y), out=out)
    else:
        raise _unknown(name)
    return out


def gradient_without_temporaries(xp: Any, name: str, y: Array, dy: Array, out: Array) -> Array:
    """``gradient`` with every intermediate written into ``out`` instead of temporaries, with the
    same results bit for bit. Where that cannot work (``out`` is ``y`` or ``dy``, or an activation
    not in BUFFERED) it is ``gradient`` itself."""
    if out is dy or out is y or name not in BUFFERED:
        return gradient(xp, name, y, dy, out=out)
    if name == "relu":
        xp.greater(y, 0, out=out)        # 1.0 where y > 0, else 0.0: dy * (y > 0)
    elif name == "tanh":
        xp.multiply(y, y, out=out)
        xp.subtract(1.0, out, out=out)   # 1 - y*y
    else:
        xp.subtract(1.0, y, out=out)
        out *= y                         # y * (1 - y)
    out *= dy
    return out
