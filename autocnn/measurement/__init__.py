"""Measurement: what a candidate kernel's verification and time are, apart from how it was chosen.

Modules: ``measure`` (the float64 check at the precision's bound, the timing protocol: L2 flushed
between repetitions, median and spread of CUDA events), ``worker`` (the process that measures, so
that a kernel that faults or hangs takes down nothing else), ``sources`` (MeasurementSource: a GPU
through the worker, or recorded measurements replayed) and ``nsight`` (Nsight Compute's report).
"""
