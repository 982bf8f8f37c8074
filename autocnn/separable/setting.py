"""What ``separable=`` asks for, on a Conv2d, a Sequential, in JSON and on the command line.

Accepted values (``parse_separable``):

* ``None``: take the model's setting (a layer's default; the model's own default is off);
* ``False``: off, the layer stays a 2D convolution (also in a separable model);
* ``True`` or ``1``: rank 1, the seed's setting; an integer r >= 1: rank r (at most min(R, S));
* ``"energy"``: the energy-chosen rank keeping 90% of the layer's filter energy; a float in
  (0, 1], or ``"energy:0.95"``: the energy-chosen rank keeping that share.

On the command line (``parse_separable_text``): ``off``, ``energy``, ``energy:SHARE``, an integer
rank (``1``, ``2``) or a share written with a decimal point (``0.95``).

A layer is eligible when it has stride 1 and a filter of at least 2x2 (a 1xS or Rx1 filter is
already separable), and, at a fixed rank, when the rank is at most min(R, S).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from autocnn.separable.rank import DEFAULT_ENERGY_SHARE, check_share

ALLOWED = ("None (the model's), False (off), True or an integer rank >= 1, \"energy\", "
           "\"energy:SHARE\" or a float share in (0, 1]")


@dataclass(frozen=True)
class SeparableSetting:
    """Off (both None), a fixed ``rank``, or an ``energy_share`` for the energy-chosen rank."""

    rank: int | None = None
    energy_share: float | None = None

    @property
    def enabled(self) -> bool:
        return self.rank is not None or self.energy_share is not None

    def text(self) -> str:
        """How repr, summaries and JSON write it back."""
        if self.rank is not None:
            return str(self.rank)
        if self.energy_share is not None:
            return "energy" if self.energy_share == DEFAULT_ENERGY_SHARE else f"energy:{self.energy_share:g}"
        return "off"

    def value(self) -> Any:
        """The setting as a ``separable=`` argument (and a JSON value) that gives it back."""
        if self.rank is not None:
            return self.rank
        if self.energy_share is not None:
            return "energy" if self.energy_share == DEFAULT_ENERGY_SHARE else self.energy_share
        return False


OFF = SeparableSetting()


def parse_separable(owner: str, value: Any, inherit: bool = False) -> SeparableSetting | None:
    """The setting ``value`` names; None for None when ``inherit`` (take the model's)."""
    if value is None:
        if inherit:
            return None
        return OFF
    if isinstance(value, SeparableSetting):
        return value
    if isinstance(value, bool):
        return SeparableSetting(rank=1) if value else OFF
    if isinstance(value, numbers.Integral):
        if value < 1:
            raise ValueError(f"{owner}: separable rank must be >= 1, got {value!r}; allowed: {ALLOWED}")
        return SeparableSetting(rank=int(value))
    if isinstance(value, numbers.Real):
        try:
            return SeparableSetting(energy_share=check_share(float(value)))
        except ValueError:
            raise ValueError(f"{owner}: separable energy share must be in (0, 1], got {value!r}; "
                             f"allowed: {ALLOWED}") from None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("off", "none", "false"):
            return OFF
        if text == "energy":
            return SeparableSetting(energy_share=DEFAULT_ENERGY_SHARE)
        if text.startswith("energy:"):
            try:
                return SeparableSetting(energy_share=check_share(float(text[len("energy:"):])))
            except ValueError:
                pass
    raise ValueError(f"{owner}: separable={value!r} is not allowed; allowed: {ALLOWED}")


def parse_separable_text(text: str) -> SeparableSetting:
    """A command-line value: off, energy, energy:SHARE, an integer rank, or a share like 0.95."""
    if not isinstance(text, str):
        raise ValueError(f"--separable takes text, got {text!r}")
    t = text.strip().lower()
    try:
        if t.isdigit():
            return parse_separable("--separable", int(t))
        if t.replace(".", "", 1).isdigit() and "." in t:
            return parse_separable("--separable", float(t))
        return parse_separable("--separable", t)
    except ValueError:
        raise ValueError(f"--separable {text!r}: use off, energy, energy:SHARE (0 < SHARE <= 1), an integer "
                         f"rank (1 is the seed's) or a share with a decimal point (0.95)") from None


def ineligibility(setting: SeparableSetting, kernel_size: tuple[int, int], stride: tuple[int, int]) -> str | None:
    """Why a convolution cannot be separable under ``setting`` (None when it can)."""
    R, S = kernel_size
    if stride != (1, 1):
        return f"stride {stride[0]}x{stride[1]} (separable kernels run stride 1)"
    if min(R, S) < 2:
        return f"a {R}x{S} filter (already one-dimensional)"
    if setting.rank is not None and setting.rank > min(R, S):
        return f"rank {setting.rank} exceeds min(R, S) = {min(R, S)} of its {R}x{S} filter"
    return None
