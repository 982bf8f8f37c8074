"""Without CuPy or a GPU, the cuda backend refuses with an error that names the numpy backend."""
from __future__ import annotations

import pytest

from autocnn.gpu import gpu_available


@pytest.mark.skipif(gpu_available(), reason="a GPU is present, so the cuda backend starts")
def test_cuda_backend_without_gpu_names_numpy():
    from autocnn import nn

    with pytest.raises(nn.BackendUnavailableError, match="numpy"):
        nn.build_network("lenet5", backend="cuda")
