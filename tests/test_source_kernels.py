"""autocnn.nn.source_kernels, the loader of the cuda backend's own kernel modules, on a stand-in for
CuPy: a source is rendered and compiled once per device, with its own options, each kernel fetched
once per device, and two sources keep their modules apart."""
from __future__ import annotations

import sys
import types

from autocnn.kernels import compiler
from autocnn.nn import fused, fused_sixteen_bit
from autocnn.nn.source_kernels import SourceKernels


class _FakeCupy(types.ModuleType):
    """What SourceKernels asks of CuPy: Device (as the current device and as a context) and RawModule."""

    def __init__(self) -> None:
        super().__init__("cupy")
        self.current = 0
        self.compiled: list[tuple[int, str, tuple[str, ...]]] = []
        self.fetched: list[tuple[int, str]] = []
        fake = self

        class Device:
            def __init__(self, device_id=None):
                self.id = fake.current if device_id is None else device_id

            def __enter__(self):
                self.saved, fake.current = fake.current, self.id
                return self

            def __exit__(self, *exc):
                fake.current = self.saved

        class RawModule:
            def __init__(self, code, options):
                self.code, self.options, self.device = code, options, fake.current

            def compile(self):
                fake.compiled.append((self.device, self.code, self.options))

            def get_function(self, name):
                fake.fetched.append((self.device, name))
                return (self.device, self.code, name)

        self.cuda = types.SimpleNamespace(Device=Device)
        self.RawModule = RawModule


def test_a_source_compiles_once_per_device_and_each_kernel_is_fetched_once(monkeypatch):
    cp = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    renders = []

    def render():
        renders.append(1)
        return "// source A"

    kernels = SourceKernels(render, lambda source: ("-std=c++17", f"-DLEN={len(source)}"))
    other = SourceKernels(lambda: "// source B", lambda source: ())
    assert renders == [] and cp.compiled == []   # nothing before a kernel is asked for
    assert kernels.kernel("k1") == (0, "// source A", "k1")
    assert kernels.kernel("k1") == (0, "// source A", "k1")
    assert kernels.kernel("k2") == (0, "// source A", "k2")
    cp.current = 1
    assert kernels.kernel("k1") == (1, "// source A", "k1")
    assert other.kernel("k1") == (1, "// source B", "k1")
    assert cp.compiled == [(0, "// source A", ("-std=c++17", "-DLEN=11")), (1, "// source A", ("-std=c++17", "-DLEN=11")),
                           (1, "// source B", ())]
    assert cp.fetched == [(0, "k1"), (0, "k2"), (1, "k1"), (1, "k1")]
    assert len(renders) == 2   # once a device
    assert cp.current == 1     # compiling on a device leaves the current one as it was


def test_the_fused_modules_compile_their_own_sources_with_their_options(monkeypatch):
    cp = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(fused.KERNELS, "module", fused.KERNELS.module.__wrapped__)
    monkeypatch.setattr(fused_sixteen_bit.KERNELS, "module", fused_sixteen_bit.KERNELS.module.__wrapped__)
    monkeypatch.setattr(compiler, "cuda_include_dir", lambda: "/cuda/include")   # where the 16-bit headers are
    fused.KERNELS.module(3)
    fused_sixteen_bit.KERNELS.module(3)
    assert cp.compiled == [(3, fused.render_source(), ("-std=c++17",)),
                           (3, fused_sixteen_bit.render_source(), ("-std=c++17", "-I/cuda/include"))]
    assert fused._kernel == fused.KERNELS.kernel and fused_sixteen_bit._kernel == fused_sixteen_bit.KERNELS.kernel
