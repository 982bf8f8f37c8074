"""Choosing a layer's rank from its filters' energy (the future work seed 002 names).

The energy of a layer's filters is sum over filters of ||F||_F^2 = sum of all their squared singular
values. The energy-chosen rank is the smallest r whose r leading singular values of every filter
together keep at least ``share`` of it: one rank per layer, since the separable kernels are
specialised on it. The choice is made once, from the weights the layer has when it is first
built, with LAPACK's singular values (numpy.linalg.svd): exact, and a one-off on the host, where
the power method's capped components would blur a threshold decision.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autocnn.separable.svd import filters_as_batch

DEFAULT_ENERGY_SHARE = 0.9


@dataclass(frozen=True)
class RankChoice:
    """The chosen rank and, for each rank 1..min(R, S), the share of the energy it keeps."""

    rank: int
    share: float
    kept: tuple[float, ...]

    def summary(self) -> str:
        kept = ", ".join(f"{100 * k:.1f}%" for k in self.kept)
        return f"rank {self.rank} keeps {100 * self.kept[self.rank - 1]:.1f}% (asked {100 * self.share:g}%; by rank: {kept})"


def check_share(share: Any) -> float:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < float(share) <= 1.0:
        raise ValueError(f"an energy share must be a number in (0, 1], got {share!r}")
    return float(share)


def energy_shares(w: Any) -> tuple[float, ...]:
    """For r = 1..min(R, S): the share of the filters' energy their r leading singular values keep."""
    sigma = np.linalg.svd(filters_as_batch(w), compute_uv=False)
    per_rank = np.sum(sigma ** 2, axis=0)
    total = float(per_rank.sum())
    if total == 0.0:
        return tuple(1.0 for _ in per_rank)
    return tuple(float(min(1.0, c)) for c in np.cumsum(per_rank) / total)


def energy_rank(w: Any, share: float = DEFAULT_ENERGY_SHARE) -> RankChoice:
    """The smallest rank whose singular values keep ``share`` of the layer's filter energy."""
    share = check_share(share)
    kept = energy_shares(w)
    # A relative slack of a few ulps: share 1.0 must not ask for more than the sum of all values.
    rank = next(r for r, k in enumerate(kept, start=1) if k >= share * (1 - 1e-12) or r == len(kept))
    return RankChoice(rank=rank, share=share, kept=kept)
