"""The zoo networks (the seed networks, a VGG-style one and two with depthwise layers), and networks
described in JSON.

Zoo networks (input -> output shapes): the seed networks of the source documents, then vgg_cifar,
mobilenetv2_cifar and convnext_cifar.

* kriz09 -- Krizhevsky's 2009 report: 3x32x32, Conv2d 3->64 8x8 pad (4,4,3,3) logistic
  -> 64x32x32, AvgPool2d(4) -> 64x8x8, Flatten, Dense(4096, 10).
* scherer10 -- Scherer, Schulz & Behnke 2010, Table 1 first row: 1x256x256, three Conv2d 8x8
  stride 2 pad 3 tanh with 8 maps each (256 -> 128 -> 64 -> 32), Flatten, Dense(8192, 100, tanh),
  Dense(100, 10).
* convnet18 -- cuda-convnet's layers-18pct: 3x32x32, three times Conv2d 5x5 pad 2 relu (32, 32,
  64 maps) + AvgPool2d(3, stride 2, padding (0,0,1,1), count_pad=False) (32 -> 16 -> 8 -> 4),
  Flatten, Dense(1024, 10).
* chellapilla06 -- Chellapilla, Puri & Simard 2006: 1x29x29, Conv2d 1->5 5x5 stride 2 tanh
  -> 5x13x13, Conv2d 5->50 5x5 stride 2 tanh -> 50x5x5, Flatten, Dense(1250, 100, tanh),
  Dense(100, 10).
* lenet5 -- for Fashion-MNIST: 1x28x28, Conv2d 1->6 5x5 pad 2 relu, AvgPool2d(2), Conv2d 6->16
  5x5 relu, AvgPool2d(2), Flatten, Dense(400, 120, relu), Dense(120, 84, relu), Dense(84, 10).
* conv4 -- the second network of the separable-filters paper (seed 002, cuda-convnet's
  layers-conv-local-11pct without its locally connected layers): 3x32x32, Conv2d 3->64 5x5,
  AvgPool2d, Conv2d 64->64 5x5, AvgPool2d, Conv2d 64->64 3x3, Conv2d 64->32 3x3, Flatten,
  Dense(2048, 10). Chosen like convnet18's, since the paper gives only sizes and maps: 'same'
  padding (2 for 5x5, 1 for 3x3) and relu on every convolution, and convnet18's overlapping 3x3
  stride-2 averaging (padding 1, count_pad=False) that halves the map (32 -> 16 -> 8). Every
  convolution has stride 1 and a filter of at least 3x3, so ``separable=`` applies to all four.
  Like convnet18 it takes 3x32x32 images: `autocnn train` fits Fashion-MNIST's 1x28x28 to it
  (bilinear resize, the grey channel repeated; nn.data.fit_to_input).
* vgg_cifar -- a VGG-style CIFAR network with today's layer shapes: 3x32x32, three stages of two
  Conv2d 3x3 pad 1 relu (64, 128, 256 maps) each followed by AvgPool2d(2) (32 -> 16 -> 8 -> 4),
  Flatten, Dense(4096, 256, relu), Dense(256, 10). Averaging stands in for VGG's max pooling (the
  library's pooling), and there is no batch normalisation; the benchmark trains it at batch 128.
* mobilenetv2_cifar -- MobileNetV2-style (Sandler et al. 2018) at CIFAR size: 3x32x32, Conv2d 3->16
  3x3 pad 1 relu, four inverted bottlenecks (1x1 expansion x6 relu, 3x3 depthwise pad 1 relu of
  stride 2, 1, 2, 1, linear 1x1 projection: 16 -> 24 -> 24 -> 32 -> 32 maps, 32 -> 16 -> 8),
  Conv2d 32->128 1x1 relu, AvgPool2d(8), Flatten, Dense(128, 10).
* convnext_cifar -- ConvNeXt-style (Liu et al. 2022) at CIFAR size: 3x32x32, a 2x2 stride-2
  patchify Conv2d 3->32 (-> 16x16), three stages of one block (7x7 depthwise pad 3, 1x1 expansion
  x4 relu, 1x1 projection) of 32, 64, 128 maps, 2x2 stride-2 Conv2d downsampling between them
  (16 -> 8 -> 4), AvgPool2d(4), Flatten, Dense(128, 10).

  Neither has its original's normalisation layers or residual adds (autocnn.nn has neither a norm
  layer nor a branching model): their builders' docstrings say what else differs and why.

JSON networks (``network_from_json``)::

    {
      "name": "my-net",                       (optional, as are "description" and "separable")
      "input_shape": [1, 28, 28],
      "layers": [
        {"type": "conv2d", "out_channels": 6, "kernel_size": 5, "padding": 2, "activation": "relu"},
        {"type": "avgpool2d", "window": 2},
        {"type": "flatten"},
        {"type": "dense", "out_features": 10}
      ]
    }

Layer types and keys (the constructor arguments of the layer classes):

* conv2d: out_channels, kernel_size (required); in_channels, stride, padding, groups (an integer
  dividing both channel counts; in_channels for a depthwise layer), dilation (an integer or
  [height, width]), bias, activation, precision ("fp32", "tf32", "bf16" or "fp16": this layer's,
  overriding the model's, which `autocnn train/tune --precision` or ``Sequential.precision`` set),
  separable (this layer's: false, true, a rank, "energy", "energy:SHARE" or a share; see
  autocnn.separable.setting; not with groups or dilation)

The top-level "separable" (same values) is the network's setting: every eligible conv2d without its
own (``Sequential(separable=)``).
* avgpool2d: window (required); stride, padding, count_pad
* dense: out_features (required); in_features, bias, activation
* flatten: (none)
* activation: activation (required)

in_channels / in_features may be left out: they are taken from the previous layer's output
(and checked when given). Sizes are integers or lists of integers; padding is one integer,
[height, width] or [top, left, bottom, right]; activation is none, relu, tanh or logistic.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autocnn.nn.backend import Backend
from autocnn.nn.layers import Activation, AvgPool2d, Conv2d, Dense, Flatten, Layer
from autocnn.nn.model import Sequential


@dataclass(frozen=True)
class NetworkSpec:
    name: str
    input_shape: tuple[int, int, int]
    description: str
    make_layers: Callable[[], list[Layer]]


def _kriz09() -> list[Layer]:
    return [Conv2d(3, 64, 8, padding=(4, 4, 3, 3), activation="logistic"), AvgPool2d(4), Flatten(),
            Dense(4096, 10)]


def _scherer10() -> list[Layer]:
    return [Conv2d(1, 8, 8, stride=2, padding=3, activation="tanh"),
            Conv2d(8, 8, 8, stride=2, padding=3, activation="tanh"),
            Conv2d(8, 8, 8, stride=2, padding=3, activation="tanh"),
            Flatten(), Dense(8192, 100, activation="tanh"), Dense(100, 10)]


def _convnet18() -> list[Layer]:
    # Overlapping 3x3 stride-2 averaging that halves the map; padding 1 on every side with the
    # divisor counting only real pixels, as the seed suite's convnet18_pool (PyTorch can express it).
    def pool() -> AvgPool2d:
        return AvgPool2d(3, stride=2, padding=1, count_pad=False)

    return [Conv2d(3, 32, 5, padding=2, activation="relu"), pool(),
            Conv2d(32, 32, 5, padding=2, activation="relu"), pool(),
            Conv2d(32, 64, 5, padding=2, activation="relu"), pool(),
            Flatten(), Dense(1024, 10)]


def _chellapilla06() -> list[Layer]:
    return [Conv2d(1, 5, 5, stride=2, activation="tanh"), Conv2d(5, 50, 5, stride=2, activation="tanh"),
            Flatten(), Dense(1250, 100, activation="tanh"), Dense(100, 10)]


def _lenet5() -> list[Layer]:
    return [Conv2d(1, 6, 5, padding=2, activation="relu"), AvgPool2d(2),
            Conv2d(6, 16, 5, activation="relu"), AvgPool2d(2), Flatten(),
            Dense(400, 120, activation="relu"), Dense(120, 84, activation="relu"), Dense(84, 10)]


def _conv4() -> list[Layer]:
    def pool() -> AvgPool2d:
        return AvgPool2d(3, stride=2, padding=1, count_pad=False)   # as convnet18's

    return [Conv2d(3, 64, 5, padding=2, activation="relu"), pool(),
            Conv2d(64, 64, 5, padding=2, activation="relu"), pool(),
            Conv2d(64, 64, 3, padding=1, activation="relu"),
            Conv2d(64, 32, 3, padding=1, activation="relu"),
            Flatten(), Dense(32 * 8 * 8, 10)]


def _vgg_cifar() -> list[Layer]:
    layers: list[Layer] = []
    channels = 3
    for maps in (64, 128, 256):
        layers += [Conv2d(channels, maps, 3, padding=1, activation="relu"),
                   Conv2d(maps, maps, 3, padding=1, activation="relu"), AvgPool2d(2)]
        channels = maps
    return layers + [Flatten(), Dense(256 * 4 * 4, 256, activation="relu"), Dense(256, 10)]


def _mobilenetv2_cifar() -> list[Layer]:
    """MobileNetV2 as close as a Sequential of autocnn.nn's layers comes, sized for CIFAR-10.

    Kept: the 3x3 stem; inverted bottlenecks, each a 1x1 expansion by 6 with an activation, a 3x3
    depthwise convolution (groups == channels, stride 1 or 2) with an activation, and a 1x1
    projection without one (the paper's linear bottleneck); a final 1x1 convolution widening the
    features; global average pooling; a dense classifier. What differs, and why:

    * no batch normalisation after each convolution: autocnn.nn has no normalisation layer, so
      every convolution has a bias instead, and the network stays shallow enough (eleven
      convolutions) to train from He-initialised weights without one;
    * no residual adds around the stride-1 blocks: a Sequential model has no skip connections, so
      the blocks whose input and output widths match (24 -> 24, 32 -> 32) run without them;
    * ReLU for ReLU6 (the library's activations are relu, tanh and logistic; ReLU6's clipping was
      chosen for low-precision inference, not for training);
    * CIFAR-sized: a stride-1 stem (32x32 images, not 224x224), four bottlenecks instead of
      seventeen (every one expanding, where the original's first does not), 128 final features
      instead of 1,280, so that a step runs in tests on the numpy backend.
    """
    layers: list[Layer] = [Conv2d(3, 16, 3, padding=1, activation="relu")]
    channels = 16
    for out, stride in ((24, 2), (24, 1), (32, 2), (32, 1)):
        hidden = 6 * channels
        layers += [Conv2d(channels, hidden, 1, activation="relu"),
                   Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, activation="relu"),
                   Conv2d(hidden, out, 1)]
        channels = out
    return layers + [Conv2d(channels, 128, 1, activation="relu"), AvgPool2d(8), Flatten(), Dense(128, 10)]


def _convnext_cifar() -> list[Layer]:
    """ConvNeXt as close as a Sequential of autocnn.nn's layers comes, sized for CIFAR-10.

    Kept: a patchify stem (a non-overlapping strided convolution); blocks of a 7x7 depthwise
    convolution (padding 3, no activation), a 1x1 expansion by 4 with the block's one activation
    and a 1x1 projection; 2x2 stride-2 convolutions downsampling between stages, doubling the
    width; global average pooling; a dense classifier. What differs, and why:

    * no LayerNorm (after the stem, in each block after the depthwise convolution, before each
      downsampling and the head): autocnn.nn has no normalisation layer; every convolution has a
      bias instead, and with one block a stage the network stays shallow enough to train without;
    * no residual adds around the blocks, no layer scale, no stochastic depth: a Sequential model
      has no skip connections (and the last two exist to tame those adds);
    * ReLU for GELU (the library's activations are relu, tanh and logistic);
    * CIFAR-sized: a 2x2 stride-2 stem (4x4 stride 4 would leave 8x8 maps of 32x32 images), three
      stages of one block (32, 64, 128 maps) instead of four stages of 3, 3, 9 and 3 blocks (96 to
      768 maps), so that a step runs in tests on the numpy backend.
    """
    layers: list[Layer] = [Conv2d(3, 32, 2, stride=2)]
    widths = (32, 64, 128)
    for i, width in enumerate(widths):
        if i:
            layers.append(Conv2d(widths[i - 1], width, 2, stride=2))
        layers += [Conv2d(width, width, 7, padding=3, groups=width),
                   Conv2d(width, 4 * width, 1, activation="relu"),
                   Conv2d(4 * width, width, 1)]
    return layers + [AvgPool2d(4), Flatten(), Dense(widths[-1], 10)]


SPECS: dict[str, NetworkSpec] = {s.name: s for s in (
    NetworkSpec("kriz09", (3, 32, 32), "Krizhevsky 2009: one 8x8 logistic conv layer, 4x4 averaging", _kriz09),
    NetworkSpec("scherer10", (1, 256, 256), "Scherer et al. 2010, Table 1 row 1: three 8x8 stride-2 tanh convs",
                _scherer10),
    NetworkSpec("convnet18", (3, 32, 32), "cuda-convnet layers-18pct: three 5x5 relu convs with 3x3 pooling",
                _convnet18),
    NetworkSpec("chellapilla06", (1, 29, 29), "Chellapilla et al. 2006: two 5x5 stride-2 tanh convs",
                _chellapilla06),
    NetworkSpec("lenet5", (1, 28, 28), "LeNet-5 style for Fashion-MNIST: two 5x5 relu convs, 2x2 averaging",
                _lenet5),
    NetworkSpec("conv4", (3, 32, 32), "separable-filters paper's second network: 5x5, 5x5, 3x3, 3x3 relu convs "
                "(64, 64, 64, 32 maps), 3x3 averaging after the first two", _conv4),
    NetworkSpec("vgg_cifar", (3, 32, 32), "VGG-style CIFAR: 3x3 relu convs in pairs of 64, 128, 256 maps, "
                "2x2 averaging after each pair", _vgg_cifar),
    NetworkSpec("mobilenetv2_cifar", (3, 32, 32), "MobileNetV2-style CIFAR: inverted bottlenecks (1x1 expand x6, "
                "3x3 depthwise, linear 1x1 project), no batch norm or residual adds", _mobilenetv2_cifar),
    NetworkSpec("convnext_cifar", (3, 32, 32), "ConvNeXt-style CIFAR: 2x2 patchify stem, blocks of 7x7 depthwise, "
                "1x1 expand x4, 1x1 project; no LayerNorm or residual adds", _convnext_cifar),
)}
NETWORKS: tuple[str, ...] = tuple(SPECS)


def _spec(name: str) -> NetworkSpec:
    if not isinstance(name, str) or name.lower() not in SPECS:
        raise ValueError(f"unknown network {name!r}; known: {', '.join(NETWORKS)} (or a .json file)")
    return SPECS[name.lower()]


def input_shape(name: str) -> tuple[int, int, int]:
    """The (C, H, W) input of a seed network."""
    return _spec(name).input_shape


def build_network(name: str, backend: str | Backend = "numpy", seed: int | None = None, dtype: Any = None,
                  separable: Any = None) -> Sequential:
    """A fresh, unbuilt Sequential for the seed network ``name`` (see NETWORKS); ``separable``: the
    network's separable setting (Sequential)."""
    spec = _spec(name)
    return Sequential(spec.make_layers(), spec.input_shape, backend=backend, seed=seed, dtype=dtype,
                      separable=separable)


# -- JSON ----------------------------------------------------------------------------------------------

# type -> (required keys, optional keys)
_JSON_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "conv2d": (("out_channels", "kernel_size"), ("in_channels", "stride", "padding", "groups", "dilation", "bias",
                                                 "activation", "precision", "separable", "name")),
    "avgpool2d": (("window",), ("stride", "padding", "count_pad", "precision", "name")),
    "dense": (("out_features",), ("in_features", "bias", "activation", "precision", "name")),
    "flatten": ((), ("name",)),
    "activation": (("activation",), ("name",)),
}
_INT_KEYS = {"out_channels", "in_channels", "out_features", "in_features", "groups"}
_SIZE_KEYS = {"kernel_size", "stride", "window", "padding", "dilation"}
_BOOL_KEYS = {"bias", "count_pad"}
_STR_KEYS = {"activation", "name", "precision"}


def _json_value(where: str, key: str, value: Any) -> Any:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if key in _INT_KEYS and not is_int(value):
        raise ValueError(f"{where}: {key} must be an integer, got {value!r}")
    if key in _SIZE_KEYS:
        if isinstance(value, list) and value and all(is_int(v) for v in value):
            return tuple(value)
        if not is_int(value):
            raise ValueError(f"{where}: {key} must be an integer or a list of integers, got {value!r}")
    if key in _BOOL_KEYS and not isinstance(value, bool):
        raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
    if key in _STR_KEYS and not isinstance(value, str):
        raise ValueError(f"{where}: {key} must be a string, got {value!r}")
    return value


def network_from_dict(spec: Any, backend: str | Backend = "numpy", seed: int | None = None, dtype: Any = None,
                      source: str = "network") -> Sequential:
    """A Sequential from the JSON structure documented in this module (already parsed)."""
    if not isinstance(spec, dict):
        raise ValueError(f"{source}: the top level must be an object with input_shape and layers")
    unknown = sorted(set(spec) - {"name", "input_shape", "layers", "description", "separable"})
    if unknown:
        raise ValueError(f"{source}: unknown top-level key(s) {', '.join(unknown)}; "
                         f"allowed: name, description, input_shape, layers, separable")
    shape = spec.get("input_shape")
    if not isinstance(shape, list) or not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                                              for s in shape):
        raise ValueError(f"{source}: input_shape must be a list of positive integers like [1, 28, 28], got {shape!r}")
    entries = spec.get("layers")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source}: layers must be a non-empty list of layer objects")
    current: tuple[int, ...] = tuple(shape)
    layers: list[Layer] = []
    for i, entry in enumerate(entries):
        where = f"{source}: layers[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise ValueError(f"{where}: each layer must be an object with a \"type\" "
                             f"(one of {', '.join(_JSON_KEYS)})")
        kind = entry["type"].lower()
        if kind not in _JSON_KEYS:
            raise ValueError(f"{where}: unknown type {entry['type']!r}; known: {', '.join(_JSON_KEYS)}")
        where = f"{where} ({kind})"
        required, optional = _JSON_KEYS[kind]
        args = {k: v for k, v in entry.items() if k != "type"}
        unknown = sorted(set(args) - set(required) - set(optional))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(required + optional)}")
        missing = [k for k in required if k not in args]
        if missing:
            raise ValueError(f"{where}: missing required key(s) {', '.join(missing)}")
        args = {k: _json_value(where, k, v) for k, v in args.items()}
        layer = _layer_from_json(where, kind, args, current)
        try:
            current = layer.compute_output_shape(current)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        layers.append(layer)
    try:
        return Sequential(layers, tuple(shape), backend=backend, seed=seed, dtype=dtype,
                          separable=spec.get("separable"))
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _layer_from_json(where: str, kind: str, args: dict[str, Any], current: tuple[int, ...]) -> Layer:
    try:
        if kind == "conv2d":
            if len(current) != 3:
                raise ValueError(f"conv2d needs a (C, H, W) input, the previous layer gives {current}")
            args.setdefault("in_channels", current[0])
            return Conv2d(**args)
        if kind == "dense":
            if len(current) != 1:
                raise ValueError(f"dense needs a flat input, the previous layer gives {current}: "
                                 f"add {{\"type\": \"flatten\"}} before it")
            args.setdefault("in_features", current[0])
            return Dense(**args)
        if kind == "avgpool2d":
            return AvgPool2d(**args)
        if kind == "flatten":
            return Flatten(**args)
        return Activation(**args)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def network_from_json(path: str | Path, backend: str | Backend = "numpy", seed: int | None = None,
                      dtype: Any = None) -> Sequential:
    """A Sequential from a JSON file in the format documented in this module's docstring."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"no network file at {path}") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    return network_from_dict(spec, backend=backend, seed=seed, dtype=dtype, source=str(path))


def load_network(name_or_path: str | Path, backend: str | Backend = "numpy", seed: int | None = None,
                 dtype: Any = None) -> Sequential:
    """A seed network by name, or a JSON network by path (anything ending in .json)."""
    if isinstance(name_or_path, Path) or str(name_or_path).lower().endswith(".json"):
        return network_from_json(name_or_path, backend=backend, seed=seed, dtype=dtype)
    return build_network(str(name_or_path), backend=backend, seed=seed, dtype=dtype)

