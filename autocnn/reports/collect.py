"""Collecting the inputs into the report's data model: the records as kernel rows grouped by GPU (or by
network), the studies, the ceilings, and every problem met on the way as an error or a note."""
from __future__ import annotations

import contextlib
import datetime as _dt
import warnings
from typing import Any

from autocnn.reports.inputs import open_database, problems_of_network, read_bench
from autocnn.reports.labels import op_order, precision_of, precision_suffix, problem_key, seed_name, shown_precision
from autocnn.reports.model import (Ceilings, Fallback, Group, KernelRow, ReportData, ReportError, ReportRequest,
                                   StudyView, first_line)
from autocnn.reports.studies import absolute_sqlite, open_storage_for_report, read_studies


def _config_text(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _gpu_key(key: Any) -> tuple:
    return (key.gpu, key.compute_capability, key.sm_count, key.cuda_runtime, key.driver)


def _gpu_title(gpu_key: tuple) -> str:
    name, cc, sms, runtime, driver = gpu_key
    return f"{name} (sm_{cc.replace('.', '')}, {sms} SMs, CUDA {runtime}, driver {driver})"


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
    seed = seed_name(record.key.op, problem)
    cudnn, source = record.cudnn_time_us, "record" if record.cudnn_time_us is not None else None
    if cudnn is None and bench_gpu is not None and bench_gpu == record.key.gpu:
        cudnn = cudnn_bench.get((record.key.op, problem_key(problem.to_dict())))
        source = "bench" if cudnn is not None else None
    return KernelRow(
        gpu_label=gpu_label, op=record.key.op, shape=problem.shape_string(),
        label=(f"{record.key.op} · {seed[1]}{precision_suffix(problem)}" if seed
               else f"{record.key.op} · {problem.shape_string()}"),
        layer=layer, precision=precision_of(problem), seed_index=seed[0] if seed else None,
        config=_config_text(record.config), time_us=record.time_us, default_us=record.default_time_us,
        cudnn_us=cudnn, cudnn_source=source, trials=record.trials, study=record.study, tuned_at=record.tuned_at,
        flops=int(operation.flops(problem)), min_bytes=int(operation.min_bytes(problem)))


def _row_sort_key(row: KernelRow, problem_order: dict[str, int] | None = None) -> tuple:
    if problem_order is not None:
        return (problem_order.get(f"{row.op}|{row.shape}", 10**6), row.shape)
    # seed shapes in the suite's order (each fp32 before tf32), then the others by shape
    return (op_order(row.op), row.seed_index if row.seed_index is not None else 10**6, row.precision, row.shape)


def collect(request: ReportRequest, stack: contextlib.ExitStack) -> ReportData:
    from autocnn import __version__
    from autocnn.store import redact_storage_url
    from autocnn.search.tuner import default_storage_url

    errors: list[str] = []
    notes: list[str] = []
    made_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    ops: set[str] | None = None
    if request.op:
        from autocnn.kernels import OPERATIONS

        ops = {o.strip() for o in request.op.split(",") if o.strip()}
        unknown = sorted(ops - set(OPERATIONS))
        if unknown:
            raise ReportError(f"--op: unknown operation(s) {', '.join(unknown)}; choose from {', '.join(OPERATIONS)}")

    # the network, first: a misspelt name should fail before anything is read
    network_problems: list[tuple[Any, str]] | None = None
    if request.network:
        network_problems = problems_of_network(request.network, request.batch, request.precision)
        if ops is not None:
            network_problems = [(p, layer) for p, layer in network_problems if p.op in ops]

    # the tuning database
    db_sources: list[str] = []
    db_files: list[str] = []
    db_warnings: list[str] = []
    records: list[Any] = []
    db = None
    try:
        db, db_sources, db_files = open_database(request.db, stack)
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
    records = [r for r in records if (not request.gpu or request.gpu.lower() in r.key.gpu.lower())
               and (ops is None or r.key.op in ops)]
    if all_records and not records:
        notes.append(f"none of the {all_records} records matches the filters")

    # the benchmark and the ceilings
    bench_device, bench_ceilings, cudnn_bench = None, None, {}
    if request.bench is not None:
        bench_device, bench_ceilings, cudnn_bench, err = read_bench(request.bench)
        if err:
            errors.append(err)
        elif bench_ceilings is None and request.ceilings is None:
            notes.append(f"benchmark {request.bench} has no measured ceilings (it ran without PyTorch)")
    bench_gpu = bench_device.get("name") if bench_device else None

    def ceilings_for(gpu_key: tuple) -> Ceilings | None:
        if request.ceilings is not None:
            return request.ceilings
        if bench_ceilings is not None and bench_gpu == gpu_key[0]:
            return bench_ceilings
        return None

    if request.ceilings is not None:
        ceilings_text = f"{request.ceilings.text()} (given with --ceilings, used for every GPU)"
    elif bench_ceilings is not None:
        ceilings_text = f"{bench_ceilings.text()} (measured on {bench_gpu} by autocnn bench)"
    else:
        ceilings_text = "unknown (give --bench bench_kernels.json or --ceilings COPY_GBPS,SGEMM_TFLOPS[,TF32_TFLOPS])"

    # the Optuna storage
    explicit = request.storage is not None
    url = absolute_sqlite(request.storage or default_storage_url())
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
            studies, study_devices = read_studies(storage, request.gpu, ops, wanted)
        except Exception as exc:  # noqa: BLE001 - a storage that opened but cannot be read
            errors.append(f"storage {shown_url} could not be read: {first_line(exc)}")
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
                                            if not request.gpu or request.gpu.lower() in k[0].lower())
        if not gpu_keys:
            notes.append(f"no GPU in the database or the storage to look up the kernels of {request.network} on")
        for gk in gpu_keys:
            device = _device_for(gk, study_devices, bench_device)
            # fp32, the default, goes unsaid
            tf32 = f", {request.precision}" if shown_precision(request.precision).tf32 else ""
            group = Group(f"g{len(groups) + 1}", f"{request.network} (batch {request.batch}{tf32}) on {_gpu_title(gk)}",
                          gk, [],
                          ceilings_for(gk), network=request.network)
            order = {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for i, (problem, layer) in enumerate(network_problems):
                    order[f"{problem.op}|{problem.shape_string()}"] = i
                    try:
                        found = db.lookup(device, problem) if db is not None else None
                    except Exception as exc:  # noqa: BLE001 - a lookup that fails is reported, not fatal
                        group.fallbacks.append(Fallback(problem.op, problem.shape_string(), layer, "error",
                                                        first_line(exc), "—"))
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
    if request.gpu:
        filters.append(f"GPU name contains {request.gpu!r}")
    if request.op:
        filters.append(f"operation in {request.op}")
    if request.network:
        filters.append(f"network {request.network} at batch {request.batch}"
                       + (f" in {request.precision}" if shown_precision(request.precision).tf32 else ""))
    return ReportData(
        made_at=made_at, version=__version__, db_sources=db_sources, db_files=db_files,
        storage_url=shown_url, storage_opened=storage is not None, storage_note=storage_note,
        bench_path=str(request.bench) if request.bench is not None else None, ceilings_text=ceilings_text,
        filters=filters, groups=groups, studies=studies, record_count=len(records), errors=errors, notes=notes,
        db_warnings=db_warnings, network=request.network)
