"""CUDA compilation: nvcc -cubin with the ptxas resource report, or NVRTC through CuPy.

nvcc runs anywhere it is installed (CI compiles every family for sm_80 and sm_90 without a GPU)
and reports registers, shared memory and spills before any GPU time is spent. NVRTC needs only
CuPy, which is what a user of the training library has; it carries no CUDA headers of its own, so a
kernel of 16-bit tensors, which includes cuda_bf16.h and cuda_fp16.h, is compiled with the CUDA
include directory found beside the toolkit or the CUDA wheels (``nvrtc_options``). Both cache by a hash of the source and
the options; a compiler failure comes back as CompileError with the compiler's log.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autocnn.errors import CompileError

NVCC_FLAGS = ("-std=c++17", "-O3")
NVRTC_FLAGS = ("-std=c++17",)
COMPILE_TIMEOUT_S = 300


def cache_root() -> Path:
    """autocnn's cache directory (compiled kernels, tuning studies); AUTOCNN_CACHE_DIR overrides."""
    env = os.environ.get("AUTOCNN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autocnn"


@dataclass(frozen=True)
class ResourceReport:
    """ptxas's account of one kernel (or the loaded function's attributes under NVRTC)."""

    kernel: str
    registers: int
    static_shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class CompiledModule:
    source_hash: str
    arch: str
    compiler: str                     # "nvcc" or "nvrtc"
    cubin_path: str | None            # nvcc output on disk (loaded by CuPy on the GPU)
    reports: dict[str, ResourceReport] = field(default_factory=dict)
    seconds: float = 0.0
    log: str = ""


def source_hash(source: str, *parts: str) -> str:
    h = hashlib.sha256(source.encode())
    for p in parts:
        h.update(b"\0" + p.encode())
    return h.hexdigest()


_FUNC_RE = re.compile(r"Function properties for (\S+)")
_STACK_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_ENTRY_RE = re.compile(r"Compiling entry function '(\S+)'")


def parse_ptxas_report(log: str) -> dict[str, ResourceReport]:
    """Parse ``ptxas -v`` output into one report per kernel (entry function)."""
    reports: dict[str, ResourceReport] = {}
    current: str | None = None
    stack = (0, 0, 0)
    for line in log.splitlines():
        m = _ENTRY_RE.search(line) or _FUNC_RE.search(line)
        if m:
            if current != m.group(1):
                stack = (0, 0, 0)
            current = m.group(1)
            continue
        m = _STACK_RE.search(line)
        if m and current:
            stack = tuple(int(g) for g in m.groups())  # type: ignore[assignment]
            continue
        m = _USED_RE.search(line)
        if m and current:
            barriers = _BARRIERS_RE.search(line)
            smem = _SMEM_RE.search(line)
            reports[current] = ResourceReport(
                kernel=current, registers=int(m.group(1)),
                static_shared_bytes=int(smem.group(1)) if smem else 0,
                stack_bytes=stack[0], spill_stores=stack[1], spill_loads=stack[2],
                barriers=int(barriers.group(1)) if barriers else 0)
    return reports


# The headers of the 16-bit element types, which the kernels of bf16 and fp16 problems include.
HALF_HEADERS = ("cuda_bf16.h", "cuda_fp16.h")


@functools.lru_cache(maxsize=1)
def cuda_include_dir() -> str | None:
    """A directory holding the 16-bit types' CUDA headers (HALF_HEADERS) for NVRTC: $CUDA_PATH's or
    $CUDA_HOME's, the toolkit beside nvcc, CuPy's CUDA path, /usr/local/cuda, or the CUDA wheels'
    (nvidia/cuda_runtime for CUDA 12, nvidia/cu13 for 13); None where none has them."""
    candidates = [os.path.join(os.environ[v], "include") for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]
    nvcc = nvcc_path()
    if nvcc:
        candidates.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include"))
    try:
        import cupy

        if cupy.cuda.get_cuda_path():
            candidates.append(os.path.join(cupy.cuda.get_cuda_path(), "include"))
    except Exception:   # CuPy absent, or without a CUDA path: the other places remain
        pass
    candidates.append("/usr/local/cuda/include")
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += [os.path.join(root, "cuda_runtime", "include"), os.path.join(root, "cu13", "include")]
    for directory in candidates:
        if all(os.path.isfile(os.path.join(directory, h)) for h in HALF_HEADERS):
            return directory
    return None


def nvrtc_options(source: str, *extra: str) -> tuple[str, ...]:
    """NVRTC's options for ``source``: NVRTC_FLAGS and ``extra``, and the CUDA include directory where
    the source includes a 16-bit type's header (only there, so that other kernels' options, and the
    caches keyed by them, stay as they are)."""
    options = (*NVRTC_FLAGS, *extra)
    if any(f"#include <{h}>" in source for h in HALF_HEADERS):
        directory = cuda_include_dir()
        if directory is None:
            raise CompileError(f"this kernel includes {' and '.join(HALF_HEADERS)}, which NVRTC does not carry, and no "
                               f"CUDA include directory has them: set CUDA_PATH to a CUDA toolkit, or pip install "
                               f"nvidia-cuda-runtime-cu12 (CUDA 12) or nvidia-cuda-runtime (CUDA 13)")
        options += (f"-I{directory}",)
    return options


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for candidate in ("/usr/local/cuda/bin/nvcc",):
        if os.path.exists(candidate):
            return candidate
    return None


class NvccCompiler:
    """``nvcc -cubin`` for one architecture, cached on disk by source hash."""

    def __init__(self, arch: str = "sm_90", nvcc: str | None = None, cache_dir: Path | None = None):
        self.arch = arch
        self.nvcc = nvcc or nvcc_path()
        if self.nvcc is None:
            raise CompileError("nvcc was not found on PATH; install the CUDA toolkit or compile with NVRTC")
        self.cache_dir = (cache_dir or cache_root() / "cubin") / arch
        self._version = self._nvcc_version()

    def _nvcc_version(self) -> str:
        try:
            out = subprocess.run([self.nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompileError(f"nvcc at {self.nvcc} does not run: {exc}") from exc
        return out.strip().splitlines()[-1] if out.strip() else "unknown"

    def compile(self, source: str, config: Any = None, arch: str | None = None) -> CompiledModule:
        """``arch``: another target than the compiler's (a plan's architecture-specific one, sm_90a)."""
        arch = arch or self.arch
        cache_dir = self.cache_dir if arch == self.arch else self.cache_dir.parent / arch
        digest = source_hash(source, arch, *NVCC_FLAGS, self._version)
        cubin = cache_dir / f"{digest}.cubin"
        meta = cache_dir / f"{digest}.json"
        if cubin.exists() and meta.exists():
            try:
                data = json.loads(meta.read_text())
                reports = {k: ResourceReport(**v) for k, v in data["reports"].items()}
                return CompiledModule(digest, arch, "nvcc", str(cubin), reports, 0.0, data.get("log", ""))
            except (ValueError, KeyError, TypeError):
                pass  # a damaged cache entry is rebuilt below
        cache_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="autocnn-nvcc-") as tmp:
            src = Path(tmp) / "kernel.cu"
            out = Path(tmp) / "kernel.cubin"
            src.write_text(source)
            cmd = [self.nvcc, "-cubin", f"-arch={arch}", *NVCC_FLAGS, "-Xptxas", "-v", "-o", str(out), str(src)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise CompileError(f"nvcc ran past {COMPILE_TIMEOUT_S} s", config=config) from None
            log = (proc.stdout or "") + (proc.stderr or "")
            if proc.returncode != 0 or not out.exists():
                raise CompileError(f"nvcc failed for {arch} (exit {proc.returncode})", log=log, config=config)
            # Write then rename, so a concurrent reader never sees half a cubin.
            tmp_cubin = _private_tmp(cubin)
            shutil.copyfile(out, tmp_cubin)
            os.replace(tmp_cubin, cubin)
        reports = parse_ptxas_report(log)
        seconds = time.perf_counter() - start
        tmp_meta = _private_tmp(meta)
        tmp_meta.write_text(json.dumps({"reports": {k: asdict(v) for k, v in reports.items()}, "log": log}))
        os.replace(tmp_meta, meta)
        return CompiledModule(digest, arch, "nvcc", str(cubin), reports, seconds, log)


def _private_tmp(path: Path) -> Path:
    """A temporary name beside ``path`` that no other writer uses: cache entries are written there
    and renamed into place. The process id alone is not enough: the compile pool's threads share
    it, and two of them writing one source's entry renamed each other's file away (seen in CI)."""
    return path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")


class NvrtcCompiler:
    """NVRTC through CuPy; modules are cached in memory by source hash (CuPy caches on disk)."""

    def __init__(self) -> None:
        from autocnn.gpu import require_cupy

        self.cp = require_cupy()
        self._modules: dict[str, Any] = {}

    def load(self, source: str, config: Any = None, arch: str | None = None) -> Any:
        """The loaded module of ``source``. ``arch``: an architecture-specific target (sm_90a), which
        CuPy's RawModule does not take: NVRTC compiles it to a cubin (cached on disk), loaded from there."""
        options = nvrtc_options(source)
        digest = source_hash(source, *options, arch or "")
        module = self._modules.get(digest)
        if module is not None:
            return module
        if arch is not None:
            module = self.cp.RawModule(path=str(self._cubin(source, arch, config)))
            self._modules[digest] = module
            return module
        try:
            module = self.cp.RawModule(code=source, options=options)
            module.compile()
        except self.cp.cuda.compiler.CompileException as exc:
            raise CompileError("NVRTC failed", log=str(exc), config=config) from None
        self._modules[digest] = module
        return module

    def _cubin(self, source: str, arch: str, config: Any) -> Path:
        options = nvrtc_options(source, f"-arch={arch}")
        path = cache_root() / "nvrtc-cubin" / arch / f"{source_hash(source, 'nvrtc', _nvrtc_version(), *options)}.cubin"
        if path.exists():
            return path
        _, cubin = _nvrtc_compile(source, options, arch, config)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _private_tmp(path)
        tmp.write_bytes(cubin)
        os.replace(tmp, path)
        return path


def _nvrtc_version() -> str:
    from cupy_backends.cuda.libs import nvrtc

    return ".".join(str(v) for v in nvrtc.getVersion())


def _nvrtc_compile(source: str, options: tuple[str, ...], arch: str, config: Any = None) -> tuple[str, bytes]:
    """NVRTC (through CuPy's bindings) to a cubin of ``arch``: the program's log and the cubin."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, "autocnn.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError:
            raise CompileError(f"NVRTC failed for {arch}", log=nvrtc.getProgramLog(prog), config=config) from None
        return nvrtc.getProgramLog(prog), nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def resource_violations(module: CompiledModule, plan: Any, regs_per_sm: int = 65536,
                        max_smem_per_block: int = 227 * 1024, allow_spills: bool = False) -> list[str]:
    """Why a compiled plan cannot run well or at all, from the ptxas report (empty when it can)."""
    reasons = []
    for launch in plan.launches:
        rep = module.reports.get(launch.kernel)
        if rep is None:
            continue
        if rep.registers * launch.threads > regs_per_sm:
            reasons.append(f"{launch.kernel}: {rep.registers} registers x {launch.threads} threads exceed "
                           f"the {regs_per_sm} registers of a multiprocessor")
        if rep.static_shared_bytes + launch.shared_bytes > max_smem_per_block:
            reasons.append(f"{launch.kernel}: {rep.static_shared_bytes + launch.shared_bytes} bytes of shared "
                           f"memory exceed {max_smem_per_block}")
        if rep.spills and not allow_spills:
            reasons.append(f"{launch.kernel}: spills registers ({rep.spill_stores} bytes stored, "
                           f"{rep.spill_loads} loaded)")
    return reasons


class ResourceReporter:
    """ptxas's resource report of a source for one architecture, without a GPU, cached on disk by
    the source's hash (a lookup asks again for the same borrowed config on every build).

    Compiles with ``nvcc -cubin -Xptxas -v`` where nvcc is installed (NvccCompiler's cache holds the
    report beside the cubin), else with NVRTC through CuPy (``-Xptxas=-v`` to a cubin of the real
    architecture), which is what a GPU host without the CUDA toolkit has.
    """

    def __init__(self, arch: str, cache_dir: Path | None = None):
        self.arch = arch
        self.cache_dir = cache_dir
        self._nvcc: NvccCompiler | None = None
        if nvcc_path() is not None:
            self._nvcc = NvccCompiler(arch, cache_dir=cache_dir)
        elif not _cupy_nvrtc_available():
            raise CompileError(f"neither nvcc nor NVRTC (through CuPy) is available to check {arch} kernels")

    def reports(self, source: str) -> dict[str, ResourceReport]:
        """One report per kernel of ``source``; CompileError when it does not compile."""
        if self._nvcc is not None:
            return self._nvcc.compile(source).reports
        return self._nvrtc_reports(source)

    def _nvrtc_reports(self, source: str) -> dict[str, ResourceReport]:
        options = nvrtc_options(source, f"-arch={self.arch}", "-Xptxas=-v")
        digest = source_hash(source, "nvrtc", _nvrtc_version(), *options)
        meta = (self.cache_dir or cache_root() / "ptxas") / self.arch / f"{digest}.json"
        try:
            return {k: ResourceReport(**v) for k, v in json.loads(meta.read_text()).items()}
        except (OSError, ValueError, TypeError):
            pass   # not cached yet (or a damaged entry): compile below
        log, _ = _nvrtc_compile(source, options, self.arch)
        reports = parse_ptxas_report(log)
        meta.parent.mkdir(parents=True, exist_ok=True)
        tmp = _private_tmp(meta)
        tmp.write_text(json.dumps({k: asdict(v) for k, v in reports.items()}))
        os.replace(tmp, meta)
        return reports


def _cupy_nvrtc_available() -> bool:
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception:  # noqa: BLE001 - no CuPy, or CuPy without a loadable NVRTC
        return False
    return True


_REPORTERS: dict[str, ResourceReporter | None] = {}


def resource_reporter(arch: str) -> ResourceReporter | None:
    """The process's reporter for ``arch``, or None where no compiler can check kernels."""
    if arch not in _REPORTERS:
        try:
            _REPORTERS[arch] = ResourceReporter(arch)
        except CompileError:
            _REPORTERS[arch] = None
    return _REPORTERS[arch]


class CompilePool:
    """Compiles plans ahead of the GPU: nvcc processes driven from a thread pool."""

    def __init__(self, arch: str, workers: int | None = None, cache_dir: Path | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.compiler = NvccCompiler(arch, cache_dir=cache_dir)
        self.executor = ThreadPoolExecutor(max_workers=workers or max(1, os.cpu_count() or 1))

    def submit(self, plan: Any):
        """A future of the CompiledModule; its exception is the CompileError."""
        return self.executor.submit(self.compiler.compile, plan.source, plan.config,
                                    plan.compile_arch(self.compiler.arch))

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
