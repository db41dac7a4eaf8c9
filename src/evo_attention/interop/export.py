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

- Nothing here holds attention logic. ``module_sources`` ships whole library modules: each file is
  the library's file with one mechanical change, its ``from evo_attention... import`` statements
  made relative (same line count, every other line equal; a test compares them). It follows every
  package-internal import of the roots, lazy ones too, so what it ships imports nothing outside it;
  the package ``__init__`` files are generated (docstrings only: the library's front door imports
  every layer). Another exporter (e.g. a Hugging Face model directory) can ship the whole ``nn``
  model the same way, with other roots.
- The exported ``EvolvedAttention`` is the library's class, so ``EvolvedAttention.state_dict()``
  loads into it unchanged and it computes what the library computes, on the same paths (PyTorch's
  fused kernel where ``can_fuse``; ``decode`` with a cache too). The entry loads the package beside
  it under a name private to the entry module: nothing is added to ``sys.path``, and it works
  however ``attention.py`` is imported, also for several exports in one program.
- It needs PyTorch, plus any other package the shipped modules import (``third_party_imports``;
  the README names them and the functions that import them lazily, e.g. ``entmax`` for sparsemax).
- A component registered from outside the shipped modules (a plugin's) cannot be exported: its
  source may import anything. ``check_exportable`` refuses it with a line naming the option,
  before anything is written.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import textwrap
from pathlib import Path
from typing import Iterable, Mapping

from evo_attention.genes import AttentionGene, parse_position
from evo_attention.nn import components
from evo_attention.util.errors import UserError
from evo_attention.util.files import check_output, output_dir, write_bytes, write_text
from evo_attention.util.version import __version__

ATTENTION_FILE = "attention.py"
WEIGHTS_FILE = "attention.safetensors"
README_FILE = "README.md"
PACKAGE = "evo_attention_export"  # the folder beside attention.py holding the library's modules
LIBRARY = "evo_attention"
ATTENTION_ROOTS = ("evo_attention.nn.attention",)  # what the attention export ships (with its imports)

# the registries a gene's categorical fields pick from
_REGISTRIES = {"similarity": components.SIMILARITIES, "normalization": components.NORMALIZATIONS,
               "gating": components.GATINGS, "temperature_mode": components.TEMPERATURES}


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


def _library_imports(name: str, tree: ast.Module) -> set[str]:
    """The library modules that module ``name`` imports anywhere (lazily too: what ships must
    import nothing outside it). A name imported from a package's ``__init__`` cannot be shipped (the
    shipped ``__init__`` files are docstrings only), nor can an ``import evo_attention...`` statement
    be made relative: both are UserErrors naming the module and line."""
    found: set[str] = set()
    for node in ast.walk(tree):
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
        todo.extend(_library_imports(name, ast.parse(_library_text(name))) - seen)
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
    made relative: in ``evo_attention.nn.attention``, ``from evo_attention.nn.dropout import`` becomes
    ``from ..nn.dropout import`` and ``from evo_attention import genes`` ``from .. import genes``.
    Only those statements change (found by parsing, so a docstring's example stays as it is).

    ``flat``: every module lies in one folder under its ``flat_name``, so ``from evo_attention.nn.dropout
    import dropout`` becomes ``from .evo_attention_nn_dropout import dropout`` and ``from evo_attention.nn
    import components`` ``from . import evo_attention_nn_components as components`` (a statement that
    imports modules from a package must then be on one line)."""
    dots = "." * name.count(".")  # from the module's package up to the library's root
    lines = text.splitlines(keepends=True)
    nodes = []
    for node in ast.walk(ast.parse(text)):
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


def module_sources(roots: Iterable[str], *, flat: bool = False) -> dict[str, str]:
    """The library's own source of ``roots`` and of every library module they import, ready to
    ship as one package: {path inside the package: text}, e.g. ``nn/attention.py``, ``genes.py``,
    and a generated ``__init__.py`` for each package on the way (``__init__.py``, ``nn/__init__.py``).
    Each module's text is the library's with ``relative_imports`` applied.

    ``flat``: every module as one file of a single folder, named ``flat_name(module) + ".py"``
    (``evo_attention_nn_attention.py``), and no ``__init__.py``: for loaders that copy only the files
    beside an entry module, such as Hugging Face's remote code (``interop/hf.py``)."""
    modules = shipped_modules(roots)
    if flat:
        sources = {f"{flat_name(name)}.py": relative_imports(name, _library_text(name), flat=True) for name in modules}
        if len(sources) != len(modules):
            raise UserError(f"two of the modules {', '.join(modules)} have the same flat name: rename one")
        return dict(sorted(sources.items()))
    sources = {_relative_path(p): _package_init(p) for name in modules for p in _packages(name)}
    for name in modules:
        sources[_relative_path(name)] = relative_imports(name, _library_text(name))
    return dict(sorted(sources.items()))


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
        for node, scope in _imports_by_scope(ast.parse(text)):
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
def check_exportable(gene: AttentionGene) -> None:
    """UserError naming the first option of ``gene`` whose component is defined outside the modules
    an export ships (a plugin's component: the export cannot ship its module)."""
    shipped = shipped_modules(ATTENTION_ROOTS)
    for field, registry in _REGISTRIES.items():
        option = getattr(gene, field)
        module = getattr(registry.get(option), "__module__", None)
        if module not in shipped:
            raise UserError(f"gene {gene.key}: {field} {option!r} cannot be exported: it is defined in {module}, and "
                            f"an export ships only the library's own modules; export a gene with a built-in {field}, "
                            f"or add {option!r} to {LIBRARY}/nn/components.py")


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

# The entries' loader of the package beside them (an entry's template fills it in as {loader}).
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


def _shipped() -> dict[str, str]:
    """The library's modules as they lie in an export: {``evo_attention_export/<path>``: text}."""
    return {f"{PACKAGE}/{path}": text for path, text in module_sources(ATTENTION_ROOTS).items()}


def attention_source(gene: AttentionGene | str, d_model: int, n_heads: int, max_seq_len: int, *,
                     source: str = "", kernel_features: int = 64, input_conv: int = 0) -> str:
    """The entry ``attention.py`` of ``gene`` at these sizes (see the module docstring)."""
    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    check_exportable(gene)
    about = _ABOUT.format(source=f" from {source}" if source else "", package=PACKAGE,
                          position_note=_POSITION_NOTES[parse_position(gene.position).kind],
                          needs=", ".join(requirements(_shipped())))
    about = "\n\n".join(textwrap.fill(paragraph, 100, break_on_hyphens=False) for paragraph in about.split("\n\n"))
    return _ENTRY.format(loader=PACKAGE_LOADER, gene=gene.key, about=about, package=PACKAGE, d_model=d_model,
                         n_heads=n_heads,
                         max_seq_len=max_seq_len, weights=WEIGHTS_FILE, kernel_features=kernel_features,
                         input_conv=input_conv)


def export_sources(gene: AttentionGene | str, d_model: int, n_heads: int, max_seq_len: int, *,
                   source: str = "", kernel_features: int = 64, input_conv: int = 0) -> dict[str, str]:
    """Every source file of the export: {path in the export directory: text}, the entry
    ``attention.py`` and the library's modules under ``evo_attention_export/``."""
    entry = attention_source(gene, d_model, n_heads, max_seq_len, source=source, kernel_features=kernel_features,
                             input_conv=input_conv)
    return {ATTENTION_FILE: entry, **_shipped()}


def _readme(gene: AttentionGene, d_model: int, n_heads: int, max_seq_len: int, n_layers: int, source: str) -> str:
    kind = parse_position(gene.position).kind
    wpe = ("keep `wpe`: this gene relies on learned absolute positions at the input" if kind == "learned"
           else "remove `wpe` (and its addition in `GPT.forward`): the attention brings its own position signal"
           if kind in ("rope", "alibi") else "remove `wpe`: this gene uses no positions")
    shipped = _shipped()
    needs = "\n".join(f"- {need}" for need in requirements(shipped))
    modules = ", ".join(f"`{path.partition('/')[2]}`" for path in shipped if not path.endswith("__init__.py"))
    return f"""# Exported attention: `{gene.key}`

{f"From {source}. " if source else ""}The module maps [B, T, {d_model}] to [B, T, {d_model}] with {n_heads} heads and
sees at most {max_seq_len} positions.

| file | what |
| --- | --- |
| `{ATTENTION_FILE}` | what you import: `EvolvedAttention` (this gene, these sizes as defaults) and `layer_state` |
| `{PACKAGE}/` | evo-attention {__version__}'s own modules that run it ({modules}): the library's files with their package imports made relative |
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
    """Whether ``directory`` holds an export of this format (its ``attention.py``)."""
    return (Path(directory) / ATTENTION_FILE).is_file()


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
    out = output_dir(check_output(out, kind="an attention export", own=is_attention_export))
    for path, text in texts.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        write_text(out / path, text)
    paths = [out / ATTENTION_FILE, out / PACKAGE, write_bytes(out / WEIGHTS_FILE, weights),
             write_text(out / README_FILE, readme)]
    return {"gene": gene.key, "files": [str(p) for p in paths], "layers": len(model.blocks)}
