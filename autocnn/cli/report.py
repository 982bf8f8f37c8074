"""``autocnn report``: its own parser (the arguments are handed over before the top-level parser
sees them), read once into a ReportRequest, which autocnn.reports writes."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from autocnn.precision import DEFAULT_PRECISION, FLOAT32_PRECISION_NAMES

if TYPE_CHECKING:   # the report's modules are read only when a report is made
    from autocnn.reports.model import Ceilings


def add_parser(sub: Any) -> None:
    """``report`` in the top-level help (its arguments never reach the top-level parser)."""
    r = sub.add_parser("report", help="an HTML and Markdown report of tuning results")
    r.add_argument("args", nargs=argparse.REMAINDER, help="arguments of scripts/tuning_report.py")
    r.set_defaults(func=lambda args: main(args.args))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="autocnn report", description="Write an HTML report (self-contained, opens offline) and a Markdown "
        "summary of the tuning database and the Optuna studies.",
        epilog="examples:\n  autocnn report --bench bench_kernels.json\n"
               "  autocnn report --db tuning_db --storage sqlite:///optuna.db --network kriz09 --batch 128\n"
               "  autocnn report --ceilings 4227,51.1 --gpu h200 --op conv_fwd --out h200.html",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, default=None,
                    help="a tuning database directory or file (default: the user's and the shipped database)")
    ap.add_argument("--storage", default=None,
                    help="Optuna storage URL (sqlite:///path, postgresql://...) or journal file (default: the "
                         "tuner's default, SQLite in the autocnn cache directory)")
    ap.add_argument("--bench", type=Path, default=None,
                    help="a benchmark JSON of autocnn bench: the GPU's measured ceilings and cuDNN times")
    ap.add_argument("--ceilings", type=parse_ceilings, default=None, metavar="COPY_GBPS,SGEMM_TFLOPS[,TF32_TFLOPS]",
                    help="the GPU's ceilings, e.g. 4227,51.1 or, with the TF32 GEMM rate that tf32 kernels are "
                         "placed against, 4227,51.1,378 (overrides those of --bench)")
    ap.add_argument("--network", default=None,
                    help="report the kernels of this zoo network (or network JSON file), and those on a fallback")
    ap.add_argument("--batch", type=int, default=128, help="with --network: the batch size (default 128)")
    ap.add_argument("--precision", choices=FLOAT32_PRECISION_NAMES, default=DEFAULT_PRECISION.name,
                    help="with --network: the model's precision, whose records its convolutions look up "
                         "(default fp32)")
    ap.add_argument("--gpu", default=None, help="only GPUs whose name contains this text (case-insensitive)")
    ap.add_argument("--op", default=None, help="only these operations (comma-separated)")
    ap.add_argument("--out", type=Path, default=Path("report.html"), help="the HTML file (default report.html)")
    ap.add_argument("--markdown", type=Path, default=None,
                    help="the Markdown summary (default: next to the HTML, with .md)")
    return ap


def parse_ceilings(text: str) -> Ceilings:
    """``COPY_GBPS,SGEMM_TFLOPS[,TF32_TFLOPS]`` as given to ``--ceilings``."""
    from autocnn.reports.model import Ceilings

    parts = [p.strip() for p in text.split(",")]
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (2, 3):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not COPY_GBPS,SGEMM_TFLOPS[,TF32_TFLOPS] (two or three positive numbers, e.g. "
            f"4227,51.1 or 4227,51.1,378)")
    if not all(v > 0 and math.isfinite(v) for v in numbers):
        raise argparse.ArgumentTypeError(f"{text!r}: every ceiling must be a positive number")
    return Ceilings(numbers[0], numbers[1], "given with --ceilings", numbers[2] if len(numbers) == 3 else None)


def main(argv: Sequence[str] | None = None) -> int:
    from autocnn.reports import ReportRequest, write_report

    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:   # autocnn report -- --out x.html: the separator reaches us
        argv = argv[1:]
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:   # --help, or a usage error argparse already explained
        return int(exc.code or 0)
    return write_report(ReportRequest(db=args.db, storage=args.storage, bench=args.bench, ceilings=args.ceilings,
                                      network=args.network, batch=args.batch, precision=args.precision,
                                      gpu=args.gpu, op=args.op, out=args.out, markdown=args.markdown))
