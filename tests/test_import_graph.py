"""No import circles inside autocnn/, no import across formulations, and no module below the command
line (autocnn/cli/) that reads arguments.

The graph: a module per .py file under autocnn/ (a package is its __init__.py), and an edge from a
module to each autocnn module it imports by any statement anywhere in it: at module level, inside
a function (an import put off until a call still ties the two modules together: neither can be
read, moved or tested without the other), under ``if TYPE_CHECKING`` (a type named across the
circle is a dependency too), and ``importlib.import_module`` with a literal name. An import names
the module it reaches: ``import a.b.c`` and ``from a.b import c`` (c a module) reach ``a.b.c``,
``from a.b import name`` reaches ``a.b``; the packages above the module named are not counted,
although Python runs their __init__.py first, since every module of a package would otherwise
depend on its package's face. A circle is a strongly connected set of two or more modules (or a
module importing itself); the test lists each with the imports that close it.

The formulations (autocnn/kernels/formulations/<name>/) are units: none imports another, and the
shared cores (formulations/cores/) import none of them.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autocnn"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a (possibly relative) import's module."""
    if not level:
        return name or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported autocnn module, line) for every import in the module's source."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out: list[tuple[str, int]] = []

    def reach(target: str, line: int) -> None:
        # The longest known module the dotted name starts with (a.b.c where it is a module, else a.b).
        parts = target.split(".")
        for i in range(len(parts), 0, -1):
            candidate = ".".join(parts[:i])
            if candidate in known:
                out.append((candidate, line))
                return

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                reach(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(name, is_package, node.level, node.module)
            for alias in node.names:
                full = f"{source}.{alias.name}"
                reach(full if full in known else source, node.lineno)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "import_module"))):
            reach(node.args[0].value, node.lineno)
    return [(m, line) for m, line in out if m.startswith("autocnn")]


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line that imports it}."""
    found = modules()
    known = set(found)
    graph: dict[str, dict[str, int]] = {}
    for name, path in found.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(name, path, known):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules, and the modules that import themselves
    (Tarjan's algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1 or node in graph[node]:
                    found.append(sorted(members))
    return sorted(found)


def describe(circle: list[str], graph: dict[str, dict[str, int]]) -> str:
    inside = set(circle)
    edges = [f"    {a} -> {b} (line {graph[a][b]})" for a in circle for b in sorted(graph[a]) if b in inside]
    return f"{len(circle)} modules: {', '.join(circle)}\n" + "\n".join(edges)


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "autocnn.kernels.space" in graph["autocnn.kernels.formulations.base"]            # module level
    assert "autocnn.kernels.reference" in graph["autocnn.kernels.conv_bwd_fused"]           # in a function,
    assert "autocnn.kernels" not in graph["autocnn.kernels.conv_bwd_fused"]                 # a module by name
    assert "autocnn.kernels.conv_pool_problems" in graph["autocnn.kernels.formulations.igemm_pool"]  # TYPE_CHECKING
    assert "autocnn.kernels.formulations" in graph["autocnn.kernels.registry"]              # a package's face
    assert "autocnn.nn.cuda_backend" in graph["autocnn.nn.backend_choice"]   # importlib.import_module("...")
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"d": 1}, "e": {"a": 1}}) == \
        [["a", "b", "c"], ["d"]]


def test_no_import_circles_inside_autocnn():
    graph = import_graph()
    found = circles(graph)
    assert not found, f"{len(found)} import circles:\n" + "\n".join(describe(c, graph) for c in found)


FORMULATIONS = "autocnn.kernels.formulations"


def formulation_of(module: str) -> str | None:
    """The formulation folder a module belongs to ("cores" for the shared cores), or None for a
    module outside them (the registry, base.py, and everything beyond formulations/)."""
    parts = module.split(".")
    if module.startswith(FORMULATIONS + ".") and (PACKAGE / "kernels" / "formulations" / parts[3]).is_dir():
        return parts[3]
    return None


def crosses_formulations(importer: str, target: str) -> bool:
    """Whether an import from ``importer`` reaches what its folder must not: a formulation reaches
    another formulation, or a core a formulation, directly or through the registry (formulations/
    __init__.py, which imports them all). What several share lives in cores/, which each imports."""
    home = formulation_of(importer)
    if home is None:
        return False
    if target == FORMULATIONS:
        return True
    there = formulation_of(target)
    return there is not None and there != home and there != "cores"


def test_the_formulation_rule_tells_peers_cores_and_the_registry_apart():
    f = FORMULATIONS
    assert crosses_formulations(f"{f}.tma", f"{f}.wgmma")
    assert crosses_formulations(f"{f}.cores.pool_blocks", f"{f}.igemm")
    assert crosses_formulations(f"{f}.cores.pool_blocks", f)
    assert crosses_formulations(f"{f}.fft.fft_kernels", f"{f}.igemm")
    assert not crosses_formulations(f"{f}.fft", f"{f}.fft.fft_planes")
    assert not crosses_formulations(f"{f}.tma", f"{f}.cores.wgmma_split_output")
    assert not crosses_formulations(f"{f}.cores.staging", f"{f}.cores.wgmma_gemm")
    assert not crosses_formulations(f"{f}.tma", f"{f}.base")
    assert not crosses_formulations(f, f"{f}.tma")                      # the registry imports them all
    assert not crosses_formulations("autocnn.kernels.registry", f"{f}.tma")


def test_no_formulation_imports_another_and_no_core_a_formulation():
    """A formulation's folder imports the cores, base.py and its own modules, never a peer's (not even
    its public names: what two formulations share belongs in cores/); a core imports no
    formulation. Every import statement counts, as for the circles above."""
    found = modules()
    known = set(found)
    crossings = list(dict.fromkeys(   # one line a statement, however many names it takes
        f"{path.relative_to(PACKAGE.parent)}:{line}: imports {target}"
        for name, path in found.items() for target, line in imports_of(name, path, known)
        if crosses_formulations(name, target)))
    assert not crossings, "imports across formulations:\n" + "\n".join(crossings)


def test_only_the_command_line_reads_arguments():
    """autocnn/cli/ turns arguments into typed settings once; below it no module imports argparse,
    so none can be handed a Namespace to read options from."""
    readers = []
    for name, path in modules().items():
        if name == "autocnn.cli" or name.startswith("autocnn.cli."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "argparse" or n.startswith("argparse.") for n in names):
                readers.append(f"{name} (line {node.lineno})")
    assert not readers, "argparse imported outside autocnn/cli/: " + ", ".join(readers)
