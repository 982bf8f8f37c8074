"""The command line: ``autocnn tune | db | bench | train | report``.

A module per command (tune, db, bench, train, report) adds its parser and turns the parsed
arguments once into its typed settings (``tune.TuneCommand``, ``train.TrainCommand``,
``db.RecordFilter``, ``autocnn.benchmark.kernels.BenchSettings``,
``autocnn.reports.ReportRequest``), which is all that the code below the command line is given.
``checks`` holds what is checked before a command starts work and how warnings are shown,
``problems`` how problems, precisions and numbers are read and printed. This module is the door:
the parser of every command, and each failure told on one line.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from autocnn.cli import bench, db, report, train, tune
from autocnn.cli.checks import plain_warnings
from autocnn.errors import AutocnnError

# Commands whose options belong to another module's parser: handed over before argparse sees them
# (argparse.REMAINDER would drop a first argument that looks like an option).
DELEGATED = {"bench": bench.main, "report": report.main}


def main(argv: Sequence[str] | None = None) -> int:
    with plain_warnings():
        return _main(argv)


def _typed_errors() -> tuple[type[BaseException], ...]:
    """The failures the library raises on purpose, each told in its own words on one line."""
    from autocnn.nn.backend import BackendUnavailableError
    from autocnn.nn.cublas import CublasUnavailableError
    from autocnn.search.study_lock import StudyLockTimeout
    from autocnn.separable.execution import SeparableUnavailableError
    from autocnn.store import DatabaseError

    return (AutocnnError, DatabaseError, BackendUnavailableError, CublasUnavailableError, SeparableUnavailableError,
            StudyLockTimeout, ValueError, FileNotFoundError, KeyError)


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        rest = argv[1:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        try:
            return int(DELEGATED[argv[0]](rest) or 0)
        except AutocnnError as exc:
            print(f"autocnn: {exc}", file=sys.stderr)
            return 1
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except _typed_errors() as exc:   # a corrupt or foreign file, a lock held too long, no CuPy, ...
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc   # KeyError's str quotes it
        print(f"autocnn: {text}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (autocnn db list | head): nothing left to say.
        sys.stderr.close()
        return 0
    except OSError as exc:   # a write the checks before the work could not foresee (a disk filling up)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"autocnn: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autocnn: interrupted; finished trials are kept in the study, re-run the same command to resume",
              file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autocnn", description="Generated, tuned CUDA kernels for CNNs.",
                                     epilog=tune.EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(title="commands")
    for command in (tune, db, bench, train, report):
        command.add_parser(sub)
    return parser
