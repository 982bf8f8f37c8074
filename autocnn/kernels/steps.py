"""What a plan runs, step by step: its generated kernels' launches and the library calls between
them (cuBLAS GEMMs, real and complex, and cuFFT transforms), each naming the plan's buffers, never
addresses (kernels/runtime.py binds them per call)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from autocnn.precision import FLOAT32

# What a plan's workspaces are made of: the runtime allocates each as an array of these (so a
# workspace's bytes are this size times its elements, whatever the precision), and the kernels use
# them for FP32 values (partial sums, TF32 parts, spectra) and staged float32 operands.
WORKSPACE_ELEMENT = FLOAT32


@dataclass(frozen=True)
class Launch:
    """A generated kernel's launch: buffers by name, then int scalars (e.g. the first image of a
    block of images, where a formulation runs one kernel per block)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[str, ...]
    scalars: tuple[int, ...] = ()
    # TMA tensor maps (kernels/tensor_maps.py: TensorMap) over the plan's buffers, passed by value ahead
    # of args. Left out of the repr: launches without any keep the code digests they had before the
    # field (KernelPlan.code_digest adds the maps of the launches that have some).
    tensor_maps: tuple[Any, ...] = field(default=(), repr=False)
    # Programmatic dependent launch (sm_90): the kernel may start while the previous one's last blocks
    # run, and waits for it (griddepcontrol.wait) before it reads what that kernel wrote. Left out of
    # the repr as the maps are: KernelPlan.code_digest adds it where it is set.
    programmatic: bool = field(default=False, repr=False)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class MatrixView:
    """Row-major matrices inside a plan buffer (a float32 array of its own, an input, an output or
    a workspace): element (i, j) of matrix b is buffer[offset + b*batch_stride + i*ld + j]. A
    batch_stride of 0 repeats one matrix over the batch."""

    buffer: str
    offset: int
    ld: int
    batch_stride: int = 0

    def extent(self, rows: int, cols: int, batch: int) -> int:
        """One past the last element the view reaches."""
        return self.offset + (batch - 1) * self.batch_stride + (rows - 1) * self.ld + cols


@dataclass(frozen=True)
class LibraryGemmShape:
    """What the library GEMM steps (real, LibraryGemm, and complex, LibraryComplexGemm) share: ``batch``
    products C = op(A) op(B) of row-major views, op(A) m x k, op(B) k x n, C m x n, each operand
    stored as op(X) ("n"), its transpose ("t") or its conjugate transpose ("h"); how the kinds name
    that is ``stored_op``. Views count FLOATS floats an element."""

    m: int
    n: int
    k: int
    a: MatrixView
    b: MatrixView
    c: MatrixView

    # What the plan's users ask of every step: a library call runs no block of ours and needs no
    # dynamic shared memory from the plan; it is named by the routine that runs it.
    shared_bytes: ClassVar[int] = 0
    threads: ClassVar[int] = 0
    FLOATS: ClassVar[int] = 1
    WHAT: ClassVar[str] = "GEMM"   # the kind, as the checks' messages name it

    def stored_op(self, operand: str) -> str:
        raise NotImplementedError

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"a library {self.WHAT} needs {name} >= 1, not {getattr(self, name)}")
        for name, (rows, cols) in self.stored_shapes().items():
            view = getattr(self, name)
            if view.ld < cols or view.offset < 0 or view.batch_stride < 0:
                raise ValueError(f"{self.WHAT} operand {name}: a {rows}x{cols} matrix cannot have ld={view.ld}, "
                                 f"offset={view.offset}, batch_stride={view.batch_stride}")
        if self.batch > 1 and self.c.batch_stride < self.c.extent(self.m, self.n, 1) - self.c.offset:
            raise ValueError(f"{self.WHAT} output matrices overlap (batch_stride {self.c.batch_stride})")

    def stored_shapes(self) -> dict[str, tuple[int, int]]:
        """(rows, cols) of each operand as stored."""
        return {"a": (self.m, self.k) if self.stored_op("a") == "n" else (self.k, self.m),
                "b": (self.k, self.n) if self.stored_op("b") == "n" else (self.n, self.k),
                "c": (self.m, self.n)}

    def extents(self) -> dict[str, tuple[str, int]]:
        """For each operand: its buffer and the floats the step reaches in it."""
        return {name: (getattr(self, name).buffer, self.FLOATS * getattr(self, name).extent(rows, cols, self.batch))
                for name, (rows, cols) in self.stored_shapes().items()}


@dataclass(frozen=True)
class LibraryGemm(LibraryGemmShape):
    """A step between generated kernels: ``batch`` float32 GEMMs C = op(A) op(B) (+ C when
    ``accumulate``) by cuBLAS (strided-batched SGEMM) on views of the plan's buffers; op(A) is
    m x k, op(B) k x n, C m x n. ``trans_a`` says A is stored as its transpose (k x m), likewise
    ``trans_b``. ``tf32`` allows TF32 tensor-op math (only a tf32 problem's formulation asks for
    it); without it cuBLAS computes in FP32 (kernels/cublas_gemm.py)."""

    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1
    accumulate: bool = False
    tf32: bool = False

    kernel: ClassVar[str] = "cublasSgemmStridedBatched"

    def stored_op(self, operand: str) -> str:
        return "t" if getattr(self, f"trans_{operand}") else "n"


@dataclass(frozen=True)
class LibraryFft:
    """A step between generated kernels: ``batch`` two-dimensional real FFTs of height x width
    planes by cuFFT (kernels/cufft_steps.py). "r2c" turns real planes (height*width floats each,
    from ``src`` at element ``src_offset``) into half spectra (height*(width//2+1) complex numbers,
    two floats each, in ``dst``); "c2r" turns them back, unnormalised (c2r after r2c multiplies by
    height*width) and, as cuFFT may, overwriting its input."""

    kind: str
    src: str
    src_offset: int
    dst: str
    dst_offset: int
    batch: int
    height: int
    width: int
    # The half spectra frequency-major, [frequency][plane]: frequency f of plane b at f*batch + b
    # (complex numbers), as a batched GEMM over frequencies reads them (LibraryComplexGemm); False,
    # plane after plane. Left out of the repr when False (below): the code digest hashes the repr,
    # and steps planned before the field existed keep their digests.
    frequency_major: bool = False

    shared_bytes: ClassVar[int] = 0
    threads: ClassVar[int] = 0

    def __repr__(self) -> str:
        names = [f.name for f in fields(self) if f.name != "frequency_major" or self.frequency_major]
        return f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + ")"

    def __post_init__(self) -> None:
        if self.kind not in ("r2c", "c2r"):
            raise ValueError(f"a library FFT is r2c or c2r, not {self.kind!r}")
        for name in ("batch", "height", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"a library FFT needs {name} >= 1, not {getattr(self, name)}")
        if self.src_offset < 0 or self.dst_offset < 0:
            raise ValueError("library FFT offsets are element counts >= 0")

    @property
    def kernel(self) -> str:
        return "cufftExecR2C" if self.kind == "r2c" else "cufftExecC2R"

    @property
    def real_plane(self) -> int:
        return self.height * self.width

    @property
    def spectrum_plane(self) -> int:
        """Floats of one half spectrum (complex numbers are two floats)."""
        return 2 * self.height * (self.width // 2 + 1)

    def extents(self) -> dict[str, tuple[str, int]]:
        """For its source and destination: the buffer and the elements the step reaches in it."""
        real, spectrum = self.real_plane, self.spectrum_plane
        src_plane, dst_plane = (real, spectrum) if self.kind == "r2c" else (spectrum, real)
        return {"src": (self.src, self.src_offset + self.batch * src_plane),
                "dst": (self.dst, self.dst_offset + self.batch * dst_plane)}


@dataclass(frozen=True)
class LibraryComplexGemm(LibraryGemmShape):
    """A step between generated kernels: ``batch`` complex GEMMs C = op(A) op(B) (+ C when
    ``accumulate``) by cuBLAS (strided-batched, complex float32) on views of the plan's buffers whose
    offsets, leading dimensions and batch strides count complex numbers (two floats). op(A) is m x k,
    op(B) k x n, C m x n, all row-major; ``op_a`` says how A is stored: "n" as op(A), "t" as its
    transpose (k x m), "h" as its conjugate transpose (k x m); likewise ``op_b``. ``tf32`` lets
    cuBLAS round the operands to TF32 on the tensor cores (only a tf32 problem's formulation asks for
    it); without it cuBLAS computes in FP32 (kernels/cublas_gemm.py)."""

    op_a: str = "n"
    op_b: str = "n"
    batch: int = 1
    accumulate: bool = False
    tf32: bool = False

    kernel: ClassVar[str] = "cublasGemmStridedBatchedEx"
    FLOATS: ClassVar[int] = 2
    WHAT: ClassVar[str] = "complex GEMM"
    OPS: ClassVar[tuple[str, ...]] = ("n", "t", "h")

    def __post_init__(self) -> None:
        for name in ("op_a", "op_b"):
            if getattr(self, name) not in self.OPS:
                raise ValueError(f"{name} is one of {self.OPS}, not {getattr(self, name)!r}")
        super().__post_init__()

    def stored_op(self, operand: str) -> str:
        return getattr(self, f"op_{operand}")


Step = Launch | LibraryGemm | LibraryComplexGemm | LibraryFft
