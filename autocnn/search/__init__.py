"""The search: one Optuna study per (GPU, operation, shape, fingerprint) over a formulation's space.

Modules: ``tuner`` (the Tuner: a study's trials measured through a MeasurementSource, the best
confirmed and stored), ``settings`` (TuneSettings, TuneOutcome), ``samplers``, ``trials`` (what a
trial records and which are in flight), ``leases`` (heartbeats of the processes sharing a study),
``storage`` and ``study_lock`` (where studies live, and one process at a time per study),
``confirm`` (re-timing the winner before it is stored), ``network`` (one trial budget over many
problems by expected time) and ``devices`` (several GPUs of one run).
"""
