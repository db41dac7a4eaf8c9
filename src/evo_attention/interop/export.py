"""Export a gene's attention as a standalone PyTorch module that runs the library's own code.

An export directory holds:

    attention.py            the entry users import: the gene and the sizes as constants,
                            ``EvolvedAttention`` (the library's class with those as its defaults) and
                            ``layer_state`` (one layer's weights from the safetensors file)
    evo_attention_export/   the library modules the attention needs (the import closure of
                            ``nn.attention``: ``nn/attention.py``, ``nn/program.py``, ``nn/components.py``,
                            ``genes.py``, ``programs.py``, ...)
    attention.safetensors   the trained attention weights of every layer (``layers.<i>.<name>``)
    README.md               how to put it into a nanoGPT-style block

Contract:

- Nothing here holds attention logic. ``module_sources`` ships whole library modules (the import
  closure of the roots, lazy imports too), each the library's file with its ``from evo_attention...
  import`` statements made relative (same line count, every other line equal; a test compares them);
  the package ``__init__`` files are generated (docstrings only). Other exporters (a Hugging Face
  model directory) ship the ``nn`` model the same way, with other roots.
- The exported ``EvolvedAttention`` is the library's class: the library's ``state_dict()`` loads into
  it unchanged and it computes what the library computes, on the same paths. The entry loads the
  package beside it under a name private to the entry module (nothing joins ``sys.path``; several
  exports may live in one program).
- It needs PyTorch, plus any other package the shipped modules import (``third_party_imports``; the
  README names them and the functions that import them lazily, e.g. ``entmax`` for sparsemax).
- A component or program op registered by a plugin ships with the plugin's module (``check_exportable``
  finds it, ``plugin_source`` ships it as ``plugins/<module>.py``, its library imports resolved and made
  relative); the entry imports it first, so its registrations run. A plugin that cannot be shipped is a
  one-line UserError naming it and why, before anything is written.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from evo_attention import programs
from evo_attention.genes import AttentionGene, canonical_program, parse_position
from evo_attention.nn import components, program
from evo_attention.util.errors import UserError
from evo_attention.util.files import check_output, output_dir, register_output_kind, write_bytes, write_text
from evo_attention.util.version import __version__

ATTENTION_FILE = "attention.py"
WEIGHTS_FILE = "attention.safetensors"
README_FILE = "README.md"
PACKAGE = "evo_attention_export"  # the folder beside attention.py holding the library's modules
LIBRARY = "evo_attention"
ATTENTION_ROOTS = ("evo_attention.nn.attention",)  # what the attention export ships (with its imports)
PLUGINS = "plugins"  # the sub-package (flat: the name part) of the shipped plugin modules
PLUGIN_PARTS = ("util", "programs", "genes", "data", "nn")  # the library layers a shipped plugin may import


# -- shipping the library's own modules --------------------------------------------------------
def _spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _is_package(name: str) -> bool:
    spec = _spec(name)
    return spec is not None and spec.submodule_search_locations is not None


def _in_library(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] == LIBRARY


def _relative_path(name: str) -> str:
    """``evo_attention.nn.attention`` -> ``nn/attention.py``; a package -> its ``__init__.py``."""
    parts = name.split(".")[1:]
    if _is_package(name):
        parts.append("__init__")
    return "/".join(parts) + ".py"


def _absolute(node: ast.ImportFrom, name: str) -> str:
    """The absolute module a ``from`` import of module ``name`` reads (relative ones resolved)."""
    if not node.level:
        return node.module
    package = name if _is_package(name) else name.rpartition(".")[0]
    return importlib.util.resolve_name("." * node.level + (node.module or ""), package)


def _library_imports(name: str, text: str) -> set[str]:
    """The library modules that module ``name`` imports anywhere (lazily too: what ships must
    import nothing outside it). A name imported from a package's ``__init__`` cannot be shipped (the
    shipped ``__init__`` files are docstrings only), nor can an ``import evo_attention...`` statement
    be made relative: both are UserErrors naming the module and line."""
    found: set[str] = set()
    for node, _ in _import_statements(text):
        if isinstance(node, ast.Import) and any(_in_library(a.name) for a in node.names):
            raise UserError(f"{name} (line {node.lineno}) imports the library with 'import': an export ships modules "
                            f"whose library imports read 'from {LIBRARY}... import ...'; write it that way")
        if not isinstance(node, ast.ImportFrom):
            continue
        module = _absolute(node, name)
        if not _in_library(module):
            continue
        if not _is_package(module):
            found.add(module)
            continue
        for alias in node.names:
            submodule = f"{module}.{alias.name}"
            if _spec(submodule) is None:
                raise UserError(f"{name} (line {node.lineno}) imports {alias.name} from the package {module}: an "
                                "export ships no package's __init__, so import it from the module that defines it")
            found.add(submodule)
    return found


def _packages(name: str) -> list[str]:
    """The packages that hold module ``name``: ``evo_attention``, ``evo_attention.nn``, ..."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def shipped_modules(roots: Iterable[str]) -> list[str]:
    """The library modules ``roots`` need: the roots and every library module they import, directly
    or through each other (sorted; packages not included)."""
    todo, seen = list(roots), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if not _in_library(name) or _spec(name) is None or _is_package(name):
            raise UserError(f"{name!r} is not a module of {LIBRARY}: name modules such as {ATTENTION_ROOTS[0]!r}")
        seen.add(name)
        todo.extend(_library_imports(name, _library_text(name)) - seen)
    return sorted(seen)


def _library_text(name: str) -> str:
    return Path(_spec(name).origin).read_text(encoding="utf-8")


_FROM_LIBRARY = re.compile(rf"(from\s+){LIBRARY}(?:\.|(?=\s))")
_FROM_MODULE = re.compile(rf"(from\s+){LIBRARY}(?:\.\w+)*(?=\s)")


def flat_name(name: str) -> str:
    """The name of library module ``name`` in a flat layout (``module_sources(..., flat=True)``):
    ``evo_attention.nn.attention`` -> ``evo_attention_nn_attention``."""
    return name.replace(".", "_")


def _column(line: str, offset: int) -> int:
    return len(line.encode("utf-8")[:offset].decode("utf-8"))  # ast counts bytes


def relative_imports(name: str, text: str, *, flat: bool = False) -> str:
    """``text`` (the source of library module ``name``) with each ``from evo_attention...`` statement
    (found by parsing) made relative: in ``evo_attention.nn.attention``, ``from evo_attention.nn.dropout
    import`` becomes ``from ..nn.dropout import``. ``flat``: every module lies in one folder under its
    ``flat_name`` (``from .evo_attention_nn_dropout import dropout``; modules imported from a package
    as ``from . import evo_attention_nn_components as components``, which must then be on one line)."""
    dots = "." * name.count(".")  # from the module's package up to the library's root
    lines = text.splitlines(keepends=True)
    nodes = []
    for node, _ in _import_statements(text):
        if not isinstance(node, ast.ImportFrom):
            continue
        if flat and node.level and _in_library(_absolute(node, name)):
            raise UserError(f"{name} line {node.lineno}: a relative import cannot be shipped in a flat layout; write "
                            f"it as 'from {LIBRARY}.<module> import <names>'")
        if not node.level and _in_library(node.module):
            nodes.append(node)
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset), reverse=True):  # right to left
        line = lines[node.lineno - 1]
        column = _column(line, node.col_offset)
        if flat and _is_package(node.module):  # modules imported from a package: name each one
            if node.end_lineno != node.lineno:
                raise UserError(f"{name} line {node.lineno}: cannot ship this import in a flat layout; write it on "
                                f"one line as 'from {node.module} import <modules>'")
            names = ", ".join(f"{flat_name(f'{node.module}.{a.name}')} as {a.asname or a.name}" for a in node.names)
            end = _column(line, node.end_col_offset)
            lines[node.lineno - 1] = line[:column] + f"from . import {names}" + line[end:]
            continue
        match = (_FROM_MODULE if flat else _FROM_LIBRARY).match(line, column)
        if match is None:
            raise UserError(f"{name} line {node.lineno}: cannot make the import relative; write it on one line as "
                            f"'from {LIBRARY}.<module> import <names>'")
        target = "." + flat_name(node.module) if flat else dots
        lines[node.lineno - 1] = line[:column] + match.group(1) + target + line[match.end():]
    return "".join(lines)


def _package_init(package: str) -> str:
    if package == LIBRARY:
        return (f'"""Modules of {LIBRARY} {__version__}, shipped by `evo-attention export`: each is the library\'s\n'
                f"own file, with its imports of the library made relative. Nothing is imported here.\n\"\"\"\n")
    return f'"""{package.partition(".")[2]}: modules of {LIBRARY} {__version__} (see the package\'s docstring)."""\n'


def module_sources(roots: Iterable[str], *, flat: bool = False, plugins: Iterable[str] = ()) -> dict[str, str]:
    """{path inside the package: text} of ``roots`` and every library module they import, with
    ``relative_imports`` applied (``nn/attention.py``, ``genes.py``, ...), and a generated ``__init__.py``
    for each package on the way. ``flat``: every module as ``flat_name(module) + ".py"`` in one folder,
    no ``__init__.py`` (for loaders that copy only the files beside an entry module: Hugging Face's
    remote code). ``plugins`` (``check_exportable`` names them) ship beside the library's modules, with
    the modules they import (``plugin_source``): ``plugins/<name>.py``, flat ``evo_attention_plugins_<name>.py``."""
    shipped_plugins = [plugin_source(name, flat=flat) for name in dict.fromkeys(plugins)]
    modules = sorted(set(shipped_modules(roots)).union(*(p.modules for p in shipped_plugins)))
    if flat:
        sources = {f"{flat_name(name)}.py": relative_imports(name, _library_text(name), flat=True) for name in modules}
        sources.update({p.path: p.text for p in shipped_plugins})
        if len(sources) != len(modules) + len(shipped_plugins):
            raise UserError(f"two of the modules {', '.join(modules + [p.module for p in shipped_plugins])} have the "
                            "same flat name: rename one")
        return dict(sorted(sources.items()))
    sources = {_relative_path(p): _package_init(p) for name in modules for p in _packages(name)}
    for name in modules:
        sources[_relative_path(name)] = relative_imports(name, _library_text(name))
    if shipped_plugins:
        sources[f"{PLUGINS}/__init__.py"] = (f'"""{PLUGINS}: the plugin modules whose ops and components the exported '
                                             'genes use, their imports of the library made relative."""\n')
        if len({p.path for p in shipped_plugins}) != len(shipped_plugins):
            raise UserError(f"two of the plugins {', '.join(p.module for p in shipped_plugins)} have the same shipped "
                            "name: rename one")
        sources.update({p.path: p.text for p in shipped_plugins})
    return dict(sorted(sources.items()))


# -- shipping a plugin's module ------------------------------------------------------------------
@dataclass(frozen=True)
class ShippedPlugin:
    """A plugin module as an export ships it: ``name`` (what the entry imports, relative to the shipped
    package: ``plugins.my_plugin``; flat: ``evo_attention_plugins_my_plugin``), ``path`` and ``text``
    (its source, its library imports rewritten), ``modules`` (the library modules it needs)."""

    module: str
    name: str
    path: str
    text: str
    modules: frozenset


def _plugin_error(module: str, why: str, used_for: str = "") -> UserError:
    return UserError(f"plugin {module}{f' ({used_for})' if used_for else ''} cannot be exported: {why}")


def _defined_in(package: str, name: str) -> tuple[str, str] | None:
    """``(module or package, name)`` that ``from <package> import <name>`` reads in the end: a module
    of the package, or where the package's ``__init__`` imports the name from (followed through
    packages, or its ``_HOMES`` table of names imported when first used); None for a name the
    ``__init__`` defines itself (or imports from outside the library)."""
    if _spec(f"{package}.{name}") is not None:  # a module of the package
        return package, name
    imported = ((_absolute(node, package), alias.name) for node, _ in _import_statements(_library_text(package))
                if isinstance(node, ast.ImportFrom) for alias in node.names if (alias.asname or alias.name) == name)
    source, name = next(imported, (None, name))
    if source is None:
        source = getattr(importlib.import_module(package), "_HOMES", {}).get(name)  # a front door that imports lazily
    if source is None or not _in_library(source):
        return None
    return _defined_in(source, name) if _is_package(source) else (source, name)


def _plugin_imports(module: str, text: str, used_for: str = "") -> tuple[str, set[str]]:
    """``text`` (the source of plugin ``module``) with each ``from evo_attention... import`` statement
    importing from the modules that define the names (a name from a package's ``__init__``, such as
    ``from evo_attention import register_op``, from ``evo_attention.nn.program``), on one line (the
    line count kept), and the library modules it imports. UserError naming the plugin when an import
    cannot be shipped."""
    def refuse(why):
        return _plugin_error(module, why, used_for)

    lines = text.splitlines(keepends=True)
    edits, imported = [], set()
    for node, _ in _import_statements(text):
        if isinstance(node, ast.Import) and any(_in_library(a.name) for a in node.names):
            raise refuse(f"line {node.lineno} imports the library with 'import': write 'from {LIBRARY}... import ...'")
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            raise refuse(f"line {node.lineno} is a relative import, and an export ships the plugin's module alone")
        if not _in_library(node.module):
            continue
        if _spec(node.module) is None:
            raise refuse(f"line {node.lineno} imports {node.module}, which is no module of this version of {LIBRARY}")
        names: dict[str, list[str]] = {}
        for alias in node.names:
            found = _defined_in(node.module, alias.name) if _is_package(node.module) else (node.module, alias.name)
            if found is None:
                raise refuse(f"line {node.lineno} imports {alias.name} from {node.module}, whose __init__ defines it, "
                             f"and an export ships no package's __init__: import it from the module that defines it")
            target, name = found
            needed = f"{target}.{name}" if _is_package(target) else target
            part = needed.split(".")[1]
            if part not in PLUGIN_PARTS:
                resolved = _is_package(node.module) and not needed.endswith(f".{alias.name}")  # (through an __init__)
                shown = f"{alias.name} from {needed}" if resolved else needed
                raise refuse(f"line {node.lineno} imports {shown}, of the library's {part} layer, and an export ships "
                             f"only the layers a model is made of ({', '.join(PLUGIN_PARTS)})")
            imported.add(needed)
            names.setdefault(target, []).append(name if (alias.asname or name) == name else f"{name} as {alias.asname}")
        edits.append((node, "; ".join(f"from {target} import {', '.join(n)}" for target, n in names.items())))
    for node, statement in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):  # right to left
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        joined = first[:_column(first, node.col_offset)] + statement + last[_column(last, node.end_col_offset):]
        lines[node.lineno - 1:node.end_lineno] = [joined] + ["\n"] * (node.end_lineno - node.lineno)
    return "".join(lines), imported


def plugin_source(module: str, *, flat: bool = False, used_for: str = "") -> ShippedPlugin:
    """Plugin ``module`` (imported, a ``.py`` file) as an export ships it: its source with its library
    imports resolved (``_plugin_imports``) and made relative as if it were ``evo_attention.plugins.<name>``,
    and the library modules it needs (their import closure). A plugin that cannot be shipped (the script
    that runs, not imported, no ``.py`` file, an import ``_plugin_imports`` refuses) is a UserError naming
    it and why; ``used_for`` (e.g. ``program op 'hgate' of gene ...``) joins the message."""
    loaded = sys.modules.get(module)
    path = getattr(loaded, "__file__", None)
    if module == "__main__":
        raise _plugin_error(module, "it is the script that runs, not a module an export can ship: move the "
                            "registration into a plugin file", used_for)
    if loaded is None:
        raise _plugin_error(module, "it is not imported", used_for)
    if not path or not str(path).endswith(".py") or not Path(path).is_file():
        raise _plugin_error(module, f"it is not a .py file ({path or 'no file'}), and an export ships a plugin's "
                            "source", used_for)
    try:
        text, imported = _plugin_imports(module, Path(path).read_text(encoding="utf-8"), used_for)
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise _plugin_error(module, f"its file {path} cannot be read ({type(exc).__name__})", used_for) from None
    name = re.sub(r"\W", "_", module.replace(".", "_"))
    virtual = f"{LIBRARY}.{PLUGINS}.{name}"  # where it lies in the shipped package
    try:
        needed = shipped_modules(imported)
        text = relative_imports(virtual, text, flat=flat)
    except UserError as exc:
        raise _plugin_error(module, str(exc), used_for) from None
    shipped = flat_name(virtual) if flat else f"{PLUGINS}.{name}"
    return ShippedPlugin(module, shipped, shipped.replace(".", "/") + ".py", text, frozenset(needed))


@functools.lru_cache(maxsize=1024)
def _import_statements(text: str) -> tuple[tuple[ast.Import | ast.ImportFrom, str], ...]:
    """Every import statement of source ``text``, in ``ast.walk`` order, with the name of the innermost
    function around it ("" at a module's top level). Parsed once per text: an export reads the same
    library files many times, and a process may export many models."""
    tree = ast.parse(text)
    scopes = {id(node): scope for node, scope in _imports_by_scope(tree)}
    return tuple((node, scopes[id(node)]) for node in ast.walk(tree) if id(node) in scopes)


def _imports_by_scope(tree: ast.AST, scope: str = ""):
    """(import node, name of the innermost function around it, "" at a module's top level)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, scope
        inner = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope
        yield from _imports_by_scope(node, inner)


def third_party_imports(sources: Mapping[str, str]) -> dict[str, dict[str, set[str]]]:
    """The packages outside the standard library that ``sources`` ({path: text}) import:
    {package: {path: names of the functions importing it when they run, "" for a top-level import}}."""
    found: dict[str, dict[str, set[str]]] = {}
    for path, text in sources.items():
        for node, scope in _import_statements(text):
            if isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module]
            else:
                names = [a.name for a in node.names]
            for top in {n.split(".")[0] for n in names}:
                if top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, {}).setdefault(path, set()).add(scope)
    return dict(sorted(found.items()))


def requirements(sources: Mapping[str, str]) -> list[str]:
    """The packages ``sources`` need, in words: ``torch``, ``entmax (imported when sparsemax_norm,
    entmax15_norm in nn/components.py run)``."""
    always, lazily = [], []
    for package, where in third_party_imports(sources).items():
        if any("" in scopes for scopes in where.values()):
            always.append(f"`{package}`")
        else:
            places = "; ".join(f"{', '.join(f'`{s}`' for s in sorted(scopes))} in `{path}`"
                               for path, scopes in sorted(where.items()))
            lazily.append(f"`{package}` (imported only when {places} run)")
    return always + lazily


# -- what can be exported ----------------------------------------------------------------------
def _uses(gene: AttentionGene):
    """(what, the objects that implement it) for each component and registered op ``gene`` uses."""
    for field in ("similarity", "normalization", "gating", "temperature_mode"):  # a gene's component fields
        option = getattr(gene, field)
        yield f"{field} {option!r}", [components.factory(field, option)]
    if gene.program is None:
        return
    for node in canonical_program(gene.program).ops():
        prefix, dot, name = node.op.partition(".")
        if dot and prefix in programs.COMPONENT_PREFIXES:
            field = programs.COMPONENT_PREFIXES[prefix]
            yield f"{field} {name!r}", [components.factory(field, name)]  # None: the engine's own (w.none)
        elif node.op not in programs.STRUCTURAL:  # registered with register_op
            impl = program.IMPLEMENTATIONS.get(node.op)
            yield f"program op {node.op!r}", [impl.apply, impl.build, programs.OPS[node.op].fold] if impl else []


def check_exportable(genes: AttentionGene | Iterable[AttentionGene]) -> list[str]:
    """The plugin modules an export of ``genes`` ships (sorted): the modules outside the library that
    define a component (its registered class or function) or a registered op (its ``apply``,
    ``build`` or ``fold``) the genes use. UserError, one line naming the plugin and why, when one
    cannot be shipped (``plugin_source``), or naming the option when its module is not found."""
    genes = [genes] if isinstance(genes, AttentionGene) else list(genes)
    shipped = shipped_modules(ATTENTION_ROOTS)
    plugins: dict[str, str] = {}
    for gene in dict.fromkeys(genes):
        for what, objects in _uses(gene):
            modules = {m for m in (getattr(o, "__module__", None) for o in objects if o is not None)
                       if m and m.split(".")[0] not in sys.stdlib_module_names}  # (e.g. fold=math.tanh: everywhere)
            outside = sorted(m for m in modules if not _in_library(m))
            for module in sorted(modules - set(outside)):
                if module not in shipped:
                    raise UserError(f"gene {gene.key}: {what} cannot be exported: it is defined in {module}, which an "
                                    "export does not ship")
            if not outside and what.startswith("program op"):
                raise UserError(f"gene {gene.key}: {what} cannot be exported: its apply and build are the library's, so "
                                "the plugin that registers it is unknown; give register_op an apply defined in the plugin")
            for module in outside:
                plugins.setdefault(module, f"{what} of gene {gene.key}")
    for module, used_for in plugins.items():
        plugin_source(module, used_for=used_for)  # checked before anything is written
    return sorted(plugins)


# -- the export's files ------------------------------------------------------------------------
_POSITION_NOTES = {
    "learned": "The gene reads word order from learned absolute position embeddings added to the token "
               "embeddings at the model's input (as nanoGPT's wpe); the attention itself uses none.",
    "none": "The gene uses no position signal at all: drop the model's position embedding (wpe).",
    "rope": "Word order comes from rotary embeddings inside the attention: drop the model's position "
            "embedding (wpe).",
    "alibi": "Word order comes from ALiBi biases inside the attention: drop the model's position embedding (wpe).",
}

_ABOUT = ("Made by `evo-attention export`{source}. The code that runs is evo-attention's own: its modules lie "
          "in `{package}/` beside this file (the library's files, their package imports made relative); this "
          "file only fixes the gene and the sizes. Input and output are [B, T, d_model], as nanoGPT's "
          "CausalSelfAttention; the module is causal. {position_note}\n\nNeeds {needs}.")

# The entries' loader of the package beside them, then of the plugins it ships (PLUGINS, set above it): an
# entry's template fills it in as {loader}.
PACKAGE_LOADER = '''def _import_package():
    """The package beside this file, imported under a name private to this module: nothing joins
    sys.path, and two exports in one program do not share it."""
    name = "_" + __name__.replace(".", "_") + "_" + PACKAGE
    if name not in sys.modules:
        init = Path(__file__).resolve().with_name(PACKAGE) / "__init__.py"
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return name

for _plugin in PLUGINS:  # imported first: their registrations run before any attention is built
    importlib.import_module(_import_package() + "." + _plugin)
'''

_ENTRY = '''"""{gene}: an attention mechanism found by evo-attention, as a standalone PyTorch module.

{about}

    from safetensors.torch import load_file
    attn = EvolvedAttention()                                  # d_model={d_model}, n_heads={n_heads}, max_seq_len={max_seq_len}
    attn.load_state_dict(layer_state(load_file("{weights}"), 0))   # the trained weights of layer 0
"""

import importlib
import importlib.util
import sys
from pathlib import Path

GENE = "{gene}"
D_MODEL, N_HEADS, MAX_SEQ_LEN = {d_model}, {n_heads}, {max_seq_len}
KERNEL_FEATURES = {kernel_features}  # random features per head (normalization favor only)
INPUT_CONV = {input_conv}  # the model's short convolution before each attention (0: none)
PACKAGE = "{package}"  # the library's modules, beside this file
PLUGINS = {plugins!r}  # the plugin modules whose ops and components GENE uses (in PACKAGE)


{loader}
_attention = importlib.import_module(_import_package() + ".nn.attention")


class EvolvedAttention(_attention.EvolvedAttention):
    """The library's EvolvedAttention of GENE, with this export's sizes as its defaults."""

    def __init__(self, d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=MAX_SEQ_LEN, *, fused=True,
                 kernel_features=KERNEL_FEATURES, input_conv=INPUT_CONV):
        super().__init__(d_model, n_heads, GENE, fused=fused, max_seq_len=max_seq_len,
                         kernel_features=kernel_features, input_conv=input_conv)


def layer_state(state, layer):
    """The weights of one layer from {weights} (keys "layers.<i>.<name>")."""
    prefix = f"layers.{{layer}}."
    return {{key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}}
'''


def _shipped(plugins: Iterable[str] = ()) -> dict[str, str]:
    """The library's modules (and ``plugins``) as they lie in an export: {``evo_attention_export/<path>``: text}."""
    return {f"{PACKAGE}/{path}": text for path, text in module_sources(ATTENTION_ROOTS, plugins=plugins).items()}


def plugin_names(plugins: Iterable[str], *, flat: bool = False) -> list[str]:
    """What an export's entry imports for each plugin module, relative to the shipped package."""
    return [plugin_source(module, flat=flat).name for module in plugins]


def attention_source(gene: AttentionGene | str, d_model: int, n_heads: int, max_seq_len: int, *,
                     source: str = "", kernel_features: int = 64, input_conv: int = 0) -> str:
    """The entry ``attention.py`` of ``gene`` at these sizes (see the module docstring)."""
    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    plugins = check_exportable(gene)
    about = _ABOUT.format(source=f" from {source}" if source else "", package=PACKAGE,
                          position_note=_POSITION_NOTES[parse_position(gene.position).kind],
                          needs=", ".join(requirements(_shipped(plugins))))
    about = "\n\n".join(textwrap.fill(paragraph, 100, break_on_hyphens=False) for paragraph in about.split("\n\n"))
    return _ENTRY.format(loader=PACKAGE_LOADER, gene=gene.key, about=about, package=PACKAGE, d_model=d_model,
                         n_heads=n_heads, plugins=tuple(plugin_names(plugins)),
                         max_seq_len=max_seq_len, weights=WEIGHTS_FILE, kernel_features=kernel_features,
                         input_conv=input_conv)


def export_sources(gene: AttentionGene | str, d_model: int, n_heads: int, max_seq_len: int, *,
                   source: str = "", kernel_features: int = 64, input_conv: int = 0) -> dict[str, str]:
    """Every source file of the export: {path in the export directory: text}, the entry
    ``attention.py`` and the library's modules (and the gene's plugins) under ``evo_attention_export/``."""
    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    entry = attention_source(gene, d_model, n_heads, max_seq_len, source=source, kernel_features=kernel_features,
                             input_conv=input_conv)
    return {ATTENTION_FILE: entry, **_shipped(check_exportable(gene))}


def _readme(gene: AttentionGene, d_model: int, n_heads: int, max_seq_len: int, n_layers: int, source: str) -> str:
    kind = parse_position(gene.position).kind
    wpe = ("keep `wpe`: this gene relies on learned absolute positions at the input" if kind == "learned"
           else "remove `wpe` (and its addition in `GPT.forward`): the attention brings its own position signal"
           if kind in ("rope", "alibi") else "remove `wpe`: this gene uses no positions")
    shipped = _shipped(check_exportable(gene))
    needs = "\n".join(f"- {need}" for need in requirements(shipped))
    modules = ", ".join(f"`{path.partition('/')[2]}`" for path in shipped if not path.endswith("__init__.py"))
    return f"""# Exported attention: `{gene.key}`

{f"From {source}. " if source else ""}The module maps [B, T, {d_model}] to [B, T, {d_model}] with {n_heads} heads and
sees at most {max_seq_len} positions.

| file | what |
| --- | --- |
| `{ATTENTION_FILE}` | what you import: `EvolvedAttention` (this gene, these sizes as defaults) and `layer_state` |
| `{PACKAGE}/` | evo-attention {__version__}'s own modules that run it ({modules}): the library's files with their package imports made relative (a plugin's module under `{PLUGINS}/`, its imports of the library made relative the same way) |
| `{WEIGHTS_FILE}` | the trained weights of all {n_layers} layer(s) (keys `layers.<i>.<name>`, read with `safetensors`) |

Keep `{ATTENTION_FILE}` and `{PACKAGE}/` side by side: `{ATTENTION_FILE}` loads the folder beside it
itself (the folder need not be on `sys.path`). It needs:

{needs}

`EvolvedAttention` is the library's class, so it computes what the library computes (PyTorch's
fused attention kernel where the library uses it) and offers the library's cached decoding
(`new_cache()`, `decode(x, cache)`).

## In a nanoGPT-style block

```python
import torch.nn as nn
from safetensors.torch import load_file

from attention import EvolvedAttention, layer_state


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = EvolvedAttention(config.n_embd, config.n_head, config.block_size)  # was CausalSelfAttention
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


weights = load_file("{WEIGHTS_FILE}")
for i, block in enumerate(model.transformer.h):  # the trained attention weights, layer by layer
    block.attn.load_state_dict(layer_state(weights, i))
```

Positions: {wpe}. To train from scratch instead, skip the `load_state_dict` lines.
"""


def is_attention_export(directory: str | Path) -> bool:
    """Whether ``directory`` holds an export of this format (its ``attention.py`` beside its package)."""
    return (Path(directory) / ATTENTION_FILE).is_file() and (Path(directory) / PACKAGE).is_dir()


register_output_kind("an attention export", is_attention_export)


def export_attention(model, out: str | Path, *, source: str = "") -> dict:
    """Write ``attention.py``, the library's modules it runs (``evo_attention_export/``),
    ``attention.safetensors`` (every layer's attention weights) and ``README.md`` for ``model`` (a
    ``TinyTransformer`` whose layers share one gene) into ``out``. Everything is checked and built
    before anything is written. Returns ``{"gene", "files": [the top-level paths], "layers"}``."""
    genes = {g.key for g in model.genes}
    if len(genes) != 1:
        raise UserError(f"the model's layers use {len(genes)} different genes: export writes one attention module, "
                        "so export a model whose layers share a gene")
    gene = model.genes[0]
    spec = model.spec
    texts = export_sources(gene, spec.d_model, spec.n_heads, spec.max_seq_len, source=source,
                           kernel_features=spec.favor_features, input_conv=spec.short_conv)
    from safetensors.torch import save

    state = {f"layers.{i}.{name}": tensor.detach().cpu().contiguous()
             for i, block in enumerate(model.blocks) for name, tensor in block.attn.state_dict().items()}
    weights = save(state, metadata={"gene": gene.key, "layers": str(len(model.blocks))})
    readme = _readme(gene, spec.d_model, spec.n_heads, spec.max_seq_len, len(model.blocks), source)
    out = output_dir(check_output(out, kind="an attention export", own=is_attention_export,
                                  writes=(ATTENTION_FILE, PACKAGE, WEIGHTS_FILE, README_FILE)))
    for path, text in texts.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        write_text(out / path, text)
    paths = [out / ATTENTION_FILE, out / PACKAGE, write_bytes(out / WEIGHTS_FILE, weights),
             write_text(out / README_FILE, readme)]
    return {"gene": gene.key, "files": [str(p) for p in paths], "layers": len(model.blocks)}
