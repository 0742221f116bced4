"""The import graph of ``src/modwire``, read from the source with ``ast``: no import cycle, and
no floor imports a floor above it (``nn`` < ``models`` < ``tasks`` < ``training`` < ``analysis`` <
``experiments`` < the CLI: the studies import everything below them and only the CLI imports them).
Imports inside functions count: they run, only later."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: floor → the packages and modules it must not import (everything above it).
ABOVE = {
    "modwire.nn": ("modwire.models", "modwire.tasks", "modwire.training", "modwire.analysis", "modwire.experiments",
                   "modwire.cli"),
    "modwire.models": ("modwire.tasks", "modwire.training", "modwire.analysis", "modwire.experiments", "modwire.cli"),
    "modwire.tasks": ("modwire.training", "modwire.analysis", "modwire.experiments", "modwire.cli"),
    "modwire.training": ("modwire.analysis", "modwire.experiments", "modwire.cli"),
    "modwire.analysis": ("modwire.experiments", "modwire.cli"),
    "modwire.experiments": ("modwire.cli",),
}


def module_paths(src: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``src`` by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
                     modules: dict[str, Path]) -> set[str]:
    """The modules an import statement in ``module`` loads, relative imports resolved: ``from X
    import a`` loads the submodule ``X.a`` if there is one, else ``X`` (which defines ``a``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:   # relative: from the module's package, one level up per extra dot
            parts = module.split(".")
            source = ".".join(parts[:len(parts) - node.level + is_package] + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
    return {m for n in names if (m := _known_prefix(n, modules)) and m != module}


def _known_prefix(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module (``modwire.nn.kernel.f`` → ``modwire.nn.kernel``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(src: Path = SRC, package: str = "modwire") -> nx.DiGraph:
    """Module → the modules of ``package`` it imports, anywhere in its source."""
    modules = module_paths(src, package)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported_modules(node, module, path.name == "__init__.py", modules):
                    graph.add_edge(module, target, line=node.lineno)
    return graph


def find_cycle(graph: nx.DiGraph) -> list[str] | None:
    """The modules of one import cycle, in import order, or None."""
    try:
        return [a for a, _ in nx.find_cycle(graph)]
    except nx.NetworkXNoCycle:
        return None


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_violations(graph: nx.DiGraph) -> list[str]:
    """``"importer -> imported (line n)"`` for each import of a floor above the importer's (:data:`ABOVE`)."""
    return [f"{a} -> {b} (line {graph.edges[a, b].get('line')})" for a, b in sorted(graph.edges)
            for floor, banned in ABOVE.items() if _within(a, floor) and any(_within(b, x) for x in banned)]


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return import_graph()


def test_the_graph_is_read_from_the_source(graph):
    assert len(graph) > 50 and ("modwire.models.registry", "modwire.models.base") in graph.edges
    assert ("modwire.training.trainer", "modwire.training.distributed") in graph.edges   # from . import distributed


def test_there_is_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join([*cycle, cycle[0]])


def test_no_floor_imports_a_floor_above_it(graph):
    assert layer_violations(graph) == []


def test_the_cycle_finder_reports_a_hand_made_cycle():
    g = nx.DiGraph([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])
    cycle = find_cycle(g)
    assert cycle is not None and sorted(cycle) == ["a", "b", "c"]
    assert all(g.has_edge(x, y) for x, y in zip(cycle, cycle[1:] + cycle[:1]))
    g.remove_edge("c", "a")
    assert find_cycle(g) is None


def test_the_layer_check_reports_an_upward_import():
    g = nx.DiGraph()
    g.add_edge("modwire.nn.kernel", "modwire.models.base", line=3)
    g.add_edge("modwire.training.trainer", "modwire.models", line=4)       # downward: fine
    g.add_edge("modwire.tasks.base", "modwire.cli", line=5)
    g.add_edge("modwire.experiments.common", "modwire.cli", line=6)
    g.add_edge("modwire.experiments.common", "modwire.analysis.study", line=7)   # downward: fine
    assert layer_violations(g) == ["modwire.experiments.common -> modwire.cli (line 6)",
                                   "modwire.nn.kernel -> modwire.models.base (line 3)",
                                   "modwire.tasks.base -> modwire.cli (line 5)"]


def test_only_the_cli_imports_the_studies(graph):
    importers = {a for a, b in graph.edges
                 if _within(b, "modwire.experiments") and not _within(a, "modwire.experiments")}
    assert importers == {"modwire.cli"}


def test_relative_function_level_and_submodule_imports_are_resolved(tmp_path):
    files = {"pkg/__init__.py": "from .a import f\n",
             "pkg/a.py": "def f():\n    from .sub import b\n    from . import c\n",
             "pkg/c.py": "import pkg.sub.b\n",
             "pkg/sub/__init__.py": "",
             "pkg/sub/b.py": "from ..a import f\nfrom .. import c\nimport os\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = import_graph(tmp_path, "pkg")
    assert sorted(g.edges) == [("pkg", "pkg.a"), ("pkg.a", "pkg.c"), ("pkg.a", "pkg.sub.b"), ("pkg.c", "pkg.sub.b"),
                               ("pkg.sub.b", "pkg.a"), ("pkg.sub.b", "pkg.c")]
    assert sorted(find_cycle(g)) in (["pkg.a", "pkg.sub.b"], ["pkg.a", "pkg.c", "pkg.sub.b"])
