"""The architecture as a test: which package may import which, and no import cycles.

The import graph is read from the source (``ast``), every ``import`` counted wherever it
appears: at module level, inside a function, or under ``if TYPE_CHECKING:`` (a type-only
import is a dependency too: it counts for the layers and for the cycles).  Layers (arrows
point down only), the "may import" column of ``docs/ARCHITECTURE.md``:

    cli, bench  ->  server  ->  cuda_ext
         |            |
         +-> client   +-> proto, transport -> core
             testing
    cli, bench -> pyg -> client

and inside ``server/`` (``SERVER_ALLOWED``):

    daemon -> worker -> sampling -> partition
               loader -/
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = tuple(sorted(init.parent.name for init in ROOT.glob("*/__init__.py")))   # as setup.py maps them

# top-level package -> the top-level packages it may import (itself included)
ALLOWED = {
    "core": {"core"},
    "proto": {"proto", "core"},
    "transport": {"transport", "core"},
    "client": {"client", "core", "proto", "transport"},
    "pyg": {"pyg", "core", "proto", "transport", "client"},
    "testing": {"testing", "core", "proto", "client"},
    "cuda_ext": {"cuda_ext"},
    "server": {"server", "core", "proto", "transport", "cuda_ext"},
    "bench": {"bench", "core", "proto", "transport", "client", "pyg", "server", "testing", "cuda_ext"},
    "cli": {"cli", "core", "proto", "transport", "client", "pyg", "server", "bench", "testing", "cuda_ext"},
}

# server sub-layer -> what it may import: server sub-layers (itself included) and top-level packages
SERVER_ALLOWED = {
    "partition": {"partition", "core"},
    "sampling": {"sampling", "partition", "core", "cuda_ext"},
    "embedding": {"embedding", "partition", "core"},
    "loader": {"loader", "embedding", "sampling", "partition", "core"},
    "worker": {"worker", "embedding", "sampling", "partition", "transport", "core"},
    "daemon": {"daemon", "worker", "embedding", "sampling", "partition", "proto", "transport", "core", "cuda_ext"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for top in TOP_LEVEL:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("graphfeed",) + parts)] = path
    return out


MODULES = _modules()


def _imported_names(tree: ast.AST, module: str, is_package: bool):
    """Every name imported in ``tree`` (relative imports resolved), ``if TYPE_CHECKING:`` blocks included."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for alias in node.names:
                yield f"{base}.{alias.name}"
        stack.extend(ast.iter_child_nodes(node))


def _target(name: str) -> str | None:
    """The project module ``name`` refers to (``pkg.mod.func`` -> ``pkg.mod``), or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            target = _target(name)
            if target is not None and target != module:
                edges[module].add(target)
    return edges


GRAPH = _graph()


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    nodes = set(edges) | {t for ts in edges.values() for t in ts}
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _layer(module: str) -> str:
    """``graphfeed.server.X.*`` -> ``X`` (a server sub-layer); any other ``graphfeed.X.*`` -> ``X``."""
    parts = module.split(".")
    return parts[2] if parts[1] == "server" and len(parts) > 2 else parts[1]


SERVER_LAYERS = tuple(sorted({_layer(m) for m in MODULES if m.startswith("graphfeed.server.")}))


def test_the_graph_is_read():
    """Guards the other tests against vacuous passes: known edges are seen, type-only ones included."""
    assert "graphfeed.core.epoch" in GRAPH["graphfeed.server.loader.local"]
    assert "graphfeed.core.spec" in GRAPH["graphfeed.proto.convert"]
    assert "graphfeed.server.sampling.graph" in GRAPH["graphfeed.server.sampling.producer"]   # if TYPE_CHECKING:
    assert len(MODULES) > 60


def test_no_module_import_cycles():
    assert _cycles(GRAPH) == []


def test_no_package_import_cycles():
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        for target in targets:
            a, b = _package(module), _package(target)
            # a package's __init__ importing its own children is not a dependency between packages
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                packages[a].add(b)
    assert _cycles(packages) == []


@pytest.mark.parametrize("top", TOP_LEVEL)
def test_layers(top):
    wrong = sorted(f"{module} imports {target}" for module, targets in GRAPH.items()
                   if module.split(".")[1] == top for target in targets
                   if target.split(".")[1] not in ALLOWED[top])
    assert wrong == []


def test_every_top_level_package_has_a_layer():
    assert set(TOP_LEVEL) == set(ALLOWED)


@pytest.mark.parametrize("layer", SERVER_LAYERS)
def test_server_sub_layers(layer):
    wrong = sorted(f"{module} imports {target}" for module, targets in GRAPH.items()
                   if module.startswith("graphfeed.server.") and _layer(module) == layer for target in targets
                   if target != "graphfeed.server" and _layer(target) not in SERVER_ALLOWED[layer])
    assert wrong == []


def test_every_server_sub_layer_has_a_rule():
    assert set(SERVER_LAYERS) == set(SERVER_ALLOWED)
    assert not [m for m in MODULES if m.startswith("graphfeed.server.") and m.count(".") == 2
                and MODULES[m].name != "__init__.py"], "a module directly in server/ belongs to no sub-layer"


def test_type_only_imports_are_read():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from graphfeed.core import spec\n")
    assert "graphfeed.core.spec" in set(_imported_names(tree, "graphfeed.x", False))


def test_every_noqa_has_a_reason():
    """A ``# noqa`` silences the linter; the reason must stand beside it (``# noqa: X -- why``)."""
    bare = [f"{path.relative_to(ROOT)}:{n}" for path in list(MODULES.values()) + list((ROOT / "tests").rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if "# noqa" in line and " -- " not in line.split("# noqa", 1)[1]]
    assert bare == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
