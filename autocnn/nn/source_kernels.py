"""The cuda backend's hand-written kernel modules (autocnn.nn.fused, autocnn.nn.fused_sixteen_bit):
one rendered CUDA source, compiled by NVRTC once per device the first time a kernel of it is asked
for there, its kernels fetched by name.
"""
from __future__ import annotations

import functools
from typing import Any, Callable


class SourceKernels:
    """A CUDA source's kernels on the current device.

    ``render_source`` gives the source (rendered only when a device first needs it, so that
    importing a module of kernels needs no GPU); ``options`` gives NVRTC's options for that source.
    """

    def __init__(self, render_source: Callable[[], str], options: Callable[[str], tuple[str, ...]]) -> None:
        self._render_source = render_source
        self._options = options
        # Per instance rather than on the methods, so that each source keeps its own modules.
        self.module = functools.lru_cache(maxsize=None)(self._compile)
        self.function = functools.lru_cache(maxsize=None)(self._get_function)

    def _compile(self, device_id: int) -> Any:
        """The compiled module on device ``device_id`` (cached: ``module``)."""
        import cupy as cp

        source = self._render_source()
        with cp.cuda.Device(device_id):
            module = cp.RawModule(code=source, options=self._options(source))
            module.compile()
        return module

    def _get_function(self, device_id: int, name: str) -> Any:
        """Kernel ``name`` of the module on device ``device_id`` (cached: ``function``)."""
        return self.module(device_id).get_function(name)

    def kernel(self, name: str) -> Any:
        """Kernel ``name`` on the current device: called as ``kernel(name)(grid, block, args)``."""
        import cupy as cp

        return self.function(cp.cuda.Device().id, name)
