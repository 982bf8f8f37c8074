"""The report's data model: what is collected from the inputs, before any page is drawn.

The HTML page, the Markdown summary and the console lines are all made from one ReportData.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from autocnn.precision import DEFAULT_PRECISION

TITLE = "autocnn tuning report"


class ReportError(Exception):
    """An input that cannot be used at all (the message names it and says what is wrong)."""


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, and the same of the exception that caused it."""
    text = str(exc).strip().splitlines()
    out = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc and str(cause).strip():
        out += f" ({type(cause).__name__}: {str(cause).strip().splitlines()[0]})"
    return out


@dataclass(frozen=True)
class ReportRequest:
    """What a report is asked to show and where it goes (autocnn.cli.report reads it from the
    command line): the inputs, the filters and the two output files."""

    db: Path | None = None              # a database directory or file; None: the user's and the shipped one
    storage: str | None = None          # an Optuna storage URL or journal file; None: the tuner's default
    bench: Path | None = None           # a benchmark JSON of autocnn bench: ceilings and cuDNN times
    ceilings: Ceilings | None = None    # given ceilings, over those of ``bench``
    network: str | None = None          # report this network's kernels, and those on a fallback
    batch: int = 128
    precision: str = DEFAULT_PRECISION.name   # the network's precision
    gpu: str | None = None              # only GPUs whose name contains this text
    op: str | None = None               # only these operations (comma-separated)
    out: Path = Path("report.html")
    markdown: Path | None = None        # None: next to ``out``, with .md


# -- collected data -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float
    sgemm_tflops: float
    source: str
    tf32_tflops: float | None = None   # the TF32 tensor-core GEMM rate, where it was measured or given

    @property
    def peak_gflops(self) -> float:
        return self.sgemm_tflops * 1000.0

    def peak_gflops_for(self, precision: str) -> float | None:
        """The compute ceiling of a kernel of this precision (a report row's label): the SGEMM rate
        for fp32 (and pooling's "-"), the TF32 GEMM rate for tf32 (None where that is unknown)."""
        from autocnn.reports.labels import shown_precision

        shown = shown_precision(precision)
        if shown is not None and shown.tf32:
            return None if self.tf32_tflops is None else self.tf32_tflops * 1000.0
        return self.peak_gflops

    def roof(self, intensity: float, precision: str = "fp32") -> float | None:
        """The attainable GFLOP/s at this arithmetic intensity (flop per byte) and precision."""
        peak = self.peak_gflops_for(precision)
        return None if peak is None else min(peak, self.copy_gbps * intensity)

    def text(self) -> str:
        tf32 = "" if self.tf32_tflops is None else f", TF32 GEMM {self.tf32_tflops:.1f} TFLOP/s"
        return f"copy {self.copy_gbps:.0f} GB/s, SGEMM {self.sgemm_tflops:.1f} TFLOP/s{tf32}"


@dataclass
class KernelRow:
    """One tuned kernel (a tuning record) as the report shows it."""

    gpu_label: str
    op: str
    shape: str
    label: str                 # "op · seed shape name" where the problem is a seed shape, else "op · shape"
    layer: str                 # the network layer(s) that run it ("" without --network)
    config: str
    time_us: float
    default_us: float | None
    cudnn_us: float | None
    cudnn_source: str | None   # "record" or "bench"
    trials: int
    study: str | None
    tuned_at: str
    flops: int
    min_bytes: int
    precision: str = "fp32"    # fp32 or tf32 ("-" for pooling); tf32 rows are compared with cuDNN TF32
    seed_index: int | None = None   # position of the seed shape in the suite, for ordering

    @property
    def speedup_default(self) -> float | None:
        return None if self.default_us is None else self.default_us / self.time_us

    @property
    def speedup_cudnn(self) -> float | None:
        return None if self.cudnn_us is None else self.cudnn_us / self.time_us

    @property
    def intensity(self) -> float:
        return self.flops / self.min_bytes if self.min_bytes else float("nan")

    @staticmethod
    def gflops_at(flops: int, time_us: float | None) -> float | None:
        return None if not time_us else flops / (time_us * 1e-6) / 1e9

    @property
    def gflops(self) -> float | None:
        return self.gflops_at(self.flops, self.time_us)

    @property
    def gbps(self) -> float | None:
        return None if not self.time_us else self.min_bytes / (self.time_us * 1e-6) / 1e9


@dataclass
class Fallback:
    """A kernel a network needs that no exact record answers."""

    op: str
    shape: str
    layer: str
    source: str
    detail: str
    config: str


@dataclass
class Group:
    """One table: the kernels of one GPU (and one network with --network)."""

    ident: str                   # for HTML ids: g1, g2, ...
    title: str
    gpu_key: tuple
    rows: list[KernelRow]
    ceilings: Ceilings | None
    network: str | None = None
    fallbacks: list[Fallback] = field(default_factory=list)


@dataclass
class StudyView:
    ident: str                   # s1, s2, ...
    name: str
    op: str
    shape: str
    label: str
    gpu: str
    stale: bool
    states: Counter
    complete: list[tuple[int, float, bool]]   # (trial number, value, reused) of COMPLETE trials
    failures: Counter
    importances: dict[str, float] | None = None
    importance_note: str = ""
    record_shape: bool = False  # a tuning record names this study

    @property
    def n_trials(self) -> int:
        return sum(self.states.values())

    @property
    def measured_times(self) -> list[float]:
        return [v for _, v, reused in self.complete if not reused]

    @property
    def best(self) -> float | None:
        return min((v for _, v, _ in self.complete), default=None)


@dataclass
class ReportData:
    made_at: str
    version: str
    db_sources: list[str]
    db_files: list[str]
    storage_url: str | None          # redacted
    storage_opened: bool
    storage_note: str
    bench_path: str | None
    ceilings_text: str
    filters: list[str]
    groups: list[Group]
    studies: list[StudyView]
    record_count: int
    errors: list[str]
    notes: list[str]
    db_warnings: list[str]
    network: str | None
