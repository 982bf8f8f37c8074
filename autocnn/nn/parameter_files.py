"""Saving a Sequential model's parameters to a .npz file and loading them back.

Parameters loaded before the model is built wait in ``_pending_params`` and are copied in by
``build``; a built model takes them at once, into its existing arrays.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

FILE_FORMAT = "autocnn.nn.Sequential/1"


class ParameterFiles:
    """Sequential's save and load (mixed into ``autocnn.nn.model.Sequential``)."""

    def save(self, path: str | Path) -> Path:
        """Write every parameter to a .npz file at exactly ``path``; returns the path."""
        if not self.built and not self._pending_params:
            raise RuntimeError("the model has no parameters yet: call build(batch_size) or fit(...) first")
        arrays: dict[str, np.ndarray] = {
            "__format__": np.array(FILE_FORMAT),
            "__layers__": np.array([type(layer).__name__ for layer in self.layers]),
        }
        for i, layer in enumerate(self.layers):
            values = ({k: self.backend.to_numpy(v) for k, v in layer.params().items()} if self.built
                      else self._pending_params.get(i, {}))
            for name, value in values.items():
                arrays[f"layers/{i}/{name}"] = np.asarray(value)
        path = Path(path)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        return path

    def load(self, path: str | Path) -> "Sequential":
        """Read parameters written by ``save``; every shape must match this model's."""
        path = Path(path)
        try:
            archive = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise FileNotFoundError(f"no model file at {path}") from None
        except (ValueError, OSError) as exc:
            raise ValueError(f"{path} is not an autocnn model file (.npz): {exc}") from None
        with archive:
            data = {k: archive[k] for k in archive.files}
        if "__format__" not in data or str(data["__format__"]) != FILE_FORMAT:
            raise ValueError(f"{path} is not an autocnn model file (no {FILE_FORMAT!r} marker)")
        file_layers = [str(s) for s in data["__layers__"]]
        model_layers = [type(layer).__name__ for layer in self.layers]
        if len(file_layers) != len(model_layers):
            raise ValueError(f"{path} holds {len(file_layers)} layers ({', '.join(file_layers)}), the model has "
                             f"{len(model_layers)} ({', '.join(model_layers)})")
        for i, (got, want) in enumerate(zip(file_layers, model_layers)):
            if got != want:
                raise ValueError(f"{path}: layer {i} is a {got} in the file but a {want} "
                                 f"('{self.layers[i].name}') in the model")
        loaded: dict[int, dict[str, np.ndarray]] = {}
        for i, layer in enumerate(self.layers):
            expected = layer.param_shapes()
            prefix = f"layers/{i}/"
            in_file = {k[len(prefix):]: v for k, v in data.items() if k.startswith(prefix)}
            missing = sorted(set(expected) - set(in_file))
            extra = sorted(set(in_file) - set(expected))
            if missing or extra:
                raise ValueError(f"{path}: layer {i} ('{layer.name}') has parameters {sorted(in_file)} in the "
                                 f"file, the model expects {sorted(expected)}")
            for name, shape in expected.items():
                value = in_file[name]
                qualified = f"{layer.name}.{name}"
                if value.dtype.kind != "f":
                    raise ValueError(f"{path}: parameter {qualified!r} has dtype {value.dtype}, not a float")
                if tuple(value.shape) != tuple(shape):
                    raise ValueError(f"{path}: parameter {qualified!r} has shape {tuple(value.shape)} in the "
                                     f"file, the model expects {tuple(shape)}")
                if not np.isfinite(value).all():
                    raise ValueError(f"{path}: parameter {qualified!r} contains NaN or infinite values")
            loaded[i] = {name: in_file[name].astype(self.dtype) for name in expected}
        self._pending_params = loaded
        if self.built:
            self._apply_pending_params()
        return self

    def _apply_pending_params(self) -> None:
        # Copy into the existing arrays, so the optimizer's and the layers' references stay valid.
        for i, values in self._pending_params.items():
            params = self.layers[i].params()
            for name, value in values.items():
                self.backend.upload(value, params[name])
        self._pending_params = {}
