"""Rendering the separable package's CUDA templates (beside this module) and compiling them.

The same Jinja settings as autocnn.kernels.codegen (StrictUndefined: a missing variable is an
error, not an empty string in CUDA source); each rendered source carries a fingerprint of its
template, so a cached module is never one of an older template.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from autocnn.kernels.codegen import make_environment

TEMPLATE_DIR = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    return make_environment(TEMPLATE_DIR)


@functools.lru_cache(maxsize=None)
def template_fingerprint(name: str) -> str:
    return hashlib.sha256((TEMPLATE_DIR / name).read_bytes()).hexdigest()[:16]


def render(name: str, **context: Any) -> str:
    """The CUDA source of template ``name`` for ``context``."""
    return _environment().get_template(name).render(fingerprint=template_fingerprint(name), **context)


def load_module(source: str) -> Any:
    """The source compiled by NVRTC (through CuPy) and loaded on the current device, cached."""
    return _nvrtc().load(source)


@functools.lru_cache(maxsize=1)
def _nvrtc() -> Any:
    from autocnn.kernels.compiler import NvrtcCompiler

    return NvrtcCompiler()


def nvcc_reports(source: str, arch: str = "sm_90") -> dict[str, Any]:
    """ptxas's resource report of each kernel of ``source`` (nvcc -cubin, no GPU needed)."""
    from autocnn.kernels.compiler import NvccCompiler

    return NvccCompiler(arch).compile(source).reports
