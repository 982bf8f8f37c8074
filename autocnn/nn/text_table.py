"""Plain-text tables, as ``Sequential.summary`` and ``Sequential.dispatch_report`` print them."""
from __future__ import annotations


def format_table(rows: list[tuple[str, ...]]) -> str:
    """The rows in left-aligned columns, a rule of dashes under the first row (the header)."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
