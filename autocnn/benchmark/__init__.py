"""Benchmarking: autocnn's kernels against their defaults and cuDNN, in one run on one GPU.

Modules: ``kernels`` (``autocnn bench``: every kernel family on the seed shapes), ``table`` (its
rows, rates and tables; no GPU), ``baselines`` (cuDNN through PyTorch, the GEMM and copy
ceilings) and ``random_shapes`` (unseen shapes for judging quick tuning).
"""
