"""Layers: Conv2d, AvgPool2d, Dense, Flatten and Activation, and LAYER_TYPES by name.

Each job lives in its own module (layer_base: the Layer base class and argument checks;
conv_layer; pool_layer; dense_layer; plain_layers: Flatten and Activation); this one gathers
them, so ``from autocnn.nn.layers import Conv2d`` keeps working. See layer_base for how a layer
is built and run.
"""
from __future__ import annotations

from autocnn.nn.conv_layer import Conv2d
from autocnn.nn.dense_layer import Dense
from autocnn.nn.layer_base import Layer, Shape, init_weights
from autocnn.nn.plain_layers import Activation, Flatten
from autocnn.nn.pool_layer import AvgPool2d

__all__ = ["Activation", "AvgPool2d", "Conv2d", "Dense", "Flatten", "Layer", "LAYER_TYPES", "Shape", "init_weights"]

LAYER_TYPES: dict[str, type[Layer]] = {
    "conv2d": Conv2d,
    "avgpool2d": AvgPool2d,
    "dense": Dense,
    "flatten": Flatten,
    "activation": Activation,
}
