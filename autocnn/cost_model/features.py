"""What the cost model sees of one measurement: the problem, the config and the GPU as numbers.

A ``Measurement`` is one config's time on one problem and GPU, from wherever it was measured
(records, replay files, studies). ``FeatureSchema`` fixes the columns: the problem's sizes and
roofline (bytes, arithmetic, their ratio), the GPU's peak rates, the operation and formulation as
categories, then every config parameter seen in training (numbers as they are, a named choice by
its index among the values seen, missing as NaN). The schema is stored with the model, so a model
reads the features it was trained on whatever parameters have been added since.

The target is the time over the problem's roofline time (its bytes at the peak bandwidth or its
direct arithmetic at the tensor-core peak, whichever is longer), in log2: configs of one problem
share the roofline, so it leaves their order alone, and it puts problems of very different sizes
on one scale.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from autocnn.device import peak_rates
from autocnn.kernels import get_operation
from autocnn.precision import precision_of

# Columns from the problem and the GPU, before the operation, the formulation and the parameters.
PROBLEM_COLUMNS = ("N", "C", "H", "W", "K", "R", "S", "stride_h", "stride_w", "pad_h", "pad_w", "P", "Q",
                   "log2_flops", "log2_bytes", "log2_intensity", "log2_roofline_us", "bias", "activation",
                   "count_pad", "pool_area", "rank", "tf32", "sm_count", "log2_copy_rate", "log2_tensor_rate")
OP_COLUMN = "op"
FORMULATION_COLUMN = "formulation"


@dataclass(frozen=True)
class Measurement:
    """One verified time: ``config`` (a parameter dict) ran ``problem`` in ``time_us`` on a GPU of
    ``arch`` with ``sm_count`` SMs. ``group`` names the set whose configs are ranked against each
    other (one problem on one GPU kind)."""

    problem: Any
    config: Mapping[str, Any]
    time_us: float
    arch: str
    sm_count: int
    group: str


def roofline_us(problem: Any, arch: str) -> float:
    """The problem's bytes at the architecture's peak bandwidth or its direct arithmetic at the
    tensor-core peak, whichever is longer, in microseconds."""
    operation = get_operation(problem.op)
    rates = peak_rates(arch)
    return max(operation.min_bytes(problem) / rates.copy_bytes_per_s,
               operation.flops(problem) / rates.tensor_flops_per_s) * 1e6


def target(m: Measurement) -> float:
    """What the model predicts: log2 of the time over the roofline time."""
    return math.log2(m.time_us / roofline_us(m.problem, m.arch))


def _pair(value: Any) -> tuple[float, float]:
    if isinstance(value, (list, tuple)):
        return float(value[0]), float(value[-1])
    return float(value), float(value)


def problem_row(problem: Any, arch: str, sm_count: int) -> list[float]:
    """The PROBLEM_COLUMNS of one problem on one GPU."""
    d = problem.to_dict()
    operation = get_operation(problem.op)
    flops = max(1.0, float(operation.flops(problem)))
    nbytes = max(1.0, float(operation.min_bytes(problem)))
    rates = peak_rates(arch)
    nan = math.nan
    window = d.get("window")
    r, s = (float(d["R"]), float(d["S"])) if "R" in d else (_pair(window) if window is not None else (nan, nan))
    sh, sw = _pair(d.get("stride", 1))
    pad = d.get("padding", (0, 0, 0, 0))
    pad_h, pad_w = float(pad[0] + pad[2]), float(pad[1] + pad[3])
    h, w = float(d.get("H", nan)), float(d.get("W", nan))
    p = math.floor((h + pad_h - r) / sh) + 1 if not math.isnan(r) else nan
    q = math.floor((w + pad_w - s) / sw) + 1 if not math.isnan(s) else nan
    pool = d.get("pool_window")
    activation = d.get("activation")
    return [float(d.get("N", nan)), float(d.get("C", nan)), h, w, float(d.get("K", nan)), r, s, sh, sw, pad_h, pad_w,
            float(p), float(q), math.log2(flops), math.log2(nbytes), math.log2(flops / nbytes),
            math.log2(roofline_us(problem, arch)), float(bool(d.get("bias", False))),
            float(activation not in (None, "none")), float(bool(d.get("count_pad", False))),
            float(pool[0] * pool[1]) if pool else nan, float(d.get("rank", nan)),
            float(precision_of(problem).tf32),
            float(sm_count), math.log2(rates.copy_bytes_per_s), math.log2(rates.tensor_flops_per_s)]


def formulation_name(op: str, config: Mapping[str, Any]) -> str | None:
    """The formulation a config runs: its ``formulation`` parameter, or its operation's only one."""
    named = config.get("formulation")
    if isinstance(named, str):
        return named
    found = get_operation(op).formulation_of(config)
    return found.formulation if found is not None else None


@dataclass(frozen=True)
class FeatureSchema:
    """The columns of a model: ``ops`` and ``formulations`` (categories, by index), the config
    ``params`` in order, and for each parameter whose choices are names, those names (by index)."""

    ops: tuple[str, ...]
    formulations: tuple[str, ...]
    params: tuple[str, ...]
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def columns(self) -> tuple[str, ...]:
        return (*PROBLEM_COLUMNS, OP_COLUMN, FORMULATION_COLUMN, *(f"param:{p}" for p in self.params))

    @property
    def categorical(self) -> tuple[int, ...]:
        """The indices of the category columns (operation and formulation)."""
        return len(PROBLEM_COLUMNS), len(PROBLEM_COLUMNS) + 1

    @staticmethod
    def of(measurements: Sequence[Measurement]) -> "FeatureSchema":
        """The schema that covers every operation, formulation and parameter value measured."""
        ops, forms, params = set(), set(), set()
        named: dict[str, set[str]] = {}
        for m in measurements:
            ops.add(m.problem.op)
            form = formulation_name(m.problem.op, m.config)
            if form is not None:
                forms.add(form)
            for k, v in m.config.items():
                if k == "formulation":
                    continue
                params.add(k)
                if isinstance(v, str):
                    named.setdefault(k, set()).add(v)
        return FeatureSchema(tuple(sorted(ops)), tuple(sorted(forms)), tuple(sorted(params)),
                             {k: tuple(sorted(v)) for k, v in sorted(named.items())})

    def row(self, problem: Any, config: Mapping[str, Any], arch: str, sm_count: int) -> list[float]:
        return self.rows(problem, [config], arch, sm_count)[0]

    def rows(self, problem: Any, configs: Sequence[Mapping[str, Any]], arch: str, sm_count: int) -> list[list[float]]:
        """One row per config of one problem (the problem's columns computed once)."""
        head = problem_row(problem, arch, sm_count)
        op = _index(self.ops, problem.op)
        out = []
        for config in configs:
            values = [_index(self.formulations, formulation_name(problem.op, config))]
            for name in self.params:
                values.append(self._value(name, config.get(name)))
            out.append([*head, op, *values])
        return out

    def _value(self, name: str, value: Any) -> float:
        if value is None:
            return math.nan
        if isinstance(value, str):
            return _index(self.choices.get(name, ()), value)
        return float(value)

    def matrix(self, measurements: Sequence[Measurement]) -> np.ndarray:
        return np.array([self.row(m.problem, m.config, m.arch, m.sm_count) for m in measurements], dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {"ops": list(self.ops), "formulations": list(self.formulations), "params": list(self.params),
                "choices": {k: list(v) for k, v in self.choices.items()}, "columns": list(self.columns)}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "FeatureSchema":
        schema = FeatureSchema(tuple(data["ops"]), tuple(data["formulations"]), tuple(data["params"]),
                               {k: tuple(v) for k, v in data["choices"].items()})
        if list(schema.columns) != list(data["columns"]):
            raise ValueError("the schema's columns are not the ones its parts make")
        return schema


def _index(names: Sequence[str], name: str | None) -> float:
    """A category's index; NaN for one the schema never saw (LightGBM reads it as missing)."""
    if name is None:
        return math.nan
    try:
        return float(names.index(name))
    except ValueError:
        return math.nan
