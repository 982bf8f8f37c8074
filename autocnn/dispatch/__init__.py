"""Dispatch: from a kernel problem to a loaded kernel that runs, for the training library and the
PyTorch front end alike.

Modules: ``quick`` (quick tuning of shapes no record covers, and the autotune modes).
"""
