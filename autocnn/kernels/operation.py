"""What every operation provides, and the plan that turns (problem, config) into launches.

An operation composes the formulations registered for it (formulations/): its search space is the
union of theirs, its heuristic default their candidates in its order of preference, and a config
is rendered, launched and fingerprinted by the formulation it names. The KernelPlan it returns is
everything a runtime needs: CUDA source, kernels in launch order with grid/block/shared memory and
argument names, buffers to zero first, and scratch workspaces.
"""
from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Mapping, Sequence

from autocnn.kernels.codegen import code_source, render_family, template_fingerprint
from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels.space import Config, Constraint, Param, SearchSpace

if TYPE_CHECKING:
    from autocnn.kernels.formulations.base import Formulation, OpFormulation

GRID_YZ_LIMIT = 65535
GRID_X_LIMIT = 2**31 - 1
# A kernel's static __shared__ arrays, on every architecture (more is dynamic, opted into per kernel).
STATIC_SMEM_LIMIT = 48 * 1024


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


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

# Bumped when what code_digest hashes, or how, changes (every stored plan digest is then stale).
CODE_DIGEST_VERSION = 1
# Lines of the rendered source that name the config and the template fingerprint
# (templates/_common.cuh.j2) rather than say what the code does.
_HEADER_PREFIXES = ("// config: ", "// Do not edit: rendered from")


def code_text(source: str) -> str:
    """The rendered source without its header lines naming the config and the fingerprint.

    They are left out of the code digest because they change whenever a parameter is added to a
    formulation (the config text gains it) or any template of it is edited (the fingerprint), even
    where the code they describe stays the same; every other line, comments included, is kept."""
    return "".join(line for line in source.splitlines(keepends=True) if not line.startswith(_HEADER_PREFIXES))


@dataclass(frozen=True)
class KernelPlan:
    op: str
    problem: Any
    config: Config
    source: str
    fingerprint: str
    launches: tuple[Launch, ...]     # the generated kernels' launches, in order
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    zero_first: tuple[str, ...] = ()
    workspaces: tuple[tuple[str, int], ...] = ()   # (name, float32 elements)
    steps: tuple[Step, ...] = ()     # all the plan runs, in order: its launches and library GEMMs between them
    # "a": compiled for the architecture-specific target (sm_90 -> sm_90a), whose instructions
    # (wgmma) run on that architecture only; "" for the portable target.
    target_suffix: str = ""

    def __post_init__(self) -> None:
        # A formulation's launches() is the whole sequence (Operation.plan passes it as
        # ``launches``): it becomes the steps, and ``launches`` keeps the generated kernels' only,
        # which is what everything that inspects kernels (resources, block sizes) means by it.
        if not self.steps:
            object.__setattr__(self, "steps", tuple(self.launches))
        object.__setattr__(self, "launches", tuple(s for s in self.launches if isinstance(s, Launch)))

    def compile_arch(self, arch: str) -> str:
        """The compiler's target for a device of architecture ``arch`` (e.g. sm_90 -> sm_90a)."""
        return arch + self.target_suffix

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """The generated kernels the plan launches (library GEMMs are not in its source)."""
        seen: list[str] = []
        for launch in self.launches:
            if launch.kernel not in seen:
                seen.append(launch.kernel)
        return tuple(seen)

    @property
    def library_gemms(self) -> tuple[LibraryGemm, ...]:
        return tuple(step for step in self.steps if isinstance(step, LibraryGemm))

    @property
    def library_complex_gemms(self) -> tuple[LibraryComplexGemm, ...]:
        return tuple(step for step in self.steps if isinstance(step, LibraryComplexGemm))

    @property
    def library_ffts(self) -> tuple[LibraryFft, ...]:
        return tuple(step for step in self.steps if isinstance(step, LibraryFft))

    @property
    def workspace_bytes(self) -> int:
        """Device memory the plan needs besides its inputs and outputs."""
        return 4 * sum(n for _, n in self.workspaces)

    @property
    def max_shared_bytes(self) -> int:
        return max((launch.shared_bytes for launch in self.launches), default=0)

    @functools.cached_property
    def code_digest(self) -> str:
        """A hash of everything the plan runs: its source (``code_text``: without the header
        lines naming the config and the fingerprint), every step as launched (kernel, grid, block,
        shared memory, arguments; library calls with their operands), its inputs, outputs, buffers
        zeroed first and workspaces. Equal digests mean the same kernels launched the same way, so
        a record whose digest equals its config's plan's now measured the code that would run
        (``autocnn.store.records.validate_record``). Not the config nor the fingerprint: both change
        where the code does not."""
        h = hashlib.sha256()
        h.update(f"code-digest:{CODE_DIGEST_VERSION}\n".encode())
        h.update(code_text(self.source).encode())
        for part in (self.steps, self.inputs, self.outputs, self.zero_first, self.workspaces):
            h.update(b"\0")
            h.update(repr(part).encode())
        maps = [(i, step.tensor_maps) for i, step in enumerate(self.steps) if getattr(step, "tensor_maps", ())]
        if maps:
            h.update(b"\0")
            h.update(repr(maps).encode())
        early = [i for i, step in enumerate(self.steps) if getattr(step, "programmatic", False)]
        if early:
            h.update(b"\0programmatic")
            h.update(repr(early).encode())
        return h.hexdigest()[:16]


class Operation:
    """Base of the five operations. An operation holds what its problem decides (inputs, outputs,
    the op template's variables, flops) and composes the formulations registered for it
    (formulations/base.py): its space is the union of theirs, and a config is planned, launched
    and fingerprinted by the formulation it names."""

    name: str = ""
    family: str = ""                                # the op template: templates/<family>.cu.j2
    problem_type: type = object
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    shared_templates: tuple[str, ...] = ("_common.cuh.j2",)   # what the op template includes besides the formulation's

    def __init__(self, registry: Sequence["Formulation"] | None = None):
        if registry is None:
            from autocnn.kernels.formulations import REGISTRY as registry
        self.formulations: tuple["OpFormulation", ...] = tuple(
            f.for_op(self.name) for f in registry if f.serves(self.name))
        if not self.formulations:
            raise ValueError(f"no formulation is registered for {self.name}")
        names = self.formulation_names
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: two formulations answer to one name in {names}")
        self._code_sources: dict[str, tuple[str, ...]] = {}
        self._code_digests: dict[tuple[str, str, str], str] = {}

    # -- what subclasses provide ------------------------------------------------------------
    def default_candidates(self, problem: Any) -> Sequence[dict[str, Any]]:
        """Configs to try in order for the heuristic default; the last must fit every problem.
        By default each formulation's, in registration order; an operation with a preference
        orders them with ``candidates`` and ``candidates_besides``."""
        return [c for f in self.formulations for c in f.default_candidates(problem)]

    def _problem_context(self, problem: Any) -> dict[str, Any]:
        """Variables of the op template (and every formulation's) beyond the problem itself."""
        return {}

    def _codegen_helpers(self) -> tuple:
        """Functions and constants, besides _problem_context, that decide the code every formulation
        of this operation generates (they are hashed into every fingerprint)."""
        return ()

    def flops(self, problem: Any) -> int:
        raise NotImplementedError

    def min_bytes(self, problem: Any) -> int:
        """Bytes that must cross device memory at least once: each input read and each output written."""
        raise NotImplementedError

    # -- the formulations --------------------------------------------------------------------
    @property
    def formulation_names(self) -> tuple[str, ...]:
        """The values of the "formulation" parameter, in registration order."""
        return tuple(n for f in self.formulations for n in f.names)

    def formulation(self, name: str) -> "OpFormulation":
        """The formulation a config value (e.g. "two_pass") or a formulation's name (e.g. "igemm") selects."""
        for f in self.formulations:
            if name in f.names:
                return f
        for f in self.formulations:
            if name == f.formulation:
                return f
        raise KeyError(f"{self.name} has no formulation {name!r}; it has {', '.join(self.formulation_names)}")

    def formulation_of(self, config: Config | Mapping[str, Any]) -> "OpFormulation | None":
        """The formulation a config names (the only one, for an operation with one), or None."""
        if len(self.formulations) == 1:
            return self.formulations[0]
        name = config.get("formulation")
        return next((f for f in self.formulations if isinstance(name, str) and name in f.names), None)

    def candidates(self, problem: Any, formulation: str) -> list[dict[str, Any]]:
        """One formulation's default candidates (none when it is not registered for this operation)."""
        try:
            return list(self.formulation(formulation).default_candidates(problem))
        except KeyError:
            return []

    def candidates_besides(self, problem: Any, formulations: Sequence[str]) -> list[dict[str, Any]]:
        """The default candidates of the formulations not named, in registration order: where an
        operation's preference order does not place a formulation, it comes last."""
        return [c for f in self.formulations if f.formulation not in formulations
                for c in f.default_candidates(problem)]

    # -- shared behaviour --------------------------------------------------------------------
    def check_problem(self, problem: Any) -> None:
        if not isinstance(problem, self.problem_type):
            raise TypeError(f"{self.name} takes a {self.problem_type.__name__}, not {type(problem).__name__}")

    def space(self, problem: Any, limits: DeviceLimits) -> SearchSpace:
        self.check_problem(problem)
        return compose_space(self.name, self.formulations, problem, limits)

    def default_config(self, problem: Any, limits: DeviceLimits, formulation: str | None = None) -> Config:
        """The first default candidate that fits (of one formulation's, if named)."""
        for config in self.default_configs(problem, limits, formulation):
            return config
        raise AssertionError("default_configs raises when nothing fits")

    def default_configs(self, problem: Any, limits: DeviceLimits, formulation: str | None = None) -> Iterator[Config]:
        """Every default candidate that fits statically, in preference order (a lookup walks them
        until ptxas's report of one shows it runs without spills). Raises when none fits."""
        self.check_problem(problem)
        space = self.space(problem, limits)
        reasons: list[str] = []
        candidates = self.default_candidates(problem) if formulation is None else self.candidates(problem, formulation)
        fitted = 0
        for candidate in candidates:
            try:
                config = space.validate(candidate)
            except InfeasibleConfigError as exc:
                reasons.extend(exc.reasons)
                continue
            except InvalidConfigError as exc:   # a tile the space leaves out for this problem
                reasons.append(str(exc))
                continue
            fitted += 1
            yield config
        if not fitted:
            # Reaching this is a bug in the candidate list, which tests check for every seed shape.
            raise InfeasibleConfigError(self.name, ["no default candidate fits: " + "; ".join(reasons)])

    def template_files(self, formulation: "OpFormulation") -> tuple[str, ...]:
        """Every template file a config of this formulation renders from."""
        return (f"{self.family}.cu.j2", *self.shared_templates, *formulation.templates)

    def _formulation_code(self, formulation: "OpFormulation") -> tuple[str, ...]:
        # The source of the Python that decides a formulation's code and launches: read once (the
        # source does not change under a running process, and lookups ask for it per record).
        key = formulation.formulation
        if key not in self._code_sources:
            parts = [Operation.plan, self._problem_context, *self._codegen_helpers(),
                     formulation.context, formulation.launches, formulation.buffers, *formulation.code_helpers()]
            self._code_sources[key] = tuple(code_source(p) for p in parts)
        return self._code_sources[key]

    def fingerprint(self, formulation: str | None = None) -> str:
        """With a formulation (a config value or a formulation's name): the hash of everything that
        decides its code: the op template, the shared includes, its templates and its Python. Without:
        one hash of all of them (what an Optuna study is named by). A record's key holds the
        fingerprint of its config's formulation, so adding or changing one formulation leaves the
        records of the others current. An operation with one formulation has one fingerprint."""
        if formulation is not None or len(self.formulations) == 1:
            f = self.formulation(formulation) if formulation is not None else self.formulations[0]
            return template_fingerprint(self.template_files(f), self._formulation_code(f))
        each = tuple(f"{f.formulation}:{self.fingerprint(f.names[0])}" for f in self.formulations)
        return template_fingerprint((), each)

    def config_fingerprint(self, config: Config | Mapping[str, Any]) -> str | None:
        """The fingerprint of the code a config generates (its formulation's); None when the config
        names no formulation of this operation."""
        f = self.formulation_of(config)
        return None if f is None else self.fingerprint(f.names[0])

    def key_fingerprint(self, fingerprint: str) -> str:
        """What a record key's fingerprint counts as when keys are compared: any formulation's
        current one counts as the operation's (one record per shape and GPU, whichever formulation
        won: a new winner replaces it), an old one as itself (a stale record stays apart)."""
        current = {self.fingerprint(f.names[0]) for f in self.formulations}
        return self.fingerprint() if fingerprint in current else fingerprint

    def workspace_bytes(self, problem: Any, config: Config) -> int:
        """The scratch memory a config's plan allocates (KernelPlan.workspace_bytes), without rendering."""
        _zero, workspaces = self.formulation_of(config).buffers(problem, config)
        return 4 * sum(n for _, n in workspaces)

    def code_digest(self, problem: Any, config: Config) -> str:
        """``plan(problem, config).code_digest``, computed once per process for each problem,
        config and fingerprint (loading a database asks it of every record whose fingerprint is
        old, and rendering takes milliseconds)."""
        key = (str(self.config_fingerprint(config)), json.dumps(problem.to_dict(), sort_keys=True), config.key())
        digest = self._code_digests.get(key)
        if digest is None:
            digest = self.plan(problem, config).code_digest
            if len(self._code_digests) >= 4096:   # bounded: a long tuning run makes many records
                self._code_digests.clear()
            self._code_digests[key] = digest
        return digest

    def plan(self, problem: Any, config: Config) -> KernelPlan:
        """Render the kernel for a validated config and describe how to launch it."""
        self.check_problem(problem)
        if config.op != self.name:
            raise ValueError(f"a {config.op} config cannot plan {self.name}")
        formulation = self.formulation_of(config)
        context = {
            "op": self.name, "family": self.family, "shape": problem.shape_string(),
            "config_text": str(config), "p": problem, "c": config.as_dict(),
        }
        # Config values are also top-level names: the shared cores are written in terms of them.
        context.update(config.as_dict())
        context.update(self._problem_context(problem))
        context.update(formulation.context(problem, config))
        context["formulation_template"] = formulation.templates[0]
        launches = formulation.launches(problem, config)
        context["planned_threads"] = launches[0].threads
        context["planned_smem"] = max(launch.shared_bytes for launch in launches)
        fingerprint = self.fingerprint(formulation.names[0])
        source = render_family(self.family, context, fingerprint)
        zero, workspaces = formulation.buffers(problem, config)
        return KernelPlan(
            op=self.name, problem=problem, config=config, source=source, fingerprint=fingerprint,
            launches=launches, inputs=self.inputs, outputs=self.outputs,
            zero_first=zero, workspaces=workspaces, target_suffix=formulation.compile_suffix(config),
        )


def compose_space(op: str, formulations: Sequence["OpFormulation"], problem: Any,
                  limits: DeviceLimits) -> SearchSpace:
    """The union of the formulations' spaces: a "formulation" parameter first (where there are
    several), then each formulation's parameters, active when it is chosen, in registration order.
    A parameter name several formulations share becomes one parameter with all their choices; each
    formulation is held to its own choices, and its constraints that touch a shared parameter
    apply to its own configs only."""
    if len(formulations) == 1:
        f = formulations[0]
        return SearchSpace(op, f.params(problem), f.constraints(problem, limits))
    doc = "; ".join(f"{'/'.join(f.names)}: {f.summary}" for f in formulations)
    params: dict[str, Param] = {"formulation": Param("formulation", tuple(n for f in formulations for n in f.names), doc)}
    own = [(f, f.params(problem)) for f in formulations]
    for f, mine in own:
        for p in mine:
            first = params.get(p.name)
            if first is None:
                params[p.name] = Param(p.name, p.choices, p.doc, (("formulation", f.names), *p.active_if))
            else:
                when = dict(first.active_if)
                theirs = {k: v for k, v in when.items() if k != "formulation"}
                if theirs != dict(p.active_if):
                    # One parameter has one activity rule: differing conditions would switch it on or
                    # off for the wrong formulation (a required value it does not use, or none).
                    raise ValueError(f"{op}: parameter {p.name} of {f.formulation} is active under "
                                     f"{dict(p.active_if) or 'no condition'}, but under {theirs or 'no condition'} "
                                     f"in a formulation registered before it: give one of them its own name")
                when["formulation"] = (*when["formulation"], *f.names)
                choices = (*first.choices, *(c for c in p.choices if c not in first.choices))
                params[p.name] = Param(p.name, choices, first.doc, tuple(when.items()))
    declared = Counter(p.name for _, mine in own for p in mine)
    shared = {name for name, n in declared.items() if n > 1}
    constraints: list[Constraint] = []
    for f, mine in own:
        for c in f.constraints(problem, limits):
            constraints.append(_scoped(c, f.names) if shared.intersection(c.params) else c)
        constraints += [_own_choices(p, f.names) for p in mine if params[p.name].choices != p.choices]
    return SearchSpace(op, list(params.values()), constraints)


def _scoped(constraint: Constraint, names: tuple[str, ...]) -> Constraint:
    """The constraint, applied only to configs of the formulation called ``names``."""
    if "formulation" in constraint.params:
        at = constraint.params.index("formulation")
        return Constraint(constraint.params, lambda *v: None if v[at] not in names else constraint.check(*v))
    return Constraint(("formulation", *constraint.params),
                      lambda f, *v: None if f not in names else constraint.check(*v))


def _own_choices(param: Param, names: tuple[str, ...]) -> Constraint:
    return Constraint(("formulation", param.name),
                      lambda f, v: None if f not in names or v in param.choices
                      else f"{param.name}={v} is not one of {f}'s choices {list(param.choices)}")


# -- constraints shared by the families -----------------------------------------------------

def threads_rule(limits: DeviceLimits, params: tuple[str, ...], count, minimum: int = 32) -> Constraint:
    def check(*values):
        n = count(*values)
        if n > limits.max_threads_per_block:
            return f"{n} threads per block exceed the limit of {limits.max_threads_per_block}"
        if n < minimum:
            return f"{n} threads per block are fewer than {minimum}"
        if n % 32:
            return f"{n} threads per block are not a whole number of warps"
        return None
    return Constraint(params, check)


def smem_rule(limits: DeviceLimits, params: tuple[str, ...], nbytes) -> Constraint:
    def check(*values):
        b = nbytes(*values)
        if b > limits.max_smem_per_block:
            return f"{b} bytes of shared memory exceed the device's {limits.max_smem_per_block} per block"
        return None
    return Constraint(params, check)


def workspace_rule(limit_bytes: int, params: tuple[str, ...], nbytes) -> Constraint:
    """A formulation's workspace (bytes, from the problem and these parameters) within the limit."""
    def check(*values):
        b = nbytes(*values)
        if b > limit_bytes:
            return f"{b} bytes of workspace exceed the limit of {limit_bytes}"
        return None
    return Constraint(params, check)


# Multiply-adds one unrolled loop body may hold before code size (and compile time) runs away.
UNROLLED_FMA_LIMIT = 16384


def code_size_rule(params: tuple[str, ...], multiply_adds, limit: int = UNROLLED_FMA_LIMIT) -> Constraint:
    """The multiply-adds of a formulation's unrolled loop body (from these parameters) within ``limit``."""
    def check(*values):
        n = multiply_adds(*values)
        return None if n <= limit else \
            f"the unrolled loop body holds {n} multiply-adds, more than {limit} (code size)"
    return Constraint(params, check)


def grid_rule(params: tuple[str, ...], blocks, axis: str = "y") -> Constraint:
    """The blocks of a launch along ``axis`` (from these parameters) within the grid's limit there."""
    limit = GRID_X_LIMIT if axis == "x" else GRID_YZ_LIMIT

    def check(*values):
        n = blocks(*values)
        return None if n <= limit else f"{n} blocks along {axis} exceed {limit}"
    return Constraint(params, check)


def divides(a: str, b: str) -> Constraint:
    return Constraint((a, b), lambda x, y: None if y % x == 0 else f"{a}={x} does not divide {b}={y}")


def at_most(param: str, bound: int, why: str) -> Constraint:
    return Constraint((param,), lambda v: None if v <= bound else f"{param}={v} exceeds {bound} ({why})")
