"""The tuning report: one self-contained HTML file and a Markdown summary of tuning results.

    autocnn report [--db DIR|FILE] [--storage URL] [--bench bench_kernels.json | --ceilings GBPS,TFLOPS]
                   [--network NAME --batch N] [--gpu TEXT] [--op OP] [--out report.html] [--markdown report.md]

(``python scripts/tuning_report.py ...`` runs the same code.)

From the tuning database: per GPU (and per network, with ``--network``) a table of every tuned kernel
with its config, tuned, default and cuDNN times and the speed-ups, a bar chart of the speed-ups and a
roofline-style plot of each kernel against the GPU's measured ceilings (copy bandwidth and SGEMM
peak, from a benchmark JSON of ``autocnn bench`` or ``--ceilings``). With ``--network`` the kernels
the network needs that would still run on a fallback (not an exact record) are listed with the
fallback that answered. From the Optuna storage: per study its trial counts, failures by class, the
optimisation history, the parameter importances (PED-ANOVA, which needs no extra package) and the
spread of trial times.

The HTML carries plotly.js once, inline, so it opens offline. Nothing here needs a GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import html
import json
import math
import shlex
import sqlite3
import sys
import tempfile
import urllib.parse
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

TITLE = "autocnn tuning report"
FAILURE_CLASSES = ("invalid_problem", "invalid_config", "infeasible", "compile_error", "launch_error",
                   "timeout", "wrong_result", "device_error")
# PED-ANOVA compares the best trials with the rest: with fewer complete trials it says nothing.
MIN_IMPORTANCE_TRIALS = 10
# At most this many skipped-record warnings are listed one by one (the rest are counted).
MAX_LISTED_WARNINGS = 20
_OP_COLOURS = {"conv_fwd": "#1f77b4", "conv_bwd_data": "#ff7f0e", "conv_wgrad": "#2ca02c",
               "avgpool_fwd": "#9467bd", "avgpool_bwd": "#8c564b"}
_FAILURE_COLOURS = {"invalid_problem": "#7f7f7f", "invalid_config": "#bcbd22", "infeasible": "#c7c7c7",
                    "compile_error": "#d62728", "launch_error": "#e377c2", "timeout": "#ff9896",
                    "wrong_result": "#9467bd", "device_error": "#17becf", "unrecorded": "#393b79"}


class ReportError(Exception):
    """An input that cannot be used at all (the message names it and says what is wrong)."""


# -- collected data -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float
    sgemm_tflops: float
    source: str

    @property
    def peak_gflops(self) -> float:
        return self.sgemm_tflops * 1000.0

    def roof(self, intensity: float) -> float:
        """The attainable GFLOP/s at this arithmetic intensity (flop per byte)."""
        return min(self.peak_gflops, self.copy_gbps * intensity)


@dataclass
class KernelRow:
    """One tuned kernel (a tuning record) as the report shows it."""

    gpu_label: str
    op: str
    shape: str
    label: str                 # seed shape name where the problem is a seed shape, else the shape
    layer: str                 # the network layer(s) that run it ("" without --network)
    config: str
    time_us: float
    default_us: float | None
    cudnn_us: float | None
    cudnn_source: str | None   # "record" or "bench"
    trials: int
    study: str | None
    tuned_at: str
    flops: int
    min_bytes: int

    @property
    def speedup_default(self) -> float | None:
        return None if self.default_us is None else self.default_us / self.time_us

    @property
    def speedup_cudnn(self) -> float | None:
        return None if self.cudnn_us is None else self.cudnn_us / self.time_us

    @property
    def intensity(self) -> float:
        return self.flops / self.min_bytes if self.min_bytes else float("nan")

    @staticmethod
    def gflops_at(flops: int, time_us: float | None) -> float | None:
        return None if not time_us else flops / (time_us * 1e-6) / 1e9

    @property
    def gflops(self) -> float | None:
        return self.gflops_at(self.flops, self.time_us)

    @property
    def gbps(self) -> float | None:
        return None if not self.time_us else self.min_bytes / (self.time_us * 1e-6) / 1e9


@dataclass
class Fallback:
    """A kernel a network needs that no exact record answers."""

    op: str
    shape: str
    layer: str
    source: str
    detail: str
    config: str


@dataclass
class Group:
    """One table: the kernels of one GPU (and one network with --network)."""

    ident: str                   # for HTML ids: g1, g2, ...
    title: str
    gpu_key: tuple
    rows: list[KernelRow]
    ceilings: Ceilings | None
    network: str | None = None
    fallbacks: list[Fallback] = field(default_factory=list)


@dataclass
class StudyView:
    ident: str                   # s1, s2, ...
    name: str
    op: str
    shape: str
    label: str
    gpu: str
    stale: bool
    states: Counter
    complete: list[tuple[int, float, bool]]   # (trial number, value, reused) of COMPLETE trials
    failures: Counter
    importances: dict[str, float] | None = None
    importance_note: str = ""
    record_shape: bool = False  # a tuning record names this study

    @property
    def n_trials(self) -> int:
        return sum(self.states.values())

    @property
    def measured_times(self) -> list[float]:
        return [v for _, v, reused in self.complete if not reused]

    @property
    def best(self) -> float | None:
        return min((v for _, v, _ in self.complete), default=None)


@dataclass
class ReportData:
    made_at: str
    version: str
    db_sources: list[str]
    db_files: list[str]
    storage_url: str | None          # redacted
    storage_opened: bool
    storage_note: str
    bench_path: str | None
    ceilings_text: str
    filters: list[str]
    groups: list[Group]
    studies: list[StudyView]
    record_count: int
    errors: list[str]
    notes: list[str]
    db_warnings: list[str]
    network: str | None


# -- helpers ----------------------------------------------------------------------------------------

def _fmt(value: float | None, spec: str = ".1f", none: str = "—") -> str:
    return none if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def _x(value: float | None) -> str:
    """A speed-up as the report prints it, e.g. ``1.20×``."""
    return _fmt(value, ".2f") + ("×" if value is not None else "")


def geomean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def _config_text(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _problem_key(problem_dict: dict[str, Any]) -> str:
    return json.dumps(problem_dict, sort_keys=True, separators=(",", ":"))


def _gpu_key(key: Any) -> tuple:
    return (key.gpu, key.compute_capability, key.sm_count, key.cuda_runtime, key.driver)


def _gpu_title(gpu_key: tuple) -> str:
    name, cc, sms, runtime, driver = gpu_key
    return f"{name} (sm_{cc.replace('.', '')}, {sms} SMs, CUDA {runtime}, driver {driver})"


def _op_order(op: str) -> int:
    from autocnn.kernels import OPERATIONS

    names = list(OPERATIONS)
    return names.index(op) if op in names else len(names)


_SEED_NAMES: dict[tuple[str, str], tuple[int, str]] | None = None


def _seed_name(op: str, problem: Any) -> tuple[int, str] | None:
    """(position, name) of the seed shape this problem is, or None."""
    global _SEED_NAMES
    if _SEED_NAMES is None:
        from autocnn.kernels import OPERATIONS
        from autocnn.kernels.suite import seed_problems

        _SEED_NAMES = {}
        for o in OPERATIONS:
            for i, (name, p) in enumerate(seed_problems(o)):
                _SEED_NAMES[(o, _problem_key(p.to_dict()))] = (i, name)
    return _SEED_NAMES.get((op, _problem_key(problem.to_dict())))


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, and the same of the exception that caused it."""
    text = str(exc).strip().splitlines()
    out = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc and str(cause).strip():
        out += f" ({type(cause).__name__}: {str(cause).strip().splitlines()[0]})"
    return out


# -- reading the inputs ----------------------------------------------------------------------------

def _storage_file(url: str) -> Path | None:
    """The file behind a SQLite URL or a journal storage, else None."""
    if url.startswith("journal:"):
        return Path(url[len("journal:"):])
    if url.endswith((".log", ".journal", ".jsonl")) and "://" not in url:
        return Path(url)
    if url.startswith("sqlite:///"):
        rest = url[len("sqlite:///"):].split("?", 1)[0]
        if rest in ("", ":memory:"):
            return None
        return Path(urllib.parse.unquote(rest))
    return None


def _absolute_sqlite(url: str) -> str:
    """A SQLite URL with a relative path made absolute (the same storage, from any directory)."""
    path = _storage_file(url)
    if url.startswith("sqlite:///") and path is not None and not path.is_absolute():
        query = url.split("?", 1)[1] if "?" in url else ""
        return f"sqlite:///{path.resolve()}" + (f"?{query}" if query else "")
    return url


def open_storage_for_report(url: str, explicit: bool) -> tuple[Any | None, str | None, str]:
    """(storage, error, note). Reading a report never creates a storage: a missing file is named."""
    from autocnn.store.database import redact_storage_url
    from autocnn.tuning.tuner import open_storage

    shown = redact_storage_url(url)
    path = _storage_file(url)
    if path is not None:
        if not path.exists():
            what = f"{path} does not exist"
            if explicit:
                return None, f"storage {shown} does not open: {what}", ""
            return None, None, f"no Optuna storage yet at {shown} ({what}; it appears with the first autocnn tune)"
        if path.is_dir():
            return None, f"storage {shown} does not open: {path} is a directory, not a storage file", ""
        if url.startswith("sqlite"):
            try:
                con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
                try:
                    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                finally:
                    con.close()
            except sqlite3.Error as exc:
                return None, f"storage {shown} does not open: {path} is not a SQLite database ({exc})", ""
            if not {"studies", "trials"} <= tables:
                return None, (f"storage {shown} does not open: {path} is a SQLite database but not an Optuna "
                              f"storage (it has no studies and trials tables)"), ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage = open_storage(url)
            storage.get_all_studies()
    except Exception as exc:  # noqa: BLE001 - any driver or schema error becomes one clear sentence
        return None, f"storage {shown} does not open: {_first_line(exc)}", ""
    return storage, None, ""


def read_bench(path: Path) -> tuple[dict[str, Any] | None, Ceilings | None, dict[tuple[str, str], float], str | None]:
    """(device dict, ceilings, {(op, problem key): cuDNN us}, error) of a benchmark JSON."""
    from autocnn.kernels import problem_from_dict
    from autocnn.kernels.suite import seed_shape

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None, {}, f"benchmark {path} does not exist"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, None, {}, f"benchmark {path} cannot be read: {_first_line(exc)}"
    if not isinstance(data, dict) or not isinstance(data.get("rows", []), list):
        return None, None, {}, f"benchmark {path} is not a benchmark of autocnn bench (no rows list)"
    device = data.get("device") if isinstance(data.get("device"), dict) else None
    ceilings = None
    c = data.get("ceilings")
    if isinstance(c, dict):
        try:
            gbps, tflops = float(c["copy_gbps"]), float(c["sgemm_tflops"])
            if gbps > 0 and tflops > 0 and math.isfinite(gbps) and math.isfinite(tflops):
                ceilings = Ceilings(gbps, tflops, f"measured by autocnn bench ({path})")
        except (KeyError, TypeError, ValueError):
            pass
    problems: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in data.get("records") or []:
        if isinstance(rec, dict) and isinstance(rec.get("problem"), dict):
            problems[(str(rec.get("op")), str(rec.get("shape")))] = rec["problem"]
    cudnn: dict[tuple[str, str], float] = {}
    for row in data.get("rows", []):
        if not isinstance(row, dict):
            continue
        op, shape, us = row.get("op"), row.get("shape"), row.get("cudnn_us")
        if not isinstance(us, (int, float)) or not us > 0:
            continue
        try:
            raw = problems.get((str(op), str(shape)))
            problem = problem_from_dict(raw) if raw is not None else seed_shape(str(shape)).problem(str(op))
        except Exception:  # noqa: BLE001 - a row of a shape this autocnn does not know is left out
            continue
        cudnn[(problem.op, _problem_key(problem.to_dict()))] = float(us)
    return device, ceilings, cudnn, None


def _parse_ceilings(text: str) -> Ceilings:
    parts = [p.strip() for p in text.split(",")]
    try:
        gbps, tflops = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not COPY_GBPS,SGEMM_TFLOPS (two positive numbers, e.g. 4227,51.1)") from None
    if not (gbps > 0 and tflops > 0 and math.isfinite(gbps) and math.isfinite(tflops)):
        raise argparse.ArgumentTypeError(f"{text!r}: both ceilings must be positive numbers")
    return Ceilings(gbps, tflops, "given with --ceilings")


def _open_database(db_arg: Path | None, stack: contextlib.ExitStack) -> tuple[Any, list[str], list[str]]:
    """(TuningDatabase, sources to state, database files). Raises ReportError for a missing --db."""
    from autocnn.store.database import TuningDatabase

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


def _device_for(gpu_key: tuple, study_devices: dict[tuple, dict], bench_device: dict | None) -> Any:
    """A DeviceInfo for lookups on a GPU known only from records (limits: from a study, the
    benchmark, or the architecture's table)."""
    from autocnn.device import DeviceInfo, DeviceLimits

    for d in [study_devices.get(gpu_key), bench_device]:
        if isinstance(d, dict):
            try:
                info = DeviceInfo.from_dict(d)
            except TypeError:
                continue
            if (info.name, info.compute_capability, info.sm_count, info.cuda_runtime, info.driver) == gpu_key:
                return info
    name, cc, sms, runtime, driver = gpu_key
    try:
        lim = DeviceLimits.for_arch(f"sm_{cc.replace('.', '')}")
        return DeviceInfo(name, cc, sms, runtime, driver, max_smem_per_block=lim.max_smem_per_block,
                          smem_per_sm=lim.smem_per_sm, regs_per_sm=lim.regs_per_sm)
    except ValueError:
        return DeviceInfo(name, cc, sms, runtime, driver)


def _row_for(record: Any, gpu_label: str, cudnn_bench: dict, bench_gpu: str | None, layer: str = "") -> KernelRow:
    from autocnn.kernels import get_operation, problem_from_dict

    problem = problem_from_dict(record.key.problem)
    operation = get_operation(record.key.op)
    seed = _seed_name(record.key.op, problem)
    cudnn, source = record.cudnn_time_us, "record" if record.cudnn_time_us is not None else None
    if cudnn is None and bench_gpu is not None and bench_gpu == record.key.gpu:
        cudnn = cudnn_bench.get((record.key.op, _problem_key(problem.to_dict())))
        source = "bench" if cudnn is not None else None
    return KernelRow(
        gpu_label=gpu_label, op=record.key.op, shape=problem.shape_string(),
        label=f"{record.key.op} · {seed[1] if seed else problem.shape_string()}", layer=layer,
        config=_config_text(record.config), time_us=record.time_us, default_us=record.default_time_us,
        cudnn_us=cudnn, cudnn_source=source, trials=record.trials, study=record.study, tuned_at=record.tuned_at,
        flops=int(operation.flops(problem)), min_bytes=int(operation.min_bytes(problem)))


def _row_sort_key(row: KernelRow, problem_order: dict[str, int] | None = None) -> tuple:
    if problem_order is not None:
        return (problem_order.get(f"{row.op}|{row.shape}", 10**6), row.shape)
    seed = row.label.split(" · ", 1)[1]
    from autocnn.kernels.suite import seed_shapes

    names = [s.name for s in seed_shapes()]
    return (_op_order(row.op), names.index(seed) if seed in names else len(names), row.shape)


def read_studies(storage: Any, gpu_filter: str | None, ops: set[str] | None,
                 wanted_problems: set[tuple[str, str]] | None) -> tuple[list[StudyView], dict]:
    """Every study matching the filters, with its trial counts, failures and importances; and the
    DeviceInfo dicts the studies recorded, by GPU identity."""
    import optuna

    from autocnn.kernels import get_operation, problem_from_dict

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    devices: dict[tuple, dict] = {}
    out: list[tuple[tuple, StudyView]] = []
    for frozen in storage.get_all_studies():
        attrs = frozen.user_attrs or {}
        parts = frozen.study_name.split("|")
        op = attrs.get("op") or (parts[1] if len(parts) > 1 else "?")
        device = attrs.get("device") if isinstance(attrs.get("device"), dict) else {}
        gpu = str(device.get("name") or (parts[0] if parts else "?"))
        if gpu_filter and gpu_filter.lower() not in gpu.lower() and gpu_filter.lower() not in parts[0].lower():
            continue
        if ops is not None and op not in ops:
            continue
        try:
            devices[(device["name"], device["compute_capability"], device["sm_count"], device["cuda_runtime"],
                     device["driver"])] = device
        except (KeyError, TypeError):
            pass
        problem = None
        try:
            problem = problem_from_dict(attrs["problem"])
            shape = problem.shape_string()
        except Exception:  # noqa: BLE001 - a study of another autocnn: its name still says the shape
            shape = parts[2] if len(parts) > 2 else frozen.study_name
        if wanted_problems is not None and (op, shape) not in wanted_problems:
            continue
        stale = False
        try:
            stale = attrs.get("fingerprint", parts[3] if len(parts) > 3 else None) != get_operation(op).fingerprint()
        except Exception:  # noqa: BLE001 - an unknown operation
            stale = True
        seed = _seed_name(op, problem) if problem is not None else None
        label = f"{op} · {seed[1] if seed else shape}" + (" (older templates)" if stale else "")
        states: Counter = Counter()
        complete: list[tuple[int, float, bool]] = []
        failures: Counter = Counter()
        for t in storage.get_all_trials(storage.get_study_id_from_name(frozen.study_name), deepcopy=False):
            states[t.state.name] += 1
            result = t.user_attrs.get("result") or {}
            if t.state.name == "COMPLETE" and t.value is not None:
                complete.append((t.number, float(t.value), bool(result.get("reused"))))
            elif t.state.name == "FAIL":
                failures[str(result.get("failure") or "unrecorded")] += 1
        complete.sort()
        view = StudyView("", frozen.study_name, op, shape, label, gpu, stale, states, complete, failures)
        _importances(storage, view)
        order = (gpu, _op_order(op), seed[0] if seed else 10**6, shape, frozen.study_name)
        out.append((order, view))
    out.sort(key=lambda t: t[0])
    views = [v for _, v in out]
    for i, v in enumerate(views, 1):
        v.ident = f"s{i}"
    return views, devices


def _importances(storage: Any, view: StudyView) -> None:
    import optuna

    distinct = {v for _, v, _ in view.complete}
    if len(view.measured_times) < MIN_IMPORTANCE_TRIALS or len(distinct) < 2:
        view.importance_note = (f"parameter importances skipped: {len(view.measured_times)} measured complete "
                                f"trial(s), at least {MIN_IMPORTANCE_TRIALS} needed")
        return
    evaluator_type = getattr(optuna.importance, "PedAnovaImportanceEvaluator", None)
    if evaluator_type is None:
        view.importance_note = "parameter importances need Optuna's PED-ANOVA evaluator (Optuna >= 3.6)"
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = optuna.load_study(study_name=view.name, storage=storage)
            imp = optuna.importance.get_param_importances(study, evaluator=evaluator_type())
    except Exception as exc:  # noqa: BLE001 - a study the evaluator cannot judge is noted, not fatal
        view.importance_note = f"parameter importances could not be computed: {_first_line(exc)}"
        return
    imp = {k: float(v) for k, v in imp.items() if v and v > 0}
    if not imp:
        view.importance_note = "no parameter explains the variation in trial times (all importances are 0)"
        return
    view.importances = dict(sorted(imp.items(), key=lambda kv: -kv[1]))


def collect(args: argparse.Namespace, stack: contextlib.ExitStack) -> ReportData:
    from autocnn import __version__
    from autocnn.store.database import redact_storage_url
    from autocnn.tuning.tuner import default_storage_url

    errors: list[str] = []
    notes: list[str] = []
    made_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    ops: set[str] | None = None
    if args.op:
        from autocnn.kernels import OPERATIONS

        ops = {o.strip() for o in args.op.split(",") if o.strip()}
        unknown = sorted(ops - set(OPERATIONS))
        if unknown:
            raise ReportError(f"--op: unknown operation(s) {', '.join(unknown)}; choose from {', '.join(OPERATIONS)}")

    # the network, first: a misspelt name should fail before anything is read
    network_problems: list[tuple[Any, str]] | None = None
    if args.network:
        network_problems = _network_problems(args.network, args.batch)
        if ops is not None:
            network_problems = [(p, layer) for p, layer in network_problems if p.op in ops]

    # the tuning database
    db_sources: list[str] = []
    db_files: list[str] = []
    db_warnings: list[str] = []
    records: list[Any] = []
    db = None
    try:
        db, db_sources, db_files = _open_database(args.db, stack)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = db.records()
        db_warnings = [str(w.message) for w in caught]
    except ReportError as exc:
        errors.append(str(exc))
    if db is not None and not db_files:
        notes.append("the tuning database has no files: nothing has been tuned into it yet "
                     f"(looked in {', '.join(db_sources)})")
    elif db is not None and not records:
        notes.append(f"the tuning database has no valid records (read {len(db_files)} file(s))")
    all_records = len(records)
    records = [r for r in records if (not args.gpu or args.gpu.lower() in r.key.gpu.lower())
               and (ops is None or r.key.op in ops)]
    if all_records and not records:
        notes.append(f"none of the {all_records} records matches the filters")

    # the benchmark and the ceilings
    bench_device, bench_ceilings, cudnn_bench = None, None, {}
    if args.bench is not None:
        bench_device, bench_ceilings, cudnn_bench, err = read_bench(args.bench)
        if err:
            errors.append(err)
        elif bench_ceilings is None and args.ceilings is None:
            notes.append(f"benchmark {args.bench} has no measured ceilings (it ran without PyTorch)")
    bench_gpu = bench_device.get("name") if bench_device else None

    def ceilings_for(gpu_key: tuple) -> Ceilings | None:
        if args.ceilings is not None:
            return args.ceilings
        if bench_ceilings is not None and bench_gpu == gpu_key[0]:
            return bench_ceilings
        return None

    if args.ceilings is not None:
        ceilings_text = (f"copy {args.ceilings.copy_gbps:.0f} GB/s, SGEMM {args.ceilings.sgemm_tflops:.1f} TFLOP/s "
                         f"(given with --ceilings, used for every GPU)")
    elif bench_ceilings is not None:
        ceilings_text = (f"copy {bench_ceilings.copy_gbps:.0f} GB/s, SGEMM {bench_ceilings.sgemm_tflops:.1f} TFLOP/s "
                         f"(measured on {bench_gpu} by autocnn bench)")
    else:
        ceilings_text = "unknown (give --bench bench_kernels.json or --ceilings COPY_GBPS,SGEMM_TFLOPS)"

    # the Optuna storage
    explicit = args.storage is not None
    url = _absolute_sqlite(args.storage or default_storage_url())
    shown_url = redact_storage_url(url)
    storage, err, storage_note = open_storage_for_report(url, explicit)
    if err:
        errors.append(err)
    if storage_note:
        notes.append(storage_note)
    studies: list[StudyView] = []
    study_devices: dict[tuple, dict] = {}
    if storage is not None:
        wanted = None
        if network_problems is not None:
            wanted = {(p.op, p.shape_string()) for p, _ in network_problems}
        try:
            studies, study_devices = read_studies(storage, args.gpu, ops, wanted)
        except Exception as exc:  # noqa: BLE001 - a storage that opened but cannot be read
            errors.append(f"storage {shown_url} could not be read: {_first_line(exc)}")
        if not studies:
            notes.append(f"the storage {shown_url} has no study matching the filters")
    named = {r.study for r in records if r.study}
    for s in studies:
        s.record_shape = s.name in named
        if not s.complete:
            notes.append(f"study {s.label} has no completed trial ({s.n_trials} trials: "
                         + (", ".join(f"{n} {c}" for c, n in s.failures.most_common()) or "none finished") + ")")

    # the tables
    groups: list[Group] = []
    by_gpu: dict[tuple, list[Any]] = {}
    for r in records:
        by_gpu.setdefault(_gpu_key(r.key), []).append(r)
    if network_problems is None:
        for gk in sorted(by_gpu):
            rows = [_row_for(r, _gpu_title(gk), cudnn_bench, bench_gpu) for r in by_gpu[gk]]
            rows.sort(key=_row_sort_key)
            groups.append(Group(f"g{len(groups) + 1}", _gpu_title(gk), gk, rows, ceilings_for(gk)))
    else:
        gpu_keys = sorted(by_gpu) or sorted(k for k in study_devices
                                            if not args.gpu or args.gpu.lower() in k[0].lower())
        if not gpu_keys:
            notes.append(f"no GPU in the database or the storage to look up the kernels of {args.network} on")
        for gk in gpu_keys:
            device = _device_for(gk, study_devices, bench_device)
            group = Group(f"g{len(groups) + 1}", f"{args.network} (batch {args.batch}) on {_gpu_title(gk)}", gk, [],
                          ceilings_for(gk), network=args.network)
            order = {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for i, (problem, layer) in enumerate(network_problems):
                    order[f"{problem.op}|{problem.shape_string()}"] = i
                    try:
                        found = db.lookup(device, problem) if db is not None else None
                    except Exception as exc:  # noqa: BLE001 - a lookup that fails is reported, not fatal
                        group.fallbacks.append(Fallback(problem.op, problem.shape_string(), layer, "error",
                                                        _first_line(exc), "—"))
                        continue
                    if found is not None and found.source == "exact" and found.record is not None:
                        group.rows.append(_row_for(found.record, _gpu_title(gk), cudnn_bench, bench_gpu, layer))
                    else:
                        group.fallbacks.append(Fallback(
                            problem.op, problem.shape_string(), layer,
                            found.source if found is not None else "default",
                            found.detail if found is not None else "no tuning database",
                            str(found.config) if found is not None else "—"))
            group.rows.sort(key=lambda row: _row_sort_key(row, order))
            groups.append(group)

    filters = []
    if args.gpu:
        filters.append(f"GPU name contains {args.gpu!r}")
    if args.op:
        filters.append(f"operation in {args.op}")
    if args.network:
        filters.append(f"network {args.network} at batch {args.batch}")
    return ReportData(
        made_at=made_at, version=__version__, db_sources=db_sources, db_files=db_files,
        storage_url=shown_url, storage_opened=storage is not None, storage_note=storage_note,
        bench_path=str(args.bench) if args.bench is not None else None, ceilings_text=ceilings_text,
        filters=filters, groups=groups, studies=studies, record_count=len(records), errors=errors, notes=notes,
        db_warnings=db_warnings, network=args.network)


def _network_problems(name: str, batch: int) -> list[tuple[Any, str]]:
    """(problem, layers that run it) of every kernel a training step of the network needs."""
    from autocnn.nn.zoo import load_network

    if batch < 1:
        raise ReportError(f"--batch must be at least 1, not {batch}")
    try:
        model = load_network(name)
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


# -- summaries ----------------------------------------------------------------------------------------

def op_summary(group: Group) -> list[dict[str, Any]]:
    """Per operation: kernels, geometric-mean speed-ups over the default and over cuDNN."""
    out = []
    ops = sorted({r.op for r in group.rows}, key=_op_order)
    for op in ops + (["all"] if len(ops) > 1 else []):
        rows = [r for r in group.rows if op == "all" or r.op == op]
        out.append({"op": op, "kernels": len(rows),
                    "vs_default": geomean(r.speedup_default for r in rows),
                    "n_default": sum(1 for r in rows if r.speedup_default is not None),
                    "vs_cudnn": geomean(r.speedup_cudnn for r in rows),
                    "n_cudnn": sum(1 for r in rows if r.speedup_cudnn is not None),
                    "faster_than_cudnn": sum(1 for r in rows if (r.speedup_cudnn or 0) > 1)})
    return out


def _roof_percent(row: KernelRow, ceilings: Ceilings | None) -> float | None:
    if ceilings is None or row.gflops is None or not math.isfinite(row.intensity):
        return None
    return 100.0 * row.gflops / ceilings.roof(row.intensity)


# -- figures ------------------------------------------------------------------------------------------

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
                         hovertext=[f"{r.shape}<br>tuned {r.time_us:.1f} us, default {_fmt(r.default_us)} us"
                                    for r in rows], hoverinfo="text+x"))
    fig.add_trace(go.Bar(name="over cuDNN", y=labels, x=[r.speedup_cudnn for r in rows], orientation="h",
                         marker_color="#d62728",
                         hovertext=[f"{r.shape}<br>tuned {r.time_us:.1f} us, cuDNN {_fmt(r.cudnn_us)} us"
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
    for op in sorted({r.op for r in rows}, key=_op_order):
        mine = [r for r in rows if r.op == op]
        fig.add_trace(go.Scatter(
            name=f"{op} tuned", x=[r.intensity for r in mine], y=[r.gflops for r in mine], mode="markers",
            marker=dict(size=10, color=_OP_COLOURS.get(op, "#333")),
            hovertext=[f"{r.label}<br>{r.shape}<br>{r.gflops:.0f} GFLOP/s, {r.gbps:.0f} GB/s"
                       + (f", {_roof_percent(r, group.ceilings):.0f}% of roof" if group.ceilings else "")
                       for r in mine], hoverinfo="text"))
    dflt = [r for r in rows if r.default_us]
    if dflt:
        fig.add_trace(go.Scatter(name="default config", x=[r.intensity for r in dflt],
                                 y=[KernelRow.gflops_at(r.flops, r.default_us) for r in dflt], mode="markers",
                                 marker=dict(size=8, symbol="circle-open", color="#555"),
                                 hovertext=[f"{r.label} default" for r in dflt], hoverinfo="text+y"))
    cud = [r for r in rows if r.cudnn_us]
    if cud:
        fig.add_trace(go.Scatter(name="cuDNN", x=[r.intensity for r in cud],
                                 y=[KernelRow.gflops_at(r.flops, r.cudnn_us) for r in cud], mode="markers",
                                 marker=dict(size=8, symbol="x", color="#000"),
                                 hovertext=[f"{r.label} cuDNN" for r in cud], hoverinfo="text+y"))
    xs = [r.intensity for r in rows]
    ys = [y for r in rows for y in (r.gflops, KernelRow.gflops_at(r.flops, r.default_us),
                                    KernelRow.gflops_at(r.flops, r.cudnn_us)) if y]
    x0, x1 = min(xs) / 2, max(xs) * 2
    y0, y1 = min(ys) / 2, max(ys) * 2
    c = group.ceilings
    if c is not None:
        ridge = c.peak_gflops / c.copy_gbps
        x0, x1 = min(x0, ridge / 2), max(x1, ridge * 2)
        y0, y1 = min(y0, c.copy_gbps * x0), max(y1, c.peak_gflops * 2)
        xm = min(x1, y1 / c.copy_gbps)   # the bandwidth line, drawn to the top of the plot
        fig.add_trace(go.Scatter(name=f"copy bandwidth {c.copy_gbps:.0f} GB/s", x=[x0, xm],
                                 y=[c.copy_gbps * x0, c.copy_gbps * xm], mode="lines",
                                 line=dict(color="#888", dash="dash"), hoverinfo="name"))
        fig.add_trace(go.Scatter(name=f"SGEMM peak {c.sgemm_tflops:.1f} TFLOP/s", x=[x0, x1],
                                 y=[c.peak_gflops, c.peak_gflops], mode="lines",
                                 line=dict(color="#444", dash="dot"), hoverinfo="name"))
        title = f"Kernels against the measured ceilings: {group.title}"
    else:
        title = f"Kernels against the ceilings (ceilings unknown): {group.title}"
        fig.add_annotation(text="GPU ceilings unknown: give --bench bench_kernels.json or --ceilings "
                                "COPY_GBPS,SGEMM_TFLOPS", xref="paper", yref="paper", x=0.5, y=1.0,
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


# -- HTML -------------------------------------------------------------------------------------------

ROOFLINE_NOTE = ("Each kernel at its arithmetic intensity (the operation's flops over the bytes it must move at "
                 "least once) and its achieved rate. Filled: tuned; open: the default config; x: cuDNN. The lines "
                 "are the GPU's measured copy bandwidth and SGEMM rate; cuDNN can lie above them with algorithms "
                 "that do fewer flops than a direct convolution (FFT, Winograd).")

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
    return f'<td class="num {cls}">{_e(_x(value))}</td>'


def _meta_rows(data: ReportData) -> list[tuple[str, str]]:
    rows = [("made", f"{data.made_at} by autocnn {data.version}"),
            ("tuning database", "; ".join(data.db_sources) or "—"),
            ("database files", ", ".join(data.db_files) or "none"),
            ("records", str(data.record_count)),
            ("Optuna storage", f"{data.storage_url or '—'} ({len(data.studies)} studies shown)"),
            ("benchmark", data.bench_path or "none"),
            ("GPU ceilings", data.ceilings_text)]
    if data.filters:
        rows.append(("filters", "; ".join(data.filters)))
    return rows


def dashboard_command(data: ReportData) -> str | None:
    if not data.storage_url or not data.storage_opened:
        return None
    return f"optuna-dashboard {shlex.quote(data.storage_url)}"


def render_html(data: ReportData) -> str:
    import plotly.offline

    parts: list[str] = []
    add = parts.append
    add(f"<h1>{_e(TITLE)}</h1>")
    add('<table class="meta">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in _meta_rows(data))
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
        cudnn = _fmt(r.cudnn_us) + (" (bench)" if r.cudnn_source == "bench" else "")
        name = r.label.split(" · ", 1)[1]
        seed = f"<br><span class='seed'>{_e(name)}</span>" if name != r.shape else ""
        link = (f'<a href="#study-{study_ids[r.study]}">{study_ids[r.study]}</a>' if r.study in study_ids
                else "—")
        out.append(
            f"<tr><td>{_e(r.op)}</td><td class='shape'>{_e(r.shape)}{seed}</td>"
            + (f"<td>{_e(r.layer)}</td>" if g.network else "")
            + f"<td class='cfg'>{_e(r.config)}</td><td class='num'>{_fmt(r.time_us)}</td>"
            f"<td class='num'>{_fmt(r.default_us)}</td><td class='num'>{_e(cudnn)}</td>"
            f"{_speedup_cell(r.speedup_default)}{_speedup_cell(r.speedup_cudnn)}"
            f"<td class='num'>{_fmt(r.gflops, '.0f')}</td><td class='num'>{_fmt(r.gbps, '.0f')}</td>"
            f"<td class='num'>{_fmt(_roof_percent(r, g.ceilings), '.0f')}{'%' if g.ceilings else ''}</td>"
            f"<td class='num'>{r.trials}</td><td>{link}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _failure_text(failures: Counter) -> str:
    return ", ".join(f"{c} {n}" for c, n in sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _study_table_html(studies: Sequence[StudyView]) -> str:
    out = ["<table><tr><th>#</th><th>study</th><th>GPU</th><th>trials</th><th>complete</th><th>of which reused</th>"
           "<th>failed</th><th>failures by class</th><th>pruned (duplicates)</th><th>best µs</th></tr>"]
    for s in studies:
        reused = sum(1 for _, _, r in s.complete if r)
        out.append(f"<tr><td><a href='#study-{s.ident}'>{s.ident}</a></td><td>{_e(s.label)}<br>"
                   f"<span class='shape'>{_e(s.shape)}</span></td><td>{_e(s.gpu)}</td>"
                   f"<td class='num'>{s.n_trials}</td><td class='num'>{len(s.complete)}</td>"
                   f"<td class='num'>{reused}</td><td class='num'>{sum(s.failures.values())}</td>"
                   f"<td>{_e(_failure_text(s.failures))}</td><td class='num'>{s.states.get('PRUNED', 0)}</td>"
                   f"<td class='num'>{_fmt(s.best)}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _study_panel_html(s: StudyView) -> str:
    head = (f'<div class="study" id="study-{s.ident}"><h3>{s.ident}: {_e(s.label)}</h3>'
            f"<div><code>{_e(s.name)}</code></div>"
            f"<div>{s.n_trials} trials: {len(s.complete)} complete ({len(s.measured_times)} measured), "
            f"{sum(s.failures.values())} failed ({_e(_failure_text(s.failures))}), "
            f"{s.states.get('PRUNED', 0)} pruned; best {_fmt(s.best)} µs</div>")
    if not s.complete:
        return head + (f'<p class="empty">This study has no completed trial: every trial failed '
                       f"({_e(_failure_text(s.failures))}).</p></div>")
    cells = [history_figure(s), importance_figure(s) or f'<p class="empty">{_e(s.importance_note)}</p>',
             times_figure(s)]
    return head + '<div class="grid3">' + "".join(f"<div>{c or ''}</div>" for c in cells) + "</div></div>"


# -- Markdown -----------------------------------------------------------------------------------------

def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(data: ReportData) -> str:
    out = [f"# {TITLE}", ""]
    for k, v in _meta_rows(data):
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
                out.append(f"| {_md(g.title)} | {s['op']} | {s['kernels']} | {_x(s['vs_default'])} | "
                           f"{_x(s['vs_cudnn'])} | {s['faster_than_cudnn']} of {s['n_cudnn']} |")
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
                cudnn = _fmt(r.cudnn_us) + (" (bench)" if r.cudnn_source == "bench" else "")
                roof = _roof_percent(r, g.ceilings)
                out.append(f"| {r.op} | {_md(r.shape)} | " + (f"{_md(r.layer)} | " if g.network else "")
                           + f"{_md(r.config)} | {_fmt(r.time_us)} | {_fmt(r.default_us)} | {cudnn} | "
                           f"{_x(r.speedup_default)} | {_x(r.speedup_cudnn)} | "
                           f"{_fmt(roof, '.0f') + ('%' if roof is not None else '')} |")
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
                       f"{sum(s.failures.values())} | {_md(_failure_text(s.failures))} | "
                       f"{_fmt(s.best) if s.complete else 'no completed trial'} |")
    else:
        out.append("No study to show.")
    out.append("")
    cmd = dashboard_command(data)
    if cmd:
        out += ["Browse the studies with optuna-dashboard (`pip install optuna-dashboard`):", "",
                f"    {cmd}", ""]
    return "\n".join(out)


# -- command line -------------------------------------------------------------------------------------

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
    ap.add_argument("--ceilings", type=_parse_ceilings, default=None, metavar="COPY_GBPS,SGEMM_TFLOPS",
                    help="the GPU's ceilings, e.g. 4227,51.1 (overrides those of --bench)")
    ap.add_argument("--network", default=None,
                    help="report the kernels of this zoo network (or network JSON file), and those on a fallback")
    ap.add_argument("--batch", type=int, default=128, help="with --network: the batch size (default 128)")
    ap.add_argument("--gpu", default=None, help="only GPUs whose name contains this text (case-insensitive)")
    ap.add_argument("--op", default=None, help="only these operations (comma-separated)")
    ap.add_argument("--out", type=Path, default=Path("report.html"), help="the HTML file (default report.html)")
    ap.add_argument("--markdown", type=Path, default=None,
                    help="the Markdown summary (default: next to the HTML, with .md)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:   # autocnn report -- --out x.html: the separator reaches us
        argv = argv[1:]
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:   # --help, or a usage error argparse already explained
        return int(exc.code or 0)
    try:
        import plotly  # noqa: F401
    except ImportError:
        print("autocnn report: needs plotly: pip install 'autocnn[report]' (or pip install plotly)", file=sys.stderr)
        return 1
    with contextlib.ExitStack() as stack:
        try:
            data = collect(args, stack)
        except ReportError as exc:
            print(f"autocnn report: {exc}", file=sys.stderr)
            return 1
    for e in data.errors:
        print(f"autocnn report: {e}", file=sys.stderr)
    for n in data.notes:
        print(f"autocnn report: note: {n}", file=sys.stderr)
    if data.db_warnings:
        print(f"autocnn report: note: {len(data.db_warnings)} database entries or files were skipped "
              f"(listed in the report)", file=sys.stderr)
    if data.record_count == 0 and not data.studies and not any(g.fallbacks for g in data.groups):
        print("autocnn report: nothing to report (no tuning record and no Optuna study); no report written",
              file=sys.stderr)
        return 1
    md_path = args.markdown if args.markdown is not None else args.out.with_suffix(".md")
    markdown = render_markdown(data)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render_html(data), encoding="utf-8")
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(markdown, encoding="utf-8")
    except OSError as exc:
        print(f"autocnn report: cannot write the report: {exc}", file=sys.stderr)
        return 1
    for g in data.groups:
        for s in op_summary(g):
            print(f"{g.title}: {s['op']}: {s['kernels']} kernels, geo-mean speed-up {_x(s['vs_default'])} over "
                  f"the default, {_x(s['vs_cudnn'])} over cuDNN ({s['n_cudnn']} timed)")
        if g.network is not None:
            print(f"{g.title}: {len(g.fallbacks)} kernels on a fallback")
    print(f"{len(data.studies)} Optuna studies; "
          f"{sum(1 for s in data.studies if not s.complete)} without a completed trial")
    print(f"wrote {args.out} and {md_path}")
    cmd = dashboard_command(data)
    if cmd:
        print(f"browse the studies: {cmd}")
    return 1 if data.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
