"""Exact reference implementations of the five operations, for NumPy and CuPy arrays alike.

They serve twice: in float64 they are the ground truth a generated kernel is checked against, and
in float32 they are the CPU backend of the training library. So they compute in the dtype they
are given, and never in a wider one behind the caller's back.

Convolutions use "shift and accumulate": the input is zero-padded once; filter offset (r, s)
reads the strided view xpad[:, :, r::sh, s::sw] (P x Q positions of it), and its contribution
is that view times the (C x K) slice W[:, :, r, s]. The S views of one filter row r are copied
side by side into a scratch block and multiplied by W[:, :, r, :] in one matrix product, over a
chunk of the batch at a time. That keeps BLAS (or cuBLAS) doing the arithmetic on products
large enough to use it well, while memory stays a few times the input; a full im2col matrix
would be R*S times the input and does not fit for the larger layers.

Grouped convolutions (``groups`` > 1; filters K x C/groups x R x S) take one tap at a time too,
as one batched product over the groups (einsum), and ``dilation`` (dh, dw) moves tap (r, s) to the
view starting at (r*dh, s*dw).

Layouts: activations NCHW, filters KCRS, padding (top, left, bottom, right), stride (sh, sw). The
problem-level wrappers (input_shapes, run_problem) take and give arrays in the problem's layout
(autocnn/layout.py: NHWC with KRSC filters too), moved to NCHW around these functions.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy

from autocnn.errors import InvalidProblemError
from autocnn.kernels.problem import ACTIVATIONS, ReferenceProblem
from autocnn.layout import DEFAULT_LAYOUT, layout_of

# numpy.ndarray or cupy.ndarray: CuPy is optional, so it cannot appear in the annotations.
Array = Any

# Elements of the largest per-chunk temporary. On the CPU the batch is cut into chunks so that
# the accumulator and the scratch block of one chunk stay in cache across the R passes (measured
# 2-3x faster than whole-batch passes on the large layers of the brief); on a GPU every pass is
# a few kernel launches, so chunks are made large enough that launches do not dominate.
_CPU_CHUNK_ELEMENTS = 1 << 18
_GPU_CHUNK_ELEMENTS = 1 << 24


def array_module(a: Array) -> Any:
    """``cupy`` for a CuPy array, otherwise ``numpy``; CuPy is imported only when one is passed."""
    if type(a).__module__.startswith("cupy"):
        import cupy  # type: ignore[import-not-found]

        return cupy
    return numpy


# -- argument checks ----------------------------------------------------------------------------

def _ints(op: str, name: str, value: Any, sizes: Sequence[int], minimum: int, meaning: str) -> tuple[int, ...]:
    """Normalise an int or a tuple of ints to a tuple; ``sizes`` lists the accepted lengths, the
    first being the full one (a shorter one is repeated, as frameworks spell "the same everywhere")."""
    vals = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    full = sizes[0]
    if len(vals) not in sizes:
        raise InvalidProblemError(op, name, value, meaning)
    # bool is an int in Python, and numpy integers are not: accept the latter, refuse the former.
    if any(isinstance(v, bool) or not isinstance(v, (int, numpy.integer)) or v < minimum for v in vals):
        raise InvalidProblemError(op, name, value, f"{meaning}, each an integer >= {minimum}")
    vals = tuple(int(v) for v in vals)
    if len(vals) == 1:
        vals = vals * full
    elif len(vals) == 2 and full == 4:  # (height, width) means top=bottom, left=right
        vals = (vals[0], vals[1], vals[0], vals[1])
    return vals


def _pair(op: str, name: str, value: Any) -> tuple[int, int]:
    return _ints(op, name, value, (2, 1), 1, "one integer or two (height, width)")  # type: ignore[return-value]


def _padding(op: str, value: Any) -> tuple[int, int, int, int]:
    return _ints(op, "padding", value, (4, 1, 2), 0,  # type: ignore[return-value]
                 "one integer, two (height, width) or four (top, left, bottom, right)")


def _check_array(op: str, name: str, a: Any, layout: str) -> None:
    ndim = len(layout.split(","))
    shape = getattr(a, "shape", None)
    if shape is None or not hasattr(a, "dtype"):
        raise InvalidProblemError(op, name, type(a).__name__, "a NumPy or CuPy array")
    if len(shape) != ndim:
        raise InvalidProblemError(op, f"{name}.shape", tuple(shape), f"{ndim} dimensions ({layout})")
    if numpy.dtype(a.dtype).kind != "f":
        raise InvalidProblemError(op, f"{name}.dtype", str(a.dtype), "a floating-point dtype")


def _check_same_kind(op: str, first: tuple[str, Array], *others: tuple[str, Array | None]) -> Any:
    """All arrays share the first one's dtype and array module; returns that module.

    A mixed-dtype call would make NumPy promote silently, and the float32 backend would then run
    (and return) float64 without anyone noticing.
    """
    name0, a0 = first
    xp = array_module(a0)
    for name, a in others:
        if a is None:
            continue
        if a.dtype != a0.dtype:
            raise InvalidProblemError(op, f"{name}.dtype", str(a.dtype), f"{a0.dtype}, the dtype of {name0}")
        if array_module(a) is not xp:
            raise InvalidProblemError(op, name, type(a).__module__ + "." + type(a).__name__,
                                      f"an array of the same library as {name0} ({xp.__name__})")
    return xp


def _out_size(op: str, name: str, size: int, pad_lo: int, pad_hi: int, k: int, stride: int) -> int:
    if size + pad_lo + pad_hi < k:
        raise InvalidProblemError(op, name, k, f"at most the padded size {size}+{pad_lo}+{pad_hi}")
    return (size + pad_lo + pad_hi - k) // stride + 1


def _check_activation(op: str, name: str) -> None:
    if name not in ACTIVATIONS:
        raise InvalidProblemError(op, "activation", name, f"one of {', '.join(ACTIVATIONS)}")


def _chunk(xp: Any, n: int, per_image: int) -> int:
    target = _CPU_CHUNK_ELEMENTS if xp is numpy else _GPU_CHUNK_ELEMENTS
    return max(1, min(n, target // max(1, per_image)))


def _buffers(xp: Any, dtype: Any, *shapes: tuple[int, ...]) -> tuple[Array, ...]:
    # Scratch arrays reused by every filter row and chunk. Allocating the gathered block and the
    # product afresh each time cost more than the matrix product itself where the OS hands out
    # freshly zeroed pages (4x slower, measured in a VM), and adds allocator churn on a GPU.
    return tuple(xp.empty(shape, dtype=dtype) for shape in shapes)


def _padded_nhwc(xp: Any, x: Array, padding: tuple[int, int, int, int]) -> Array:
    # Channels last, so that each strided view gathers contiguous C-vectors and reshapes into the
    # (pixels x C) operand of one matrix product.
    n, c, h, w = x.shape
    pt, pl, pb, pr = padding
    xpad = xp.zeros((n, h + pt + pb, w + pl + pr, c), dtype=x.dtype)
    xpad[:, pt:pt + h, pl:pl + w, :] = x.transpose(0, 2, 3, 1)
    return xpad


def _window(start: int, stride: int, count: int) -> slice:
    # The rows (or columns) that output positions 0..count-1 read at one filter offset.
    return slice(start, start + stride * (count - 1) + 1, stride)


def _groups(op: str, groups: Any, **channels: int) -> int:
    if isinstance(groups, bool) or not isinstance(groups, (int, numpy.integer)) or groups < 1:
        raise InvalidProblemError(op, "groups", groups, "an integer >= 1")
    for name, count in channels.items():
        if count % groups:
            raise InvalidProblemError(op, "groups", groups, f"a divisor of {name}={count}")
    return int(groups)


def _extent(size: int, dilation: int) -> int:
    # The span of a filter of ``size`` taps dilated by ``dilation``.
    return (size - 1) * dilation + 1


def _grouped_taps(R: int, S: int, dilation: tuple[int, int], stride: tuple[int, int], P: int, Q: int):
    """Each tap (r, s) with the rows and columns of the padded input its P x Q outputs read."""
    for r in range(R):
        for s in range(S):
            yield r, s, _window(r * dilation[0], stride[0], P), _window(s * dilation[1], stride[1], Q)


# -- activations --------------------------------------------------------------------------------

def activation(z: Array, name: str) -> Array:
    """The elementwise activation ``name`` of ``z``, in ``z``'s dtype."""
    _check_activation("activation", name)
    return _activate(z, name)


def _activate(z: Array, name: str) -> Array:
    # Separate from ``activation`` because conv_fwd's keyword argument of that name hides it.
    xp = array_module(z)
    if name == "none":
        return z.copy()
    if name == "relu":
        return xp.maximum(z, 0)
    if name == "tanh":
        return xp.tanh(z)
    # exp(-|z|) never overflows, and both branches are accurate where they are used; the naive
    # 1/(1+exp(-z)) overflows (with a warning) for z below about -710 in float64, -88 in float32.
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1 / (1 + e), e / (1 + e))


def activation_grad(y: Array, dy: Array, name: str) -> Array:
    """The gradient with respect to the pre-activation, from the activation's OUTPUT ``y``.

    Kernels keep only y, not z, so the derivative is written in terms of y: relu dy*(y>0),
    tanh dy*(1-y^2), logistic dy*y*(1-y).
    """
    _check_activation("activation_grad", name)
    if tuple(y.shape) != tuple(dy.shape):
        raise InvalidProblemError("activation_grad", "dy.shape", tuple(dy.shape), f"y's shape {tuple(y.shape)}")
    _check_same_kind("activation_grad", ("y", y), ("dy", dy))
    if name == "none":
        return dy.copy()
    if name == "relu":
        return dy * (y > 0)
    if name == "tanh":
        return dy * (1 - y * y)
    return dy * y * (1 - y)


# -- convolution --------------------------------------------------------------------------------

def conv_fwd(x: Array, w: Array, *, stride: Any, padding: Any, bias: Array | None = None,
             activation: str = "none", groups: int = 1, dilation: Any = 1) -> Array:
    """y = act(conv(x, w) + bias): x (N,C,H,W), w (K,C/groups,R,S), bias (K,) -> y (N,K,P,Q)."""
    op = "conv_fwd"
    _check_array(op, "x", x, "N,C,H,W")
    _check_array(op, "w", w, "K,C,R,S")
    N, C, H, W = x.shape
    K, Cw, R, S = w.shape
    G = _groups(op, groups, C=C, K=K)
    dh, dw = _pair(op, "dilation", dilation)
    if Cw * G != C:
        raise InvalidProblemError(op, "w.shape", tuple(w.shape), f"(K, C/groups, R, S) with C/groups={C // G} as in x")
    if bias is not None:
        _check_array(op, "bias", bias, "K")
        if tuple(bias.shape) != (K,):
            raise InvalidProblemError(op, "bias.shape", tuple(bias.shape), f"({K},): one value per filter")
    _check_activation(op, activation)
    xp = _check_same_kind(op, ("x", x), ("w", w), ("bias", bias))
    sh, sw = _pair(op, "stride", stride)
    pad = _padding(op, padding)
    P = _out_size(op, "R", H, pad[0], pad[2], _extent(R, dh), sh)
    Q = _out_size(op, "S", W, pad[1], pad[3], _extent(S, dw), sw)

    xpad = _padded_nhwc(xp, x, pad)
    if G > 1:
        xg = xpad.reshape(*xpad.shape[:3], G, Cw)
        wg = w.reshape(G, K // G, Cw, R, S)
        acc5 = xp.zeros((N, P, Q, G, K // G), dtype=x.dtype)
        for r, s, rows, cols in _grouped_taps(R, S, (dh, dw), (sh, sw), P, Q):
            acc5 += xp.einsum("npqgc,gkc->npqgk", xg[:, rows, cols], wg[:, :, :, r, s])
        out = acc5.reshape(N, P, Q, K)
        return _conv_fwd_epilogue(xp, out, bias, activation)
    wt = xp.ascontiguousarray(w.transpose(2, 3, 1, 0)).reshape(R, S * C, K)
    out = xp.zeros((N, P, Q, K), dtype=x.dtype)
    step = _chunk(xp, N, P * Q * max(S * C, K))
    cols, prod = _buffers(xp, x.dtype, (step, P, Q, S, C), (step * P * Q, K))
    for n0 in range(0, N, step):
        n = min(step, N - n0)
        m = n * P * Q
        acc = out[n0:n0 + n].reshape(m, K)  # a view: accumulating into it fills ``out``
        for r in range(R):
            rows = _window(r * dh, sh, P)
            for s in range(S):
                cols[:n, :, :, s, :] = xpad[n0:n0 + n, rows, _window(s * dw, sw, Q), :]
            xp.matmul(cols[:n].reshape(m, S * C), wt[r], out=prod[:m])
            acc += prod[:m]
    return _conv_fwd_epilogue(xp, out, bias, activation)


def _conv_fwd_epilogue(xp: Any, out: Array, bias: Array | None, activation: str) -> Array:
    # out: the (N, P, Q, K) sums.
    if bias is not None:
        out += bias
    y = xp.ascontiguousarray(out.transpose(0, 3, 1, 2))
    if activation == "none":
        return y
    return _activate(y, activation)


def conv_bwd_data(dy: Array, w: Array, *, input_hw: Any, stride: Any, padding: Any, groups: int = 1,
                  dilation: Any = 1) -> Array:
    """dx = the gradient of sum(conv(x, w) * dy) with respect to x: dy (N,K,P,Q) -> dx (N,C,H,W).

    Computed as the exact adjoint of conv_fwd's shift-and-accumulate: each offset's part of the
    product dy @ W[:, :, r, :] is added back onto the strided positions conv_fwd read it from.
    Padding positions are then cut off, and rows or columns no window reaches keep their zero.
    """
    op = "conv_bwd_data"
    _check_array(op, "dy", dy, "N,K,P,Q")
    _check_array(op, "w", w, "K,C,R,S")
    xp = _check_same_kind(op, ("dy", dy), ("w", w))
    H, W = _pair(op, "input_hw", input_hw)
    sh, sw = _pair(op, "stride", stride)
    pad = _padding(op, padding)
    pt, pl, pb, pr = pad
    N, K, P, Q = dy.shape
    Kw, C, R, S = w.shape
    G = _groups(op, groups, K=Kw)
    dh, dw = _pair(op, "dilation", dilation)
    expect = (N, Kw, _out_size(op, "R", H, pt, pb, _extent(R, dh), sh),
              _out_size(op, "S", W, pl, pr, _extent(S, dw), sw))
    if tuple(dy.shape) != expect:
        raise InvalidProblemError(
            op, "dy.shape", tuple(dy.shape),
            f"the conv output shape (N, K, P, Q) = {expect} for w {tuple(w.shape)}, input_hw {(H, W)}, "
            f"stride {(sh, sw)}, padding {pad}, dilation {(dh, dw)}")
    if G > 1:
        dyg = xp.ascontiguousarray(dy.transpose(0, 2, 3, 1)).reshape(N, P, Q, G, K // G)
        wg = w.reshape(G, K // G, C, R, S)
        dxg = xp.zeros((N, H + pt + pb, W + pl + pr, G, C), dtype=dy.dtype)
        for r, s, rows, cols in _grouped_taps(R, S, (dh, dw), (sh, sw), P, Q):
            target = dxg[:, rows, cols]   # a view, as below
            target += xp.einsum("npqgk,gkc->npqgc", dyg, wg[:, :, :, r, s])
        dxpad = dxg.reshape(N, H + pt + pb, W + pl + pr, G * C)
        return xp.ascontiguousarray(dxpad[:, pt:pt + H, pl:pl + W, :].transpose(0, 3, 1, 2))

    dy2 = xp.ascontiguousarray(dy.transpose(0, 2, 3, 1))  # (N, P, Q, K): row blocks of dy per chunk
    wt = xp.ascontiguousarray(w.transpose(2, 0, 3, 1)).reshape(R, K, S * C)
    dxpad = xp.zeros((N, H + pt + pb, W + pl + pr, C), dtype=dy.dtype)
    step = _chunk(xp, N, P * Q * max(S * C, K))
    (prod,) = _buffers(xp, dy.dtype, (step * P * Q, S * C))
    for n0 in range(0, N, step):
        n = min(step, N - n0)
        m = n * P * Q
        g = dy2[n0:n0 + n].reshape(m, K)
        for r in range(R):
            rows = _window(r * dh, sh, P)
            xp.matmul(g, wt[r], out=prod[:m])
            parts = prod[:m].reshape(n, P, Q, S, C)
            for s in range(S):
                # Through a named view: ``a[idx] += b`` would also write the view back onto itself.
                target = dxpad[n0:n0 + n, rows, _window(s * dw, sw, Q), :]
                target += parts[:, :, :, s, :]
    return xp.ascontiguousarray(dxpad[:, pt:pt + H, pl:pl + W, :].transpose(0, 3, 1, 2))


def conv_wgrad(x: Array, dy: Array, *, kernel_hw: Any, stride: Any, padding: Any,
               bias: bool = True, groups: int = 1, dilation: Any = 1) -> tuple[Array, Array | None]:
    """(dw, db): the gradients of sum((conv(x, w) + b) * dy) with respect to w (K,C/groups,R,S) and b (K,).

    ``db`` is None when ``bias`` is false.
    """
    op = "conv_wgrad"
    _check_array(op, "x", x, "N,C,H,W")
    _check_array(op, "dy", dy, "N,K,P,Q")
    xp = _check_same_kind(op, ("x", x), ("dy", dy))
    R, S = _pair(op, "kernel_hw", kernel_hw)
    sh, sw = _pair(op, "stride", stride)
    pad = _padding(op, padding)
    N, C, H, W = x.shape
    K = dy.shape[1]
    G = _groups(op, groups, C=C, K=K)
    dh, dw_ = _pair(op, "dilation", dilation)
    expect = (N, K, _out_size(op, "kernel_hw", H, pad[0], pad[2], _extent(R, dh), sh),
              _out_size(op, "kernel_hw", W, pad[1], pad[3], _extent(S, dw_), sw))
    if tuple(dy.shape) != expect:
        raise InvalidProblemError(
            op, "dy.shape", tuple(dy.shape),
            f"the conv output shape (N, K, P, Q) = {expect} for x {tuple(x.shape)}, kernel_hw {(R, S)}, "
            f"stride {(sh, sw)}, padding {pad}, dilation {(dh, dw_)}")
    P, Q = expect[2], expect[3]
    db = dy.sum(axis=(0, 2, 3)) if bias else None

    xpad = _padded_nhwc(xp, x, pad)
    if G > 1:
        xg = xpad.reshape(*xpad.shape[:3], G, C // G)
        dyg = xp.ascontiguousarray(dy.transpose(0, 2, 3, 1)).reshape(N, P, Q, G, K // G)
        dwg = xp.zeros((G, K // G, C // G, R, S), dtype=x.dtype)
        for r, s, rows, cols in _grouped_taps(R, S, (dh, dw_), (sh, sw), P, Q):
            dwg[:, :, :, r, s] = xp.einsum("npqgk,npqgc->gkc", dyg, xg[:, rows, cols])
        return dwg.reshape(K, C // G, R, S), db
    dy2 = xp.ascontiguousarray(dy.transpose(0, 2, 3, 1))  # (N, P, Q, K)
    dw = xp.zeros((R, K, S * C), dtype=x.dtype)
    step = _chunk(xp, N, P * Q * max(S * C, K))
    cols, prod = _buffers(xp, x.dtype, (step, P, Q, S, C), (K, S * C))
    for n0 in range(0, N, step):
        n = min(step, N - n0)
        m = n * P * Q
        gT = dy2[n0:n0 + n].reshape(m, K).T
        for r in range(R):
            rows = _window(r * dh, sh, P)
            for s in range(S):
                cols[:n, :, :, s, :] = xpad[n0:n0 + n, rows, _window(s * dw_, sw, Q), :]
            xp.matmul(gT, cols[:n].reshape(m, S * C), out=prod)
            dw[r] += prod
    dw = xp.ascontiguousarray(dw.reshape(R, K, S, C).transpose(1, 3, 0, 2))
    return dw, db


# -- average pooling ----------------------------------------------------------------------------

def _pool_geometry(op: str, hw: tuple[int, int], window: Any, stride: Any, padding: Any
                   ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int], int, int]:
    kh, kw = _pair(op, "window", window)
    sh, sw = _pair(op, "stride", stride)
    pad = _padding(op, padding)
    # A window entirely in the padding would average nothing (a division by zero without
    # count_pad); the problem classes refuse it for the same reason.
    if max(pad[0], pad[2]) >= kh or max(pad[1], pad[3]) >= kw:
        raise InvalidProblemError(op, "padding", pad, f"each side smaller than the window {(kh, kw)}")
    P = _out_size(op, "window", hw[0], pad[0], pad[2], kh, sh)
    Q = _out_size(op, "window", hw[1], pad[1], pad[3], kw, sw)
    return (kh, kw), (sh, sw), pad, P, Q


def _pool_divisor(xp: Any, dtype: Any, hw: tuple[int, int], window: tuple[int, int],
                  stride: tuple[int, int], pad: tuple[int, int, int, int], P: int, Q: int,
                  count_pad: bool) -> Any:
    """kh*kw, or the (P, Q) array of how many window positions fall inside the image."""
    if count_pad:
        return window[0] * window[1]

    def inside(size: int, k: int, s: int, lo: int, count: int) -> Array:
        start = xp.arange(count) * s - lo
        return xp.minimum(start + k, size) - xp.maximum(start, 0)

    rows = inside(hw[0], window[0], stride[0], pad[0], P)
    cols = inside(hw[1], window[1], stride[1], pad[1], Q)
    return (rows[:, None] * cols[None, :]).astype(dtype)


def avgpool_fwd(x: Array, *, window: Any, stride: Any, padding: Any, count_pad: bool) -> Array:
    """y (N,C,P,Q): the mean of each window of x (N,C,H,W); see ``count_pad`` in PoolProblem."""
    op = "avgpool_fwd"
    _check_array(op, "x", x, "N,C,H,W")
    xp = array_module(x)
    N, C, H, W = x.shape
    (kh, kw), (sh, sw), pad, P, Q = _pool_geometry(op, (H, W), window, stride, padding)
    pt, pl, pb, pr = pad
    xpad = xp.zeros((N, C, H + pt + pb, W + pl + pr), dtype=x.dtype)
    xpad[:, :, pt:pt + H, pl:pl + W] = x
    acc = xp.zeros((N, C, P, Q), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            acc += xpad[:, :, _window(i, sh, P), _window(j, sw, Q)]
    return acc / _pool_divisor(xp, x.dtype, (H, W), (kh, kw), (sh, sw), pad, P, Q, count_pad)


def avgpool_bwd(dy: Array, *, input_hw: Any, window: Any, stride: Any, padding: Any,
                count_pad: bool) -> Array:
    """dx (N,C,H,W): the exact adjoint of avgpool_fwd applied to dy (N,C,P,Q)."""
    op = "avgpool_bwd"
    _check_array(op, "dy", dy, "N,C,P,Q")
    xp = array_module(dy)
    H, W = _pair(op, "input_hw", input_hw)
    N, C = dy.shape[:2]
    (kh, kw), (sh, sw), pad, P, Q = _pool_geometry(op, (H, W), window, stride, padding)
    if tuple(dy.shape) != (N, C, P, Q):
        raise InvalidProblemError(
            op, "dy.shape", tuple(dy.shape),
            f"the pooling output shape (N, C, P, Q) = {(N, C, P, Q)} for input_hw {(H, W)}, "
            f"window {(kh, kw)}, stride {(sh, sw)}, padding {pad}")
    pt, pl, pb, pr = pad
    g = dy / _pool_divisor(xp, dy.dtype, (H, W), (kh, kw), (sh, sw), pad, P, Q, count_pad)
    dxpad = xp.zeros((N, C, H + pt + pb, W + pl + pr), dtype=dy.dtype)
    for i in range(kh):
        for j in range(kw):
            target = dxpad[:, :, _window(i, sh, P), _window(j, sw, Q)]  # a view, as in conv_bwd_data
            target += g
    return xp.ascontiguousarray(dxpad[:, :, pt:pt + H, pl:pl + W])


# -- problem-level wrappers ---------------------------------------------------------------------

_FILTERS = ("w", "dw")   # the tensors of a convolution's filter shape; the other 4-D ones are activations


def _in_layout(problem: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The logical (NCHW, KCRS) shapes of the five operations' tensors as the problem's layout holds them."""
    layout = layout_of(problem)
    return {name: (layout.filter_shape(shape) if name in _FILTERS else layout.activation_shape(shape))
            if len(shape) == 4 else shape for name, shape in shapes.items()}


def input_shapes(problem: Any) -> dict[str, tuple[int, ...]]:
    """The arrays ``run_problem`` takes for ``problem``, by name, with their shapes (in the problem's
    layout: an NHWC problem's x is N x H x W x C, its filters K x R x S x C)."""
    if isinstance(problem, ReferenceProblem):
        return problem.input_shapes()
    return _in_layout(problem, _logical_inputs(problem))


def _logical_inputs(problem: Any) -> dict[str, tuple[int, ...]]:
    op = problem.op
    if op == "conv_fwd":
        shapes = {"x": problem.x_shape, "w": problem.w_shape}
        if problem.bias:
            shapes["bias"] = (problem.K,)
        return shapes
    if op == "conv_bwd_data":
        return {"dy": problem.y_shape, "w": problem.w_shape}
    if op == "conv_wgrad":
        return {"x": problem.x_shape, "dy": problem.y_shape}
    if op == "avgpool_fwd":
        return {"x": problem.x_shape}
    if op == "avgpool_bwd":
        return {"dy": problem.y_shape}
    raise InvalidProblemError("reference", "op", op, "a problem from autocnn.kernels.problem")


def output_shapes(problem: Any) -> dict[str, tuple[int, ...]]:
    """The arrays ``run_problem`` returns for ``problem``, by name, with their shapes (in the
    problem's layout, as input_shapes)."""
    if isinstance(problem, ReferenceProblem):
        return problem.output_shapes()
    return _in_layout(problem, _logical_outputs(problem))


def _logical_outputs(problem: Any) -> dict[str, tuple[int, ...]]:
    op = problem.op
    if op == "conv_fwd":
        return {"y": problem.y_shape}
    if op == "conv_bwd_data":
        return {"dx": problem.x_shape}
    if op == "conv_wgrad":
        return {"dw": problem.w_shape, **({"db": (problem.K,)} if problem.bias else {})}
    if op == "avgpool_fwd":
        return {"y": problem.y_shape}
    if op == "avgpool_bwd":
        return {"dx": problem.x_shape}
    raise InvalidProblemError("reference", "op", op, "a problem from autocnn.kernels.problem")


def run_problem(problem: Any, inputs: Mapping[str, Array]) -> dict[str, Array]:
    """Compute ``problem``'s outputs from ``inputs`` (named as in ``input_shapes``).

    The computation runs in the inputs' dtype, not ``problem.dtype``: verification passes float64
    copies of the float32 data the kernel saw.
    """
    expected = input_shapes(problem)
    if set(inputs) != set(expected):
        raise InvalidProblemError(problem.op, "inputs", sorted(inputs), f"exactly {sorted(expected)}")
    for name, shape in expected.items():
        got = tuple(getattr(inputs[name], "shape", ()))
        if got != shape:
            raise InvalidProblemError(problem.op, f"{name}.shape", got, f"{shape} for {problem.shape_string()}")

    if isinstance(problem, ReferenceProblem):
        return problem.reference(inputs)
    # The references compute in NCHW (KCRS filters): another layout's arrays are moved there and
    # the outputs moved back, so every layout is checked against the same float64 arithmetic.
    layout = layout_of(problem)
    if layout is DEFAULT_LAYOUT:
        return _run_nchw(problem, inputs)
    nchw = {name: layout.to_nchw(a, filters=name in _FILTERS) if a.ndim == 4 else a for name, a in inputs.items()}
    return {name: layout.from_nchw(a, filters=name in _FILTERS) if a.ndim == 4 else a
            for name, a in _run_nchw(problem, nchw).items()}


def _run_nchw(problem: Any, inputs: Mapping[str, Array]) -> dict[str, Array]:
    op = problem.op
    geo = {"stride": problem.stride, "padding": problem.padding}
    if op in ("conv_fwd", "conv_bwd_data", "conv_wgrad"):
        geo.update(groups=problem.groups, dilation=problem.dilation)
    if op == "conv_fwd":
        return {"y": conv_fwd(inputs["x"], inputs["w"], bias=inputs.get("bias"),
                              activation=problem.activation, **geo)}
    if op == "conv_bwd_data":
        return {"dx": conv_bwd_data(inputs["dy"], inputs["w"], input_hw=(problem.H, problem.W), **geo)}
    if op == "conv_wgrad":
        dw, db = conv_wgrad(inputs["x"], inputs["dy"], kernel_hw=(problem.R, problem.S),
                            bias=problem.bias, **geo)
        return {"dw": dw, "db": db} if problem.bias else {"dw": dw}
    pool = {"window": problem.window, "count_pad": problem.count_pad, **geo}
    if op == "avgpool_fwd":
        return {"y": avgpool_fwd(inputs["x"], **pool)}
    return {"dx": avgpool_bwd(inputs["dy"], input_hw=(problem.H, problem.W), **pool)}


def reduction_length(problem: Any, output_name: str) -> int:
    """How many products are summed into one element of output ``output_name``.

    Error bounds for verification scale with this. For the backward operations it is the largest
    count over the output (border elements sum fewer terms).
    """
    op = problem.op
    outputs = output_shapes(problem)
    if output_name not in outputs:
        raise InvalidProblemError(op, "output_name", output_name, f"one of {', '.join(outputs)}")
    if isinstance(problem, ReferenceProblem):
        return problem.reduction_length(output_name)
    sh, sw = problem.stride
    if op == "conv_fwd":
        return problem.C // problem.groups * problem.R * problem.S
    if op == "conv_bwd_data":
        # Of the taps along an axis, every (stride / gcd(stride, dilation))-th reaches one input.
        dh, dw = problem.dilation
        taps_h = math.ceil(problem.R / (sh // math.gcd(sh, dh)))
        taps_w = math.ceil(problem.S / (sw // math.gcd(sw, dw)))
        return taps_h * taps_w * problem.K // problem.groups
    if op == "conv_wgrad":
        return problem.N * problem.P * problem.Q
    kh, kw = problem.window
    if op == "avgpool_fwd":
        return kh * kw
    return math.ceil(kh / sh) * math.ceil(kw / sw)
