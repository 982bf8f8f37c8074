#!/usr/bin/env python3
"""An HTML and Markdown report of tuning results (same as ``autocnn report``).

    python scripts/tuning_report.py --bench bench_kernels.json --out report.html
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.cli.report import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
