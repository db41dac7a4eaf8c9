"""The layers of the package and the direction of its imports (docs/architecture.md).

    cli -> studies -> report -> search -> train -> interop -> nn -> data -> genes -> util

Every ``import`` statement counts, wherever it stands in a module (module level, inside a function,
a method, a ``try`` or an ``if``): the checks read each module's whole syntax tree with ``ast``.

* Layering: each top-level part of ``evo_attention`` imports only the parts listed for it in
  ``LOWER``, so no two parts import each other.
* Cycles: no two modules import each other, directly or through others. An import inside a function
  of module A of module B, with B importing A anywhere, is a cycle: it only waits for a call to
  bite, and it ties the two modules together as much as a module-level one.

Failures name each import as ``file:line (module level | in function())``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "evo_attention"

# part -> the parts it may import (itself always allowed)
# ``programs`` (the program language's grammar) belongs to the genes layer: genes imports it, never
# the other way round.
LOWER = {
    "util": set(),
    "programs": {"util"},
    "genes": {"util", "programs"},
    "data": {"util"},
    "nn": {"util", "genes", "programs", "data"},
    "interop": {"util", "genes", "programs", "data", "nn"},
    "train": {"util", "genes", "programs", "data", "nn", "interop"},
    "search": {"util", "genes", "programs", "data", "nn", "interop", "train"},
    "report": {"util", "genes", "programs", "data", "nn", "interop", "train", "search"},
    "studies": {"util", "genes", "programs", "data", "nn", "interop", "train", "search", "report"},
    "cli": {"util", "genes", "programs", "data", "nn", "interop", "train", "search", "report", "studies"},
    "utils": {"util", "data", "train"},  # the original project's helper module (seed API)
}
FRONT_DOOR = "__init__"  # the package root may import every part; no part imports it


@dataclass(frozen=True)
class Import:
    """One evo_attention import of a module: what it imports, on which line, from which function."""

    target: str  # a module, or the package or module a name is imported from
    line: int
    function: str = ""  # qualified name of the enclosing function; "" at module level (import time)

    @property
    def where(self) -> str:
        return f"in {self.function}()" if self.function else "module level"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _statements(node: ast.AST, qualname: str = "", function: str = ""):
    """``(import node, enclosing function)`` for every import under ``node``, at any depth."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, function
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{qualname}.{child.name}" if qualname else child.name
            yield from _statements(child, name, name)
        elif isinstance(child, ast.ClassDef):  # a class body runs at import time, its methods do not
            yield from _statements(child, f"{qualname}.{child.name}" if qualname else child.name, function)
        else:
            yield from _statements(child, qualname, function)


def imports(path: Path, root: Path = PACKAGE) -> list[Import]:
    """Every evo_attention import in ``path``, at any depth (relative ones resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node, function in _statements(tree):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, node.lineno, function) for alias in node.names]
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        # ``from evo_attention.x import y`` imports the submodule x.y when there is one, else a name of x
        submodules = [f"{target}.{alias.name}" for alias in node.names if _is_module(f"{target}.{alias.name}", root)]
        if len(submodules) < len(node.names):
            found.append(Import(target, node.lineno, function))
        found += [Import(m, node.lineno, function) for m in submodules]
    return [i for i in found if i.target == "evo_attention" or i.target.startswith("evo_attention.")]


def _is_module(name: str, root: Path = PACKAGE) -> bool:
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_of(target: str, root: Path = PACKAGE) -> str:
    """The module an import loads: ``pkg.mod`` for ``from pkg.mod import name``."""
    while target and not _is_module(target, root):
        target = target.rpartition(".")[0]
    return target


def part_of(module: str) -> str:
    parts = module.split(".")
    return FRONT_DOOR if len(parts) == 1 else parts[1]


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


def layering_violations(path: Path, root: Path = PACKAGE) -> list[str]:
    """Each import of ``path`` that points at the package root or at a part above or beside its own."""
    mine = part_of(module_name(path, root))
    if mine == FRONT_DOOR:
        return []
    found = []
    for imp in imports(path, root):
        theirs = part_of(imp.target)
        if theirs == FRONT_DOOR:
            found.append(f"{_relative(path, root)}:{imp.line} ({imp.where}) imports the package root "
                         f"({imp.target}): import the module itself")
        elif theirs != mine and theirs not in LOWER[mine]:
            found.append(f"{_relative(path, root)}:{imp.line} ({imp.where}) ({mine}) imports {imp.target} "
                         f"({theirs}), a layer above or beside it")
    return found


def import_graph(sources: list[Path], root: Path = PACKAGE) -> dict[str, dict[str, list[str]]]:
    """module -> {imported module: ["file:line (where)", ...]}, over imports at any depth."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sources:
        name = module_name(path, root)
        edges = graph.setdefault(name, {})
        for imp in imports(path, root):
            target = _module_of(imp.target, root)
            if target and target != name:
                edges.setdefault(target, []).append(f"{_relative(path, root)}:{imp.line} ({imp.where})")
    return graph


def strongly_connected(graph: dict[str, dict]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm): each one holds a cycle."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
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
                components.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def import_cycles(sources: list[Path], root: Path = PACKAGE) -> list[str]:
    """One line per import cycle: its modules, then every import between them, with where it is."""
    graph = import_graph(sources, root)
    found = []
    for component in strongly_connected(graph):
        members = set(component)
        edges = [f"{a} -> {b} at {', '.join(graph[a][b])}" for a in component for b in sorted(graph[a]) if b in members]
        found.append(f"cycle {' <-> '.join(component)}: " + "; ".join(edges))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_is_known():
    parts = {part_of(module_name(p)) for p in SOURCES} - {FRONT_DOOR}
    assert parts == set(LOWER), "add the new part to LOWER (and docs/architecture.md)"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    violations = layering_violations(path)
    assert not violations, "\n".join(violations)


def test_no_two_parts_import_each_other():
    edges = {(part_of(module_name(p)), part_of(i.target)) for p in SOURCES for i in imports(p)}
    mutual = sorted((a, b) for a, b in edges if a < b and (b, a) in edges and FRONT_DOOR not in (a, b))
    assert not mutual


def test_no_import_cycle():
    cycles = import_cycles(SOURCES)
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(cycles)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A throwaway ``evo_attention`` package holding ``files`` (relative path -> source)."""
    root = tmp_path / "evo_attention"
    for relative, text in {"__init__.py": "", **files}.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        init = path.parent / "__init__.py"
        if not init.exists():
            init.write_text("")
    return root


def test_the_checker_sees_a_violation(tmp_path):
    """The rules can fail: an upward import, relative or absolute, at any depth, is found and attributed."""
    root = _package(tmp_path, {
        "search/store.py": "",
        "util/bad.py": "from evo_attention.search.store import RunStore\nfrom ..search import store\n",
        "util/hidden.py": "class A:\n    def f(self):\n        try:\n            from evo_attention.search import store\n"
                          "        except ImportError:\n            pass\n",
    })
    found = [part_of(i.target) for i in imports(root / "util" / "bad.py", root=root)]
    assert found and set(found) == {"search"}
    assert all(p == "util" for p in (part_of(i.target) for i in imports(PACKAGE / "util" / "jsonio.py")))
    (hidden,) = layering_violations(root / "util" / "hidden.py", root)
    assert hidden.startswith("util/hidden.py:4 (in A.f())") and "evo_attention.search.store" in hidden


def test_the_checker_sees_a_cycle_through_a_function(tmp_path):
    """A imports B at module level, B imports A inside a function: a cycle, named with both places."""
    root = _package(tmp_path, {
        "data/a.py": "from evo_attention.data.b import thing\n",
        "data/b.py": "thing = 1\n\ndef late():\n    from evo_attention.data import a\n    return a\n",
        "data/c.py": "import evo_attention.data.a\n",  # imports into the cycle, not part of it
    })
    (cycle,) = import_cycles(sorted(root.rglob("*.py")), root)
    assert cycle.startswith("cycle evo_attention.data.a <-> evo_attention.data.b:")
    assert "data/a.py:1 (module level)" in cycle and "data/b.py:4 (in late())" in cycle and ".c" not in cycle


def test_the_version_is_one_number():
    import re

    import evo_attention

    pyproject = (PACKAGE.parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == evo_attention.__version__


# -- private names stay private ---------------------------------------------------------------------------
# A ``_name`` of a module is its own business: another module that imports it (``from evo_attention.x
# import _name``) or reaches it through the module (``mod._name``, ``mod`` bound by ``import
# evo_attention.x as mod`` or ``from evo_attention import x``) ties itself to what the owner may change
# freely. Make the name public in its module (or move the code that needs it there). Dunder names
# (``__version__``) are public; importing a public name under a private alias (``import x as _x``) is fine.

@dataclass(frozen=True)
class PrivateReach:
    """One use in ``file`` (relative to the package) of the private ``name`` of module ``owner``."""

    file: str
    line: int
    name: str
    owner: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} uses {self.name} of {self.owner}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _import_target(node: ast.ImportFrom, package: str) -> str:
    """The module (or package) a ``from ... import`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _module_aliases(tree: ast.AST, package: str, root: Path) -> dict[str, str]:
    """Local name -> package module, for every name an import binds to a module of the package (at any depth)."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("evo_attention"):
                    continue
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:  # ``import evo_attention.x.y`` binds ``evo_attention``
                    bound[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            target = _import_target(node, package)
            if target != "evo_attention" and not target.startswith("evo_attention."):
                continue
            for alias in node.names:
                if _is_module(f"{target}.{alias.name}", root):
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"
    return bound


def _module_named(node: ast.AST, bound: dict[str, str], root: Path) -> str | None:
    """The package module an expression such as ``mod`` or ``evo_attention.nn.components`` names."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        outer = _module_named(node.value, bound, root)
        if outer is not None and _is_module(f"{outer}.{node.attr}", root):
            return f"{outer}.{node.attr}"
    return None


def private_reaches(path: Path, root: Path = PACKAGE) -> list[PrivateReach]:
    """Each place in ``path`` that imports or reads a private name of another module of the package."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    file = _relative(path, root)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _import_target(node, package)
            if (target == "evo_attention" or target.startswith("evo_attention.")) and target != me:
                found += [PrivateReach(file, node.lineno, alias.name, target)
                          for alias in node.names if _private(alias.name)]
    bound = _module_aliases(tree, package, root)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _module_named(node.value, bound, root)
            if owner is not None and owner != me:
                found.append(PrivateReach(file, node.lineno, node.attr, owner))
    return sorted(found, key=lambda r: (r.file, r.line, r.name))


def test_no_module_reaches_into_another_modules_private_names():
    found = [reach for path in SOURCES for reach in private_reaches(path)]
    assert not found, ("private names of another module (make the name public in its module, or move the code "
                       "that needs it there):\n" + "\n".join(map(str, found)))


def test_the_checker_sees_a_private_reach(tmp_path):
    """Private imports, relative or absolute, and reads through a module alias, at any depth, are found;
    dunders, private aliases of public names and a module's own private names are not."""
    root = _package(tmp_path, {
        "nn/components.py": "_REGISTRIES = {}\nPUBLIC = 1\n__version__ = '1'\n",
        "nn/positions.py": "def _offsets():\n    pass\n",
        "nn/user.py": ("from evo_attention.nn.components import _REGISTRIES, PUBLIC as _PUBLIC, __version__\n"
                       "import evo_attention.nn.positions as pos\n"
                       "from . import components\n"
                       "import evo_attention.nn.components\n"
                       "_mine = 1\n"
                       "def f():\n"
                       "    from .positions import _offsets\n"
                       "    return pos._offsets, components._REGISTRIES, components.__name__, components.PUBLIC\n"
                       "class A:\n"
                       "    def g(self):\n"
                       "        return evo_attention.nn.components._REGISTRIES, self._x, _mine\n"),
        "nn/own.py": "from evo_attention.nn import own\n_x = 1\ny = own._x\n",
    })
    found = [(r.line, r.name, r.owner) for r in private_reaches(root / "nn" / "user.py", root)]
    assert found == [(1, "_REGISTRIES", "evo_attention.nn.components"),
                     (7, "_offsets", "evo_attention.nn.positions"),
                     (8, "_REGISTRIES", "evo_attention.nn.components"),
                     (8, "_offsets", "evo_attention.nn.positions"),
                     (11, "_REGISTRIES", "evo_attention.nn.components")]
    assert str(private_reaches(root / "nn" / "user.py", root)[0]).startswith("nn/user.py:1 uses _REGISTRIES of ")
    assert private_reaches(root / "nn" / "own.py", root) == []
