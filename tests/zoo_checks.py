"""What the zoo networks' tests share: a network must fit a batch a linear model could separate."""
from __future__ import annotations

import numpy as np

from autocnn import nn


def small_batch_losses(name: str, learning_rate: float, steps: int = 12) -> list[float]:
    """The losses of ``steps`` Adam steps of network ``name`` on the numpy backend over eight
    images whose two classes differ by the sign of their mean."""
    rng = np.random.default_rng(0)
    model = nn.build_network(name, backend=nn.NumpyBackend(blas_threads=1), seed=0)
    model.build(8).compile(nn.Adam(learning_rate))
    y = np.array([0, 1] * 4)
    x = (rng.standard_normal((8, 3, 32, 32)) + np.where(y == 0, -0.5, 0.5)[:, None, None, None]).astype(np.float32)
    return [model.train_step(x, y).loss for _ in range(steps)]
