"""Tuning reports (autocnn report): reading storages and benchmark files, collecting them into the
report's data model, figures, the HTML page and the Markdown summary.

The modules, in the order the data flows: studies and inputs (reading), collect (the data model of
model.py), figures, html_page and markdown (drawing, with what they share in summaries), command
(writing the report a ReportRequest asks for; autocnn.cli.report is the command line).
"""
from autocnn.reports.collect import collect
from autocnn.reports.command import write_report
from autocnn.reports.html_page import render_html
from autocnn.reports.markdown import render_markdown
from autocnn.reports.model import TITLE, ReportData, ReportError, ReportRequest

__all__ = ["TITLE", "ReportData", "ReportError", "ReportRequest", "collect", "render_html", "render_markdown",
           "write_report"]
