"""Configs in the cost model's order, for the places that choose among configs no one measured on
the problem: the lookup where no record of the problem serves, quick tuning's candidates and the
tuner's first trials. Without a model in use (none named, or its file refused with a warning),
``predicted_order`` answers None and the caller keeps the order its own rule gives.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from autocnn.cost_model.model_file import active_model

T = TypeVar("T")


def model_in_use() -> bool:
    """Whether ``predicted_order`` ranks (a caller may skip gathering candidates otherwise)."""
    return active_model() is not None


def predicted_order(problem: Any, device: Any, items: Sequence[T],
                    config_of: Callable[[T], Any] = lambda item: item) -> list[T] | None:
    """``items`` fastest first by the model's prediction for ``problem`` on ``device`` (ties keep
    their order), or None when no model is in use. ``config_of`` gives an item's Config."""
    model = active_model()
    if model is None:
        return None
    if len(items) < 2:
        return list(items)
    predicted = model.predict(problem, [config_of(item).as_dict() for item in items], device.arch, device.sm_count)
    order = sorted(range(len(items)), key=lambda i: (float(predicted[i]), i))
    return [items[i] for i in order]
