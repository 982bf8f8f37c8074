"""The tuning database: record keys, records, atomic storage and lookup with fallback.

A record says "on this GPU, with this CUDA runtime and driver, this config ran this problem of this
operation in this time, with the template family at this fingerprint". Records live as JSON, one
file per GPU kind (``<device.slug()>.json``): the shipped ones in the package's ``tuning_db``
directory (read-only), the user's in ``AUTOCNN_TUNING_DB`` or ``cache_root()/tuning_db``.

Nothing read from a file is trusted. Every record is validated on load: its problem must parse,
its operation must exist, its fingerprint must be its formulation's current one (or the code its
config generates must be the code it was tuned with, its plan digest), and its config
must be a point of the current search space (``SearchSpace.validate``), so a value a template
would paste into CUDA source is always one the space offers. A record that fails any check is
skipped with a warning naming the file, the record and the reason; it is never returned.

Lookup falls back in a fixed chain and says which step answered:
exact GPU identity -> same compute capability -> nearest tuned shape -> the heuristic default;
a nearest shape's config only when ptxas's report shows it runs on the device (``feasibility``).

Modules: ``records`` (keys, records, their checks and failures), ``files`` (reading, scanning and
atomically writing the JSON files), ``lookup`` (the fallback chain, neighbours, stale records),
``transfer`` (export and import), ``feasibility`` (whether a borrowed config runs: ptxas's report,
from nvcc or CuPy's NVRTC), ``database`` (TuningDatabase, which composes them).
This package runs on CPU-only machines: it imports no CuPy (only a lookup's check may, on a GPU host).
"""
from autocnn.store.database import SummaryRow, TuningDatabase
from autocnn.store.feasibility import ResourceCheck, approve_all, ptxas_check
from autocnn.store.files import ENV_VAR, LOCK_TIMEOUT_S, Origin, default_shipped_dir, default_user_dir
from autocnn.store.lookup import (MAX_CHECKED_NEIGHBOURS, NEAREST_SHAPE_MAX_DISTANCE, LookupResult, LookupSource,
                                  shape_distance)
from autocnn.store.records import (RECORD_FORMAT, DatabaseError, InvalidRecordWarning, RecordError, RecordKey,
                                   StaleRecordError, StaleRecordWarning, TuningRecord, ValidRecord, now_utc,
                                   redact_storage_url, validate_record)
from autocnn.store.transfer import ImportRejection, ImportReport

__all__ = [
    "DatabaseError", "ENV_VAR", "ImportRejection", "ImportReport", "InvalidRecordWarning", "LOCK_TIMEOUT_S",
    "LookupResult", "LookupSource", "MAX_CHECKED_NEIGHBOURS", "NEAREST_SHAPE_MAX_DISTANCE", "Origin", "RECORD_FORMAT", "RecordError",
    "RecordKey", "ResourceCheck", "StaleRecordError", "StaleRecordWarning", "SummaryRow", "TuningDatabase", "TuningRecord",
    "ValidRecord", "approve_all", "default_shipped_dir", "default_user_dir", "now_utc", "ptxas_check", "redact_storage_url",
    "shape_distance", "validate_record",
]
