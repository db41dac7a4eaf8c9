"""The layers of the package and the direction of its imports (docs/architecture.md).

    cli -> studies -> report -> search -> train -> nn -> data -> genes -> util

Each top-level part of ``evo_attention`` may import only the parts listed for it below (any
import, also one inside a function), so no two parts import each other; and no module-level import
cycle exists between any two modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "evo_attention"

# part -> the parts it may import (itself always allowed)
LOWER = {
    "util": set(),
    "genes": {"util"},
    "data": {"util"},
    "nn": {"util", "genes", "data"},
    "train": {"util", "genes", "data", "nn"},
    "search": {"util", "genes", "data", "nn", "train"},
    "report": {"util", "genes", "data", "nn", "train", "search"},
    "studies": {"util", "genes", "data", "nn", "train", "search", "report"},
    "cli": {"util", "genes", "data", "nn", "train", "search", "report", "studies"},
    "utils": {"util", "data", "train"},  # the original project's helper module (seed API)
}
FRONT_DOOR = "__init__"  # the package root may import every part; no part imports it


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path, top_level_only: bool = False, root: Path = PACKAGE) -> list[tuple[str, int]]:
    """``(imported module, line)`` of every evo_attention import in ``path`` (relative ones resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from evo_attention.x import y`` imports the submodule x.y when there is one, else a name of x
            submodules = [f"{target}.{alias.name}" for alias in node.names if _is_module(f"{target}.{alias.name}", root)]
            if len(submodules) < len(node.names):
                found.append((target, node.lineno))
            found += [(m, node.lineno) for m in submodules]
    return [(t, line) for t, line in found if t == "evo_attention" or t.startswith("evo_attention.")]


def _is_module(name: str, root: Path = PACKAGE) -> bool:
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def part_of(module: str) -> str:
    parts = module.split(".")
    return FRONT_DOOR if len(parts) == 1 else parts[1]


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_is_known():
    parts = {part_of(module_name(p)) for p in SOURCES} - {FRONT_DOOR}
    assert parts == set(LOWER), "add the new part to LOWER (and docs/architecture.md)"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    mine = part_of(module_name(path))
    if mine == FRONT_DOOR:
        return
    for target, line in imports(path):
        theirs = part_of(target)
        assert theirs != FRONT_DOOR, f"{path.name}:{line} imports the package root ({target}): import the module itself"
        assert theirs == mine or theirs in LOWER[mine], (
            f"{path.relative_to(PACKAGE)}:{line} ({mine}) imports {target} ({theirs}), a layer above or beside it")


def test_no_two_parts_import_each_other():
    edges = {(part_of(module_name(p)), part_of(t)) for p in SOURCES for t, _ in imports(p)}
    mutual = sorted((a, b) for a, b in edges if a < b and (b, a) in edges and FRONT_DOOR not in (a, b))
    assert not mutual


def test_no_module_level_import_cycle():
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        name = module_name(path)
        graph[name] = set()
        for target, _ in imports(path, top_level_only=True):
            while target and not _is_module(target):  # ``from pkg.mod import name``: the module is pkg.mod
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    # Tarjan's strongly connected components: any with more than one module is a cycle
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"module-level import cycles: {cycles}"


def test_the_checker_sees_a_violation(tmp_path):
    """The rules can fail: an upward import, relative or absolute, is found and attributed."""
    root = tmp_path / "evo_attention"
    (root / "util").mkdir(parents=True)
    (root / "search").mkdir()
    for init in (root / "__init__.py", root / "util" / "__init__.py", root / "search" / "__init__.py"):
        init.write_text("")
    (root / "search" / "store.py").write_text("")
    bad = root / "util" / "bad.py"
    bad.write_text("from evo_attention.search.store import RunStore\nfrom ..search import store\n")
    found = [part_of(t) for t, _ in imports(bad, root=root)]
    assert found and set(found) == {"search"}
    assert all(p == "util" for p in (part_of(t) for t, _ in imports(PACKAGE / "util" / "jsonio.py")))


def test_the_version_is_one_number():
    import re

    import evo_attention

    pyproject = (PACKAGE.parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == evo_attention.__version__
