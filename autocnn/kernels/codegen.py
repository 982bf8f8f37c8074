"""Rendering: the Jinja environment, op templates, and fingerprints.

StrictUndefined turns a missing template variable into an error instead of an empty string in
CUDA source. A fingerprint hashes everything that decides the generated code of a formulation of
an operation (Operation.fingerprint picks the files and the Python), so a tuning record made before
a template or its launch geometry changed is never reused unless its config is shown to generate
the very code it was tuned with (KernelPlan.code_digest, autocnn.store.records.validate_record).
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


# The op templates live in templates/; each formulation's templates in its folder under
# formulations/, and those several formulations share in formulations/cores/. Both travel inside the
# package, so an installed copy finds them the same way.
KERNELS_DIR = Path(__file__).resolve().parent
TEMPLATE_ROOTS = (KERNELS_DIR / "templates", KERNELS_DIR / "formulations")


class DuplicateTemplateError(RuntimeError):
    """Two kernel templates share a file name: includes and fingerprints name a template by its file
    name alone, so which one a name meant would depend on the order folders are read in."""


@functools.lru_cache(maxsize=1)
def template_index() -> dict[str, Path]:
    """Every kernel template, by file name, wherever it lives under TEMPLATE_ROOTS."""
    index: dict[str, Path] = {}
    for root in TEMPLATE_ROOTS:
        if not root.is_dir():
            raise FileNotFoundError(f"autocnn's templates are missing (looked in {root})")
        for path in sorted(root.rglob("*.j2")):
            if path.name in index:
                raise DuplicateTemplateError(f"template {path.name!r} is both {index[path.name]} and {path}")
            index[path.name] = path
    return index


class IndexLoader(jinja2.BaseLoader):
    """Finds a kernel template by its file name in template_index(), whichever folder holds it."""

    def get_source(self, environment: jinja2.Environment, template: str):
        path = template_index().get(template)
        if path is None:
            raise jinja2.TemplateNotFound(template)
        mtime = path.stat().st_mtime
        return path.read_text(encoding="utf-8"), str(path), lambda: path.is_file() and path.stat().st_mtime == mtime

    def list_templates(self) -> list[str]:
        return sorted(template_index())


def _environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    return jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def make_environment(*dirs: Path) -> jinja2.Environment:
    """An environment over the templates of the given folders (autocnn.nn's, autocnn.separable's)."""
    for d in dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"autocnn's templates are missing (looked in {d})")
    return _environment(jinja2.FileSystemLoader([str(d) for d in dirs]))


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The kernel templates' environment: op templates and every formulation's, found by name."""
    return _environment(IndexLoader())


def template_path(name: str) -> Path:
    """Where a kernel template file lives."""
    try:
        return template_index()[name]
    except KeyError:
        raise FileNotFoundError(f"no template {name!r} under {', '.join(str(d) for d in TEMPLATE_ROOTS)}") from None


@functools.lru_cache(maxsize=None)
def template_fingerprint(files: tuple[str, ...], code_sources: tuple[str, ...] = ()) -> str:
    """A hash of everything that decides the code generated for a config: the template files it
    renders from (by name and content, wherever they live) and the Python that turns a
    (problem, config) into template variables and launch geometry.

    The search space is deliberately not part of it: changing which configs may be tried does not
    change the kernel of a config, and stored configs are re-validated against the space anyway.
    """
    h = hashlib.sha256()
    h.update(f"render-version:{RENDER_VERSION}\n".encode())
    for name in files:
        h.update(name.encode())
        h.update(template_path(name).read_bytes())
    for text in code_sources:
        h.update(b"\0")
        h.update(text.encode())
    return h.hexdigest()[:16]


def code_source(obj: object) -> str:
    """Source text of a function or method (for fingerprints), or repr for a constant. A decorated
    function (functools.lru_cache, wraps) counts by the source it wraps: the wrapper's repr holds its
    address, which would give every process its own fingerprint and Optuna study."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj):
        return inspect.getsource(obj)
    return repr(obj)


def render_family(family: str, context: dict[str, Any], fingerprint: str) -> str:
    """Render the op template ``<family>.cu.j2``; it includes the formulation's (``formulation_template``)."""
    template = environment().get_template(f"{family}.cu.j2")
    return template.render(fingerprint=fingerprint, **context)
