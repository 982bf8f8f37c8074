"""The float64 references of grouped and dilated convolutions (all three operations) against the
definitions written as loops over groups and taps, and, where PyTorch is installed, against its
conv2d and its gradients, on small shapes that divide nothing evenly."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn.kernels import reference as ref
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem

# (N, C, H, W, K, R, S, stride, padding, groups, dilation): depthwise, depthwise with a channel
# multiplier, grouped, each dilated or strided somewhere, none dividing evenly.
SHAPES = [
    (2, 5, 9, 7, 5, 3, 3, (1, 1), (1, 1, 1, 1), 5, (2, 2)),
    (1, 3, 11, 10, 6, 3, 2, (3, 2), (2, 1, 0, 1), 3, (2, 3)),
    (2, 15, 7, 8, 9, 3, 3, (2, 1), (1, 0, 2, 1), 3, (1, 2)),
    (1, 4, 6, 9, 4, 2, 3, (1, 2), (0, 2, 1, 0), 2, (1, 1)),
    (1, 6, 8, 8, 6, 1, 1, (1, 1), (0, 0, 0, 0), 6, (1, 1)),
]


def _problem(cls, shape, **extra):
    N, C, H, W, K, R, S, stride, padding, groups, dilation = shape
    return cls(N=N, C=C, H=H, W=W, K=K, R=R, S=S, stride=stride, padding=padding, groups=groups,
               dilation=dilation, **extra)


def loop_conv_fwd(x, w, stride, pad, groups, dilation):
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = stride, pad, dilation
    P = (H + pt + pb - (R - 1) * dh - 1) // sh + 1
    Q = (W + pl + pr - (S - 1) * dw - 1) // sw + 1
    Kg = K // groups
    y = np.zeros((N, K, P, Q))
    for n in range(N):
        for k in range(K):
            g = k // Kg
            for p in range(P):
                for q in range(Q):
                    acc = 0.0
                    for c in range(Cg):
                        for r in range(R):
                            for s in range(S):
                                h, v = p * sh - pt + r * dh, q * sw - pl + s * dw
                                if 0 <= h < H and 0 <= v < W:
                                    acc += x[n, g * Cg + c, h, v] * w[k, c, r, s]
                    y[n, k, p, q] = acc
    return y


def loop_conv_bwd_data(dy, w, hw, stride, pad, groups, dilation):
    """dx by scattering each dy[n, k, p, q] back onto the inputs its window read."""
    N, K, P, Q = dy.shape
    _, Cg, R, S = w.shape
    (H, W), (sh, sw), (pt, pl, _, _), (dh, dw) = hw, stride, pad, dilation
    Kg = K // groups
    dx = np.zeros((N, Cg * groups, H, W))
    for n in range(N):
        for k in range(K):
            g = k // Kg
            for p in range(P):
                for q in range(Q):
                    for c in range(Cg):
                        for r in range(R):
                            for s in range(S):
                                h, v = p * sh - pt + r * dh, q * sw - pl + s * dw
                                if 0 <= h < H and 0 <= v < W:
                                    dx[n, g * Cg + c, h, v] += dy[n, k, p, q] * w[k, c, r, s]
    return dx


def loop_conv_wgrad(x, dy, kernel_hw, stride, pad, groups, dilation):
    N, C, H, W = x.shape
    _, K, P, Q = dy.shape
    (R, S), (sh, sw), (pt, pl, _, _), (dh, dw) = kernel_hw, stride, pad, dilation
    Cg, Kg = C // groups, K // groups
    dwt = np.zeros((K, Cg, R, S))
    for k in range(K):
        g = k // Kg
        for c in range(Cg):
            for r in range(R):
                for s in range(S):
                    acc = 0.0
                    for n in range(N):
                        for p in range(P):
                            for q in range(Q):
                                h, v = p * sh - pt + r * dh, q * sw - pl + s * dw
                                if 0 <= h < H and 0 <= v < W:
                                    acc += dy[n, k, p, q] * x[n, g * Cg + c, h, v]
                    dwt[k, c, r, s] = acc
    return dwt


def _inputs(problem, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape) for name, shape in ref.input_shapes(problem).items()}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"C{s[1]}g{s[9]}d{s[10][0]}{s[10][1]}")
def test_grouped_references_match_the_loops(shape):
    fwd = _problem(ConvFwdProblem, shape)
    args = dict(stride=fwd.stride, pad=fwd.padding, groups=fwd.groups, dilation=fwd.dilation)
    inputs = _inputs(fwd, 1)
    y = ref.run_problem(fwd, inputs)["y"]
    assert y.shape == fwd.y_shape
    np.testing.assert_allclose(y, loop_conv_fwd(inputs["x"], inputs["w"], **args), rtol=1e-12, atol=1e-12)

    bwd = _problem(ConvBwdDataProblem, shape)
    inputs = _inputs(bwd, 2)
    dx = ref.run_problem(bwd, inputs)["dx"]
    assert dx.shape == bwd.x_shape
    np.testing.assert_allclose(dx, loop_conv_bwd_data(inputs["dy"], inputs["w"], (bwd.H, bwd.W), **args),
                               rtol=1e-12, atol=1e-12)

    wgrad = _problem(ConvWgradProblem, shape)
    inputs = _inputs(wgrad, 3)
    out = ref.run_problem(wgrad, inputs)
    assert out["dw"].shape == wgrad.w_shape
    np.testing.assert_allclose(out["dw"], loop_conv_wgrad(inputs["x"], inputs["dy"], (wgrad.R, wgrad.S), **args),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["db"], inputs["dy"].sum(axis=(0, 2, 3)), rtol=1e-12)


def test_dense_path_takes_dilation_as_the_grouped_one_does():
    # groups=1 runs the BLAS path, groups>1 the per-tap one: a dilated dense problem split into
    # groups of one whole is the same sums.
    shape = (2, 4, 10, 9, 3, 3, 2, (2, 1), (1, 1, 2, 0), 1, (3, 2))
    fwd = _problem(ConvFwdProblem, shape)
    inputs = _inputs(fwd, 4)
    np.testing.assert_allclose(ref.run_problem(fwd, inputs)["y"],
                               loop_conv_fwd(inputs["x"], inputs["w"], fwd.stride, fwd.padding, 1, fwd.dilation),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"C{s[1]}g{s[9]}d{s[10][0]}{s[10][1]}")
def test_grouped_references_match_torch(shape):
    torch = pytest.importorskip("torch")
    fwd = _problem(ConvFwdProblem, shape)
    pt, pl, pb, pr = fwd.padding
    inputs = _inputs(fwd, 5)
    x = torch.tensor(inputs["x"], requires_grad=True)
    w = torch.tensor(inputs["w"], requires_grad=True)
    # torch pads symmetrically: pad explicitly, then convolve unpadded.
    xpad = torch.nn.functional.pad(x, (pl, pr, pt, pb))
    y = torch.nn.functional.conv2d(xpad, w, stride=fwd.stride, dilation=fwd.dilation, groups=fwd.groups)
    np.testing.assert_allclose(ref.run_problem(fwd, inputs)["y"], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    dy = torch.tensor(np.random.default_rng(6).standard_normal(tuple(y.shape)))
    y.backward(dy)
    bwd = _problem(ConvBwdDataProblem, shape)
    np.testing.assert_allclose(ref.run_problem(bwd, {"dy": dy.numpy(), "w": inputs["w"]})["dx"],
                               x.grad.numpy(), rtol=1e-12, atol=1e-12)
    wgrad = _problem(ConvWgradProblem, shape)
    np.testing.assert_allclose(ref.run_problem(wgrad, {"x": inputs["x"], "dy": dy.numpy()})["dw"],
                               w.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_reduction_lengths_count_a_groups_channels_and_the_taps_that_reach_an_input():
    fwd = ConvFwdProblem(N=1, C=12, H=9, W=9, K=6, R=3, S=3, groups=3)
    assert ref.reduction_length(fwd, "y") == 4 * 9
    # Stride 2, dilation 2: every tap of an axis lands on the same phase, so all 3 reach an input.
    bwd = ConvBwdDataProblem(N=1, C=4, H=11, W=11, K=8, R=3, S=3, stride=2, dilation=2, groups=4)
    assert ref.reduction_length(bwd, "dx") == 3 * 3 * 2
    # Stride 2, dilation 1: every other tap, as before dilation existed.
    bwd = ConvBwdDataProblem(N=1, C=4, H=11, W=11, K=8, R=3, S=3, stride=2, groups=4)
    assert ref.reduction_length(bwd, "dx") == 2 * 2 * 2


def test_reference_refuses_groups_that_do_not_divide_the_channels():
    x, w = np.zeros((1, 6, 5, 5)), np.zeros((4, 2, 3, 3))
    with pytest.raises(ValueError, match="groups=4 is not allowed: a divisor of C=6"):
        ref.conv_fwd(x, w, stride=1, padding=0, groups=4)
    with pytest.raises(ValueError, match=r"w.shape=\(4, 2, 3, 3\) is not allowed: \(K, C/groups, R, S\)"):
        ref.conv_fwd(x, w, stride=1, padding=0, groups=2)
