"""Sequential: training on synthetic data, reproducibility, persistence and input validation."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn import nn
from autocnn.nn import RPROP, SGD, Adam, AvgPool2d, Conv2d, Dense, Flatten, Sequential


def two_class_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class 0: bright left half; class 1: bright right half; plus noise. Linearly separable."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    x = rng.normal(0.0, 0.3, size=(n, 1, 8, 8))
    x[y == 0, :, :, :4] += 1.0
    x[y == 1, :, :, 4:] += 1.0
    return x.astype(np.float32), y


def small_net(seed: int | None = 0, classes: int = 2, hidden: int = 2) -> Sequential:
    return Sequential([Conv2d(1, hidden, 3, padding=1, activation="relu"), AvgPool2d(2), Flatten(),
                       Dense(hidden * 16, classes)], input_shape=(1, 8, 8), seed=seed)


# -- training --------------------------------------------------------------------------------------

def test_fit_lowers_the_loss_and_separates_two_classes():
    x, y = two_class_images(200, seed=1)
    xv, yv = two_class_images(100, seed=2)
    model = small_net(seed=0)
    before, _ = model.evaluate(xv, yv, batch_size=32)
    history = model.fit(x, y, epochs=4, batch_size=32, optimizer=Adam(lr=0.02), validation_data=(xv, yv),
                        verbose=False)
    assert history.epochs == 4
    assert len(history.val_loss) == len(history.seconds) == 4
    assert history.loss[-1] < history.loss[0]
    assert history.val_loss[-1] < before
    assert history.val_accuracy[-1] >= 0.95
    loss, acc = model.evaluate(xv, yv)
    assert acc == pytest.approx(history.val_accuracy[-1])
    assert acc >= 0.95
    probs = model.predict(xv[:7])
    assert probs.shape == (7, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert (probs.argmax(axis=1) == yv[:7]).mean() >= 0.8


@pytest.mark.parametrize("make_optimizer", [lambda: SGD(lr=0.1, momentum=0.9), lambda: RPROP(step_init=0.01)],
                         ids=["sgd", "rprop"])
def test_other_optimizers_also_learn(make_optimizer):
    x, y = two_class_images(128, seed=3)
    model = small_net(seed=1)
    history = model.fit(x, y, epochs=5, batch_size=32, optimizer=make_optimizer(), verbose=False)
    assert history.loss[-1] < history.loss[0]
    assert history.accuracy[-1] >= 0.95


def test_seed_makes_training_reproducible():
    x, y = two_class_images(70, seed=4)  # 70 = 2 full batches of 32 and a padded one of 6

    def run(seed):
        model = small_net(seed=seed)
        model.fit(x, y, epochs=2, batch_size=32, verbose=False)
        return model.get_weights()

    a, b, c = run(11), run(11), run(12)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_shuffle_changes_the_batches():
    x, y = two_class_images(64, seed=5)
    weights = []
    for shuffle in (True, False):
        model = small_net(seed=3)
        model.fit(x, y, epochs=1, batch_size=16, shuffle=shuffle, verbose=False)
        weights.append(model.get_weights())
    assert any(not np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_train_step_and_the_padded_last_batch():
    x, y = two_class_images(5, seed=6)
    model = small_net(seed=0).build(8).compile("sgd", lr=0.1)
    step = model.train_step(x, y)
    assert step.samples == 5
    assert 0.0 <= step.accuracy <= 1.0 and np.isfinite(step.loss)
    # Weighted: one sample with weight 0 changes the accounted total.
    step = model.train_step(x, y, weights=np.array([1, 1, 1, 1, 0.0]))
    assert step.samples == 4
    with pytest.raises(ValueError, match="batch size 8"):
        model.train_step(*two_class_images(9, seed=7))


def test_train_step_needs_build_and_optimizer():
    x, y = two_class_images(4, seed=8)
    model = small_net()
    with pytest.raises(RuntimeError, match="build"):
        model.train_step(x, y)
    model.build(4)
    with pytest.raises(RuntimeError, match="compile"):
        model.train_step(x, y)


def test_rebuild_keeps_the_parameters():
    x, y = two_class_images(12, seed=9)
    model = small_net(seed=0).build(4)
    before = model.predict(x)
    params = model.params()
    model.build(6)
    assert model.batch_size == 6
    for k, v in model.params().items():
        assert v is params[k]
    np.testing.assert_allclose(model.predict(x), before, rtol=1e-6)


# -- problems and dispatch -------------------------------------------------------------------------

def test_problems_are_deduplicated_in_order():
    model = Sequential([Conv2d(2, 4, 3, padding=1), Conv2d(4, 4, 3, padding=1), Conv2d(4, 4, 3, padding=1),
                        Flatten(), Dense(64, 3)], input_shape=(2, 4, 4))
    ops = [(p.op, p.C) for p in model.problems(16)]
    # The first layer needs no dX; the third repeats the second's three problems.
    assert ops == [("conv_fwd", 2), ("conv_wgrad", 2), ("conv_fwd", 4), ("conv_bwd_data", 4), ("conv_wgrad", 4)]
    assert all(p.N == 16 for p in model.problems(16))
    model.build(8)
    assert [p.N for p in model.problems()] == [8] * 5
    assert len(model.dispatch) == 5


def test_dispatch_report_names_every_layer_and_op():
    model = small_net().build(4)
    report = model.dispatch_report()
    for text in ("conv2d_1", "avgpool2d_1", "conv_fwd", "conv_wgrad", "avgpool_fwd", "numpy reference (CPU)"):
        assert text in report
    assert "conv_bwd_data" not in report  # the first layer needs no input gradient
    # avgpool_bwd is needed: the conv before it has weights
    assert "avgpool_bwd" in report
    # Dense layers are listed too, with what multiplies their matrices.
    assert "dense" in report and "numpy.matmul" in report
    with pytest.raises(RuntimeError, match="not built"):
        small_net().dispatch_report()


def test_kernel_calls_count_one_step():
    x, y = two_class_images(4, seed=10)
    model = small_net().build(4).compile("adam")
    model.backend.kernel_calls.clear()
    model.train_step(x, y)
    assert dict(model.backend.kernel_calls) == {"conv_fwd": 1, "conv_wgrad": 1, "avgpool_fwd": 1, "avgpool_bwd": 1}
    model.predict(x)
    assert model.backend.kernel_calls["conv_fwd"] == 2


# -- persistence -----------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    x, y = two_class_images(20, seed=11)
    model = small_net(seed=0)
    model.fit(x, y, epochs=1, batch_size=8, verbose=False)
    path = model.save(tmp_path / "model.npz")
    assert path.exists()
    other = small_net(seed=99)  # different initial weights
    other.load(path)  # before build: applied when built
    np.testing.assert_array_equal(other.predict(x, batch_size=8), model.predict(x, batch_size=8))
    third = small_net(seed=5).build(3)
    third.load(path)  # after build: copied into the live arrays
    np.testing.assert_allclose(third.predict(x), model.predict(x), rtol=1e-6)


def test_load_rejects_mismatched_shapes(tmp_path):
    small_net(hidden=2).build(2).save(tmp_path / "m.npz")
    other = small_net(hidden=3)
    with pytest.raises(ValueError, match=r"conv2d_1\.weight.*\(2, 1, 3, 3\).*\(3, 1, 3, 3\)"):
        other.load(tmp_path / "m.npz")


def test_load_rejects_a_different_layer_count(tmp_path):
    small_net().build(2).save(tmp_path / "m.npz")
    deeper = Sequential([Conv2d(1, 2, 3, padding=1), Conv2d(2, 2, 3, padding=1), AvgPool2d(2), Flatten(),
                         Dense(32, 2)], input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match="holds 4 layers.*has 5"):
        deeper.load(tmp_path / "m.npz")


def test_load_rejects_other_files(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="not an autocnn model file"):
        small_net().load(tmp_path / "plain.npz")
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(ValueError, match="not an autocnn model file"):
        small_net().load(tmp_path / "text.npz")
    with pytest.raises(FileNotFoundError):
        small_net().load(tmp_path / "missing.npz")
    with pytest.raises(RuntimeError, match="no parameters"):
        small_net().save(tmp_path / "unbuilt.npz")


# -- input validation ------------------------------------------------------------------------------

def test_wrong_input_shapes():
    model = small_net()
    x, y = two_class_images(4, seed=12)
    with pytest.raises(ValueError, match=r"\(4, 1, 8, 7\).*\(n, 1, 8, 8\)"):
        model.fit(x[..., :7], y, verbose=False)
    with pytest.raises(ValueError, match=r"x\[:, None\]"):
        model.predict(x[:, 0])
    with pytest.raises(ValueError, match=r"one sample"):
        model.predict(x[0])
    with pytest.raises(ValueError, match="3 labels for 4 samples"):
        model.fit(x, y[:3], verbose=False)


def test_wrong_dtypes():
    model = small_net()
    x, y = two_class_images(4, seed=13)
    with pytest.raises(TypeError, match="floating-point.*uint8.*255"):
        model.predict((x * 255).astype(np.uint8))
    with pytest.raises(TypeError, match="floating-point.*object"):
        model.predict(x.astype(object))
    with pytest.raises(TypeError, match="integer class indices.*float"):
        model.fit(x, y.astype(np.float32), verbose=False)
    with pytest.raises(ValueError, match="one-hot"):
        model.fit(x, np.eye(2)[y], verbose=False)
    # float64 is converted to the model's float32.
    assert model.predict(x.astype(np.float64)).dtype == np.float32


def test_non_finite_inputs():
    model = small_net()
    x, y = two_class_images(4, seed=14)
    x[2, 0, 1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite.*sample 2"):
        model.fit(x, y, verbose=False)
    x[2, 0, 1, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        model.evaluate(x, y)


def test_labels_out_of_range():
    model = small_net(classes=2)
    x, y = two_class_images(4, seed=15)
    y[3] = 2
    with pytest.raises(ValueError, match=r"\[0, 2\).*y\[3\] = 2"):
        model.fit(x, y, verbose=False)
    y[3] = -1
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        model.evaluate(x, y)


def test_bad_fit_arguments():
    model = small_net()
    x, y = two_class_images(4, seed=16)
    with pytest.raises(ValueError, match="epochs"):
        model.fit(x, y, epochs=0, verbose=False)
    with pytest.raises(ValueError, match="batch_size"):
        model.fit(x, y, batch_size=0, verbose=False)
    with pytest.raises(ValueError, match="validation_data"):
        model.fit(x, y, validation_data=x, verbose=False)
    with pytest.raises(ValueError, match="unknown optimizer"):
        model.fit(x, y, optimizer="adagrad", verbose=False)


def test_layer_shape_errors_name_the_layer_and_shapes():
    with pytest.raises(ValueError, match=r"Conv2d 'conv2d_2' expects input \(3, H, W\), got \(4, 8, 8\)"):
        Sequential([Conv2d(1, 4, 3, padding=1), Conv2d(3, 4, 3, padding=1), Flatten(), Dense(256, 2)],
                   input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match=r"Dense 'dense_1' expects input \(10,\), got \(2, 4, 4\).*Flatten"):
        Sequential([Conv2d(1, 2, 3, padding=1), AvgPool2d(2), Dense(10, 2)], input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match=r"Dense 'dense_1' expects input \(10,\), got \(32,\)"):
        Sequential([Conv2d(1, 2, 3, padding=1), AvgPool2d(2), Flatten(), Dense(10, 2)], input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match="one score per class"):
        Sequential([Conv2d(1, 2, 3)], input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match="cannot run on input"):
        Sequential([Conv2d(1, 2, 5), Flatten(), Dense(2, 2)], input_shape=(1, 3, 3))


def test_layer_forward_checks_the_batch_shape(rng):
    layer = Conv2d(1, 2, 3, name="c")
    layer.build((1, 5, 5), 2, nn.NumpyBackend(), rng)
    with pytest.raises(ValueError, match=r"Conv2d 'c': input has shape \(3, 1, 5, 5\), expected \(2, 1, 5, 5\)"):
        layer.forward(np.zeros((3, 1, 5, 5), dtype=np.float32))
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.zeros((2, 2, 3, 3), dtype=np.float32))


def test_layer_constructor_errors():
    with pytest.raises(ValueError, match="kernel_size"):
        Conv2d(1, 2, 0)
    with pytest.raises(ValueError, match="padding"):
        Conv2d(1, 2, 3, padding=(1, 2, 3))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        Conv2d(1, 2, 3, padding=3)
    with pytest.raises(ValueError, match="activation"):
        Dense(2, 2, activation="softmax")
    with pytest.raises(ValueError, match="in_features"):
        Dense(True, 2)
    with pytest.raises(ValueError, match="smaller than the window"):
        AvgPool2d(2, padding=2)


def test_a_layer_belongs_to_one_model():
    conv = Conv2d(1, 2, 3, padding=1)
    Sequential([conv, Flatten(), Dense(128, 2)], input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match="already belongs to a model"):
        Sequential([conv, Flatten(), Dense(128, 2)], input_shape=(1, 8, 8))
