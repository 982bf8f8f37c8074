"""The report as one self-contained HTML page: tables, figures and plotly.js inline, so it opens offline."""
from __future__ import annotations

import html
from typing import Any, Sequence

from autocnn.reports.figures import (ROOFLINE_NOTE, failures_figure, history_figure, importance_figure,
                                     roofline_figure, speedup_figure, times_figure)
from autocnn.reports.model import TITLE, Group, ReportData, StudyView
from autocnn.reports.summaries import (MAX_LISTED_WARNINGS, dashboard_command, failure_text, fmt_number,
                                       fmt_speedup, meta_rows, op_summary, roof_percent)

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 24px 32px;
       color: #222; max-width: 1500px; }
h1 { margin-bottom: 4px; } h2 { margin-top: 36px; border-bottom: 2px solid #ddd; padding-bottom: 4px; }
h3 { margin-top: 24px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; vertical-align: top; }
th { background: #f3f3f3; text-align: left; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.shape, td.cfg, span.shape { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
td.shape { white-space: nowrap; } td.cfg { min-width: 260px; max-width: 420px; }
.seed { color: #666; font-size: 11px; } .caption { color: #555; font-size: 12px; max-width: 1100px; }
.good { color: #176f2c; font-weight: 600; } .bad { color: #b00; font-weight: 600; }
.meta td:first-child { font-weight: 600; white-space: nowrap; }
.errors { background: #fde8e8; border: 1px solid #e0a0a0; padding: 8px 14px; }
.notes { background: #fff8e1; border: 1px solid #e8d38a; padding: 8px 14px; }
.study { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; margin: 14px 0; }
.study h3 { margin: 4px 0; font-size: 15px; }
.grid3 { display: grid; grid-template-columns: 1fr 1fr 1fr; gap: 8px; }
.empty { color: #777; font-style: italic; padding: 10px; }
code { background: #f3f3f3; padding: 1px 4px; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _speedup_cell(value: float | None) -> str:
    cls = "" if value is None else ("good" if value > 1.0 else "bad" if value < 1.0 else "")
    return f'<td class="num {cls}">{_e(fmt_speedup(value))}</td>'


def render_html(data: ReportData) -> str:
    import plotly.offline

    parts: list[str] = []
    add = parts.append
    add(f"<h1>{_e(TITLE)}</h1>")
    add('<table class="meta">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in meta_rows(data))
        + "</table>")
    if data.errors:
        add('<div class="errors"><b>Problems with the inputs</b><ul>'
            + "".join(f"<li>{_e(e)}</li>" for e in data.errors) + "</ul></div>")
    if data.notes or data.db_warnings:
        items = [f"<li>{_e(n)}</li>" for n in data.notes]
        if data.db_warnings:
            listed = "".join(f"<li><code>{_e(w)}</code></li>" for w in data.db_warnings[:MAX_LISTED_WARNINGS])
            more = len(data.db_warnings) - MAX_LISTED_WARNINGS
            items.append(f"<li>{len(data.db_warnings)} database entries or files were skipped:<ul>{listed}"
                         + (f"<li>and {more} more</li>" if more > 0 else "") + "</ul></li>")
        add('<div class="notes"><b>Notes</b><ul>' + "".join(items) + "</ul></div>")

    # summary
    if any(g.rows for g in data.groups):
        add('<h2 id="summary">Summary</h2>')
        add("<table><tr><th>GPU / network</th><th>operation</th><th>kernels</th><th>geo-mean speed-up over "
            "default</th><th>geo-mean speed-up over cuDNN</th><th>faster than cuDNN</th></tr>")
        for g in data.groups:
            for s in op_summary(g):
                add(f"<tr><td>{_e(g.title)}</td><td>{_e(s['op'])}</td><td class='num'>{s['kernels']}</td>"
                    f"{_speedup_cell(s['vs_default'])}{_speedup_cell(s['vs_cudnn'])}"
                    f"<td class='num'>{s['faster_than_cudnn']} of {s['n_cudnn']}</td></tr>")
        add("</table>")
    elif not data.groups or all(not g.rows for g in data.groups):
        add('<h2 id="summary">Tuned kernels</h2><p class="empty">There are no tuning records to show'
            + (" (see the notes above)." if data.notes or data.errors else ".") + "</p>")

    for g in data.groups:
        add(f'<h2 id="group-{g.ident}">{_e(g.title)}</h2>')
        if g.rows:
            add(_kernel_table_html(g, data))
        else:
            add('<p class="empty">No kernel of this group has an exact tuning record.</p>')
        if g.network is not None:
            add(f"<h3>Kernels of {_e(g.network)} still on a fallback</h3>")
            if g.fallbacks:
                add("<table><tr><th>operation</th><th>shape</th><th>layer</th><th>source</th><th>config that "
                    "would run</th><th>why</th></tr>")
                for f in g.fallbacks:
                    add(f"<tr><td>{_e(f.op)}</td><td class='shape'>{_e(f.shape)}</td><td>{_e(f.layer)}</td>"
                        f"<td><b>{_e(f.source)}</b></td><td class='cfg'>{_e(f.config)}</td><td>{_e(f.detail)}</td></tr>")
                add("</table>")
            else:
                add("<p>None: every kernel has an exact record for this GPU.</p>")
        fig = speedup_figure(g)
        if fig:
            add(fig)
        fig = roofline_figure(g)
        if fig:
            add(fig)
            add(f'<p class="caption">{_e(ROOFLINE_NOTE)}</p>')

    # studies
    add('<h2 id="studies">Optuna studies</h2>')
    if not data.studies:
        add('<p class="empty">No study to show'
            + (f" (storage {_e(data.storage_url)})" if data.storage_url else "") + ".</p>")
    else:
        add(_study_table_html(data.studies))
        fig = failures_figure(data.studies)
        if fig:
            add(fig)
        for s in data.studies:
            add(_study_panel_html(s))
    cmd = dashboard_command(data)
    if cmd:
        add(f"<h2>Browse the studies</h2><p>The same storage opens in optuna-dashboard "
            f"(<code>pip install optuna-dashboard</code>): <code>{_e(cmd)}</code></p>")

    head = (f'<meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(TITLE)}</title><style>{_CSS}</style>"
            f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>')
    return f"<!DOCTYPE html>\n<html lang=\"en\"><head>{head}</head><body>\n" + "\n".join(parts) + "\n</body></html>\n"


def _kernel_table_html(g: Group, data: ReportData) -> str:
    study_ids = {s.name: s.ident for s in data.studies}
    out = ["<table><tr><th>operation</th><th>shape</th>" + ("<th>layer</th>" if g.network else "")
           + "<th>config</th><th>tuned µs</th><th>default µs</th><th>cuDNN µs</th><th>speed-up over default</th>"
           "<th>speed-up over cuDNN</th><th>GFLOP/s</th><th>GB/s</th><th>of roof</th><th>trials</th><th>study</th></tr>"]
    for r in g.rows:
        cudnn = fmt_number(r.cudnn_us) + (" (bench)" if r.cudnn_source == "bench" else "")
        name = r.label.split(" · ", 1)[1]
        seed = f"<br><span class='seed'>{_e(name)}</span>" if name != r.shape else ""
        link = (f'<a href="#study-{study_ids[r.study]}">{study_ids[r.study]}</a>' if r.study in study_ids
                else "—")
        out.append(
            f"<tr><td>{_e(r.op)}</td><td class='shape'>{_e(r.shape)}{seed}</td>"
            + (f"<td>{_e(r.layer)}</td>" if g.network else "")
            + f"<td class='cfg'>{_e(r.config)}</td><td class='num'>{fmt_number(r.time_us)}</td>"
            f"<td class='num'>{fmt_number(r.default_us)}</td><td class='num'>{_e(cudnn)}</td>"
            f"{_speedup_cell(r.speedup_default)}{_speedup_cell(r.speedup_cudnn)}"
            f"<td class='num'>{fmt_number(r.gflops, '.0f')}</td><td class='num'>{fmt_number(r.gbps, '.0f')}</td>"
            f"<td class='num'>{fmt_number(roof_percent(r, g.ceilings), '.0f')}{'%' if g.ceilings else ''}</td>"
            f"<td class='num'>{r.trials}</td><td>{link}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _study_table_html(studies: Sequence[StudyView]) -> str:
    out = ["<table><tr><th>#</th><th>study</th><th>GPU</th><th>trials</th><th>complete</th><th>of which reused</th>"
           "<th>failed</th><th>failures by class</th><th>pruned (duplicates)</th><th>best µs</th></tr>"]
    for s in studies:
        reused = sum(1 for _, _, r in s.complete if r)
        out.append(f"<tr><td><a href='#study-{s.ident}'>{s.ident}</a></td><td>{_e(s.label)}<br>"
                   f"<span class='shape'>{_e(s.shape)}</span></td><td>{_e(s.gpu)}</td>"
                   f"<td class='num'>{s.n_trials}</td><td class='num'>{len(s.complete)}</td>"
                   f"<td class='num'>{reused}</td><td class='num'>{sum(s.failures.values())}</td>"
                   f"<td>{_e(failure_text(s.failures))}</td><td class='num'>{s.states.get('PRUNED', 0)}</td>"
                   f"<td class='num'>{fmt_number(s.best)}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _study_panel_html(s: StudyView) -> str:
    head = (f'<div class="study" id="study-{s.ident}"><h3>{s.ident}: {_e(s.label)}</h3>'
            f"<div><code>{_e(s.name)}</code></div>"
            f"<div>{s.n_trials} trials: {len(s.complete)} complete ({len(s.measured_times)} measured), "
            f"{sum(s.failures.values())} failed ({_e(failure_text(s.failures))}), "
            f"{s.states.get('PRUNED', 0)} pruned; best {fmt_number(s.best)} µs</div>")
    if not s.complete:
        return head + (f'<p class="empty">This study has no completed trial: every trial failed '
                       f"({_e(failure_text(s.failures))}).</p></div>")
    cells = [history_figure(s), importance_figure(s) or f'<p class="empty">{_e(s.importance_note)}</p>',
             times_figure(s)]
    return head + '<div class="grid3">' + "".join(f"<div>{c or ''}</div>" for c in cells) + "</div></div>"
