"""The cuda backend's fused element-wise, loss and optimizer kernels (nn_step.cu.j2, beside this module).

Each replaces several CuPy array operations with one launch on preallocated buffers, reading its
hyper-parameters and the step counter from device memory, so a whole training step is a fixed
sequence of launches that a CUDA graph can capture once and replay (autocnn.nn.model).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from autocnn.kernels.problem import ACTIVATIONS
from autocnn.nn.source_kernels import SourceKernels

# Activation name -> the number the kernels switch on (the order of ACTIVATIONS).
ACTIVATION_CODES = {name: i for i, name in enumerate(ACTIVATIONS)}
THREADS = 256
LOSS_THREADS = 256
# The fused classifier head (nn_dense_softmax_xent): at most 32 classes, 1024 input features and
# 10240 weights (40 KiB of shared memory); one row a warp, 4 warps a block: a training batch's rows
# spread over more SMs (a row is a short latency-bound chain, each block stages all of W once).
# The blocks loop over the rows beyond HEAD_MAX_BLOCKS * 4, which keeps the staging bounded.
HEAD_MAX_CLASSES = 32
HEAD_MAX_FEATURES = 1024
HEAD_MAX_WEIGHTS = 10240
HEAD_THREADS = 128
# W^T in the head's shared memory, each class's row padded to a multiple of 32 features.
HEAD_MAX_PADDED = max(o * -(-min(HEAD_MAX_FEATURES, HEAD_MAX_WEIGHTS // o) // 32) * 32
                      for o in range(1, HEAD_MAX_CLASSES + 1))
HEAD_MAX_BLOCKS = 1024
# nn_activation_grad_colsum: blocks of 32 columns x COLSUM_ROWS row slices.
COLSUM_ROWS = 32
# Elements an optimizer kernel's thread updates a pass (OPT_ITEMS in the template).
OPT_ITEMS = 4
# Grid-stride loops: enough blocks to fill any current GPU, no more (they loop).
MAX_BLOCKS = 4096


def render_source() -> str:
    """The CUDA source of the fused kernels (no GPU needed; the tests compile it with nvcc)."""
    from autocnn.kernels.codegen import make_environment

    return make_environment(Path(__file__).resolve().parent).get_template("nn_step.cu.j2").render(
        activations=ACTIVATIONS, block=LOSS_THREADS, head_max_f=HEAD_MAX_FEATURES, head_max_w=HEAD_MAX_WEIGHTS,
        head_max_wt=HEAD_MAX_PADDED, opt_items=OPT_ITEMS)


# Compiled once per device; C++17 is all the source needs of NVRTC.
KERNELS = SourceKernels(render_source, lambda source: ("-std=c++17",))
_kernel = KERNELS.kernel   # what each launch below calls (tests stand in for it)


def _grid(n: int, per_thread: int = 1) -> tuple[int]:
    # Any grid is correct (the kernels loop); this one gives every thread per_thread elements.
    per_block = THREADS * per_thread
    return (max(1, min(MAX_BLOCKS, (n + per_block - 1) // per_block)),)


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


def head_fits(features: int, classes: int) -> bool:
    """Whether a Dense layer of this size can run as the fused classifier head."""
    return (1 <= classes <= HEAD_MAX_CLASSES and 1 <= features <= HEAD_MAX_FEATURES
            and features * classes <= HEAD_MAX_WEIGHTS)


def dense_softmax_xent(x: Any, w: Any, bias: Any | None, labels: Any, weights: Any, dlogits: Any,
                       db: Any | None, dx: Any | None, loss_out: Any, acc_out: Any, scratch: Any) -> None:
    """The classifier head of a training step in one launch (see nn_dense_softmax_xent).

    x (n, F), w (F, O), bias (O,) or None, labels int64 (n,), weights (n,), dlogits (n, O), db (O,)
    or None, dx (n, F) or None; loss_out float32 and acc_out float64 0-d arrays; scratch a zeroed
    float64 array of 3 + HEAD_MAX_CLASSES elements, zero again after the launch.
    """
    n, features = (int(s) for s in x.shape)
    classes = int(w.shape[1])
    if not head_fits(features, classes):
        raise ValueError(f"dense_softmax_xent: a {features} x {classes} layer is too large for the fused head")
    if tuple(w.shape) != (features, classes) or tuple(dlogits.shape) != (n, classes):
        raise ValueError(f"dense_softmax_xent: shapes x {x.shape}, w {w.shape}, dlogits {dlogits.shape} do not fit")
    if labels.dtype != np.int64 or loss_out.dtype != np.float32 or acc_out.dtype != np.float64 \
            or scratch.dtype != np.float64 or scratch.size < 3 + HEAD_MAX_CLASSES:
        raise TypeError("dense_softmax_xent: labels int64, loss float32, accuracy and scratch float64")
    _contiguous("dense_softmax_xent", x, w, bias, labels, weights, dlogits, db, dx)
    rows_per_block = HEAD_THREADS // 32
    blocks = max(1, min(HEAD_MAX_BLOCKS, (n + rows_per_block - 1) // rows_per_block))
    _kernel("nn_dense_softmax_xent")((blocks,), (HEAD_THREADS,), (
        x, w, _or_null(bias), labels, weights, dlogits, _or_null(db), _or_null(dx), loss_out, acc_out, scratch,
        np.int32(n), np.int32(features), np.int32(classes)))


def _or_null(array: Any | None) -> Any:
    # An absent optional buffer: a null pointer, which the kernel tests for.
    return np.uint64(0) if array is None else array


def activation_grad_colsum(name: str, y: Any, dy: Any, dz_out: Any | None, db_out: Any) -> Any:
    """dz = dL/dz from y = act(z) and dy (into dz_out; None with no activation: dz is dy) and
    db_out = dz summed over the rows, in one launch. Returns dz."""
    if name != "none" and dz_out is None:
        raise ValueError("activation_grad_colsum: an activation needs a dz buffer")
    dz = dy if name == "none" else dz_out
    _contiguous("activation_grad_colsum", y, dy, dz, db_out)
    rows, cols = (int(s) for s in dy.shape)
    _kernel("nn_activation_grad_colsum")(((cols + 31) // 32,), (32, COLSUM_ROWS),
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


# The optimizer kernels share a step counter (int64 [step, finished blocks]): the first update of
# a step passes first=True and advances it, the others of the same step read the new value.

def adam(p: Any, g: Any, m: Any, v: Any, hyper: Any, counter: Any, first: bool = True, skip: Any = None) -> None:
    """One Adam update; hyper = [lr, beta1, beta2, eps, weight_decay] (float64). ``skip``: a float32
    flag on the device (the loss scaler's), nonzero to leave everything as it is."""
    _contiguous("adam", p, g, m, v)
    n = int(p.size)
    _kernel("nn_adam")(_grid(n, OPT_ITEMS), (THREADS,), (p, g, m, v, hyper, counter, np.int32(first), np.int64(n),
                                                         _or_null(skip)))


def sgd(p: Any, g: Any, velocity: Any, hyper: Any, counter: Any, first: bool = True, skip: Any = None) -> None:
    """One SGD update; hyper = [lr, momentum, weight_decay, nesterov].

    velocity has p's size even without momentum: the kernel reads it always (writes it only with
    momentum), so that its loads need not wait for the momentum to be read.
    """
    _contiguous("sgd", p, g, velocity)
    n = int(p.size)
    if int(velocity.size) != n:
        raise ValueError(f"sgd: velocity has {velocity.size} elements, the parameters {n}")
    _kernel("nn_sgd")(_grid(n, OPT_ITEMS), (THREADS,), (p, g, velocity, hyper, counter, np.int32(first), np.int64(n),
                                                        _or_null(skip)))


def rprop(p: Any, g: Any, step: Any, prev: Any, hyper: Any, counter: Any, first: bool = True, skip: Any = None) -> None:
    """One iRprop- update; hyper = [eta_plus, eta_minus, step_min, step_max]."""
    _contiguous("rprop", p, g, step, prev)
    n = int(p.size)
    _kernel("nn_rprop")(_grid(n, OPT_ITEMS), (THREADS,),
                        (p, g, step, prev, hyper, counter, np.int32(first), np.int64(n), _or_null(skip)))
