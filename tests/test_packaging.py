"""pyproject.toml names every package of autocnn/, so that an installed copy (``pip install .``, a
wheel) holds every module and template: setuptools ships only the packages it is given, and a
formulation's folder left out would be missing from the installed package without any error."""
from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent


def test_every_folder_of_modules_or_templates_is_a_listed_package():
    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(d.relative_to(ROOT).parts) for d in (ROOT / "autocnn").rglob("*")
               if d.is_dir() and d.name != "__pycache__" and (any(d.glob("*.py")) or any(d.glob("*.j2")))}
    assert folders | {"autocnn"} <= packages, f"add to pyproject.toml's packages: {sorted(folders - packages)}"
