"""Reading Optuna storages: opening one without creating it, and each study's trials, failures and
parameter importances as a StudyView."""
from __future__ import annotations

import sqlite3
import urllib.parse
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from autocnn.reports.labels import op_order, precision_suffix, seed_name
from autocnn.reports.model import StudyView, first_line

# PED-ANOVA compares the best trials with the rest: with fewer complete trials it says nothing.
MIN_IMPORTANCE_TRIALS = 10


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


def absolute_sqlite(url: str) -> str:
    """A SQLite URL with a relative path made absolute (the same storage, from any directory)."""
    path = _storage_file(url)
    if url.startswith("sqlite:///") and path is not None and not path.is_absolute():
        query = url.split("?", 1)[1] if "?" in url else ""
        return f"sqlite:///{path.resolve()}" + (f"?{query}" if query else "")
    return url


def open_storage_for_report(url: str, explicit: bool) -> tuple[Any | None, str | None, str]:
    """(storage, error, note). Reading a report never creates a storage: a missing file is named."""
    from autocnn.store import redact_storage_url
    from autocnn.search.tuner import open_storage

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
        return None, f"storage {shown} does not open: {first_line(exc)}", ""
    return storage, None, ""


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
        seed = seed_name(op, problem) if problem is not None else None
        label = (f"{op} · {seed[1] if seed else shape}" + (precision_suffix(problem) if seed else "")
                 + (" (older templates)" if stale else ""))
        states: Counter = Counter()
        complete: list[tuple[int, float, bool]] = []
        failures: Counter = Counter()
        for t in storage.get_all_trials(storage.get_study_id_from_name(frozen.study_name), deepcopy=False):
            states[t.state.name] += 1
            result = t.user_attrs.get("result") or {}
            if t.state.name == "COMPLETE" and t.value is not None:
                complete.append((t.number, float(t.value), bool(result.get("reused"))))
            elif t.state.name == "FAIL":
                # A replay file's miss is no failure of the config: counted under its own name.
                failures[str(result.get("failure") or ("replay_miss" if result.get("replay_miss") else "unrecorded"))] += 1
        complete.sort()
        view = StudyView("", frozen.study_name, op, shape, label, gpu, stale, states, complete, failures)
        _importances(storage, view)
        order = (gpu, op_order(op), seed[0] if seed else 10**6, shape, frozen.study_name)
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
        view.importance_note = f"parameter importances could not be computed: {first_line(exc)}"
        return
    imp = {k: float(v) for k, v in imp.items() if v and v > 0}
    if not imp:
        view.importance_note = "no parameter explains the variation in trial times (all importances are 0)"
        return
    view.importances = dict(sorted(imp.items(), key=lambda kv: -kv[1]))
