"""The reference operations against independent formulations, on fresh random data every run.

The references decide whether a generated kernel is right, so each is checked against something
that shares none of its code: the definitions written as plain loops, finite differences of the
forward operations, and the adjoint identities that tie the backward operations to the forward.
"""
from __future__ import annotations

import subprocess
import sys
import tracemalloc
import warnings

import numpy as np
import pytest

from autocnn.kernels import reference as ref
from autocnn.kernels.problem import (
    AvgPoolBwdProblem,
    AvgPoolFwdProblem,
    ConvBwdDataProblem,
    ConvFwdProblem,
    ConvWgradProblem,
)

# -- the definitions, as loops ------------------------------------------------------------------


def out_size(size: int, lo: int, hi: int, k: int, stride: int) -> int:
    return (size + lo + hi - k) // stride + 1


def loop_conv_fwd(x, w, b, stride, pad):
    N, C, H, W = x.shape
    K, _, R, S = w.shape
    (sh, sw), (pt, pl, pb, pr) = stride, pad
    P, Q = out_size(H, pt, pb, R, sh), out_size(W, pl, pr, S, sw)
    y = np.zeros((N, K, P, Q))
    for n in range(N):
        for k in range(K):
            for p in range(P):
                for q in range(Q):
                    acc = 0.0 if b is None else b[k]
                    for c in range(C):
                        for r in range(R):
                            for s in range(S):
                                h, v = p * sh - pt + r, q * sw - pl + s
                                if 0 <= h < H and 0 <= v < W:
                                    acc += x[n, c, h, v] * w[k, c, r, s]
                    y[n, k, p, q] = acc
    return y


def loop_conv_bwd_data(dy, w, hw, stride, pad):
    """dx by gathering: input (h, v) receives dy[p, q] * w[r, s] wherever p*sh - pt + r == h."""
    N, K, P, Q = dy.shape
    _, C, R, S = w.shape
    (H, W), (sh, sw), (pt, pl, _, _) = hw, stride, pad
    dx = np.zeros((N, C, H, W))
    terms = np.zeros((H, W), dtype=int)
    for n in range(N):
        for c in range(C):
            for h in range(H):
                for v in range(W):
                    acc, count = 0.0, 0
                    for k in range(K):
                        for r in range(R):
                            for s in range(S):
                                ph, qv = h + pt - r, v + pl - s
                                if ph % sh or qv % sw:
                                    continue
                                p, q = ph // sh, qv // sw
                                if 0 <= p < P and 0 <= q < Q:
                                    acc += dy[n, k, p, q] * w[k, c, r, s]
                                    count += 1
                    dx[n, c, h, v] = acc
                    terms[h, v] = count
    return dx, terms


def loop_conv_wgrad(x, dy, rs, stride, pad):
    N, C, H, W = x.shape
    _, K, P, Q = dy.shape
    (R, S), (sh, sw), (pt, pl, _, _) = rs, stride, pad
    dw = np.zeros((K, C, R, S))
    db = np.zeros(K)
    for k in range(K):
        for n in range(N):
            for p in range(P):
                for q in range(Q):
                    db[k] += dy[n, k, p, q]
        for c in range(C):
            for r in range(R):
                for s in range(S):
                    acc = 0.0
                    for n in range(N):
                        for p in range(P):
                            for q in range(Q):
                                h, v = p * sh - pt + r, q * sw - pl + s
                                if 0 <= h < H and 0 <= v < W:
                                    acc += x[n, c, h, v] * dy[n, k, p, q]
                    dw[k, c, r, s] = acc
    return dw, db


def loop_pool_divisor(hw, window, stride, pad, p, q, count_pad):
    (H, W), (kh, kw), (sh, sw), (pt, pl, _, _) = hw, window, stride, pad
    if count_pad:
        return kh * kw
    return sum(1 for i in range(kh) for j in range(kw)
               if 0 <= p * sh - pt + i < H and 0 <= q * sw - pl + j < W)


def loop_avgpool_fwd(x, window, stride, pad, count_pad):
    N, C, H, W = x.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = window, stride, pad
    P, Q = out_size(H, pt, pb, kh, sh), out_size(W, pl, pr, kw, sw)
    y = np.zeros((N, C, P, Q))
    for n in range(N):
        for c in range(C):
            for p in range(P):
                for q in range(Q):
                    total = 0.0
                    for i in range(kh):
                        for j in range(kw):
                            h, v = p * sh - pt + i, q * sw - pl + j
                            if 0 <= h < H and 0 <= v < W:
                                total += x[n, c, h, v]
                    y[n, c, p, q] = total / loop_pool_divisor((H, W), window, stride, pad, p, q, count_pad)
    return y


def loop_avgpool_bwd(dy, hw, window, stride, pad, count_pad):
    """dx by gathering from every window that covers the input position."""
    N, C, P, Q = dy.shape
    (H, W), (kh, kw), (sh, sw), (pt, pl, _, _) = hw, window, stride, pad
    dx = np.zeros((N, C, H, W))
    terms = np.zeros((H, W), dtype=int)
    for h in range(H):
        for v in range(W):
            covering = [(p, q) for p in range(P) for q in range(Q)
                        if 0 <= h - (p * sh - pt) < kh and 0 <= v - (q * sw - pl) < kw]
            terms[h, v] = len(covering)
            for p, q in covering:
                div = loop_pool_divisor(hw, window, stride, pad, p, q, count_pad)
                dx[:, :, h, v] += dy[:, :, p, q] / div
    return dx, terms


# -- geometries ---------------------------------------------------------------------------------
# (N, C, H, W, K, R, S, stride, padding). None divides evenly where it matters: several leave the
# last input rows or columns outside every window, and stride 3 with R=2 leaves holes between them.
CONV_CASES = [
    pytest.param(1, 1, 5, 5, 1, 3, 3, (1, 1), (0, 0, 0, 0), id="plain"),
    pytest.param(3, 2, 8, 6, 5, 3, 2, (2, 1), (2, 1, 0, 1), id="asym-pad-stride2-untouched-row"),
    pytest.param(2, 3, 8, 9, 3, 2, 3, (3, 3), (1, 0, 1, 2), id="stride3-holes"),
    pytest.param(1, 2, 9, 7, 7, 4, 3, (2, 3), (3, 2, 0, 1), id="nonsquare-strides-2-3"),
    pytest.param(3, 3, 7, 5, 9, 1, 1, (2, 2), (0, 0, 0, 0), id="1x1-stride2"),
    pytest.param(2, 2, 4, 5, 3, 5, 6, (1, 1), (1, 0, 0, 1), id="filter-covers-input"),
]
# (N, C, H, W, window, stride, padding): overlapping, gapped, asymmetric, mostly-padding windows.
POOL_CASES = [
    pytest.param(1, 1, 6, 6, (2, 2), (2, 2), (0, 0, 0, 0), id="2x2s2"),
    pytest.param(3, 2, 9, 8, (3, 3), (2, 2), (1, 1, 1, 1), id="overlap-3x3s2-pad"),
    pytest.param(2, 3, 8, 7, (2, 2), (3, 3), (0, 1, 1, 0), id="gap-2x2s3-asym-pad"),
    pytest.param(1, 2, 7, 10, (3, 2), (2, 3), (2, 1, 0, 1), id="nonsquare"),
    pytest.param(2, 1, 5, 4, (5, 4), (1, 2), (4, 3, 4, 3), id="windows-mostly-padding"),
]


def conv_case_arrays(rng, N, C, H, W, K, R, S, stride, pad):
    P, Q = out_size(H, pad[0], pad[2], R, stride[0]), out_size(W, pad[1], pad[3], S, stride[1])
    return (rng.standard_normal((N, C, H, W)), rng.standard_normal((K, C, R, S)),
            rng.standard_normal(K), rng.standard_normal((N, K, P, Q)))


def pool_out_shape(N, C, H, W, window, stride, pad):
    return (N, C, out_size(H, pad[0], pad[2], window[0], stride[0]),
            out_size(W, pad[1], pad[3], window[1], stride[1]))


# -- the loops ----------------------------------------------------------------------------------


@pytest.mark.parametrize("N,C,H,W,K,R,S,stride,pad", CONV_CASES)
def test_conv_matches_loops(rng, N, C, H, W, K, R, S, stride, pad):
    x, w, b, dy = conv_case_arrays(rng, N, C, H, W, K, R, S, stride, pad)

    y = ref.conv_fwd(x, w, stride=stride, padding=pad, bias=b)
    np.testing.assert_allclose(y, loop_conv_fwd(x, w, b, stride, pad), rtol=1e-12, atol=1e-12)

    dx = ref.conv_bwd_data(dy, w, input_hw=(H, W), stride=stride, padding=pad)
    want_dx, _ = loop_conv_bwd_data(dy, w, (H, W), stride, pad)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-12)

    dw, db = ref.conv_wgrad(x, dy, kernel_hw=(R, S), stride=stride, padding=pad)
    want_dw, want_db = loop_conv_wgrad(x, dy, (R, S), stride, pad)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, want_db, rtol=1e-12, atol=1e-12)


def test_conv_bwd_data_zero_where_no_window_reaches(rng):
    # H + pt + pb - R = 8 + 2 + 0 - 3 = 7 is odd with stride 2: the last input row is read by no
    # output, so its gradient must be exactly zero (not garbage from a padded buffer).
    x, w, _, dy = conv_case_arrays(rng, 3, 2, 8, 6, 5, 3, 2, (2, 1), (2, 1, 0, 1))
    dx = ref.conv_bwd_data(dy, w, input_hw=(8, 6), stride=(2, 1), padding=(2, 1, 0, 1))
    assert np.all(dx[:, :, 7, :] == 0)
    assert np.all(dx[:, :, :7, :] != 0)
    # Stride 3 with R=2 leaves every third padded row unread.
    x, w, _, dy = conv_case_arrays(rng, 2, 3, 8, 9, 3, 2, 3, (3, 3), (1, 0, 1, 2))
    dx = ref.conv_bwd_data(dy, w, input_hw=(8, 9), stride=(3, 3), padding=(1, 0, 1, 2))
    _, terms = loop_conv_bwd_data(dy, w, (8, 9), (3, 3), (1, 0, 1, 2))
    assert (terms == 0).any() and (terms > 0).any()
    assert np.all(dx[:, :, terms == 0] == 0)
    assert np.all(dx[:, :, terms > 0] != 0)


@pytest.mark.parametrize("images_per_chunk", [1, 2])
def test_conv_batch_chunks_match_loops(rng, monkeypatch, images_per_chunk):
    # The small cases above fit in one chunk; force several, with a short last one (3 = 2 + 1).
    N, C, H, W, K, R, S, stride, pad = 3, 2, 8, 6, 5, 3, 2, (2, 1), (2, 1, 0, 1)
    x, w, b, dy = conv_case_arrays(rng, N, C, H, W, K, R, S, stride, pad)
    P, Q = dy.shape[2:]
    monkeypatch.setattr(ref, "_CPU_CHUNK_ELEMENTS", images_per_chunk * P * Q * max(S * C, K))
    np.testing.assert_allclose(ref.conv_fwd(x, w, stride=stride, padding=pad, bias=b),
                               loop_conv_fwd(x, w, b, stride, pad), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref.conv_bwd_data(dy, w, input_hw=(H, W), stride=stride, padding=pad),
                               loop_conv_bwd_data(dy, w, (H, W), stride, pad)[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref.conv_wgrad(x, dy, kernel_hw=(R, S), stride=stride, padding=pad)[0],
                               loop_conv_wgrad(x, dy, (R, S), stride, pad)[0], rtol=1e-12, atol=1e-12)


def test_conv_wgrad_without_bias_returns_no_db(rng):
    x, w, _, dy = conv_case_arrays(rng, 2, 3, 8, 9, 3, 2, 3, (3, 3), (1, 0, 1, 2))
    dw, db = ref.conv_wgrad(x, dy, kernel_hw=(2, 3), stride=3, padding=(1, 0, 1, 2), bias=False)
    assert db is None
    np.testing.assert_allclose(dw, loop_conv_wgrad(x, dy, (2, 3), (3, 3), (1, 0, 1, 2))[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,fn", [
    ("relu", lambda z: np.where(z > 0, z, 0.0)),
    ("tanh", lambda z: (np.exp(2 * z) - 1) / (np.exp(2 * z) + 1)),
    ("logistic", lambda z: 1 / (1 + np.exp(-z))),
    ("none", lambda z: z),
])
def test_conv_fwd_applies_activation_after_bias(rng, name, fn):
    x, w, b, _ = conv_case_arrays(rng, 3, 2, 8, 6, 5, 3, 2, (2, 1), (2, 1, 0, 1))
    b += 0.5  # move the pre-activations off zero on average, so a missing bias shows under relu
    y = ref.conv_fwd(x, w, stride=(2, 1), padding=(2, 1, 0, 1), bias=b, activation=name)
    want = fn(loop_conv_fwd(x, w, b, (2, 1), (2, 1, 0, 1)))
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("count_pad", [True, False])
@pytest.mark.parametrize("N,C,H,W,window,stride,pad", POOL_CASES)
def test_avgpool_matches_loops(rng, N, C, H, W, window, stride, pad, count_pad):
    x = rng.standard_normal((N, C, H, W))
    dy = rng.standard_normal(pool_out_shape(N, C, H, W, window, stride, pad))
    y = ref.avgpool_fwd(x, window=window, stride=stride, padding=pad, count_pad=count_pad)
    np.testing.assert_allclose(y, loop_avgpool_fwd(x, window, stride, pad, count_pad), rtol=1e-12, atol=1e-14)
    dx = ref.avgpool_bwd(dy, input_hw=(H, W), window=window, stride=stride, padding=pad, count_pad=count_pad)
    np.testing.assert_allclose(dx, loop_avgpool_bwd(dy, (H, W), window, stride, pad, count_pad)[0],
                               rtol=1e-12, atol=1e-14)


def test_avgpool_divisor_rule():
    # A constant image averages to the constant when only inside positions count, and is diluted
    # by the padding when they all count: at the 3x3 corner window with 1 pixel of padding, 4 of
    # the 9 positions are inside.
    x = np.ones((1, 1, 5, 5))
    inside = ref.avgpool_fwd(x, window=3, stride=2, padding=1, count_pad=False)
    counted = ref.avgpool_fwd(x, window=3, stride=2, padding=1, count_pad=True)
    np.testing.assert_array_equal(inside, np.ones((1, 1, 3, 3)))
    assert counted[0, 0, 0, 0] == pytest.approx(4 / 9, abs=1e-15)
    assert counted[0, 0, 1, 1] == 1.0


# -- finite differences -------------------------------------------------------------------------


def central_difference(f, a, index, eps):
    old = a[index]
    a[index] = old + eps
    up = f()
    a[index] = old - eps
    down = f()
    a[index] = old
    return (up - down) / (2 * eps)


def random_indices(rng, shape, count=5):
    return [tuple(int(rng.integers(0, d)) for d in shape) for _ in range(count)]


@pytest.mark.parametrize("N,C,H,W,K,R,S,stride,pad", CONV_CASES[1:4])
def test_conv_gradients_match_finite_differences(rng, N, C, H, W, K, R, S, stride, pad):
    x, w, b, g = conv_case_arrays(rng, N, C, H, W, K, R, S, stride, pad)

    def loss():
        return float(np.sum(ref.conv_fwd(x, w, stride=stride, padding=pad, bias=b) * g))

    dx = ref.conv_bwd_data(g, w, input_hw=(H, W), stride=stride, padding=pad)
    dw, db = ref.conv_wgrad(x, g, kernel_hw=(R, S), stride=stride, padding=pad)
    # The loss is linear in each argument, so central differences are exact up to rounding.
    for array, grad in ((x, dx), (w, dw), (b, db)):
        for index in random_indices(rng, array.shape):
            assert central_difference(loss, array, index, 1e-3) == pytest.approx(grad[index], rel=1e-8, abs=1e-9)


@pytest.mark.parametrize("name", ["tanh", "logistic"])
def test_layer_chain_rule_through_activation(rng, name):
    # The training library's backward step: dz = activation_grad(y, dy), then the two conv
    # backward operations on dz. Nonlinear, so the differences carry an O(eps^2) error.
    stride, pad = (2, 1), (2, 1, 0, 1)
    x, w, b, g = conv_case_arrays(rng, 3, 2, 8, 6, 5, 3, 2, stride, pad)

    def loss():
        return float(np.sum(ref.conv_fwd(x, w, stride=stride, padding=pad, bias=b, activation=name) * g))

    y = ref.conv_fwd(x, w, stride=stride, padding=pad, bias=b, activation=name)
    dz = ref.activation_grad(y, g, name)
    dx = ref.conv_bwd_data(dz, w, input_hw=(8, 6), stride=stride, padding=pad)
    dw, db = ref.conv_wgrad(x, dz, kernel_hw=(3, 2), stride=stride, padding=pad)
    for array, grad in ((x, dx), (w, dw), (b, db)):
        for index in random_indices(rng, array.shape):
            assert central_difference(loss, array, index, 1e-5) == pytest.approx(grad[index], rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("count_pad", [True, False])
@pytest.mark.parametrize("N,C,H,W,window,stride,pad", POOL_CASES[1:])
def test_avgpool_bwd_matches_finite_differences(rng, N, C, H, W, window, stride, pad, count_pad):
    x = rng.standard_normal((N, C, H, W))
    g = rng.standard_normal(pool_out_shape(N, C, H, W, window, stride, pad))
    kw = dict(window=window, stride=stride, padding=pad, count_pad=count_pad)

    def loss():
        return float(np.sum(ref.avgpool_fwd(x, **kw) * g))

    dx = ref.avgpool_bwd(g, input_hw=(H, W), **kw)
    for index in random_indices(rng, x.shape):
        assert central_difference(loss, x, index, 1e-3) == pytest.approx(dx[index], rel=1e-8, abs=1e-10)


@pytest.mark.parametrize("name", ["none", "relu", "tanh", "logistic"])
def test_activation_grad_matches_finite_differences(rng, name):
    z = rng.standard_normal((4, 3, 5, 7)) * 3
    z[np.abs(z) < 0.05] = 0.5  # keep away from relu's kink, where no derivative exists
    dy = rng.standard_normal(z.shape)
    eps = 1e-6
    numeric = dy * (ref.activation(z + eps, name) - ref.activation(z - eps, name)) / (2 * eps)
    got = ref.activation_grad(ref.activation(z, name), dy, name)
    np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-9)


def test_activation_values_and_extremes():
    z = np.array([-1000.0, -50.0, -1.0, 0.0, 0.5, 50.0, 1000.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the naive logistic overflows in exp here
        s = ref.activation(z, "logistic")
    assert np.all(np.isfinite(s))
    assert s[0] == 0.0 and s[-1] == 1.0 and s[3] == 0.5
    mid = z[1:-1]
    np.testing.assert_allclose(s[1:-1], 1 / (1 + np.exp(-mid)), rtol=1e-15, atol=1e-300)
    np.testing.assert_array_equal(ref.activation(z, "relu"), [0, 0, 0, 0, 0.5, 50, 1000])
    np.testing.assert_allclose(ref.activation(z, "tanh"), np.tanh(z), rtol=1e-15)
    out = ref.activation(z, "none")
    out[0] = 7.0  # a copy, so that a caller may write into the result
    assert z[0] == -1000.0


# -- adjoint identities -------------------------------------------------------------------------


def adjoint_error(fwd_out, probe, back_in, back_out):
    """|<A a, b> - <a, A* b>| relative to |A a| |b|, which cancellation cannot make small."""
    lhs = float(np.vdot(fwd_out, probe))
    rhs = float(np.vdot(back_in, back_out))
    return abs(lhs - rhs) / (np.linalg.norm(fwd_out) * np.linalg.norm(probe))


def random_conv_geometry(rng):
    R, S = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    sh, sw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    pad = (int(rng.integers(0, R)), int(rng.integers(0, S)), int(rng.integers(0, R)), int(rng.integers(0, S)))
    H = int(rng.integers(max(1, R - pad[0] - pad[2]), 14))
    W = int(rng.integers(max(1, S - pad[1] - pad[3]), 14))
    return (int(rng.integers(1, 4)), int(rng.integers(1, 6)), H, W, int(rng.integers(1, 11)), R, S, (sh, sw), pad)


def check_conv_adjoints(rng, N, C, H, W, K, R, S, stride, pad):
    x, w, _, y = conv_case_arrays(rng, N, C, H, W, K, R, S, stride, pad)
    fx = ref.conv_fwd(x, w, stride=stride, padding=pad)
    dx = ref.conv_bwd_data(y, w, input_hw=(H, W), stride=stride, padding=pad)
    dw, _ = ref.conv_wgrad(x, y, kernel_hw=(R, S), stride=stride, padding=pad, bias=False)
    geometry = (N, C, H, W, K, R, S, stride, pad)
    assert adjoint_error(fx, y, x, dx) < 1e-12, geometry
    assert adjoint_error(fx, y, w, dw) < 1e-12, geometry


@pytest.mark.parametrize("N,C,H,W,K,R,S,stride,pad", CONV_CASES + [
    pytest.param(4, 6, 23, 17, 11, 5, 4, (3, 2), (4, 1, 2, 3), id="larger-untouched"),
    pytest.param(2, 5, 31, 29, 13, 7, 7, (2, 2), (3, 3, 3, 3), id="larger-7x7"),
])
def test_conv_adjoint_identities(rng, N, C, H, W, K, R, S, stride, pad):
    check_conv_adjoints(rng, N, C, H, W, K, R, S, stride, pad)


def test_conv_adjoint_identities_on_random_geometries(rng):
    for _ in range(30):
        check_conv_adjoints(rng, *random_conv_geometry(rng))


@pytest.mark.parametrize("count_pad", [True, False])
@pytest.mark.parametrize("N,C,H,W,window,stride,pad", POOL_CASES + [
    pytest.param(3, 4, 33, 30, (3, 3), (2, 2), (1, 2, 1, 0), id="larger"),
])
def test_avgpool_adjoint_identity(rng, N, C, H, W, window, stride, pad, count_pad):
    x = rng.standard_normal((N, C, H, W))
    y = rng.standard_normal(pool_out_shape(N, C, H, W, window, stride, pad))
    kw = dict(window=window, stride=stride, padding=pad, count_pad=count_pad)
    fx = ref.avgpool_fwd(x, **kw)
    dx = ref.avgpool_bwd(y, input_hw=(H, W), **kw)
    assert adjoint_error(fx, y, x, dx) < 1e-12


# -- dtypes -------------------------------------------------------------------------------------


def test_float32_in_float32_out(rng):
    stride, pad = (2, 1), (2, 1, 0, 1)
    x, w, b, dy = conv_case_arrays(rng, 3, 2, 8, 6, 5, 3, 2, stride, pad)
    pool = dict(window=3, stride=2, padding=1, count_pad=False)
    py = rng.standard_normal((3, 2, 4, 3))
    ops = {
        "conv_fwd": lambda a: ref.conv_fwd(a["x"], a["w"], stride=stride, padding=pad, bias=a["b"], activation="logistic"),
        "conv_bwd_data": lambda a: ref.conv_bwd_data(a["dy"], a["w"], input_hw=(8, 6), stride=stride, padding=pad),
        "conv_wgrad.dw": lambda a: ref.conv_wgrad(a["x"], a["dy"], kernel_hw=(3, 2), stride=stride, padding=pad)[0],
        "conv_wgrad.db": lambda a: ref.conv_wgrad(a["x"], a["dy"], kernel_hw=(3, 2), stride=stride, padding=pad)[1],
        "avgpool_fwd": lambda a: ref.avgpool_fwd(a["x"], **pool),
        "avgpool_bwd": lambda a: ref.avgpool_bwd(a["py"], input_hw=(8, 6), **pool),
        "relu": lambda a: ref.activation(a["x"], "relu"),
        "logistic": lambda a: ref.activation(a["x"], "logistic"),
        "tanh_grad": lambda a: ref.activation_grad(a["x"], a["x"], "tanh"),
    }
    f64 = {"x": x, "w": w, "b": b, "dy": dy, "py": py}
    f32 = {k: v.astype(np.float32) for k, v in f64.items()}
    for name, op in ops.items():
        got = op(f32)
        assert got.dtype == np.float32, name
        want = op({k: v.astype(np.float64) for k, v in f32.items()})
        assert want.dtype == np.float64, name
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=name)


# -- errors -------------------------------------------------------------------------------------

X = np.zeros((2, 3, 8, 8))
Wt = np.zeros((4, 3, 3, 3))
DY = np.zeros((2, 4, 6, 6))  # conv output of X, Wt with stride 1, no padding
BAD_CALLS = [
    ("x.shape", lambda: ref.conv_fwd(X[0], Wt, stride=1, padding=0)),
    ("w.shape", lambda: ref.conv_fwd(X, np.zeros((4, 2, 3, 3)), stride=1, padding=0)),
    ("bias.shape", lambda: ref.conv_fwd(X, Wt, stride=1, padding=0, bias=np.zeros(3))),
    ("activation", lambda: ref.conv_fwd(X, Wt, stride=1, padding=0, activation="gelu")),
    ("w.dtype", lambda: ref.conv_fwd(X, Wt.astype(np.float32), stride=1, padding=0)),
    ("x.dtype", lambda: ref.conv_fwd(X.astype(np.int64), Wt, stride=1, padding=0)),
    ("stride", lambda: ref.conv_fwd(X, Wt, stride=0, padding=0)),
    ("stride", lambda: ref.conv_fwd(X, Wt, stride=(1, 1, 1), padding=0)),
    ("padding", lambda: ref.conv_fwd(X, Wt, stride=1, padding=(1, 1, 1))),
    ("padding", lambda: ref.conv_fwd(X, Wt, stride=1, padding=-1)),
    ("R", lambda: ref.conv_fwd(X, np.zeros((4, 3, 9, 3)), stride=1, padding=0)),
    ("dy.shape", lambda: ref.conv_bwd_data(DY[:, :, :5], Wt, input_hw=8, stride=1, padding=0)),
    ("dy.shape", lambda: ref.conv_bwd_data(DY[:, :3], Wt, input_hw=8, stride=1, padding=0)),
    ("input_hw", lambda: ref.conv_bwd_data(DY, Wt, input_hw=(8, 8, 8), stride=1, padding=0)),
    ("dy.shape", lambda: ref.conv_wgrad(X, DY[:1], kernel_hw=3, stride=1, padding=0)),
    ("dy.shape", lambda: ref.conv_wgrad(X, DY, kernel_hw=3, stride=2, padding=0)),
    ("x.shape", lambda: ref.conv_wgrad(X[None], DY, kernel_hw=3, stride=1, padding=0)),
    ("dy.dtype", lambda: ref.conv_wgrad(X, DY.astype(np.float32), kernel_hw=3, stride=1, padding=0)),
    ("padding", lambda: ref.avgpool_fwd(X, window=2, stride=2, padding=2, count_pad=False)),
    ("window", lambda: ref.avgpool_fwd(X, window=0, stride=2, padding=0, count_pad=True)),
    ("dy.shape", lambda: ref.avgpool_bwd(DY, input_hw=8, window=2, stride=2, padding=0, count_pad=True)),
    ("activation", lambda: ref.activation(X, "swish")),
    ("activation", lambda: ref.activation_grad(X, X, "softplus")),
    ("dy.shape", lambda: ref.activation_grad(X, DY, "relu")),
]


@pytest.mark.parametrize("field,call", BAD_CALLS, ids=[f"{i}-{f}" for i, (f, _) in enumerate(BAD_CALLS)])
def test_bad_arguments_raise_naming_the_argument(field, call):
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert f": {field}=" in message, message
    assert "is not allowed:" in message, message  # and says what is allowed


# -- problem-level wrappers ---------------------------------------------------------------------

GEOMETRY = dict(N=2, C=3, H=7, W=9, K=5, R=3, S=2, stride=(2, 1), padding=(1, 0, 2, 1))
PROBLEMS = [
    pytest.param(ConvFwdProblem(**GEOMETRY, bias=True, activation="tanh"), id="conv_fwd-bias-tanh"),
    pytest.param(ConvFwdProblem(**GEOMETRY, activation="relu"), id="conv_fwd-relu"),
    pytest.param(ConvBwdDataProblem(**GEOMETRY), id="conv_bwd_data"),
    pytest.param(ConvWgradProblem(**GEOMETRY), id="conv_wgrad-bias"),
    pytest.param(ConvWgradProblem(**GEOMETRY, bias=False), id="conv_wgrad-nobias"),
    pytest.param(AvgPoolFwdProblem(N=2, C=3, H=9, W=8, window=3, stride=2, padding=1, count_pad=False), id="avgpool_fwd"),
    pytest.param(AvgPoolBwdProblem(N=2, C=3, H=8, W=7, window=2, stride=3, padding=(0, 1, 1, 0)), id="avgpool_bwd"),
]


def loop_outputs(problem, inputs):
    """The problem's outputs from the loop definitions, not from the wrappers' plumbing."""
    geo = (problem.stride, problem.padding)
    if problem.op == "conv_fwd":
        z = loop_conv_fwd(inputs["x"], inputs["w"], inputs.get("bias"), *geo)
        act = {"none": lambda v: v, "relu": lambda v: np.maximum(v, 0), "tanh": np.tanh,
               "logistic": lambda v: 1 / (1 + np.exp(-v))}[problem.activation]
        return {"y": act(z)}
    if problem.op == "conv_bwd_data":
        return {"dx": loop_conv_bwd_data(inputs["dy"], inputs["w"], (problem.H, problem.W), *geo)[0]}
    if problem.op == "conv_wgrad":
        dw, db = loop_conv_wgrad(inputs["x"], inputs["dy"], (problem.R, problem.S), *geo)
        return {"dw": dw, "db": db} if problem.bias else {"dw": dw}
    if problem.op == "avgpool_fwd":
        return {"y": loop_avgpool_fwd(inputs["x"], problem.window, *geo, problem.count_pad)}
    return {"dx": loop_avgpool_bwd(inputs["dy"], (problem.H, problem.W), problem.window, *geo, problem.count_pad)[0]}


@pytest.mark.parametrize("problem", PROBLEMS)
def test_run_problem_matches_loops(rng, problem):
    inputs = {name: rng.standard_normal(shape) for name, shape in ref.input_shapes(problem).items()}
    outputs = ref.run_problem(problem, inputs)
    shapes = ref.output_shapes(problem)
    assert set(outputs) == set(shapes)
    want = loop_outputs(problem, inputs)
    for name, shape in shapes.items():
        assert outputs[name].shape == shape, name
        assert outputs[name].dtype == np.float64, name
        np.testing.assert_allclose(outputs[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_shapes_of_the_example_problem():
    # P = (7+1+2-3)//2+1 = 4, Q = (9+0+1-2)//1+1 = 9
    fwd = ConvFwdProblem(**GEOMETRY, bias=True, activation="tanh")
    assert ref.input_shapes(fwd) == {"x": (2, 3, 7, 9), "w": (5, 3, 3, 2), "bias": (5,)}
    assert ref.output_shapes(fwd) == {"y": (2, 5, 4, 9)}
    assert ref.input_shapes(ConvFwdProblem(**GEOMETRY)) == {"x": (2, 3, 7, 9), "w": (5, 3, 3, 2)}
    assert ref.input_shapes(ConvBwdDataProblem(**GEOMETRY)) == {"dy": (2, 5, 4, 9), "w": (5, 3, 3, 2)}
    assert ref.output_shapes(ConvBwdDataProblem(**GEOMETRY)) == {"dx": (2, 3, 7, 9)}
    assert ref.input_shapes(ConvWgradProblem(**GEOMETRY)) == {"x": (2, 3, 7, 9), "dy": (2, 5, 4, 9)}
    assert ref.output_shapes(ConvWgradProblem(**GEOMETRY)) == {"dw": (5, 3, 3, 2), "db": (5,)}
    assert ref.output_shapes(ConvWgradProblem(**GEOMETRY, bias=False)) == {"dw": (5, 3, 3, 2)}
    # (9+1+1-3)//2+1 = 5, (8+1+1-3)//2+1 = 4
    pool = AvgPoolFwdProblem(N=2, C=3, H=9, W=8, window=3, stride=2, padding=1)
    assert ref.input_shapes(pool) == {"x": (2, 3, 9, 8)}
    assert ref.output_shapes(pool) == {"y": (2, 3, 5, 4)}
    assert ref.input_shapes(pool.with_op("avgpool_bwd")) == {"dy": (2, 3, 5, 4)}
    assert ref.output_shapes(pool.with_op("avgpool_bwd")) == {"dx": (2, 3, 9, 8)}


@pytest.mark.parametrize("problem,output,expected", [
    (ConvFwdProblem(**GEOMETRY, bias=True, activation="tanh"), "y", 3 * 3 * 2),
    (ConvBwdDataProblem(**GEOMETRY), "dx", 2 * 2 * 5),
    (ConvWgradProblem(**GEOMETRY), "dw", 2 * 4 * 9),
    (ConvWgradProblem(**GEOMETRY), "db", 2 * 4 * 9),
    (AvgPoolFwdProblem(N=1, C=1, H=9, W=9, window=3, stride=2), "y", 9),
    (AvgPoolBwdProblem(N=1, C=1, H=9, W=9, window=3, stride=2), "dx", 4),
    (AvgPoolBwdProblem(N=1, C=1, H=9, W=9, window=(3, 2), stride=(1, 3)), "dx", 3),
    (AvgPoolBwdProblem(N=1, C=1, H=9, W=9, window=2, stride=3), "dx", 1),
])
def test_reduction_length(problem, output, expected):
    assert ref.reduction_length(problem, output) == expected


@pytest.mark.parametrize("problem", [
    ConvBwdDataProblem(**GEOMETRY),
    ConvBwdDataProblem(N=1, C=1, H=11, W=10, K=3, R=5, S=4, stride=(3, 2), padding=(2, 1, 1, 3)),
    ConvBwdDataProblem(N=1, C=1, H=9, W=9, K=2, R=2, S=2, stride=3),
])
def test_conv_bwd_data_reduction_length_is_the_largest_term_count(rng, problem):
    dy = rng.standard_normal(problem.y_shape)
    w = rng.standard_normal(problem.w_shape)
    _, terms = loop_conv_bwd_data(dy, w, (problem.H, problem.W), problem.stride, problem.padding)
    assert terms.max() == ref.reduction_length(problem, "dx")


@pytest.mark.parametrize("problem", [
    AvgPoolBwdProblem(N=1, C=1, H=9, W=9, window=3, stride=2, padding=1),
    AvgPoolBwdProblem(N=1, C=1, H=9, W=10, window=(3, 2), stride=(1, 3)),
    AvgPoolBwdProblem(N=1, C=1, H=9, W=9, window=2, stride=3),
])
def test_avgpool_bwd_reduction_length_is_the_largest_term_count(problem):
    dy = np.ones(problem.y_shape)
    _, terms = loop_avgpool_bwd(dy, (problem.H, problem.W), problem.window, problem.stride,
                                problem.padding, problem.count_pad)
    assert terms.max() == ref.reduction_length(problem, "dx")


def test_problem_wrappers_reject_bad_requests(rng):
    problem = ConvWgradProblem(**GEOMETRY, bias=False)
    with pytest.raises(ValueError, match="output_name='db'"):
        ref.reduction_length(problem, "db")
    fwd = ConvFwdProblem(**GEOMETRY, bias=True)
    inputs = {name: rng.standard_normal(shape) for name, shape in ref.input_shapes(fwd).items()}
    with pytest.raises(ValueError, match="inputs="):
        ref.run_problem(fwd, {"x": inputs["x"], "w": inputs["w"]})  # the bias is missing
    with pytest.raises(ValueError, match=r"x\.shape=\(2, 3, 9, 7\)"):
        ref.run_problem(fwd, {**inputs, "x": rng.standard_normal((2, 3, 9, 7))})


# -- scale --------------------------------------------------------------------------------------


def test_conv_memory_stays_far_below_im2col(rng):
    # A full im2col matrix of this layer is N*P*Q*C*R*S doubles (29 MB); shift-and-accumulate
    # needs the padded input, the output and bounded scratch (a few MB).
    N, C, H, K, R, pad = 4, 8, 48, 8, 7, 3
    x = rng.standard_normal((N, C, H, H))
    w = rng.standard_normal((K, C, R, R))
    dy = rng.standard_normal((N, K, H, H))
    im2col_bytes = N * H * H * C * R * R * 8
    for name, call in [
        ("conv_fwd", lambda: ref.conv_fwd(x, w, stride=1, padding=pad)),
        ("conv_bwd_data", lambda: ref.conv_bwd_data(dy, w, input_hw=H, stride=1, padding=pad)),
        ("conv_wgrad", lambda: ref.conv_wgrad(x, dy, kernel_hw=R, stride=1, padding=pad)),
    ]:
        tracemalloc.start()
        try:
            call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < im2col_bytes / 4, (name, peak, im2col_bytes)


@pytest.mark.slow
def test_large_layer_is_right(rng):
    # The largest seed layer (scherer10 L1) end to end: no time is asserted (speed belongs in
    # benchmarks), but the shift-and-accumulate formulation keeps this to seconds on 2 cores.
    N, C, H, K, R, stride, pad = 60, 4, 256, 16, 8, 2, 3
    x = rng.standard_normal((N, C, H, H))
    w = rng.standard_normal((K, C, R, R))
    y = ref.conv_fwd(x, w, stride=stride, padding=pad)
    dx = ref.conv_bwd_data(y, w, input_hw=H, stride=stride, padding=pad)
    dw, _ = ref.conv_wgrad(x, y, kernel_hw=R, stride=stride, padding=pad)
    assert y.shape == (N, K, 128, 128)
    xpad = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    for n, k, p, q in random_indices(rng, y.shape, count=20):
        patch = xpad[n, :, p * stride:p * stride + R, q * stride:q * stride + R]
        assert y[n, k, p, q] == pytest.approx(float(np.sum(patch * w[k])), rel=1e-10, abs=1e-10)
    assert adjoint_error(y, y, x, dx) < 1e-12
    assert adjoint_error(y, y, w, dw) < 1e-12


# -- array modules ------------------------------------------------------------------------------


def test_importing_the_reference_does_not_import_cupy():
    code = "import sys, autocnn.kernels.reference as r, numpy; assert r.array_module(numpy.zeros(1)) is numpy; " \
           "assert 'cupy' not in sys.modules, 'cupy imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.gpu
@pytest.mark.parametrize("gpu_chunk", [None, 1], ids=["one-chunk", "image-chunks"])
def test_cupy_matches_numpy(rng, monkeypatch, gpu_chunk):
    import cupy

    if gpu_chunk is not None:
        monkeypatch.setattr(ref, "_GPU_CHUNK_ELEMENTS", gpu_chunk)

    stride, pad = (2, 1), (2, 1, 0, 1)
    x, w, b, dy = conv_case_arrays(rng, 3, 2, 8, 6, 5, 3, 2, stride, pad)
    pool = dict(window=3, stride=2, padding=1, count_pad=False)
    py = rng.standard_normal((3, 2, 4, 3))
    calls = [
        lambda m: ref.conv_fwd(m(x), m(w), stride=stride, padding=pad, bias=m(b), activation="logistic"),
        lambda m: ref.conv_bwd_data(m(dy), m(w), input_hw=(8, 6), stride=stride, padding=pad),
        lambda m: ref.conv_wgrad(m(x), m(dy), kernel_hw=(3, 2), stride=stride, padding=pad)[0],
        lambda m: ref.conv_wgrad(m(x), m(dy), kernel_hw=(3, 2), stride=stride, padding=pad)[1],
        lambda m: ref.avgpool_fwd(m(x), **pool),
        lambda m: ref.avgpool_bwd(m(py), input_hw=(8, 6), **pool),
        lambda m: ref.activation(m(x), "relu"),
        lambda m: ref.activation_grad(m(np.tanh(x)), m(x), "tanh"),
    ]
    assert ref.array_module(cupy.zeros(1)) is cupy
    for i, call in enumerate(calls):
        got = call(cupy.asarray)
        assert isinstance(got, cupy.ndarray), i
        assert got.dtype == cupy.float64, i
        np.testing.assert_allclose(cupy.asnumpy(got), call(np.asarray), rtol=1e-12, atol=1e-12, err_msg=str(i))
