"""The report's figures (plotly), each as an HTML div without plotly.js (the page carries it once)."""
from __future__ import annotations

import math
from typing import Any, Sequence

from autocnn.precision import TF32
from autocnn.reports.labels import op_order, shows_tf32
from autocnn.reports.model import Group, KernelRow, StudyView
from autocnn.reports.summaries import fmt_number, roof_percent

# The tuner's failure classes, in the order the failures figure stacks them.
FAILURE_CLASSES = ("invalid_problem", "invalid_config", "infeasible", "compile_error", "launch_error",
                   "timeout", "wrong_result", "device_error")
_OP_COLOURS = {"conv_fwd": "#1f77b4", "conv_bwd_data": "#ff7f0e", "conv_wgrad": "#2ca02c",
               "avgpool_fwd": "#9467bd", "avgpool_bwd": "#8c564b"}
_FAILURE_COLOURS = {"invalid_problem": "#7f7f7f", "invalid_config": "#bcbd22", "infeasible": "#c7c7c7",
                    "compile_error": "#d62728", "launch_error": "#e377c2", "timeout": "#ff9896",
                    "wrong_result": "#9467bd", "device_error": "#17becf", "unrecorded": "#393b79"}

# The roofline figure's caption (the HTML page prints it under the figure).
ROOFLINE_NOTE = ("Each kernel at its arithmetic intensity (the operation's flops over the bytes it must move at "
                 "least once) and its achieved rate. Filled: tuned; open: the default config; x: cuDNN. The lines "
                 "are the GPU's measured copy bandwidth, SGEMM rate and (with tf32 kernels, diamonds) TF32 GEMM rate; "
                 "fp32 kernels on tensor cores (3xTF32) may pass the SGEMM line; cuDNN can lie above them with algorithms "
                 "that do fewer flops than a direct convolution (FFT, Winograd).")


def _fig_html(fig: Any, div_id: str, height: int, small: bool = False) -> str:
    fig.update_layout(height=height, template="plotly_white", font=dict(size=11),
                      margin=dict(l=60, r=20, t=50 if small else 90, b=50))
    fig.update_layout(title=dict(y=0.98, yref="container", yanchor="top", x=0.01, xanchor="left"))
    config = {"displaylogo": False, "responsive": True}
    if small:
        config["displayModeBar"] = False   # a small panel's title would be under it; drag still zooms
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, default_height=f"{height}px",
                       default_width="100%", config=config)


def _log_ticks(lo: float, hi: float, steps: Sequence[float] = (1, 2, 5)) -> list[float]:
    """Tick values 1, 2, 5 x 10^k between lo and hi (a clean log axis)."""
    out = []
    for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        out += [m * 10.0 ** k for m in steps if lo <= m * 10.0 ** k <= hi]
    return out


def speedup_figure(group: Group) -> str | None:
    import plotly.graph_objects as go

    rows = group.rows
    if not rows:
        return None
    labels = [r.label + (f" [{r.layer}]" if r.layer else "") for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(name="over the default config", y=labels, x=[r.speedup_default for r in rows],
                         orientation="h", marker_color="#1f77b4",
                         hovertext=[f"{r.shape}<br>tuned {r.time_us:.1f} us, default {fmt_number(r.default_us)} us"
                                    for r in rows], hoverinfo="text+x"))
    fig.add_trace(go.Bar(name="over cuDNN", y=labels, x=[r.speedup_cudnn for r in rows], orientation="h",
                         marker_color="#d62728",
                         hovertext=[f"{r.shape}<br>tuned {r.time_us:.1f} us, cuDNN {fmt_number(r.cudnn_us)} us"
                                    for r in rows], hoverinfo="text+x"))
    fig.add_vline(x=1.0, line_dash="dash", line_color="#444")
    values = [v for r in rows for v in (r.speedup_default, r.speedup_cudnn) if v]
    lo, hi = min(values + [1.0]) / 1.3, max(values + [1.0]) * 1.3
    fig.update_layout(title=f"Speed-up per kernel: {group.title}", barmode="group",
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
                      xaxis=dict(type="log", range=[math.log10(lo), math.log10(hi)], tickvals=_log_ticks(lo, hi),
                                 title="speed-up (×, log scale; > 1 is faster)"),
                      yaxis=dict(autorange="reversed", automargin=True))
    return _fig_html(fig, f"fig-speedup-{group.ident}", 160 + 34 * len(rows))


def roofline_figure(group: Group) -> str | None:
    import plotly.graph_objects as go

    rows = [r for r in group.rows if r.gflops and math.isfinite(r.intensity) and r.intensity > 0]
    if not rows:
        return None
    fig = go.Figure()
    for op, precision in sorted({(r.op, r.precision) for r in rows}, key=lambda k: (op_order(k[0]), k[1])):
        mine = [r for r in rows if (r.op, r.precision) == (op, precision)]
        tf32 = shows_tf32(precision)   # diamonds: placed against the TF32 GEMM line
        fig.add_trace(go.Scatter(
            name=f"{op} tuned" + (" tf32" if tf32 else ""), x=[r.intensity for r in mine], y=[r.gflops for r in mine],
            mode="markers", marker=dict(size=10, color=_OP_COLOURS.get(op, "#333"), symbol="diamond" if tf32 else "circle"),
            hovertext=[f"{r.label}<br>{r.shape}<br>{r.gflops:.0f} GFLOP/s, {r.gbps:.0f} GB/s"
                       + (f", {roof_percent(r, group.ceilings):.0f}% of roof" if group.ceilings else "")
                       for r in mine], hoverinfo="text"))
    # the same kernels at their default config's time and at cuDNN's, where the record has them
    for name, word, symbol, colour, attr in (("default config", "default", "circle-open", "#555", "default_us"),
                                             ("cuDNN", "cuDNN", "x", "#000", "cudnn_us")):
        timed = [r for r in rows if getattr(r, attr)]
        if timed:
            fig.add_trace(go.Scatter(name=name, x=[r.intensity for r in timed],
                                     y=[KernelRow.gflops_at(r.flops, getattr(r, attr)) for r in timed], mode="markers",
                                     marker=dict(size=8, symbol=symbol, color=colour),
                                     hovertext=[f"{r.label} {word}" for r in timed], hoverinfo="text+y"))
    xs = [r.intensity for r in rows]
    ys = [y for r in rows for y in (r.gflops, KernelRow.gflops_at(r.flops, r.default_us),
                                    KernelRow.gflops_at(r.flops, r.cudnn_us)) if y]
    x0, x1 = min(xs) / 2, max(xs) * 2
    y0, y1 = min(ys) / 2, max(ys) * 2
    c = group.ceilings
    if c is not None:
        ridge = c.peak_gflops / c.copy_gbps
        x0, x1 = min(x0, ridge / 2), max(x1, ridge * 2)
        tf32_peak = c.peak_gflops_for(TF32.name) if any(shows_tf32(r.precision) for r in rows) else None
        y0, y1 = min(y0, c.copy_gbps * x0), max(y1, c.peak_gflops * 2, (tf32_peak or 0.0) * 2)
        xm = min(x1, y1 / c.copy_gbps)   # the bandwidth line, drawn to the top of the plot
        fig.add_trace(go.Scatter(name=f"copy bandwidth {c.copy_gbps:.0f} GB/s", x=[x0, xm],
                                 y=[c.copy_gbps * x0, c.copy_gbps * xm], mode="lines",
                                 line=dict(color="#888", dash="dash"), hoverinfo="name"))
        fig.add_trace(go.Scatter(name=f"SGEMM peak {c.sgemm_tflops:.1f} TFLOP/s", x=[x0, x1],
                                 y=[c.peak_gflops, c.peak_gflops], mode="lines",
                                 line=dict(color="#444", dash="dot"), hoverinfo="name"))
        if tf32_peak is not None:
            fig.add_trace(go.Scatter(name=f"TF32 GEMM peak {c.tf32_tflops:.1f} TFLOP/s", x=[x0, x1],
                                     y=[tf32_peak, tf32_peak], mode="lines",
                                     line=dict(color="#444", dash="dashdot"), hoverinfo="name"))
        title = f"Kernels against the measured ceilings: {group.title}"
    else:
        title = f"Kernels against the ceilings (ceilings unknown): {group.title}"
        fig.add_annotation(text="GPU ceilings unknown: give --bench bench_kernels.json or --ceilings "
                                "COPY_GBPS,SGEMM_TFLOPS[,TF32_TFLOPS]", xref="paper", yref="paper", x=0.5, y=1.0,
                           showarrow=False, font=dict(color="#b00"))
    fig.update_layout(title=title, legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
                      xaxis=dict(type="log", range=[math.log10(x0), math.log10(x1)], dtick=1,
                                 title="arithmetic intensity (flop per minimum byte moved)"),
                      yaxis=dict(type="log", range=[math.log10(y0), math.log10(y1)], dtick=1,
                                 title="achieved GFLOP/s (direct-convolution flops / time)"))
    return _fig_html(fig, f"fig-roofline-{group.ident}", 520)


def failures_figure(studies: Sequence[StudyView]) -> str | None:
    import plotly.graph_objects as go

    if not studies or not any(s.failures for s in studies):
        return None
    labels = [s.label for s in studies]
    classes = [c for c in (*FAILURE_CLASSES, "unrecorded") if any(s.failures.get(c) for s in studies)]
    fig = go.Figure()
    for c in classes:
        fig.add_trace(go.Bar(name=c, y=labels, x=[s.failures.get(c, 0) for s in studies], orientation="h",
                             marker_color=_FAILURE_COLOURS.get(c)))
    fig.update_layout(title="Failed trials by class per study", barmode="stack", showlegend=True,
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
                      xaxis=dict(title="failed trials"), yaxis=dict(autorange="reversed", automargin=True))
    return _fig_html(fig, "fig-failures", 140 + 18 * len(studies))


def history_figure(s: StudyView) -> str | None:
    import plotly.graph_objects as go

    if not s.complete:
        return None
    xs = [n for n, _, _ in s.complete]
    ys = [v for _, v, _ in s.complete]
    best, run = [], math.inf
    for v in ys:
        run = min(run, v)
        best.append(run)
    fig = go.Figure()
    fig.add_trace(go.Scatter(name="trial", x=xs, y=ys, mode="markers", marker=dict(size=5, color="#1f77b4")))
    fig.add_trace(go.Scatter(name="best so far", x=xs, y=best, mode="lines", line=dict(shape="hv", color="#d62728")))
    fig.update_layout(title="Optimisation history", showlegend=False, xaxis=dict(title="trial"),
                      yaxis=dict(type="log", title="time (us)"))
    return _fig_html(fig, f"fig-history-{s.ident}", 280, small=True)


def importance_figure(s: StudyView) -> str | None:
    import plotly.graph_objects as go

    if not s.importances:
        return None
    names = list(s.importances)[:10]
    fig = go.Figure(go.Bar(x=[s.importances[n] for n in names], y=names, orientation="h", marker_color="#2ca02c"))
    fig.update_layout(title="Parameter importances (PED-ANOVA)", xaxis=dict(title="importance"),
                      yaxis=dict(autorange="reversed", automargin=True))
    return _fig_html(fig, f"fig-importance-{s.ident}", 280, small=True)


def times_figure(s: StudyView) -> str | None:
    import plotly.graph_objects as go

    times = s.measured_times
    if not times:
        return None
    fig = go.Figure(go.Box(x=times, name="", boxpoints="all", jitter=0.6, pointpos=0, marker=dict(size=4),
                           line=dict(color="#9467bd"), fillcolor="rgba(148,103,189,0.15)", hoverinfo="x"))
    failed = sum(s.failures.values())
    fig.update_layout(title=f"Trial times ({len(times)} measured, {failed} failed)", showlegend=False,
                      xaxis=dict(type="log", title="time (us)"), yaxis=dict(showticklabels=False))
    return _fig_html(fig, f"fig-times-{s.ident}", 280, small=True)
