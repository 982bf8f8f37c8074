"""The modules of autocnn.nn import each other without a circle.

A circle makes the import order matter (a name imported from a module that is still running its
own imports is missing) and usually hides one by moving the import into a function; so every
import counts here, at the top of a module or inside a function, and so do
``importlib.import_module("autocnn.nn...")`` calls with a literal name. Importing a submodule
also runs the package's ``__init__`` first; that edge is left out (Python handles it), but
``from autocnn.nn import Name`` for a name that is not a submodule is an edge to ``__init__``.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "autocnn.nn"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / "autocnn" / "nn"


def _imported(tree: ast.AST, package: str, modules: set[str]) -> set[str]:
    """The package's modules (stems, "__init__" for the package itself) that ``tree`` imports."""
    found: set[str] = set()

    def add(dotted: str, names: tuple[str, ...] = ()) -> None:
        if dotted == package:
            # ``from package import a, b``: a submodule each, or a name of the package's __init__.
            found.update(n if n in modules else "__init__" for n in names or ("__init__",))
        elif dotted.startswith(package + "."):
            found.add(dotted[len(package) + 1:].split(".")[0])

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package itself (or above it)
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            add(base, tuple(alias.name for alias in node.names))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value)
    return found & modules


def import_graph(directory: Path, package: str) -> dict[str, set[str]]:
    """Module stem -> the stems of the same package it imports (itself left out)."""
    files = {path.stem: path for path in sorted(directory.glob("*.py"))}
    modules = set(files)
    return {stem: _imported(ast.parse(path.read_text(), str(path)), package, modules) - {stem}
            for stem, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path that ends where it starts, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def test_autocnn_nn_imports_form_no_circle():
    graph = import_graph(PACKAGE_DIR, PACKAGE)
    assert "backend" in graph and "layers" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "autocnn.nn modules import each other in a circle: " + " -> ".join(cycle or [])


def test_backend_interface_imports_no_layer_or_model():
    # The interface is what layers, losses and optimizers are written against: it imports none of them.
    # Besides the activations it takes mixed precision's names (the loss scaler's slots, ScaleUse),
    # which import nothing of autocnn.nn.
    graph = import_graph(PACKAGE_DIR, PACKAGE)
    assert graph["backend"] <= {"activations", "mixed_precision"}, sorted(graph["backend"])
    assert not graph["mixed_precision"], sorted(graph["mixed_precision"])


def test_the_check_sees_imports_inside_functions_and_import_module(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("A = 1\ndef f():\n    from .b import B\n    return B\n")
    (pkg / "b.py").write_text("import importlib\nB = 2\ndef g():\n    return importlib.import_module('pkg.c')\n")
    (pkg / "c.py").write_text("from pkg import A\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"__init__": {"a"}, "a": {"b"}, "b": {"c"}, "c": {"__init__"}}
    assert find_cycle(graph) == ["__init__", "a", "b", "c", "__init__"]
    (pkg / "c.py").write_text("from pkg import a\n")   # a submodule: the edge goes to it
    graph = import_graph(pkg, "pkg")
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    (pkg / "c.py").write_text("import numpy\n")
    assert find_cycle(import_graph(pkg, "pkg")) is None
