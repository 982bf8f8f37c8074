"""Reading the report's other inputs: tuning-database files, a benchmark JSON of autocnn bench, the
ceilings given on the command line and the kernels of a network."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from autocnn.reports.labels import problem_key
from autocnn.reports.model import Ceilings, ReportError, first_line


def read_bench(path: Path) -> tuple[dict[str, Any] | None, Ceilings | None, dict[tuple[str, str], float], str | None]:
    """(device dict, ceilings, {(op, problem key): cuDNN us}, error) of a benchmark JSON.

    A row's cuDNN time is keyed by its problem at the row's precision (a tf32 row was timed with
    cuDNN TF32, an fp32 one with TF32 off), so each record meets the cuDNN time of its precision.
    Benchmarks made before precision existed have fp32 rows only.
    """
    from autocnn.kernels import problem_from_dict
    from autocnn.kernels.suite import seed_shape

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None, {}, f"benchmark {path} does not exist"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, None, {}, f"benchmark {path} cannot be read: {first_line(exc)}"
    if not isinstance(data, dict) or not isinstance(data.get("rows", []), list):
        return None, None, {}, f"benchmark {path} is not a benchmark of autocnn bench (no rows list)"
    device = data.get("device") if isinstance(data.get("device"), dict) else None
    ceilings = None
    c = data.get("ceilings")
    if isinstance(c, dict):
        from autocnn.benchmark.table import GpuRates

        rates = GpuRates.from_dict(c)   # unmeasured or unusable numbers come back as None
        if rates.copy_gbps is not None and rates.sgemm_tflops is not None:
            ceilings = Ceilings(rates.copy_gbps, rates.sgemm_tflops, f"measured by autocnn bench ({path})",
                                rates.tf32_tflops)
    problems: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rec in data.get("records") or []:
        if isinstance(rec, dict) and isinstance(rec.get("problem"), dict):
            precision = str(rec["problem"].get("precision", "fp32"))
            problems[(str(rec.get("op")), str(rec.get("shape")), precision)] = rec["problem"]
    cudnn: dict[tuple[str, str], float] = {}
    for row in data.get("rows", []):
        if not isinstance(row, dict):
            continue
        op, shape, us = row.get("op"), row.get("shape"), row.get("cudnn_us")
        precision = str(row.get("precision") or "fp32")
        if not isinstance(us, (int, float)) or not us > 0:
            continue
        try:
            raw = problems.get((str(op), str(shape), "fp32" if precision == "-" else precision))
            if raw is not None:
                problem = problem_from_dict(raw)
            else:
                problem = seed_shape(str(shape)).problem(str(op))
                if precision != "-" and hasattr(problem, "precision"):
                    problem = dataclasses.replace(problem, precision=precision)
        except Exception:  # noqa: BLE001 - a row of a shape this autocnn does not know is left out
            continue
        cudnn[(problem.op, problem_key(problem.to_dict()))] = float(us)
    return device, ceilings, cudnn, None


def open_database(db_arg: Path | None, stack: contextlib.ExitStack) -> tuple[Any, list[str], list[str]]:
    """(TuningDatabase, sources to state, database files). Raises ReportError for a missing --db."""
    from autocnn.store import TuningDatabase

    if db_arg is None:
        db = TuningDatabase()
        sources = [f"{db.user_dir} (user)", f"{db.shipped_dir} (shipped)"]
        dirs = [db.shipped_dir, db.user_dir]
    else:
        path = Path(db_arg).expanduser()
        empty = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="autocnn-report-")))
        if not path.exists():
            raise ReportError(f"tuning database {path} does not exist (give a database directory or file with --db)")
        if path.is_file():
            # One database file: read it through a directory that holds only a link to it.
            holder = empty / "db"
            holder.mkdir()
            (holder / path.name).symlink_to(path.resolve())
            db = TuningDatabase(user_dir=holder, shipped_dir=empty / "none")
            return db, [f"{path} (file)"], [str(path)]
        db = TuningDatabase(user_dir=path, shipped_dir=empty / "none")
        sources = [f"{path} (directory)"]
        dirs = [path]
    files = [str(p) for d in dirs if d.is_dir() for p in sorted(d.glob("*.json")) if p.is_file()]
    return db, sources, files


def problems_of_network(name: str, batch: int, precision: str = "fp32") -> list[tuple[Any, str]]:
    """(problem, layers that run it) of every kernel a training step of the network needs, with the
    model at ``precision`` (its convolutions' problems carry it)."""
    from autocnn.nn.zoo import load_network

    if batch < 1:
        raise ReportError(f"--batch must be at least 1, not {batch}")
    try:
        model = load_network(name)
        model.precision = precision
        problems = model.problems(batch)
    except (ValueError, KeyError, FileNotFoundError, OSError) as exc:
        raise ReportError(f"--network {name}: {exc}") from None
    layers: dict[Any, list[str]] = {}
    try:
        inputs = [model.input_shape, *model.layer_output_shapes[:-1]]
        for layer, shape in zip(model.layers, inputs):
            for p in layer.make_problems(shape, batch):
                layers.setdefault(p, []).append(layer.describe())
    except Exception:  # noqa: BLE001 - layer names are a nicety; the problems are what counts
        layers = {}
    return [(p, ", ".join(layers.get(p, []))) for p in problems]
