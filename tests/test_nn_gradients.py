"""Finite-difference checks of every layer's gradients, the loss's and a whole model's (float64)."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn import nn
from autocnn.nn import Activation, AvgPool2d, Conv2d, Dense, Flatten, NumpyBackend, SoftmaxCrossEntropy

EPS = 1e-6
RTOL = 1e-5
ATOL = 1e-8
SAMPLES = 12  # random coordinates checked per array


def _close(numeric: float, analytic: float) -> bool:
    return abs(numeric - analytic) <= ATOL + RTOL * max(abs(numeric), abs(analytic))


def _coords(rng: np.random.Generator, shape: tuple[int, ...], k: int = SAMPLES) -> list[tuple[int, ...]]:
    flat = rng.choice(int(np.prod(shape)), size=min(k, int(np.prod(shape))), replace=False)
    return [tuple(int(i) for i in np.unravel_index(f, shape)) for f in flat]


def check_layer(layer: nn.Layer, input_shape: tuple[int, ...], rng: np.random.Generator, batch: int = 2) -> None:
    """L = sum(forward(x) * R): compare backward(R) (dx and parameter grads) with central differences."""
    backend = NumpyBackend(np.float64)
    layer.build(input_shape, batch, backend, rng)
    params = layer.params()
    for p in params.values():  # non-zero biases, so the bias path is exercised
        p[...] = rng.normal(0, 0.5, size=p.shape)
    x = rng.normal(0, 1, size=(batch, *input_shape))
    y = layer.forward(x).copy()
    R = rng.normal(0, 1, size=y.shape)
    dx = layer.backward(R)
    dx = None if dx is None else dx.copy()
    grads = {k: v.copy() for k, v in layer.grads().items()}
    assert set(grads) == set(params)

    def loss() -> float:
        return float(np.sum(layer.forward(x) * R))

    checked = 0
    targets = [("x", x, dx)] + [(k, params[k], grads[k]) for k in params]
    for name, array, analytic in targets:
        assert analytic is not None, f"{name}: no gradient computed"
        assert analytic.shape == array.shape
        for idx in _coords(rng, array.shape):
            old = array[idx]
            array[idx] = old + EPS
            up = loss()
            array[idx] = old - EPS
            down = loss()
            array[idx] = old
            numeric = (up - down) / (2 * EPS)
            assert _close(numeric, analytic[idx]), (
                f"{layer!r} d/d{name}{idx}: finite difference {numeric!r}, backward {analytic[idx]!r}")
            checked += 1
    assert checked >= SAMPLES * len(targets) // 2


@pytest.mark.parametrize("activation", ["none", "relu", "tanh", "logistic"])
def test_conv2d_each_activation(activation, rng):
    check_layer(Conv2d(3, 4, 3, padding=1, activation=activation), (3, 6, 7), rng)


@pytest.mark.parametrize("kwargs,input_shape", [
    (dict(kernel_size=3, stride=2), (2, 7, 8)),
    (dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0, 2, 1)), (2, 6, 5)),
    (dict(kernel_size=4, stride=3, padding=(2, 1, 0, 3), activation="tanh"), (2, 9, 8)),
    (dict(kernel_size=8, padding=(4, 4, 3, 3), activation="logistic"), (1, 8, 8)),
    (dict(kernel_size=3, bias=False, activation="relu"), (2, 5, 5)),
])
def test_conv2d_strides_and_padding(kwargs, input_shape, rng):
    check_layer(Conv2d(input_shape[0], 3, **kwargs), input_shape, rng)


@pytest.mark.parametrize("count_pad", [True, False])
@pytest.mark.parametrize("kwargs,input_shape", [
    (dict(window=3, stride=2, padding=(0, 0, 1, 1)), (2, 8, 8)),   # convnet18's overlapping pooling
    (dict(window=2, stride=1), (2, 5, 6)),                         # overlapping, no padding
    (dict(window=(2, 3), stride=(1, 2), padding=(1, 1, 0, 2)), (3, 5, 7)),
    (dict(window=2), (1, 6, 6)),                                   # plain non-overlapping
])
def test_avgpool2d(kwargs, input_shape, count_pad, rng):
    check_layer(AvgPool2d(count_pad=count_pad, **kwargs), input_shape, rng)


@pytest.mark.parametrize("activation", ["none", "relu", "tanh", "logistic"])
def test_dense_each_activation(activation, rng):
    check_layer(Dense(7, 5, activation=activation), (7,), rng, batch=3)


def test_dense_without_bias(rng):
    layer = Dense(6, 4, bias=False)
    check_layer(layer, (6,), rng)
    assert set(layer.params()) == {"weight"}


@pytest.mark.parametrize("activation", ["none", "relu", "tanh", "logistic"])
def test_activation_layer(activation, rng):
    check_layer(Activation(activation), (3, 4, 4), rng)


def test_flatten(rng):
    layer = Flatten()
    check_layer(layer, (2, 3, 4), rng)
    assert layer.output_shape == (24,)


def test_logistic_activation_is_stable_for_large_inputs():
    backend = NumpyBackend(np.float32)
    z = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise"):  # overflow in exp would raise here
        y = backend.activation("logistic", z, out=np.empty_like(z))
    np.testing.assert_allclose(y, [0.0, 1.9287498e-22, 0.5, 1.0, 1.0], rtol=1e-6, atol=0)


def test_first_layer_skips_the_input_gradient(rng):
    layer = Conv2d(2, 3, 3)
    layer.needs_input_grad = False
    backend = NumpyBackend(np.float64)
    layer.build((2, 5, 5), 2, backend, rng)
    assert [p.op for p in layer.problems()] == ["conv_fwd", "conv_wgrad"]
    layer.forward(rng.normal(size=(2, 2, 5, 5)))
    assert layer.backward(rng.normal(size=(2, 3, 3, 3))) is None
    assert backend.kernel_calls["conv_bwd_data"] == 0
    assert backend.kernel_calls["conv_wgrad"] == 1
    assert np.abs(layer.grads()["weight"]).sum() > 0


# -- the loss --------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_weights", [False, True])
def test_softmax_cross_entropy_gradient(with_weights, rng):
    logits = rng.normal(0, 3, size=(6, 5))
    labels = rng.integers(0, 5, size=6)
    weights = np.array([1.0, 0.0, 2.0, 0.5, 0.0, 1.0]) if with_weights else None
    loss_fn = SoftmaxCrossEntropy()
    loss, grad = loss_fn(logits, labels, weights)
    assert loss == pytest.approx(loss_fn.loss(logits, labels, weights), rel=1e-12)
    for i in range(6):
        for j in range(5):
            old = logits[i, j]
            logits[i, j] = old + EPS
            up = loss_fn.loss(logits, labels, weights)
            logits[i, j] = old - EPS
            down = loss_fn.loss(logits, labels, weights)
            logits[i, j] = old
            assert _close((up - down) / (2 * EPS), grad[i, j]), (i, j)
    if with_weights:  # zero-weight samples get no gradient at all
        assert np.all(grad[[1, 4]] == 0)


def test_softmax_cross_entropy_values():
    loss_fn = SoftmaxCrossEntropy()
    logits = np.array([[0.0, 0.0], [1000.0, 0.0]])  # the second row overflows a naive exp
    labels = np.array([0, 1])
    loss, grad = loss_fn(logits, labels)
    assert loss == pytest.approx((np.log(2) + 1000.0) / 2)
    np.testing.assert_allclose(grad, [[-0.25, 0.25], [0.5, -0.5]], atol=1e-12)
    # A mask that keeps only the first sample gives that sample's loss.
    assert loss_fn.loss(logits, labels, np.array([1.0, 0.0])) == pytest.approx(np.log(2))
    # All weights zero: nothing counts.
    loss0, grad0 = loss_fn(logits, labels, np.zeros(2))
    assert loss0 == 0.0 and np.all(grad0 == 0)


def test_loss_rejects_bad_labels():
    loss_fn = SoftmaxCrossEntropy()
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        loss_fn(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(TypeError, match="integer"):
        loss_fn(np.zeros((2, 3)), np.array([0.0, 1.0]))


def test_accuracy_helper():
    logits = np.array([[2.0, 1.0], [0.0, 3.0], [5.0, 0.0]])
    labels = np.array([0, 1, 1])
    assert nn.accuracy(logits, labels) == pytest.approx(2 / 3)
    assert nn.accuracy(logits, labels, np.array([1.0, 1.0, 0.0])) == pytest.approx(1.0)


# -- a whole model ---------------------------------------------------------------------------------

def _small_model(seed: int) -> nn.Sequential:
    layers = [Conv2d(2, 3, 3, padding=1, activation="tanh"), AvgPool2d(2), Conv2d(3, 4, 2, activation="relu"),
              Flatten(), Dense(4, 5, activation="logistic"), Dense(5, 3)]
    return nn.Sequential(layers, (2, 4, 4), dtype=np.float64, seed=seed)


def test_model_gradients_match_finite_differences(rng):
    model = _small_model(seed=1).build(4)
    x = rng.normal(size=(4, 2, 4, 4))
    y = np.array([0, 2, 1, 2])
    model.loss_and_gradients(x, y)
    grads = {k: v.copy() for k, v in model.grads().items()}
    params = model.params()
    for name, p in params.items():
        for idx in _coords(rng, p.shape, k=4):
            old = p[idx]
            p[idx] = old + EPS
            up = model.evaluate(x, y)[0]
            p[idx] = old - EPS
            down = model.evaluate(x, y)[0]
            p[idx] = old
            assert _close((up - down) / (2 * EPS), grads[name][idx]), (name, idx)


def test_padded_batch_counts_for_nothing(rng):
    """Three samples in a model built for five give exactly the gradients of a batch of three."""
    x = rng.normal(size=(3, 2, 4, 4))
    y = np.array([0, 2, 1])
    padded = _small_model(seed=3).build(5)
    exact = _small_model(seed=3).build(3)
    loss_padded = padded.loss_and_gradients(x, y)
    loss_exact = exact.loss_and_gradients(x, y)
    assert loss_padded == pytest.approx(loss_exact, rel=1e-12)
    for name, g in exact.grads().items():
        np.testing.assert_allclose(padded.grads()[name], g, rtol=1e-10, atol=1e-14, err_msg=name)
