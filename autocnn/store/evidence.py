"""Whether a record's numbers can be true: a stored time is evidence, not truth.

``time_floor_us`` is the least time a problem can take on an architecture: its bytes (each input
read and each output written once) at the fastest memory bandwidth of that architecture, or its
least arithmetic at the fastest tensor-core rate, whichever is longer, halved (outputs of a small
problem may still sit in L2 when the timing ends, and datasheets round). The least arithmetic of a
convolution is its direct multiply-adds over the filter's taps: fast algorithms (Winograd, FFT)
trade taps for transforms, and at best do one product per output, input channel and filter (the
11x11 FFT records run at 1.2x the TF32 rate by the direct count). A record faster than the floor
was not measured on such a GPU: ``db import`` refuses it and ``db check`` names it.

``digest_problem`` says whether a record whose fingerprint is current plans to the digest it
carries: one that does not names code it was not tuned with.
"""
from __future__ import annotations

from typing import Any

from autocnn.device import peak_rates
from autocnn.kernels import get_operation
from autocnn.store.files import CorruptFile, ForeignFormat, describe_raw, read_raw
from autocnn.store.records import RecordError, RecordKey, TuningRecord, ValidRecord, validate_record

# The floor is this share of the time the peaks allow (see the module's text).
FLOOR_SHARE = 0.5


def time_floor_us(key: RecordKey, problem: Any) -> float:
    """The least time in microseconds ``problem`` can take on a GPU of the key's architecture."""
    operation = get_operation(key.op)
    rates = peak_rates(key.arch)
    seconds = operation.min_bytes(problem) / rates.copy_bytes_per_s
    flops = operation.flops(problem)
    if flops and key.op.startswith(("conv", "sep_conv")):
        taps = max(1, int(getattr(problem, "R", 1)) * int(getattr(problem, "S", 1)))
        seconds = max(seconds, flops / taps / rates.tensor_flops_per_s)
    return seconds * 1e6 * FLOOR_SHARE


def implausible_times(valid: ValidRecord) -> list[str]:
    """The record's times (its own, the default's, cuDNN's, the runner-up's) under the floor, each
    as a sentence; empty when all can be true."""
    r = valid.record
    floor = time_floor_us(r.key, valid.problem)
    times = [("time_us", r.time_us), ("default_time_us", r.default_time_us), ("cudnn_time_us", r.cudnn_time_us),
             ("runner_up.time_us", (r.runner_up or {}).get("time_us"))]
    return [f"{name} {value:.3g} us is below the {floor:.3g} us that {valid.problem.shape_string()} takes at "
            f"least on any {r.key.arch} GPU (its bytes at {peak_rates(r.key.arch).copy_bytes_per_s / 1e12:.2f} "
            f"TB/s, its least arithmetic at the tensor-core peak); it was not measured"
            for name, value in times if value is not None and value < floor]


def digest_problem(valid: ValidRecord, original: TuningRecord) -> str | None:
    """Where a record of a current fingerprint carries a plan digest that its config does not plan
    to now: a sentence; None otherwise (no digest, or a record re-keyed by its digest, which
    ``validate_record`` checked already)."""
    if original.plan_digest is None or valid.record.key.fingerprint != original.key.fingerprint:
        return None
    try:
        digest = get_operation(original.key.op).code_digest(valid.problem, valid.config)
    except Exception as exc:  # noqa: BLE001 - a config that cannot be planned is named, not raised
        return f"plan_digest: its config cannot be planned ({type(exc).__name__}: {exc})"
    if digest != original.plan_digest:
        return (f"plan_digest: {original.plan_digest} is not the digest of its config's code ({digest}): the "
                f"record does not describe the kernels it names")
    return None


def evidence_problems(valid: ValidRecord, original: TuningRecord) -> list[str]:
    """Every reason the record's numbers cannot be the measurement they claim to be."""
    out = implausible_times(valid)
    digest = digest_problem(valid, original)
    if digest is not None:
        out.append(digest)
    return out


def file_evidence(path: Any) -> list[str]:
    """``evidence_problems`` of every valid record of a database file, one sentence each naming the
    file and the record (what ``autocnn db check`` adds to the files' own problems)."""
    try:
        raws = read_raw(path)
    except (CorruptFile, ForeignFormat, OSError):
        return []   # the file's own problem, which scan_file names
    out = []
    for i, raw in enumerate(raws):
        try:
            original = TuningRecord.from_dict(raw)
            valid = validate_record(original)
        except RecordError:
            continue   # skipped on load, and named as such
        out += [f"{path}: record {i}{describe_raw(raw)}: {why}" for why in evidence_problems(valid, original)]
    return out
