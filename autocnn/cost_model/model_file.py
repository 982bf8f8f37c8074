"""The cost model's file: the trees, the feature schema they read, and how well they ranked.

One gzipped JSON document: ``format`` (COST_MODEL_FORMAT; a file of another format is refused, as
its columns may mean something else), the ``schema`` (``features.FeatureSchema``), LightGBM's text
dump of the booster, and ``metadata`` (what it was trained on, when, and the held-out rank
correlations of the model and of the nearest-shape rule, which ``autocnn db`` shows).

The model in use is the shipped file beside this module, or the one ``$AUTOCNN_COST_MODEL`` names
(``off``: none). A file that is missing, unreadable, of another format or whose trees cannot be
read is refused with one warning per file, and the callers keep the rule they had before the model:
nearest shape, then the heuristic default.
"""
from __future__ import annotations

import gzip
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from autocnn.cost_model.features import FeatureSchema

COST_MODEL_FORMAT = 1
COST_MODEL_ENV = "AUTOCNN_COST_MODEL"
SHIPPED_MODEL = Path(__file__).resolve().parent / "cost_model.json.gz"
_KIND = "autocnn cost model"


class CostModelWarning(UserWarning):
    """A cost model file was refused; the rule without a model is used."""


class CostModelRefused(ValueError):
    """A cost model file that cannot be used; says which file and why."""


@dataclass(frozen=True)
class HeldOut:
    """Rank correlations of predicted against measured times on problems left out of training,
    averaged over the held-out groups (one problem on one GPU kind) with at least three configs;
    ``pairs_kendall`` averages Kendall's tau over every group of two or more configs."""

    groups: int
    spearman: float
    kendall: float
    pairs_groups: int
    pairs_kendall: float

    def to_dict(self) -> dict[str, Any]:
        return {"groups": self.groups, "spearman": self.spearman, "kendall": self.kendall,
                "pairs_groups": self.pairs_groups, "pairs_kendall": self.pairs_kendall}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "HeldOut":
        return HeldOut(int(data["groups"]), float(data["spearman"]), float(data["kendall"]),
                       int(data["pairs_groups"]), float(data["pairs_kendall"]))


@dataclass(frozen=True)
class ModelMetadata:
    """What a model was trained on and how well it and the nearest-shape rule ranked held-out problems."""

    trained_at: str
    measurements: int
    problems: int
    sources: tuple[str, ...]
    model: HeldOut
    nearest_shape: HeldOut
    folds: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"held-out rank correlation (Spearman, {self.model.groups} problems of 3+ configs, "
                f"{self.folds}-fold leave-shapes-out): model {self.model.spearman:.3f}, nearest-shape rule "
                f"{self.nearest_shape.spearman:.3f}; Kendall over {self.model.pairs_groups} problems of 2+ "
                f"configs: model {self.model.pairs_kendall:.3f}, rule {self.nearest_shape.pairs_kendall:.3f}; "
                f"trained {self.trained_at} on {self.measurements} measurements of {self.problems} problems")

    def to_dict(self) -> dict[str, Any]:
        return {"trained_at": self.trained_at, "measurements": self.measurements, "problems": self.problems,
                "sources": list(self.sources), "model": self.model.to_dict(),
                "nearest_shape": self.nearest_shape.to_dict(), "folds": self.folds, "extra": dict(self.extra)}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "ModelMetadata":
        return ModelMetadata(str(data["trained_at"]), int(data["measurements"]), int(data["problems"]),
                             tuple(data["sources"]), HeldOut.from_dict(data["model"]),
                             HeldOut.from_dict(data["nearest_shape"]), int(data["folds"]), dict(data.get("extra", {})))


class CostModel:
    """Gradient-boosted trees over ``schema``'s columns that predict log2(time / roofline time)."""

    def __init__(self, booster: Any, schema: FeatureSchema, metadata: ModelMetadata | None = None):
        self.booster = booster
        self.schema = schema
        self.metadata = metadata

    def predict(self, problem: Any, configs: Sequence[Mapping[str, Any]], arch: str, sm_count: int) -> np.ndarray:
        """Predicted log2(time / roofline) of each config of ``problem``: lower runs faster."""
        if not configs:
            return np.zeros(0)
        rows = np.array(self.schema.rows(problem, configs, arch, sm_count), dtype=np.float64)
        return self.predict_rows(rows)

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.booster.predict(rows, num_threads=1), dtype=np.float64)

    def save(self, path: Path) -> None:
        if self.metadata is None:
            raise ValueError("a cost model is saved with the metadata of its training")
        document = {"format": COST_MODEL_FORMAT, "kind": _KIND, "schema": self.schema.to_dict(),
                    "metadata": self.metadata.to_dict(), "booster": self.booster.model_to_string()}
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        # mtime=0: the same model writes the same bytes, so retraining on unchanged records changes no file.
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as fh:
            fh.write(json.dumps(document, sort_keys=True).encode("utf-8"))
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> "CostModel":
        """The model in ``path``; CostModelRefused naming the file and the reason otherwise."""
        path = Path(path)
        try:
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                document = json.load(fh)
        except FileNotFoundError:
            raise CostModelRefused(f"cost model {path} does not exist") from None
        except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:
            raise CostModelRefused(f"cost model {path} cannot be read ({type(exc).__name__})") from None
        if not isinstance(document, dict) or document.get("kind") != _KIND:
            raise CostModelRefused(f"cost model {path} is not an autocnn cost model file")
        if document.get("format") != COST_MODEL_FORMAT:
            raise CostModelRefused(f"cost model {path} is of format {document.get('format')!r}, this autocnn "
                                   f"reads {COST_MODEL_FORMAT} (retrain: scripts/train_cost_model.py)")
        try:
            schema = FeatureSchema.from_dict(document["schema"])
            metadata = ModelMetadata.from_dict(document["metadata"])
            text = document["booster"]
            if not isinstance(text, str):
                raise TypeError("the booster is not LightGBM's text")
        except (KeyError, TypeError, ValueError) as exc:
            raise CostModelRefused(f"cost model {path} is malformed ({type(exc).__name__}: {exc})") from None
        try:
            import lightgbm
        except ImportError:
            raise CostModelRefused(f"cost model {path} needs lightgbm, which is not installed") from None
        try:
            booster = lightgbm.Booster(model_str=text)
        except lightgbm.basic.LightGBMError as exc:
            raise CostModelRefused(f"cost model {path}: LightGBM cannot read its trees ({exc})") from None
        if booster.num_feature() != len(schema.columns):
            raise CostModelRefused(f"cost model {path}: its trees read {booster.num_feature()} columns, its "
                                   f"schema names {len(schema.columns)}")
        return CostModel(booster, schema, metadata)


# path -> (stat signature, model or None): each file is read, and refused with a warning, once
_loaded: dict[Path, tuple[tuple[int, int] | None, CostModel | None]] = {}


def model_path() -> Path | None:
    """The model file in use: $AUTOCNN_COST_MODEL's (None for ``off``), else the shipped one."""
    named = os.environ.get(COST_MODEL_ENV, "").strip()
    if named.lower() == "off":
        return None
    return Path(named) if named else SHIPPED_MODEL


def active_model() -> CostModel | None:
    """The cost model to rank with, or None (no file in use, or its file refused with a warning)."""
    path = model_path()
    if path is None:
        return None
    try:
        st = path.stat()
        sig: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
    except OSError:
        sig = None
    hit = _loaded.get(path)
    if hit is not None and hit[0] == sig:
        return hit[1]
    try:
        model: CostModel | None = CostModel.load(path)
    except CostModelRefused as exc:
        warnings.warn(f"{exc}; configs are ranked without it (nearest tuned shape, then the heuristic default)",
                      CostModelWarning, stacklevel=3)
        model = None
    _loaded[path] = (sig, model)
    return model


def in_use_text() -> str:
    """One line for people: the model in use and how well it ranked held-out problems, or why none is."""
    model = active_model()
    if model is not None and model.metadata is not None:
        return f"cost model {model_path()}: {model.metadata.summary()}"
    rule = "unseen shapes take the nearest tuned shape's config, else the heuristic default"
    if model_path() is None:
        return f"cost model: none in use (${COST_MODEL_ENV}=off); {rule}"
    return f"cost model: refused (see the warning); {rule}"
