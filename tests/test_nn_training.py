"""nn.train end to end on small Fashion-MNIST-format files written here."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn import nn
from autocnn.nn import Sequential

from .test_nn_data import write_mnist_like


@pytest.fixture
def fashion_root(tmp_path):
    write_mnist_like(tmp_path / "fashion", n_train=48, n_test=20, seed=3)
    return tmp_path / "fashion"


def test_train_lenet5_reports_every_epoch(fashion_root, capsys):
    report = nn.train("lenet5", data_root=fashion_root, epochs=2, batch_size=16, seed=0, verbose=True)
    assert isinstance(report, nn.TrainingReport)
    assert report.network == "lenet5" and report.dataset == "Fashion-MNIST" and report.backend == "numpy"
    assert report.train_samples == 48 and report.test_samples == 20
    assert report.history.epochs == 2 and len(report.test_accuracy) == 2
    assert all(0.0 <= a <= 1.0 for a in report.test_accuracy)
    assert report.final_test_accuracy == report.history.val_accuracy[-1]
    assert report.seconds > 0
    assert "conv_fwd" in report.dispatch_report and "numpy reference (CPU)" in report.dispatch_report
    assert "final test accuracy" in report.summary()
    assert report.to_dict()["history"]["loss"] == report.history.loss
    err = capsys.readouterr().err  # tqdm's progress bars
    assert "epoch 1/2" in err and "epoch 2/2" in err and "loss=" in err and "val_acc=" in err


def test_train_fits_images_to_the_network(fashion_root):
    # kriz09 takes 3x32x32: the 1x28x28 images are resized and the channel replicated.
    report = nn.train("kriz09", data_root=fashion_root, epochs=1, batch_size=16, limit=16, optimizer="rprop",
                      verbose=False)
    assert report.train_samples == 16 and report.test_samples == 16
    assert "C=3,H=32,W=32" in report.dispatch_report


def test_train_is_reproducible_with_a_seed(fashion_root):
    a = nn.train("chellapilla06", data_root=fashion_root, epochs=1, batch_size=16, seed=4, verbose=False)
    b = nn.train("chellapilla06", data_root=fashion_root, epochs=1, batch_size=16, seed=4, verbose=False)
    assert a.history.loss == b.history.loss and a.test_accuracy == b.test_accuracy


def test_train_accepts_a_model(fashion_root):
    model = Sequential([nn.Flatten(), nn.Dense(784, 10)], input_shape=(1, 28, 28), seed=0)
    report = nn.train(model, data_root=fashion_root, epochs=1, batch_size=8, optimizer=nn.SGD(lr=0.1),
                      verbose=False)
    assert report.network == "model" and report.history.epochs == 1
    assert "no convolution or pooling layers" in report.dispatch_report


def test_train_errors(fashion_root, tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        nn.train("lenet5", data_root=tmp_path / "none", verbose=False)
    with pytest.raises(ValueError, match="unknown data set 'imagenet'"):
        nn.train("lenet5", dataset="imagenet", verbose=False)
    with pytest.raises(ValueError, match="data_root"):
        nn.train("lenet5", dataset="mnist", verbose=False)
    with pytest.raises(ValueError, match="memory_limit_gib.*limit="):
        nn.train("scherer10", data_root=fashion_root, memory_limit_gib=0.001, verbose=False)
    with pytest.raises(ValueError, match="rprop has no learning rate"):
        nn.train("lenet5", data_root=fashion_root, optimizer="rprop", lr=0.1, verbose=False)
    five_classes = Sequential([nn.Flatten(), nn.Dense(784, 5)], input_shape=(1, 28, 28))
    with pytest.raises(ValueError, match="5 outputs but Fashion-MNIST has 10 classes"):
        nn.train(five_classes, data_root=fashion_root, verbose=False)


def test_load_dataset_by_name(fashion_root):
    ds = nn.load_dataset("Fashion-MNIST", fashion_root)
    assert ds.x_train.shape == (48, 1, 28, 28)
    assert np.issubdtype(ds.y_train.dtype, np.integer)


def test_train_fuse_option(fashion_root, tmp_path):
    """fuse=False reaches the model (and `autocnn train --no-fuse` passes it); a wrong value is refused
    before any data is read."""
    report = nn.train("lenet5", data_root=fashion_root, epochs=1, batch_size=16, seed=0, verbose=False, fuse=False)
    assert report.model.fuse is False
    assert nn.train("lenet5", data_root=fashion_root, epochs=1, batch_size=16, seed=0, verbose=False).model.fuse
    with pytest.raises(TypeError, match="fuse must be True, False or None"):
        nn.train("lenet5", data_root=tmp_path / "none", fuse="no", verbose=False)
    from autocnn.cli import build_parser

    args = build_parser().parse_args(["train", "--network", "lenet5", "--no-fuse"])
    assert args.no_fuse is True
