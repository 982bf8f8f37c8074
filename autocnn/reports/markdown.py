"""The report's Markdown summary: the same tables as the HTML page, without the figures."""
from __future__ import annotations

from typing import Any

from autocnn.reports.model import TITLE, ReportData
from autocnn.reports.summaries import (MAX_LISTED_WARNINGS, dashboard_command, failure_text, fmt_number,
                                       fmt_speedup, meta_rows, op_summary, roof_percent)


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(data: ReportData) -> str:
    out = [f"# {TITLE}", ""]
    for k, v in meta_rows(data):
        out.append(f"- {k}: {_md(v)}")
    out.append("")
    if data.errors:
        out += ["## Problems with the inputs", ""] + [f"- {_md(e)}" for e in data.errors] + [""]
    if data.notes or data.db_warnings:
        out += ["## Notes", ""] + [f"- {_md(n)}" for n in data.notes]
        if data.db_warnings:
            out.append(f"- {len(data.db_warnings)} database entries or files were skipped:")
            out += [f"  - {_md(w)}" for w in data.db_warnings[:MAX_LISTED_WARNINGS]]
            if len(data.db_warnings) > MAX_LISTED_WARNINGS:
                out.append(f"  - and {len(data.db_warnings) - MAX_LISTED_WARNINGS} more")
        out.append("")
    if any(g.rows for g in data.groups):
        out += ["## Summary", "", "| GPU / network | operation | kernels | geo-mean speed-up over default | "
                "geo-mean speed-up over cuDNN | faster than cuDNN |", "|---|---|---:|---:|---:|---:|"]
        for g in data.groups:
            for s in op_summary(g):
                out.append(f"| {_md(g.title)} | {s['op']} | {s['kernels']} | {fmt_speedup(s['vs_default'])} | "
                           f"{fmt_speedup(s['vs_cudnn'])} | {s['faster_than_cudnn']} of {s['n_cudnn']} |")
        out.append("")
    else:
        out += ["## Tuned kernels", "", "There are no tuning records to show.", ""]
    for g in data.groups:
        out += [f"## {_md(g.title)}", ""]
        if g.rows:
            out += ["| operation | shape | " + ("layer | " if g.network else "") + "config | tuned µs | default µs | "
                    "cuDNN µs | speed-up over default | speed-up over cuDNN | of roof |",
                    "|---|---|" + ("---|" if g.network else "") + "---|---:|---:|---:|---:|---:|---:|"]
            for r in g.rows:
                cudnn = fmt_number(r.cudnn_us) + (" (bench)" if r.cudnn_source == "bench" else "")
                roof = roof_percent(r, g.ceilings)
                out.append(f"| {r.op} | {_md(r.shape)} | " + (f"{_md(r.layer)} | " if g.network else "")
                           + f"{_md(r.config)} | {fmt_number(r.time_us)} | {fmt_number(r.default_us)} | {cudnn} | "
                           f"{fmt_speedup(r.speedup_default)} | {fmt_speedup(r.speedup_cudnn)} | "
                           f"{fmt_number(roof, '.0f') + ('%' if roof is not None else '')} |")
        else:
            out.append("No kernel of this group has an exact tuning record.")
        out.append("")
        if g.network is not None:
            out += [f"### Kernels of {_md(g.network)} still on a fallback", ""]
            if g.fallbacks:
                out += ["| operation | shape | layer | source | why |", "|---|---|---|---|---|"]
                out += [f"| {f.op} | {_md(f.shape)} | {_md(f.layer)} | {f.source} | {_md(f.detail)} |"
                        for f in g.fallbacks]
            else:
                out.append("None: every kernel has an exact record for this GPU.")
            out.append("")
    out += ["## Optuna studies", ""]
    if data.studies:
        out += ["| # | study | trials | complete | failed | failures by class | best µs |",
                "|---|---|---:|---:|---:|---|---:|"]
        for s in data.studies:
            out.append(f"| {s.ident} | {_md(s.label)}: {_md(s.shape)} | {s.n_trials} | {len(s.complete)} | "
                       f"{sum(s.failures.values())} | {_md(failure_text(s.failures))} | "
                       f"{fmt_number(s.best) if s.complete else 'no completed trial'} |")
    else:
        out.append("No study to show.")
    out.append("")
    cmd = dashboard_command(data)
    if cmd:
        out += ["Browse the studies with optuna-dashboard (`pip install optuna-dashboard`):", "",
                f"    {cmd}", ""]
    return "\n".join(out)
