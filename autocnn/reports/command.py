"""The tuning report: one self-contained HTML file and a Markdown summary of tuning results.

    autocnn report [--db DIR|FILE] [--storage URL] [--bench bench_kernels.json | --ceilings GBPS,TFLOPS[,TF32]]
                   [--network NAME --batch N] [--gpu TEXT] [--op OP] [--out report.html] [--markdown report.md]

(``python scripts/tuning_report.py ...`` runs the same code.)

From the tuning database: per GPU (and per network, with ``--network``) a table of every tuned kernel
with its config, tuned, default and cuDNN times and the speed-ups, a bar chart of the speed-ups and a
roofline-style plot of each kernel against the GPU's measured ceilings (copy bandwidth, SGEMM
peak and, for tf32 kernels, the TF32 GEMM peak, from a benchmark JSON of ``autocnn bench`` or
``--ceilings``). A tf32 record shows its precision in its shape (``...,precision=tf32``) and
label (``conv_fwd · modern_14 · tf32``), is compared with cuDNN TF32 and summed up apart from the
fp32 ones (each kernel against cuDNN at its own precision). With ``--network`` the kernels
the network needs that would still run on a fallback (not an exact record) are listed with the
fallback that answered. From the Optuna storage: per study its trial counts, failures by class, the
optimisation history, the parameter importances (PED-ANOVA, which needs no extra package) and the
spread of trial times.

The HTML carries plotly.js once, inline, so it opens offline. Nothing here needs a GPU.

The modules beside this one do the work: studies and inputs read, collect gathers the data model,
figures, html_page and markdown draw it; this one writes the report a ReportRequest asks for (the
command line, autocnn.cli.report, makes the request).
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from autocnn.reports.collect import collect
from autocnn.reports.html_page import render_html
from autocnn.reports.markdown import render_markdown
from autocnn.reports.model import ReportError, ReportRequest
from autocnn.reports.summaries import dashboard_command, fmt_speedup, op_summary


def write_report(request: ReportRequest) -> int:
    """Collect what ``request`` asks for, write the HTML page and the Markdown summary, and say on the
    console what they hold; 1 where nothing could be reported or an input failed."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        print("autocnn report: needs plotly: pip install 'autocnn[report]' (or pip install plotly)", file=sys.stderr)
        return 1
    md_path = request.markdown if request.markdown is not None else request.out.with_suffix(".md")
    problem = _inputs_and_outputs(request, md_path)   # before anything is read or drawn
    if problem is not None:
        print(f"autocnn report: {problem}; no report written", file=sys.stderr)
        return 1
    for path in (request.out, md_path):
        if not path.parent.exists():   # made, and said: a mistyped folder is not made silently
            print(f"autocnn report: note: creating the directory {path.parent} for {path.name}", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        try:
            data = collect(request, stack)
        except ReportError as exc:
            print(f"autocnn report: {exc}", file=sys.stderr)
            return 1
    for e in data.errors:
        print(f"autocnn report: {e}", file=sys.stderr)
    for n in data.notes:
        print(f"autocnn report: note: {n}", file=sys.stderr)
    if data.db_warnings:
        print(f"autocnn report: note: {len(data.db_warnings)} database entries or files were skipped "
              f"(listed in the report)", file=sys.stderr)
    if data.record_count == 0 and not data.studies and not any(g.fallbacks for g in data.groups):
        print("autocnn report: nothing to report (no tuning record and no Optuna study); no report written",
              file=sys.stderr)
        return 1
    markdown = render_markdown(data)
    try:
        request.out.parent.mkdir(parents=True, exist_ok=True)
        request.out.write_text(render_html(data), encoding="utf-8")
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(markdown, encoding="utf-8")
    except OSError as exc:
        print(f"autocnn report: cannot write the report: {exc}", file=sys.stderr)
        return 1
    for g in data.groups:
        for s in op_summary(g):
            print(f"{g.title}: {s['op']}: {s['kernels']} kernels, geo-mean speed-up "
                  f"{fmt_speedup(s['vs_default'])} over the default, {fmt_speedup(s['vs_cudnn'])} over cuDNN "
                  f"({s['n_cudnn']} timed)")
        if g.network is not None:
            print(f"{g.title}: {len(g.fallbacks)} kernels on a fallback")
    print(f"{len(data.studies)} Optuna studies; "
          f"{sum(1 for s in data.studies if not s.complete)} without a completed trial")
    print(f"wrote {request.out} and {md_path}")
    cmd = dashboard_command(data)
    if cmd:
        print(f"browse the studies: {cmd}")
    return 1 if data.errors else 0


def _inputs_and_outputs(request: ReportRequest, md_path: Path) -> str | None:
    """Why the report cannot be made as asked, before any work: a --bench file that cannot be read
    (its ceilings and cuDNN times were asked for), an output that cannot be written."""
    from autocnn.errors import EnvironmentCheckError
    from autocnn.preflight import writable_directory

    if request.bench is not None:
        from autocnn.reports.inputs import read_bench

        error = read_bench(request.bench)[3]
        if error is not None:
            return error
    for flag, path in (("--out", request.out), ("--markdown", md_path)):
        if path.is_dir():
            return f"{flag} {path} is a directory; give a file name"
        try:
            writable_directory(path.parent, f"{flag} {path}: the directory", "give a path you can write")
        except EnvironmentCheckError as exc:
            return str(exc)
    return None
