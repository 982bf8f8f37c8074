"""Data readers on small files written here (IDX raw and gzip, CIFAR-10 pickles) and image adaptation."""
from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from autocnn.nn import data as nndata
from autocnn.nn import fit_to_input, load_cifar10, load_fashion_mnist, load_mnist, read_cifar10_batch, read_idx
from autocnn.nn import resize, to_channels

IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B, np.dtype(">i4"): 0x0C,
             np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def idx_bytes(array: np.ndarray) -> bytes:
    array = np.asarray(array)
    big = array.astype(array.dtype.newbyteorder(">")) if array.dtype.itemsize > 1 else array
    header = bytes([0, 0, IDX_CODES[big.dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + big.tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> Path:
    raw = idx_bytes(array)
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


def write_mnist_like(root: Path, n_train: int, n_test: int, seed: int = 0, compress_train: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, size=n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, size=n_test, dtype=np.uint8),
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        # Mixed on purpose: the training files gzip-compressed (as Debian ships them), the test files raw.
        write_idx(root / name, array, compress=compress_train and name.startswith("train"))
    return arrays


# -- IDX ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trip(tmp_path, dtype, compress):
    array = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    if dtype == np.uint8:
        array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / "a.idx", array, compress=compress)
    got = read_idx(path)
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative
    np.testing.assert_array_equal(got, array)


def test_read_idx_rejects_bad_files(tmp_path):
    good = idx_bytes(np.zeros((2, 3), dtype=np.uint8))
    cases = {
        "magic.idx": (b"\x01\x00" + good[2:], "not an IDX file"),
        "type.idx": (good[:2] + b"\x07" + good[3:], "not an IDX file"),
        "short.idx": (b"\x00\x00", "shorter than the 4-byte magic"),
        "header.idx": (good[:6], "truncated IDX header"),
        "truncated.idx": (good[:-1], r"5 bytes.*needs 6"),
        "extra.idx": (good + b"\x00", r"7 bytes.*needs 6"),
        "badgzip.idx": (b"\x1f\x8b" + b"garbage", "corrupt gzip"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=message) as info:
            read_idx(tmp_path / name)
        assert name in str(info.value)
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "missing.idx")


def test_load_fashion_mnist_from_written_files(tmp_path):
    arrays = write_mnist_like(tmp_path, n_train=6, n_test=4)
    ds = load_fashion_mnist(tmp_path)
    assert ds.x_train.shape == (6, 1, 28, 28) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (4, 1, 28, 28)
    assert ds.y_train.dtype == np.int64 and ds.y_test.shape == (4,)
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    np.testing.assert_allclose(ds.x_train[:, 0] * 255, arrays["train-images-idx3-ubyte"], atol=1e-3)
    np.testing.assert_array_equal(ds.y_test, arrays["t10k-labels-idx1-ubyte"])
    assert ds.num_classes == 10 and ds.class_names[9] == "Ankle boot"
    assert ds.limit(3).x_train.shape[0] == 3 and ds.limit(3).x_test.shape[0] == 3


def test_load_mnist_same_format(tmp_path):
    write_mnist_like(tmp_path, n_train=3, n_test=2, compress_train=False)
    ds = load_mnist(tmp_path)
    assert ds.name == "MNIST" and ds.x_train.shape == (3, 1, 28, 28) and ds.class_names[0] == "0"


def test_missing_fashion_mnist_names_the_debian_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist") as info:
        load_fashion_mnist(tmp_path / "nowhere")
    assert "train-images-idx3-ubyte" in str(info.value)
    # One file missing is named too.
    write_mnist_like(tmp_path / "partial", n_train=2, n_test=2)
    os.remove(tmp_path / "partial" / "t10k-labels-idx1-ubyte")
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte") as info:
        load_fashion_mnist(tmp_path / "partial")
    assert "train-images" not in str(info.value)


def test_mismatched_image_and_label_counts(tmp_path):
    write_mnist_like(tmp_path, n_train=3, n_test=2)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(5, dtype=np.uint8))
    with pytest.raises(ValueError, match="2 images but 5 labels"):
        load_mnist(tmp_path)


@pytest.mark.skipif(not Path(nndata.FASHION_MNIST_ROOT, "t10k-labels-idx1-ubyte.gz").exists(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_the_installed_fashion_mnist():
    ds = load_fashion_mnist()
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.y_test).tolist() == [1000] * 10


# -- CIFAR-10 -----------------------------------------------------------------------------------------

def write_cifar_batch(path: Path, n: int, seed: int) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, size=n)]
    with open(path, "wb") as f:
        pickle.dump({b"batch_label": b"test", b"data": data, b"labels": labels}, f)
    return data, labels


def test_read_cifar10_batch(tmp_path):
    data, labels = write_cifar_batch(tmp_path / "data_batch_1", 5, seed=0)
    x, y = read_cifar10_batch(tmp_path / "data_batch_1")
    assert x.shape == (5, 3, 32, 32) and x.dtype == np.float32
    assert y.dtype == np.int64 and y.tolist() == labels
    # Channel-major rows: the first 1024 bytes are the red plane.
    np.testing.assert_allclose(x[2, 0].ravel() * 255, data[2, :1024], atol=1e-3)
    np.testing.assert_allclose(x[2, 2].ravel() * 255, data[2, 2048:], atol=1e-3)


def test_load_cifar10(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    for i in range(1, 6):
        write_cifar_batch(root / f"data_batch_{i}", 2, seed=i)
    write_cifar_batch(root / "test_batch", 3, seed=9)
    ds = load_cifar10(tmp_path)  # finds the cifar-10-batches-py folder
    assert ds.x_train.shape == (10, 3, 32, 32) and ds.x_test.shape == (3, 3, 32, 32)
    assert ds.class_names[0] == "airplane"
    os.remove(root / "data_batch_4")
    with pytest.raises(FileNotFoundError, match="data_batch_4"):
        load_cifar10(root)


def test_cifar10_reader_rejects_bad_batches(tmp_path):
    bad = tmp_path / "bad"
    with open(bad, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(ValueError, match=r"\(n, 3072\)"):
        read_cifar10_batch(bad)
    with open(bad, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8)}, f)
    with pytest.raises(ValueError, match="labels"):
        read_cifar10_batch(bad)
    with open(bad, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, f)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        read_cifar10_batch(bad)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_cifar10_reader_refuses_code_in_pickles(tmp_path):
    path = tmp_path / "evil"
    with open(path, "wb") as f:
        pickle.dump({b"data": _Evil(), b"labels": []}, f)
    with pytest.raises(ValueError, match="refusing to load"):
        read_cifar10_batch(path)


# -- resizing and channels ----------------------------------------------------------------------------

def test_resize_bilinear_half_pixel():
    img = np.array([[0.0, 1.0], [2.0, 3.0]], dtype=np.float32)
    out = resize(img[None, None], (4, 4))[0, 0]
    # Source coordinates of the 4 outputs: -0.25, 0.25, 0.75, 1.25 -> clamped 0, 0.25, 0.75, 1.
    expected_row0 = [0.0, 0.25, 0.75, 1.0]
    np.testing.assert_allclose(out[0], expected_row0, atol=1e-6)
    np.testing.assert_allclose(out[:, 0], [0.0, 0.5, 1.5, 2.0], atol=1e-6)
    np.testing.assert_allclose(out[3], [2.0, 2.25, 2.75, 3.0], atol=1e-6)


def test_resize_preserves_constants_and_downscales():
    img = np.full((3, 2, 28, 28), 0.7, dtype=np.float32)
    big = resize(img, (256, 256), chunk=2)
    assert big.shape == (3, 2, 256, 256) and big.dtype == np.float32
    np.testing.assert_allclose(big, 0.7, rtol=1e-6)
    ramp = np.tile(np.arange(8, dtype=np.float32), (8, 1))
    half = resize(ramp, (4, 4))
    np.testing.assert_allclose(half[0], [0.5, 2.5, 4.5, 6.5], atol=1e-6)  # 2x down: mean of pairs
    with pytest.raises(ValueError, match="size"):
        resize(img, (0, 4))


def test_channels_and_fit_to_input():
    grey = np.random.default_rng(0).random((2, 1, 28, 28), dtype=np.float32)
    rgb = to_channels(grey, 3)
    assert rgb.shape == (2, 3, 28, 28)
    np.testing.assert_array_equal(rgb[:, 2], grey[:, 0])
    np.testing.assert_allclose(to_channels(rgb, 1), grey, rtol=1e-6)
    with pytest.raises(ValueError, match="3 channels into 2"):
        to_channels(rgb, 2)
    fitted = fit_to_input(grey, (3, 32, 32))
    assert fitted.shape == (2, 3, 32, 32) and fitted.dtype == np.float32 and fitted.flags.c_contiguous
    assert fit_to_input(grey, (1, 28, 28)).shape == (2, 1, 28, 28)
    assert fit_to_input(rgb, (1, 29, 29)).shape == (2, 1, 29, 29)


def test_cifar10_reader_accepts_numpy_1_protocol_2_pickles(tmp_path):
    # The distributed batches were pickled by an old numpy: arrays live in numpy.core.multiarray there.
    data = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    raw = pickle.dumps({b"data": data, b"labels": [4, 5]}, protocol=2)
    raw = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    (tmp_path / "old").write_bytes(raw)
    x, y = read_cifar10_batch(tmp_path / "old")
    assert y.tolist() == [4, 5]
    np.testing.assert_allclose(x.reshape(2, -1) * 255, data, atol=1e-3)
