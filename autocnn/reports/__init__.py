"""Tuning reports (autocnn report): reading storages and benchmark files, collecting them into the
report's data model, figures, the HTML page and the Markdown summary.

The modules, in the order the data flows: studies and inputs (reading), collect (the data model of
model.py), figures, html_page and markdown (drawing, with what they share in summaries), command
(the command line).
"""
from autocnn.reports.collect import collect
from autocnn.reports.command import build_parser, main
from autocnn.reports.html_page import render_html
from autocnn.reports.markdown import render_markdown
from autocnn.reports.model import TITLE, ReportData, ReportError

__all__ = ["TITLE", "ReportData", "ReportError", "build_parser", "collect", "main", "render_html", "render_markdown"]
