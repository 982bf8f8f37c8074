"""autocnn: generated, tuned CUDA kernels for convolutional networks."""
from __future__ import annotations

__version__ = "0.1.0"
