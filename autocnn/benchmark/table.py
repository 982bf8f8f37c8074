"""What ``autocnn bench`` makes of its measurements: rows, rates, shares of the GPU's ceilings and
the tables. Nothing here touches a GPU, so it is tested on the CPU with recorded numbers.

Achieved rate: a convolution does ``Operation.flops(problem)`` = 2*N*K*C*R*S*P*Q floating-point
operations (one multiply and one add per term of the direct convolution; the same count for the
forward, backward-data and weight-gradient operations), whatever algorithm runs: cuDNN's FFT or
Winograd algorithms do fewer and may then lie above the GEMM rates. ``tflops`` turns that count
and a time into TFLOP/s, for the kernels and for the GEMM ceilings alike (a square n x n matrix
product does 2*n**3).

Each convolution row holds the run's precisions side by side (fp32 and tf32 by default): fp32
against cuDNN in FP32 (TF32 off), tf32 against cuDNN with TF32 on, bf16 and fp16 against cuDNN in
the same 16-bit type, each with its achieved TFLOP/s and that rate's share of the GPU's SGEMM rate
and of its tensor-core GEMM rate for the precision's operands (TF32 for fp32 and tf32, BF16 or FP16
for bf16 and fp16), measured in the same run. Pooling is placed against the copy bandwidth; its
rows are float32 ("-", which fp32 and tf32 runs share) or 16-bit.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from autocnn.kernels.problem import PoolProblem, precision_label, problem_type
from autocnn.precision import FLOAT32_PRECISION_NAMES, precision_named

CONV_PRECISIONS = FLOAT32_PRECISION_NAMES   # a run's precisions unless told others (the rows name theirs)
NO_PRECISION = "-"        # a float32 pooling row's precision, which fp32 and tf32 runs share
LOW_SPEEDUP = 0.8         # the summary counts the problems below this many times cuDNN's speed


def per_second(amount: float, time_us: float | None) -> float | None:
    """``amount`` (flops, bytes) per second when done in ``time_us`` microseconds (None without a time)."""
    if not time_us or time_us <= 0 or not math.isfinite(time_us):
        return None
    return amount / (time_us * 1e-6)


def tflops(flops: float, time_us: float | None) -> float | None:
    """TFLOP/s of ``flops`` done in ``time_us`` microseconds (None without a time)."""
    rate = per_second(flops, time_us)
    return None if rate is None else rate / 1e12


def gemm_tflops(n: int, time_us: float) -> float:
    """The rate of an n x n by n x n matrix product (2*n**3 flops) done in ``time_us``."""
    rate = tflops(2 * n**3, time_us)
    if rate is None:
        raise ValueError(f"a matrix product needs a positive time, got {time_us!r} us")
    return rate


def share(rate: float | None, ceiling: float | None) -> float | None:
    """``rate`` as a fraction of ``ceiling`` (None where either is unknown)."""
    if rate is None or not ceiling:
        return None
    return rate / ceiling


def geomean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


@dataclass(frozen=True)
class GpuRates:
    """The GPU's ceilings measured in the benchmark's run (None: not measured, e.g. without PyTorch)."""

    copy_gbps: float | None = None
    sgemm_tflops: float | None = None     # FP32 matrix product, TF32 off
    tf32_tflops: float | None = None      # the same product on TF32 tensor cores
    bf16_tflops: float | None = None      # the same product of bfloat16 matrices (measured in 16-bit runs)
    fp16_tflops: float | None = None      # the same product of float16 matrices (measured in 16-bit runs)

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any] | None) -> "GpuRates":
        data = data or {}
        return GpuRates(*(_positive(data.get(k)) for k in ("copy_gbps", "sgemm_tflops", "tf32_tflops",
                                                           "bf16_tflops", "fp16_tflops")))

    def tensor_core(self, precision: str) -> tuple[str, float | None]:
        """The tensor-core GEMM a precision's kernels are placed against, by name, and its rate: the
        TF32 GEMM for fp32 and tf32 (FP32 operands), the product of its own 16-bit type otherwise."""
        p = precision_named(precision)
        field = p.peak if p.sixteen_bit else "tf32_tflops"
        return field.split("_")[0].upper(), getattr(self, field)

    def header(self) -> str:
        def text(v: float | None, spec: str, unit: str) -> str:
            return "not measured" if v is None else f"{format(v, spec)} {unit}"

        sixteen = "".join(f", {name.split('_')[0].upper()} GEMM {text(v, '.1f', 'TFLOP/s')}"
                          for name, v in (("bf16_tflops", self.bf16_tflops), ("fp16_tflops", self.fp16_tflops))
                          if v is not None)
        return (f"# measured in this run: SGEMM {text(self.sgemm_tflops, '.1f', 'TFLOP/s')}, TF32 GEMM "
                f"{text(self.tf32_tflops, '.1f', 'TFLOP/s')}{sixteen}, copy {text(self.copy_gbps, '.0f', 'GB/s')}")


def _positive(v: Any) -> float | None:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if v > 0 and math.isfinite(v) else None


@dataclass
class BenchRow:
    """One problem at one precision: the untuned default, the best sampled config and cuDNN."""

    op: str
    shape: str                       # the seed shape's name
    precision: str                   # the precision's name (a Precision is taken for it); "-": float32 pooling
    flops: int                       # Operation.flops: 2*N*K*C*R*S*P*Q for a convolution
    min_bytes: int                   # Operation.min_bytes: what must cross device memory at least once
    default_us: float | None = None
    best_us: float | None = None
    cudnn_us: float | None = None
    default_failure: str | None = None
    best_config: dict[str, Any] | None = None
    measured: int = 0
    failures: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.precision = str(self.precision)   # rows are text (tables, JSON): the name

    @property
    def vs_cudnn(self) -> float | None:
        """How many times faster than cuDNN the best config is (> 1: faster)."""
        return self.cudnn_us / self.best_us if self.cudnn_us and self.best_us else None

    @property
    def vs_default(self) -> float | None:
        return self.default_us / self.best_us if self.default_us and self.best_us else None

    @property
    def tflops(self) -> float | None:
        return tflops(self.flops, self.best_us)

    @property
    def gbps(self) -> float | None:
        rate = per_second(self.min_bytes, self.best_us)
        return None if rate is None else rate / 1e9

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(vs_cudnn=self.vs_cudnn, tflops=self.tflops, gbps=self.gbps)
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "BenchRow":
        names = BenchRow.__dataclass_fields__
        return BenchRow(**{k: v for k, v in data.items() if k in names})


def fastest_draws(draws: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Per problem, the fastest of several processes' cuDNN times (``draws[process][problem]``);
    None where no process timed it."""
    if not draws:
        return []
    if len({len(d) for d in draws}) != 1:
        raise ValueError(f"cuDNN draws of different lengths: {[len(d) for d in draws]}")
    return [min((t for t in times if t is not None), default=None) for times in zip(*draws)]


def row_from_results(op: str, name: str, problem: Any, results: Sequence[Any], cudnn_us: float | None) -> BenchRow:
    """A row from the measured TrialResults (the default config's first) and cuDNN's time."""
    from autocnn.kernels import operation_for

    operation = operation_for(problem)
    ok = [r for r in results if r.ok]
    best = min(ok, key=lambda r: r.time_us) if ok else None
    default = results[0] if results else None
    failures: dict[str, int] = {}
    for r in results:
        if not r.ok:
            failures[r.failure.value] = failures.get(r.failure.value, 0) + 1
    return BenchRow(
        op=op, shape=name, precision=precision_label(problem),
        flops=int(operation.flops(problem)), min_bytes=int(operation.min_bytes(problem)),
        default_us=default.time_us if default is not None and default.ok else None,
        default_failure=(None if default is None or default.ok
                         else f"{default.failure.value}: {default.message[:200]}"),
        best_us=best.time_us if best else None, best_config=best.config.as_dict() if best else None,
        cudnn_us=cudnn_us, measured=len(ok), failures=failures)


# -- text -------------------------------------------------------------------------------------------

def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def progress_line(r: BenchRow) -> str:
    """One line printed as soon as a row is measured."""
    return (f"{r.op:14s} {r.shape:17s} {r.precision:4s} default {_fmt(r.default_us):>9s} us  best "
            f"{_fmt(r.best_us):>9s} us  cuDNN {_fmt(r.cudnn_us):>9s} us  x{_fmt(r.vs_cudnn, '.2f')}  "
            f"({r.measured} ok, failures {r.failures})")


def _conv_cells(r: BenchRow | None, rates: GpuRates, precision: str) -> list[str]:
    if r is None:
        return ["-"] * 7
    return [_fmt(r.default_us), _fmt(r.best_us), _fmt(r.cudnn_us), _fmt(r.vs_cudnn, ".2f"), _fmt(r.tflops, ".2f"),
            _pct(share(r.tflops, rates.sgemm_tflops)), _pct(share(r.tflops, rates.tensor_core(precision)[1]))]


def _conv_mean_cells(rows: list[BenchRow], rates: GpuRates, precision: str) -> list[str]:
    rate = geomean(r.tflops for r in rows)
    return ["-", "-", "-", _fmt(geomean(r.vs_cudnn for r in rows), ".2f"), _fmt(rate, ".2f"),
            _pct(share(rate, rates.sgemm_tflops)), _pct(share(rate, rates.tensor_core(precision)[1]))]


def conv_table(rows: Sequence[BenchRow], rates: GpuRates, precisions: Sequence[str] = CONV_PRECISIONS) -> str:
    """Markdown: one line per (op, shape) with each precision's columns side by side, then the
    geometric means. Each precision is compared with cuDNN in the same precision."""
    head = ["op", "shape"]
    for p in precisions:
        cudnn = f"cuDNN {p.upper()}"
        head += [f"{p} default us", f"{p} best us", f"{cudnn} us", f"{p} vs {cudnn}", f"{p} TFLOP/s",
                 f"{p} of SGEMM", f"{p} of {rates.tensor_core(p)[0]} GEMM"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    by_key = {(r.op, r.shape, r.precision): r for r in rows}
    keys = list(dict.fromkeys((r.op, r.shape) for r in rows if r.precision in precisions))
    for op, shape in keys:
        cells = [op, shape]
        for p in precisions:
            cells += _conv_cells(by_key.get((op, shape, p)), rates, p)
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["**geometric mean**", f"{len(keys)} problems"]
    for p in precisions:
        cells += _conv_mean_cells([r for r in rows if r.precision == p], rates, p)
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pool_table(rows: Sequence[BenchRow], rates: GpuRates) -> str:
    """Markdown: pooling rows against cuDNN and the copy bandwidth, then the geometric means."""
    lines = ["| op | shape | default us | best us | cuDNN us | vs cuDNN | GB/s | of copy |", "|---|---|" + "---:|" * 6]
    for r in rows:
        shape = r.shape if r.precision == NO_PRECISION else f"{r.shape} ({r.precision})"
        lines.append(f"| {r.op} | {shape} | {_fmt(r.default_us)} | {_fmt(r.best_us)} | {_fmt(r.cudnn_us)} | "
                     f"{_fmt(r.vs_cudnn, '.2f')} | {_fmt(r.gbps, '.0f')} | {_pct(share(r.gbps, rates.copy_gbps))} |")
    rate = geomean(r.gbps for r in rows)
    lines.append(f"| **geometric mean** | {len(rows)} problems | - | - | - | "
                 f"{_fmt(geomean(r.vs_cudnn for r in rows), '.2f')} | {_fmt(rate, '.0f')} | "
                 f"{_pct(share(rate, rates.copy_gbps))} |")
    return "\n".join(lines)


def summary_lines(rows: Sequence[BenchRow], precisions: Sequence[str] = CONV_PRECISIONS) -> list[str]:
    """Per precision: the geometric-mean speed-up over cuDNN and how many problems are below 0.8x and 1x."""
    out = []
    for p in precisions:
        timed = [r.vs_cudnn for r in rows if r.precision == p and r.vs_cudnn is not None]
        if not timed:
            out.append(f"# {p}: no problem timed against cuDNN {p.upper()}")
            continue
        out.append(f"# {p}: geometric mean {geomean(timed):.2f}x cuDNN {p.upper()} over {len(timed)} problems; "
                   f"{sum(v < LOW_SPEEDUP for v in timed)} below {LOW_SPEEDUP}x, {sum(v < 1.0 for v in timed)} "
                   f"below 1x, slowest {min(timed):.2f}x")
    return out


def is_pooling(row: BenchRow) -> bool:
    """Whether a row is of a pooling operation (placed against the copy bandwidth)."""
    try:
        return issubclass(problem_type(row.op), PoolProblem)
    except ValueError:   # an operation this autocnn does not know (a results file of another)
        return row.precision == NO_PRECISION


def tables(rows: Sequence[BenchRow], rates: GpuRates, precisions: Sequence[str] = CONV_PRECISIONS) -> str:
    """Everything printed at the end of a run: the ceilings, the convolution and pooling tables, the summary."""
    conv = [r for r in rows if not is_pooling(r)]
    pool = [r for r in rows if is_pooling(r)]
    parts = [rates.header()]
    if conv:
        parts += ["", conv_table(conv, rates, precisions), "", *summary_lines(conv, precisions)]
    if pool:
        parts += ["", pool_table(pool, rates)]
    return "\n".join(parts)
