"""What the HTML page, the Markdown summary and the console lines share: number formats, the
per-operation summary, the share of the roof, the sources table and the optuna-dashboard command."""
from __future__ import annotations

import math
import shlex
from collections import Counter
from typing import Any, Iterable

from autocnn.cost_model.model_file import in_use_text
from autocnn.reports.labels import op_order, shows_tf32
from autocnn.reports.model import Ceilings, Group, KernelRow, ReportData

# At most this many skipped-record warnings are listed one by one (the rest are counted).
MAX_LISTED_WARNINGS = 20


def fmt_number(value: float | None, spec: str = ".1f", none: str = "—") -> str:
    return none if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def fmt_speedup(value: float | None) -> str:
    """A speed-up as the report prints it, e.g. ``1.20×``."""
    return fmt_number(value, ".2f") + ("×" if value is not None else "")


def geomean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def op_summary(group: Group) -> list[dict[str, Any]]:
    """Per operation and precision: kernels, geometric-mean speed-ups over the default and over
    cuDNN (each row against cuDNN at its own precision). A tf32 line is named "conv_fwd · tf32"."""
    out = []
    kinds = sorted({(r.op, r.precision) for r in group.rows}, key=lambda k: (op_order(k[0]), shows_tf32(k[1])))
    for op, precision in kinds + ([("all", "")] if len(kinds) > 1 else []):
        rows = [r for r in group.rows if op == "all" or (r.op, r.precision) == (op, precision)]
        name = op + (f" · {precision}" if shows_tf32(precision) else "")
        out.append({"op": name, "precision": precision, "kernels": len(rows),
                    "vs_default": geomean(r.speedup_default for r in rows),
                    "n_default": sum(1 for r in rows if r.speedup_default is not None),
                    "vs_cudnn": geomean(r.speedup_cudnn for r in rows),
                    "n_cudnn": sum(1 for r in rows if r.speedup_cudnn is not None),
                    "faster_than_cudnn": sum(1 for r in rows if (r.speedup_cudnn or 0) > 1)})
    return out


def roof_percent(row: KernelRow, ceilings: Ceilings | None) -> float | None:
    """The achieved rate's share of the roof at the row's intensity and precision (an fp32 kernel
    on tensor cores, 3xTF32, may pass the SGEMM roof)."""
    if ceilings is None or row.gflops is None or not math.isfinite(row.intensity):
        return None
    roof = ceilings.roof(row.intensity, row.precision)
    return None if roof is None else 100.0 * row.gflops / roof


def failure_text(failures: Counter) -> str:
    return ", ".join(f"{c} {n}" for c, n in sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def meta_rows(data: ReportData) -> list[tuple[str, str]]:
    rows = [("made", f"{data.made_at} by autocnn {data.version}"),
            ("tuning database", "; ".join(data.db_sources) or "—"),
            ("database files", ", ".join(data.db_files) or "none"),
            ("records", str(data.record_count)),
            ("Optuna storage", f"{data.storage_url or '—'} ({len(data.studies)} studies shown)"),
            ("benchmark", data.bench_path or "none"),
            ("GPU ceilings", data.ceilings_text),
            ("ranking of unseen shapes", in_use_text())]
    if data.filters:
        rows.append(("filters", "; ".join(data.filters)))
    return rows


def dashboard_command(data: ReportData) -> str | None:
    if not data.storage_url or not data.storage_opened:
        return None
    return f"optuna-dashboard {shlex.quote(data.storage_url)}"
