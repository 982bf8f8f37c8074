"""A training step that never waits for the device, on the numpy backend.

Loss and accuracy stay 0-d arrays until read; fit can keep its data on the device and gather each
batch there; train_step, evaluate and predict take device arrays without host validation; the
loss, the activation gradients and the optimizers write into preallocated buffers. Every one of
these gives exactly the numbers of the plain host path (compared bit for bit here). The numpy
backend normally takes none of the device paths, so the tests force them: ``fit(device_data=True)``
and a patched ``Sequential._device_array`` that counts numpy arrays as device arrays.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from autocnn import nn
from autocnn.nn import RPROP, SGD, Adam, AvgPool2d, Conv2d, Dense, Flatten, NumpyBackend, Sequential
from autocnn.nn import fitting as model_module
from autocnn.nn.backend import activation_grad
from autocnn.nn.losses import Accuracy, SoftmaxCrossEntropy


def images(n: int, seed: int, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n)
    x = rng.normal(0.0, 0.4, size=(n, 2, 8, 8))
    for c in range(classes):
        x[y == c, c % 2, :, c * 2:c * 2 + 3] += 1.0
    return x.astype(np.float32), y


def net(seed: int = 0) -> Sequential:
    return Sequential([Conv2d(2, 4, 3, padding=1, activation="relu"), AvgPool2d(2),
                       Conv2d(4, 4, 3, padding=1, activation="tanh"), Flatten(),
                       Dense(64, 8, activation="logistic"), Dense(8, 3)], input_shape=(2, 8, 8), seed=seed)


OPTIMIZERS = {
    "adam": lambda: Adam(lr=0.01),
    "sgd": lambda: SGD(lr=0.05, momentum=0.9, nesterov=True),
    "rprop": lambda: RPROP(step_init=0.01),
}


def assert_same_weights(a: Sequential, b: Sequential) -> None:
    wa, wb = a.get_weights(), b.get_weights()
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)


@pytest.fixture
def device_numpy(monkeypatch):
    """Count numpy arrays as device arrays: train_step/evaluate/predict take the device path."""
    monkeypatch.setattr(Sequential, "_device_array", lambda self, a: isinstance(a, np.ndarray))


# -- metrics stay on the device until read ---------------------------------------------------------

def test_loss_and_accuracy_are_0d_arrays_and_floats_on_request():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    labels = rng.integers(0, 4, 6)
    weights = np.array([1, 0, 1, 1, 0.5, 1], dtype=np.float32)
    loss_fn = SoftmaxCrossEntropy()
    loss, grad = loss_fn.loss_and_grad(logits, labels, weights)
    assert isinstance(loss, np.ndarray) and loss.shape == () and loss.dtype == np.float32
    assert isinstance(loss_fn.loss(logits, labels, weights), float)
    assert loss_fn.loss(logits, labels, weights) == float(loss)
    slot = np.zeros(3, dtype=np.float32)
    loss_fn.loss_and_grad(logits, labels, weights, loss_out=slot[1, ...])
    assert slot[1] == loss and slot[0] == slot[2] == 0
    acc = nn.accuracy(logits, labels, weights)
    assert isinstance(acc, np.ndarray) and acc.shape == () and acc.dtype == np.float64
    correct = (logits.argmax(axis=1) == labels)
    assert float(acc) == float(np.float32((correct * weights).sum())) / float(weights.sum())
    assert float(nn.accuracy(logits[:0], labels[:0])) == 0.0
    assert float(nn.accuracy(logits, labels, np.zeros(6, np.float32))) == 0.0


def test_loss_and_accuracy_match_the_plain_formulas_bit_for_bit():
    # The buffered loss against the formulas it replaces (temporaries everywhere), float32 and float64.
    rng = np.random.default_rng(1)
    loss_fn, metric = SoftmaxCrossEntropy(), Accuracy()
    for trial in range(60):
        dtype = (np.float32, np.float64)[trial % 2]
        n, c = int(rng.integers(1, 40)), int(rng.integers(2, 11))
        logits = rng.normal(0, 4, size=(n, c)).astype(dtype)
        labels = rng.integers(0, c, n)
        w = None if trial % 3 == 0 else (rng.random(n) * (rng.random(n) > 0.3)).astype(dtype)
        ww = np.ones(n, dtype) if w is None else w
        shifted = logits - logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        wsum = np.maximum(ww.sum(), np.finfo(dtype).tiny)
        picked = np.take_along_axis(shifted, labels[:, None], axis=1)[:, 0]
        want_loss = np.sum(ww * (lse[:, 0] - picked)) / wsum
        want_grad = np.exp(shifted - lse)
        want_grad -= (np.arange(c)[None, :] == labels[:, None]).astype(dtype)
        want_grad *= (ww / wsum)[:, None]
        loss, grad = loss_fn.loss_and_grad(logits, labels, w)
        assert loss == want_loss and loss.dtype == want_loss.dtype
        np.testing.assert_array_equal(grad, want_grad)
        correct = (np.argmax(logits, axis=1) == labels).astype(dtype)
        if w is None:
            want_acc = float(correct.mean())
        else:
            total = float(w.sum())
            want_acc = float((correct * w).sum()) / total if total > 0 else 0.0
        assert float(metric(logits, labels, w)) == want_acc


def test_step_results_are_lazy_and_keep_their_own_values():
    x, y = images(40, seed=2)
    sync, lazy = net(4).build(8).compile(Adam(0.01)), net(4).build(8).compile(Adam(0.01))
    read_at_once = []
    for start in range(0, 40, 8):
        step = sync.train_step(x[start:start + 8], y[start:start + 8])
        read_at_once.append((step.loss, step.accuracy, step.samples))
    results = [lazy.train_step_async(x[start:start + 8], y[start:start + 8]) for start in range(0, 40, 8)]
    for r in results:
        assert r._values is None  # nothing was read yet
        assert r.loss_array.shape == () and r.accuracy_array.shape == ()
    # Read after every step ran: each result still holds its own step's values.
    assert [(r.loss, r.accuracy, r.samples) for r in results] == read_at_once
    assert all(isinstance(r.loss, float) and isinstance(r.accuracy, float) for r in results)
    assert len({r.loss for r in results}) == len(results)
    assert "loss=" in repr(results[0])
    assert_same_weights(sync, lazy)


def test_fit_history_is_the_running_mean_of_the_step_metrics():
    x, y = images(45, seed=3)  # 45 = two batches of 16 and a padded one of 13
    fitted = net(5)
    history = fitted.fit(x, y, epochs=1, batch_size=16, optimizer=SGD(0.05), shuffle=False, verbose=True)
    stepped = net(5).build(16).compile(SGD(0.05))
    loss_sum = correct_sum = seen = 0.0
    for start in range(0, 45, 16):
        step = stepped.train_step(x[start:start + 16], y[start:start + 16])
        loss_sum += step.loss * step.samples
        correct_sum += step.accuracy * step.samples
        seen += step.samples
    assert history.loss == [loss_sum / seen]
    assert history.accuracy == [correct_sum / seen]
    assert_same_weights(fitted, stepped)


def test_progress_reads_do_not_change_the_history(monkeypatch):
    x, y = images(100, seed=4)
    monkeypatch.setattr(model_module, "PROGRESS_EVERY", 3)
    a = net(1).fit(x, y, epochs=2, batch_size=8, verbose=True)
    monkeypatch.setattr(model_module, "PROGRESS_EVERY", 1000)
    b = net(1).fit(x, y, epochs=2, batch_size=8, verbose=False)
    assert (a.loss, a.accuracy) == (b.loss, b.accuracy)


# -- device-resident data in fit -------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("shuffle", [True, False])
def test_fit_with_device_data_matches_the_host_path(optimizer, shuffle):
    x, y = images(70, seed=5)   # 70 = four batches of 16 and a padded one of 6
    xv, yv = images(30, seed=6)
    histories, models = [], []
    for device_data in (False, True):
        model = net(seed=7)
        h = model.fit(x, y, epochs=3, batch_size=16, optimizer=OPTIMIZERS[optimizer](),
                      validation_data=(xv, yv), shuffle=shuffle, verbose=False, device_data=device_data)
        histories.append(h)
        models.append(model)
    host, device = histories
    for field in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert getattr(host, field) == getattr(device, field), field
    assert_same_weights(*models)
    np.testing.assert_array_equal(models[0].predict(xv), models[1].predict(xv))


def test_fit_takes_the_device_path_when_the_helper_says_the_data_fits(monkeypatch):
    x, y = images(50, seed=8)
    assert net()._device_data_fits(1) is False   # numpy never keeps a device copy
    calls = {"rows": 0, "host": 0}
    stage_rows, stage = Sequential._stage_rows, Sequential._stage

    def counting_rows(self, *args):
        calls["rows"] += 1
        return stage_rows(self, *args)

    def counting_stage(self, *args):
        calls["host"] += 1
        return stage(self, *args)

    monkeypatch.setattr(Sequential, "_stage_rows", counting_rows)
    monkeypatch.setattr(Sequential, "_stage", counting_stage)
    host = net(2).fit(x, y, epochs=2, batch_size=16, verbose=False)
    assert calls == {"rows": 0, "host": 8}
    monkeypatch.setattr(Sequential, "_device_data_fits", lambda self, nbytes: nbytes == x.nbytes + y.nbytes)
    calls.update(rows=0, host=0)
    device = net(2).fit(x, y, epochs=2, batch_size=16, verbose=False)
    assert calls == {"rows": 8, "host": 0}
    assert (host.loss, host.accuracy) == (device.loss, device.accuracy)


def test_fit_checks_the_data_once_up_front_on_the_device_path():
    x, y = images(20, seed=9)
    x[13, 0, 2, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        net().fit(x, y, batch_size=8, verbose=False, device_data=True)
    x, y = images(20, seed=9)
    y[3] = 3
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        net().fit(x, y, batch_size=8, verbose=False, device_data=True)
    with pytest.raises(ValueError, match="device_data"):
        net().fit(x, y, batch_size=8, verbose=False, device_data="yes")


# -- device arrays in train_step, evaluate and predict ---------------------------------------------

@pytest.mark.parametrize("n", [8, 5])   # a full batch and a padded one
def test_train_step_with_a_device_array_matches_a_host_array(n, monkeypatch):
    x, y = images(n, seed=10)
    host = net(3).build(8).compile(Adam(0.01))
    h1, h2 = host.train_step(x, y), host.train_step(x[::-1].copy(), y[::-1].copy())
    device = net(3).build(8).compile(Adam(0.01))
    monkeypatch.setattr(Sequential, "_device_array", lambda self, a: isinstance(a, np.ndarray))

    def no_host_checks(*args, **kwargs):
        raise AssertionError("a device array went through host validation")

    monkeypatch.setattr(model_module, "check_images", no_host_checks)
    monkeypatch.setattr(model_module, "check_labels", no_host_checks)
    d1, d2 = device.train_step(x, y), device.train_step_async(x[::-1].copy(), y[::-1].copy())
    assert (h1.loss, h1.accuracy, h1.samples) == (d1.loss, d1.accuracy, d1.samples)
    assert (h2.loss, h2.accuracy, h2.samples) == (d2.loss, d2.accuracy, d2.samples)
    assert_same_weights(host, device)


def test_a_batch_written_into_the_input_buffers_is_read_in_place(device_numpy, monkeypatch):
    x, y = images(8, seed=13)
    host = net(3).build(8).compile(Adam(0.01))
    h = [host.train_step(x, y), host.train_step(x[::-1].copy(), y[::-1].copy())]
    model = net(3).build(8).compile(Adam(0.01))
    x_buf, y_buf = model.input_buffers()
    assert x_buf.shape == (8, *model.input_shape) and y_buf.shape == (8,) and y_buf.dtype == np.int64
    copies = []
    original = model.backend.copy_into

    def copy_into(dst, src):
        if dst is x_buf or dst is y_buf:
            copies.append(dst)
        return original(dst, src)

    monkeypatch.setattr(model.backend, "copy_into", copy_into)
    d = []
    for xb, yb in ((x, y), (x[::-1], y[::-1])):
        x_buf[...] = xb
        y_buf[...] = yb
        d.append(model.train_step(x_buf, y_buf))
    assert copies == []                            # nothing staged: the step read the buffers
    assert [(r.loss, r.accuracy, r.samples) for r in h] == [(r.loss, r.accuracy, r.samples) for r in d]
    assert_same_weights(host, model)
    with pytest.raises(RuntimeError, match="build"):
        net(3).input_buffers()


def test_evaluate_and_predict_with_device_arrays_match_host_arrays(device_numpy, monkeypatch):
    x, y = images(21, seed=11)
    model = net(6)
    model.fit(*images(40, seed=12), epochs=1, batch_size=8, verbose=False)
    monkeypatch.setattr(Sequential, "_device_array", lambda self, a: False)
    want_eval, want_probs = model.evaluate(x, y, batch_size=8), model.predict(x)
    monkeypatch.setattr(Sequential, "_device_array", lambda self, a: isinstance(a, np.ndarray))
    assert model.evaluate(x, y, batch_size=8) == want_eval
    np.testing.assert_array_equal(model.predict(x), want_probs)
    # Device images with host labels (validated on the host) give the same too.
    assert model.evaluate(x, list(y)) == want_eval


def test_a_wrong_device_array_still_gets_a_clear_error(device_numpy):
    model = net().build(8).compile("sgd")
    x, y = images(8, seed=13)
    with pytest.raises(ValueError, match=r"xb has shape \(8, 2, 7, 8\), the model expects \(n, 2, 8, 8\)"):
        model.train_step(x[:, :, :7], y)
    with pytest.raises(ValueError, match=r"a batch of 9 samples does not fit the model built for batch size 8"):
        model.train_step(np.concatenate([x, x[:1]]), np.concatenate([y, y[:1]]))
    with pytest.raises(ValueError, match="yb has 7 labels for 8 samples"):
        model.train_step(x, y[:7])
    with pytest.raises(TypeError, match="floating-point"):
        model.train_step(x.astype(np.int32), y)
    with pytest.raises(ValueError, match=r"x has shape \(5, 8, 8\)"):
        model.predict(x[:5, 0])
    # Another float dtype is not staged as it is but converted on the host path, and works.
    step = model.train_step(x.astype(np.float64), y)
    assert np.isfinite(step.loss)


def test_device_labels_of_another_integer_type_are_copied_as_they_are(device_numpy):
    x, y = images(8, seed=14)
    a, b = net(2).build(8).compile("adam"), net(2).build(8).compile("adam")
    sa, sb = a.train_step(x, y), b.train_step(x, y.astype(np.int32))
    assert (sa.loss, sa.accuracy) == (sb.loss, sb.accuracy)
    assert_same_weights(a, b)


# -- fewer temporaries, same numbers ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["relu", "tanh", "logistic", "none"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_buffered_activation_gradients_match_the_backend(name, dtype):
    rng = np.random.default_rng(15)
    be = NumpyBackend(dtype)
    z = rng.normal(size=(9, 5)).astype(dtype)
    z[::3] = 0.0
    y = be.activation(name, z, out=np.empty_like(z))
    dy = rng.normal(size=z.shape).astype(dtype)
    dy[1::4] = -0.0
    want = be.activation_grad(name, y, dy, out=np.empty_like(y))
    got = activation_grad(be, name, y, dy, out=np.empty_like(y))
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def _reference_update(opt, p, g, state):
    """The optimizers' updates as written before they used preallocated buffers (temporaries)."""
    if isinstance(opt, SGD):
        d = g + opt.weight_decay * p if opt.weight_decay else g.copy()
        if opt.momentum:
            v = state.setdefault("velocity", np.zeros_like(p))
            v *= opt.momentum
            v += d
            d = d + opt.momentum * v if opt.nesterov else v.copy()
        p -= d * opt.lr
    elif isinstance(opt, Adam):
        t = state["t"] = state.get("t", 0) + 1
        m = state.setdefault("m", np.zeros_like(p))
        v = state.setdefault("v", np.zeros_like(p))
        d = g + opt.weight_decay * p if opt.weight_decay else g.copy()
        m *= opt.beta1
        m += (1.0 - opt.beta1) * d
        v *= opt.beta2
        d *= d
        d *= 1.0 - opt.beta2
        v += d
        d = np.sqrt(v)
        d /= math.sqrt(1.0 - opt.beta2 ** t)
        d += opt.eps
        d = m / d
        d *= opt.lr / (1.0 - opt.beta1 ** t)
        p -= d
    else:
        step = state.setdefault("step", np.full_like(p, opt.step_init))
        prev = state.setdefault("prev", np.zeros_like(p))
        agreement = g * prev
        same_sign, flipped = agreement > 0, agreement < 0
        step *= np.where(same_sign, opt.eta_plus, np.where(flipped, opt.eta_minus, 1.0)).astype(step.dtype)
        np.clip(step, opt.step_min, opt.step_max, out=step)
        prev[...] = g
        prev[flipped] = 0
        p -= np.sign(prev) * step


@pytest.mark.parametrize("make", [
    lambda: SGD(lr=0.1), lambda: SGD(lr=0.05, momentum=0.9, weight_decay=0.01),
    lambda: SGD(lr=0.05, momentum=0.8, nesterov=True), lambda: Adam(lr=0.01),
    lambda: Adam(lr=0.01, weight_decay=0.1), lambda: RPROP(step_init=0.01, step_max=0.03),
], ids=["sgd", "sgd-momentum", "sgd-nesterov", "adam", "adam-decay", "rprop"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_buffered_optimizer_updates_match_the_plain_formulas(make, dtype):
    rng = np.random.default_rng(16)
    shapes = {"conv.weight": (3, 2, 3, 3), "conv.bias": (3,), "dense.weight": (7, 4)}
    params = {k: rng.normal(size=s).astype(dtype) for k, s in shapes.items()}
    expected = {k: v.copy() for k, v in params.items()}
    opt, reference = make(), make()
    states: dict[str, dict] = {k: {} for k in shapes}
    for _ in range(20):
        grads = {k: (rng.normal(size=s) * (rng.random(s) > 0.2)).astype(dtype) for k, s in shapes.items()}
        kept = {k: g.copy() for k, g in grads.items()}
        opt.step(params, grads)
        for k in shapes:
            _reference_update(reference, expected[k], grads[k], states[k])
            np.testing.assert_array_equal(params[k], expected[k], err_msg=k)
            np.testing.assert_array_equal(grads[k], kept[k])  # the gradient buffers stay as computed
            assert params[k].dtype == dtype
