"""Rendering: the Jinja environment, template families, and their fingerprints.

StrictUndefined turns a missing template variable into an error instead of an empty string in
CUDA source. The fingerprint hashes everything that decides the generated code for a family, so
a tuning record made before a template or its launch geometry changed is never reused.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
from pathlib import Path
from typing import Any

import jinja2

# Bumped when the way configs map to code changes in a way no file hash would notice.
RENDER_VERSION = 1


# The op templates live in templates/; each formulation's core lives beside its module in
# formulations/. Both travel inside the package, so an installed copy finds them the same way.
KERNELS_DIR = Path(__file__).resolve().parent
TEMPLATE_DIRS = (KERNELS_DIR / "templates", KERNELS_DIR / "formulations")


def templates_dir() -> Path:
    """The folder of the op templates (``<family>.cu.j2``)."""
    return TEMPLATE_DIRS[0]


def make_environment(*dirs: Path) -> jinja2.Environment:
    for d in dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"autocnn's templates are missing (looked in {d})")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in dirs]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return make_environment(*TEMPLATE_DIRS)


def family_files(family: str) -> list[Path]:
    """The family's template and every shared include (all of them: cheap and never stale)."""
    main = templates_dir() / f"{family}.cu.j2"
    if not main.exists():
        raise FileNotFoundError(f"no template for family {family!r} in {templates_dir()}")
    # Sorted by file name alone, so moving a shared core between the folders keeps the hash.
    shared = sorted((p for d in TEMPLATE_DIRS for p in d.glob("_*.j2")), key=lambda p: p.name)
    return [main, *shared]


@functools.lru_cache(maxsize=None)
def template_fingerprint(family: str, code_sources: tuple[str, ...] = ()) -> str:
    """A hash of everything that decides the code generated for a config: the family's templates and
    the Python that turns a (problem, config) into template variables and launch geometry.

    The search space is deliberately not part of it: changing which configs may be tried does not
    change the kernel of a config, and stored configs are re-validated against the space anyway.
    """
    h = hashlib.sha256()
    h.update(f"render-version:{RENDER_VERSION}\n".encode())
    for path in family_files(family):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    for text in code_sources:
        h.update(b"\0")
        h.update(text.encode())
    return h.hexdigest()[:16]


def code_source(obj: object) -> str:
    """Source text of a function or method (for fingerprints), or repr for a constant."""
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj):
        return inspect.getsource(obj)
    return repr(obj)


def render_family(family: str, context: dict[str, Any], fingerprint: str) -> str:
    template = environment().get_template(f"{family}.cu.j2")
    return template.render(fingerprint=fingerprint, **context)
