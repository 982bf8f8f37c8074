"""Data sets from local files: IDX (MNIST, Fashion-MNIST) and CIFAR-10's python batches.

Nothing is downloaded: Fashion-MNIST comes from Debian's package ``dataset-fashion-mnist``
(installed under /usr/share/datasets/fashion-mnist), the others from a directory you give.
Images are returned as float32 in [0, 1], NCHW; labels as int64.

``fit_to_input`` adapts images to a network's input: the 2010 paper scaled MNIST's 28x28
digits up to 256x256 (bilinear ``resize``), and a 3-channel network gets the grey channel
replicated (``to_channels``).
"""
from __future__ import annotations

import gzip
import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")
MNIST_CLASSES = tuple(str(d) for d in range(10))
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# IDX type codes (the third magic byte) -> big-endian numpy dtypes.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class ImageDataset:
    """Train and test splits: x as float32 (n, C, H, W) in [0, 1], y as int64 class indices."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def limit(self, n: int | None) -> "ImageDataset":
        """The first ``n`` samples of each split (all of them for None)."""
        if n is None:
            return self
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"limit must be an integer >= 1, got {n!r}")
        return ImageDataset(self.name, self.x_train[:n], self.y_train[:n], self.x_test[:n], self.y_test[:n],
                            self.class_names)

    def standardize(self) -> "ImageDataset":
        """Both splits shifted and scaled per channel to zero mean and unit variance, with the
        statistics of the training split only (the test split must not inform training)."""
        axes = (0, 2, 3) if self.x_train.ndim == 4 else (0,)
        mean = self.x_train.mean(axis=axes, keepdims=True, dtype=np.float64)
        std = self.x_train.std(axis=axes, keepdims=True, dtype=np.float64)
        std = np.where(std > 0, std, 1.0)
        scale = lambda x: ((x - mean) / std).astype(self.x_train.dtype)  # noqa: E731
        return ImageDataset(self.name, scale(self.x_train), self.y_train, scale(self.x_test), self.y_test,
                            self.class_names)

    def fit_to(self, input_shape: Sequence[int]) -> "ImageDataset":
        """Both splits resized and channel-adapted to a network's (C, H, W) input."""
        return ImageDataset(self.name, fit_to_input(self.x_train, input_shape), self.y_train,
                            fit_to_input(self.x_test, input_shape), self.y_test, self.class_names)


# -- IDX ----------------------------------------------------------------------------------------------

def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: corrupt gzip data ({exc})") from None
    return raw


def read_idx(path: str | Path) -> np.ndarray:
    """The array in an IDX file (raw or gzip-compressed), in native byte order.

    Format: two zero bytes, a type code, the number of dimensions, each dimension as a
    big-endian uint32, then the data; anything else is an error naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no IDX file at {path}")
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(f"{path}: not an IDX file ({len(data)} bytes, shorter than the 4-byte magic)")
    if data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (magic {data[:4].hex()}; expected 0000 followed by a type "
                         f"code in {', '.join(f'{c:02x}' for c in _IDX_DTYPES)} and the number of dimensions)")
    ndim = data[3]
    if ndim < 1:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(data)} bytes, {header} needed for {ndim} dimensions)")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(f"{path}: IDX data is {len(data) - header} bytes, the header's shape {shape} of "
                         f"{dtype.str} needs {expected}")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find_idx_files(root: Path) -> tuple[dict[str, Path], list[str]]:
    found, missing = {}, []
    for key, base in IDX_FILES.items():
        for name in (base, base + ".gz"):
            if (root / name).is_file():
                found[key] = root / name
                break
        else:
            missing.append(base + "[.gz]")
    return found, missing


def _images(array: np.ndarray, path: Path) -> np.ndarray:
    if array.ndim != 3:
        raise ValueError(f"{path}: expected images (n, rows, cols), got shape {array.shape}")
    scale = 255.0 if array.dtype == np.uint8 else 1.0
    return (array.astype(np.float32) / np.float32(scale))[:, None, :, :]


def _labels(array: np.ndarray, path: Path, classes: int) -> np.ndarray:
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise ValueError(f"{path}: expected a 1-D integer label array, got {array.dtype} {array.shape}")
    labels = array.astype(np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"{path}: labels must lie in [0, {classes}), found {labels.min()}..{labels.max()}")
    return labels


def load_idx_dataset(root: str | Path, name: str, class_names: Sequence[str],
                     missing_hint: str = "") -> ImageDataset:
    """An MNIST-format data set: the four IDX files (raw or .gz) in ``root``."""
    root = Path(root)
    found, missing = _find_idx_files(root)
    if missing:
        text = f"{name} is not in {root}: missing {', '.join(missing)}"
        raise FileNotFoundError(text + (f"; {missing_hint}" if missing_hint else ""))
    classes = len(class_names)
    x_train = _images(read_idx(found["train_images"]), found["train_images"])
    y_train = _labels(read_idx(found["train_labels"]), found["train_labels"], classes)
    x_test = _images(read_idx(found["test_images"]), found["test_images"])
    y_test = _labels(read_idx(found["test_labels"]), found["test_labels"], classes)
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if len(x) != len(y):
            raise ValueError(f"{root}: the {split} split has {len(x)} images but {len(y)} labels")
    return ImageDataset(name, x_train, y_train, x_test, y_test, tuple(class_names))


def load_fashion_mnist(root: str | Path = FASHION_MNIST_ROOT) -> ImageDataset:
    """Fashion-MNIST (60000 + 10000 images, 1x28x28, 10 classes) from Debian's package files."""
    return load_idx_dataset(root, "Fashion-MNIST", FASHION_MNIST_CLASSES,
                            missing_hint=f"install Debian's package {FASHION_MNIST_PACKAGE} "
                                         f"(apt-get install {FASHION_MNIST_PACKAGE}, files go to "
                                         f"{FASHION_MNIST_ROOT}) or pass root= a directory with these files")


def load_mnist(root: str | Path) -> ImageDataset:
    """MNIST digits from the four IDX files (raw or .gz) in ``root``."""
    return load_idx_dataset(root, "MNIST", MNIST_CLASSES,
                            missing_hint="pass root= a directory with the MNIST IDX files")


# -- CIFAR-10 -----------------------------------------------------------------------------------------

class _BatchUnpickler(pickle.Unpickler):
    """Unpickles CIFAR-10 batches and nothing else: only numpy's array reconstruction may be called.

    A pickle can run arbitrary code; a data file has no business doing more than rebuilding arrays.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("_codecs", "encode"),  # protocol-2 pickles written by Python 3 spell bytes this way
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # numpy.core under numpy 2
            return super().find_class(module, name)


def read_cifar10_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 (n, 3, 32, 32) in [0, 1], labels int64) from one CIFAR-10 python batch."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no CIFAR-10 batch at {path}")
    try:
        batch = _BatchUnpickler(io.BytesIO(path.read_bytes()), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a CIFAR-10 python batch ({exc})") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: not a CIFAR-10 python batch (a {type(batch).__name__}, not a dict)")
    batch = {(k.decode() if isinstance(k, bytes) else k): v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise ValueError(f"{path}: a CIFAR-10 batch needs b'data' and b'labels', found {sorted(map(str, batch))}")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: b'data' must be uint8 of shape (n, 3072), got {data.dtype} {data.shape}")
    if labels.ndim != 1 or len(labels) != len(data) or labels.dtype.kind not in "iu":
        raise ValueError(f"{path}: b'labels' must be {len(data)} integers, got {labels.dtype} {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= 10):
        raise ValueError(f"{path}: labels must lie in [0, 10), found {labels.min()}..{labels.max()}")
    images = data.reshape(-1, 3, 32, 32).astype(np.float32) / np.float32(255.0)
    return images, labels.astype(np.int64)


def load_cifar10(root: str | Path) -> ImageDataset:
    """CIFAR-10 from data_batch_1..5 and test_batch in ``root`` (or its cifar-10-batches-py/)."""
    root = Path(root)
    if not (root / "test_batch").is_file() and (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise FileNotFoundError(f"CIFAR-10 is not in {root}: missing {', '.join(missing)}; pass root= the "
                                f"directory of the python version (cifar-10-batches-py)")
    train = [read_cifar10_batch(root / n) for n in names[:5]]
    x_test, y_test = read_cifar10_batch(root / "test_batch")
    return ImageDataset("CIFAR-10", np.concatenate([t[0] for t in train]), np.concatenate([t[1] for t in train]),
                        x_test, y_test, CIFAR10_CLASSES)


# -- adapting images to a network's input ----------------------------------------------------------------

def _axis_weights(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Half-pixel centres (align_corners=False, as PIL, OpenCV and PyTorch's default).
    pos = (np.arange(dst) + 0.5) * (src / dst) - 0.5
    pos = np.clip(pos, 0, src - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, src - 1)
    return lo, hi, (pos - lo).astype(np.float32)


def resize(images: np.ndarray, size: Sequence[int], chunk: int = 1024) -> np.ndarray:
    """Bilinear resize of the last two axes to ``size`` = (height, width); float32 result.

    Done in chunks of images so the temporaries stay small next to the result.
    """
    images = np.asarray(images)
    if images.ndim < 2:
        raise ValueError(f"resize needs images with at least 2 dimensions (..., H, W), got {images.shape}")
    if images.dtype.kind not in "fiu":
        raise TypeError(f"resize needs numeric images, got dtype {images.dtype}")
    if len(size) != 2 or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1 for s in size):
        raise ValueError(f"size must be (height, width) of positive integers, got {size!r}")
    h, w = int(size[0]), int(size[1])
    H, W = images.shape[-2:]
    if (H, W) == (h, w):
        return images.astype(np.float32, copy=False)
    lead = images.shape[:-2]
    flat = images.reshape(-1, H, W)
    rl, rh, rf = _axis_weights(H, h)
    cl, ch, cf = _axis_weights(W, w)
    out = np.empty((len(flat), h, w), dtype=np.float32)
    for start in range(0, len(flat), chunk):
        block = flat[start:start + chunk].astype(np.float32)
        rows = block[:, rl, :] * (1 - rf)[None, :, None] + block[:, rh, :] * rf[None, :, None]
        out[start:start + chunk] = rows[:, :, cl] * (1 - cf) + rows[:, :, ch] * cf
    return out.reshape(*lead, h, w)


def to_channels(images: np.ndarray, channels: int) -> np.ndarray:
    """(n, c, H, W) with ``channels`` channels: 1 -> c replicates the grey channel, c -> 1 averages."""
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"to_channels needs (n, C, H, W) images, got shape {images.shape}")
    c = images.shape[1]
    if c == channels:
        return images
    if c == 1:
        return np.repeat(images, channels, axis=1)
    if channels == 1:
        return images.mean(axis=1, keepdims=True, dtype=np.float32)
    raise ValueError(f"cannot turn {c} channels into {channels}: only 1 -> any and any -> 1 are defined")


def fit_to_input(images: np.ndarray, input_shape: Sequence[int]) -> np.ndarray:
    """Images (n, c, h, w) resized and channel-adapted to a network's (C, H, W) input."""
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {tuple(input_shape)}")
    C, H, W = (int(s) for s in input_shape)
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"fit_to_input needs (n, C, H, W) images, got shape {images.shape}")
    # Change the channel count after resizing when replicating (less to resize), before when averaging.
    if images.shape[1] > C:
        images = to_channels(images, C)
    return np.ascontiguousarray(to_channels(resize(images, (H, W)), C), dtype=np.float32)
