"""The cuda backend's fused element-wise, loss and optimizer kernels (templates/nn_step.cu.j2).

Each replaces several CuPy array operations with one launch on preallocated buffers, reading its
hyper-parameters and the step counter from device memory, so a whole training step is a fixed
sequence of launches that a CUDA graph can capture once and replay (autocnn.nn.model).
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..ops.problem import ACTIVATIONS

# Activation name -> the number the kernels switch on (the order of ACTIVATIONS).
ACTIVATION_CODES = {name: i for i, name in enumerate(ACTIVATIONS)}
THREADS = 256
LOSS_THREADS = 256
# Grid-stride loops: enough blocks to fill any current GPU, no more (they loop).
MAX_BLOCKS = 4096


def render_source() -> str:
    """The CUDA source of the fused kernels (no GPU needed; the tests compile it with nvcc)."""
    from ..codegen import environment

    return environment().get_template("nn_step.cu.j2").render(activations=ACTIVATIONS, block=LOSS_THREADS)


@functools.lru_cache(maxsize=None)
def _module(device_id: int) -> Any:
    import cupy as cp

    with cp.cuda.Device(device_id):
        module = cp.RawModule(code=render_source(), options=("-std=c++17",))
        module.compile()
    return module


@functools.lru_cache(maxsize=None)
def _function(device_id: int, name: str) -> Any:
    return _module(device_id).get_function(name)


def _kernel(name: str) -> Any:
    import cupy as cp

    return _function(cp.cuda.Device().id, name)


def _grid(n: int) -> tuple[int]:
    return (max(1, min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)),)


def _code(activation: str) -> np.int32:
    try:
        return np.int32(ACTIVATION_CODES[activation])
    except KeyError:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}") from None


def _contiguous(name: str, *arrays: Any) -> None:
    for a in arrays:
        if a is not None and not a.flags.c_contiguous:
            raise ValueError(f"{name}: every array must be C-contiguous (got shape {a.shape}, "
                             f"strides {a.strides})")


def activation(name: str, z: Any, out: Any) -> Any:
    """out = act(z), one launch; out may be z."""
    _contiguous("activation", z, out)
    n = int(z.size)
    _kernel("nn_activation")(_grid(n), (THREADS,), (z, out, np.int64(n), _code(name)))
    return out


def bias_activation(y: Any, bias: Any, name: str) -> Any:
    """y = act(y + bias) in place, the bias broadcast along the last axis (a Dense layer's epilogue)."""
    _contiguous("bias_activation", y, bias)
    n = int(y.size)
    _kernel("nn_bias_activation")(_grid(n), (THREADS,), (y, bias, np.int64(n), np.int32(bias.size), _code(name)))
    return y


def activation_grad(name: str, y: Any, dy: Any, out: Any) -> Any:
    """out = dL/dz from the activation's output y and dL/dy; out may be dy (not y)."""
    _contiguous("activation_grad", y, dy, out)
    n = int(y.size)
    _kernel("nn_activation_grad")(_grid(n), (THREADS,), (y, dy, out, np.int64(n), _code(name)))
    return out


def activation_grad_colsum(name: str, y: Any, dy: Any, dz_out: Any | None, db_out: Any) -> Any:
    """dz = dL/dz from y = act(z) and dy (into dz_out; None with no activation: dz is dy) and
    db_out = dz summed over the rows, in one launch. Returns dz."""
    if name != "none" and dz_out is None:
        raise ValueError("activation_grad_colsum: an activation needs a dz buffer")
    dz = dy if name == "none" else dz_out
    _contiguous("activation_grad_colsum", y, dy, dz, db_out)
    rows, cols = (int(s) for s in dy.shape)
    _kernel("nn_activation_grad_colsum")(((cols + 31) // 32,), (32, 8),
                                         (y, dy, dz, db_out, np.int32(rows), np.int32(cols), _code(name)))
    return dz


def softmax_xent(logits: Any, labels: Any, weights: Any, grad_out: Any, loss_out: Any, acc_out: Any) -> None:
    """Weighted softmax cross-entropy, its gradient and the weighted accuracy, in one launch.

    logits float32 (n, classes), labels int64 (n,), weights float32 (n,), grad_out like logits,
    loss_out a float32 0-d array, acc_out a float64 0-d array.
    """
    n, classes = (int(s) for s in logits.shape)
    if (labels.dtype != np.int64 or weights.dtype != np.float32 or logits.dtype != np.float32
            or grad_out.dtype != np.float32 or loss_out.dtype != np.float32 or acc_out.dtype != np.float64):
        raise TypeError("softmax_xent: logits, weights, grad and loss are float32, labels int64, accuracy float64")
    _contiguous("softmax_xent", logits, labels, weights, grad_out)
    _kernel("nn_softmax_xent")((1,), (LOSS_THREADS,), (logits, labels, weights, grad_out, loss_out, acc_out,
                                                       np.int32(n), np.int32(classes)))


def advance(counter: Any) -> None:
    """counter += 1 on the device (an int64 array of one element)."""
    _kernel("nn_advance")((1,), (1,), (counter,))


def adam(p: Any, g: Any, m: Any, v: Any, hyper: Any, step: Any) -> None:
    """One Adam update; hyper = [lr, beta1, beta2, eps, weight_decay] (float64), step the advanced counter."""
    _contiguous("adam", p, g, m, v)
    n = int(p.size)
    _kernel("nn_adam")(_grid(n), (THREADS,), (p, g, m, v, hyper, step, np.int64(n)))


def sgd(p: Any, g: Any, velocity: Any, hyper: Any) -> None:
    """One SGD update; hyper = [lr, momentum, weight_decay, nesterov] (velocity unused without momentum)."""
    _contiguous("sgd", p, g, velocity)
    n = int(p.size)
    _kernel("nn_sgd")(_grid(n), (THREADS,), (p, g, velocity, hyper, np.int64(n)))


def rprop(p: Any, g: Any, step: Any, prev: Any, hyper: Any) -> None:
    """One iRprop- update; hyper = [eta_plus, eta_minus, step_min, step_max]."""
    _contiguous("rprop", p, g, step, prev)
    n = int(p.size)
    _kernel("nn_rprop")(_grid(n), (THREADS,), (p, g, step, prev, hyper, np.int64(n)))
