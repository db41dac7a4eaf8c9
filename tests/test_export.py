"""evo-attention export: the exported attention is the library's own code (its modules, shipped with
their package imports made relative) and computes what the library computes, in a fresh interpreter
where evo_attention cannot be imported, for every option of every component and axis."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import evo_attention
from evo_attention import TinyTransformer
from evo_attention.cli import main
from evo_attention.genes import CATEGORICAL_FIELDS, OPTIONS, AttentionGene
from evo_attention.interop.export import (ATTENTION_FILE, ATTENTION_ROOTS, PACKAGE, WEIGHTS_FILE, attention_source,
                                          check_exportable, export_attention, export_sources, module_sources,
                                          shipped_modules)
from evo_attention.interop.pretrained import save_pretrained
from evo_attention.nn import components
from evo_attention.nn.spec import ModelSpec
from evo_attention.util.errors import UserError

CONFIG = ModelSpec(vocab_size=30, d_model=16, n_heads=4, n_layers=2, max_seq_len=12, dropout=0.0)
LIBRARY_DIR = Path(evo_attention.__file__).parent
REGISTRIES = {"similarity": components.SIMILARITIES, "normalization": components.NORMALIZATIONS,
              "gating": components.GATINGS, "temperature_mode": components.TEMPERATURES}

# Runs with -I (no PYTHONPATH, no user site) and with evo_attention blocked even if installed.
CHECK = r'''
import importlib.abc, importlib.util, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "evo_attention":
            raise ImportError("evo_attention must not be needed")
sys.meta_path.insert(0, Block())
import torch
from safetensors.torch import load_file
result = {}
for case in json.loads(sys.argv[1]):
    spec = importlib.util.spec_from_file_location(f"exported{len(result)}", case["dir"] + "/attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weights, io = load_file(case["dir"] + "/attention.safetensors"), load_file(case["dir"] + "/io.safetensors")
    errors = []
    for layer in range(case["layers"]):
        attn = module.EvolvedAttention().double().eval()
        attn.load_state_dict(module.layer_state(weights, layer), strict=True)
        with torch.no_grad():
            errors.append(float((attn(io["x"]) - io[f"y{layer}"]).abs().max()))
            cache = attn.new_cache()  # the library's cached decoding comes along: prefill, then one by one
            steps = [attn.decode(io["x"][:, :4], cache)] + [attn.decode(io["x"][:, i:i + 1], cache)
                                                             for i in range(4, io["x"].shape[1])]
            errors.append(float((torch.cat(steps, dim=1) - io[f"y{layer}"]).abs().max()))
    result[case["gene"]] = errors
assert "evo_attention" not in sys.modules
print(json.dumps(result))
'''


def random_model(gene: str) -> TinyTransformer:
    torch.manual_seed(0)
    model = TinyTransformer(CONFIG, gene).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


def _imports(tree: ast.AST, top_level_only: bool) -> set:
    """The absolute modules a parsed file imports (at its top level only, or anywhere)."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
    return found | {n.module for n in nodes if isinstance(n, ast.ImportFrom) and not n.level}


def _outside_stdlib(modules: set) -> set:
    return {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"__future__"}


def test_every_built_in_option_is_exportable():
    shipped = set(shipped_modules(ATTENTION_ROOTS))
    assert "evo_attention.nn.components" in shipped and "evo_attention.nn.positions" in shipped
    for field in CATEGORICAL_FIELDS:
        for name in OPTIONS[field]:
            module = REGISTRIES[field][name].__module__
            if module.startswith("evo_attention."):
                assert module in shipped, (field, name, module)


def test_the_exported_module_equals_the_library_in_a_fresh_interpreter(covering_genes, tmp_path):
    x = torch.randn(2, 10, CONFIG.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cases = []
    for i, gene in enumerate(covering_genes()):
        model = random_model(gene)
        out = tmp_path / f"g{i}"
        export_attention(model, out, source="a test")
        with torch.no_grad():
            expected = {f"y{layer}": block.attn(x) for layer, block in enumerate(model.blocks)}  # fused where it can
        save_file({"x": x, **expected}, str(out / "io.safetensors"))
        for path in out.rglob("*.py"):  # torch and the standard library; entmax only inside the functions using it
            tree = ast.parse(path.read_text())
            assert not {m for m in _imports(tree, False) if m.split(".")[0] == "evo_attention"}, path
            assert _outside_stdlib(_imports(tree, True)) <= {"torch"}, path
            assert _outside_stdlib(_imports(tree, False)) <= {"torch", "entmax"}, path
        cases.append({"gene": AttentionGene.parse(gene).key, "dir": str(out), "layers": len(model.blocks)})
    run = subprocess.run([sys.executable, "-I", "-c", CHECK, json.dumps(cases)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    errors = json.loads(run.stdout)
    assert set(errors) == {c["gene"] for c in cases}
    for gene, per_layer in errors.items():
        assert max(per_layer) <= 1e-10, (gene, per_layer)


def _library_line_made_relative(line: str, depth: int) -> str:
    """The test's own statement of the one change: ``from evo_attention.x`` -> ``from <depth dots>x``,
    ``from evo_attention import`` -> ``from <depth dots> import``."""
    return re.sub(r"^(\s*from )evo_attention(\.|(?= ))", lambda m: m.group(1) + "." * depth, line)


def test_the_shipped_modules_are_the_librarys_own_files(tmp_path):
    export_attention(random_model("cosine|entmax15|highway|adaptive|pos=alibi|abias=rel|kvh=2"), tmp_path)
    package = tmp_path / PACKAGE
    shipped = sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py"))
    modules = [p for p in shipped if not p.endswith("__init__.py")]
    assert {"nn/attention.py", "nn/components.py", "nn/positions.py", "nn/dropout.py", "genes.py"} <= set(modules)
    changed = 0
    for path in modules:
        library = (LIBRARY_DIR / path).read_text().splitlines()
        exported = (package / path).read_text().splitlines()
        assert len(exported) == len(library), path
        for mine, theirs in zip(exported, library):
            assert mine == _library_line_made_relative(theirs, path.count("/") + 1), (path, theirs, mine)
            changed += mine != theirs
    assert changed >= 5  # the package imports of attention, components, positions and genes
    for path in set(shipped) - set(modules):  # generated: a docstring and nothing else
        body = ast.parse((package / path).read_text()).body
        assert len(body) == 1 and isinstance(body[0].value, ast.Constant), path
    files = set(export_sources("dot|softmax|none|fixed", 16, 4, 12))
    assert files == {ATTENTION_FILE} | {f"{PACKAGE}/{p}" for p in shipped}


def test_module_sources_ship_the_import_closure_of_any_modules():
    sources = module_sources(["evo_attention.nn.positions"])
    assert set(sources) == {"__init__.py", "genes.py", "programs.py", "nn/__init__.py", "nn/fold.py",
                            "nn/positions.py", "util/__init__.py", "util/errors.py"}
    assert "from ..genes import" in sources["nn/positions.py"] and "from .util.errors import" in sources["genes.py"]
    with pytest.raises(UserError, match="not a module of evo_attention"):
        module_sources(["torch.nn"])


def test_a_plugin_component_that_cannot_be_shipped_is_named_and_nothing_is_written(tmp_path):
    """A component registered here, in this test module: its module imports the library with 'import'
    (and the cli layer), so the export cannot ship it (tests/test_plugin_export.py ships plugins that it can)."""
    @components.register_gating("test_plugin_gate", default_space=False)
    class PluginGate(components.Gating):
        pass

    try:
        model = random_model("dot|softmax|test_plugin_gate|fixed")
        with pytest.raises(UserError, match=r"^plugin test_export \(gating 'test_plugin_gate' of gene dot\|softmax\|"
                                            r"test_plugin_gate\|fixed\|.*\) cannot be exported: line \d+ imports the "
                                            r"library with 'import'") as info:
            export_attention(model, tmp_path / "out")
        assert "\n" not in str(info.value)
        assert not (tmp_path / "out").exists()
        assert check_exportable(AttentionGene.parse("dot|softmax|highway|fixed")) == []  # a built-in one: no plugin
    finally:
        components.unregister("gating", "test_plugin_gate")


def test_export_command_from_a_model_directory(tmp_path, capsys):
    model = random_model("cosine|sparsemax|output_gate|learned|pos=rope|win=4").float()
    save_pretrained(model, tmp_path / "m")
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "e")]) == 0
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["README.md", ATTENTION_FILE, WEIGHTS_FILE, PACKAGE]
    readme = (tmp_path / "e" / "README.md").read_text()
    assert "EvolvedAttention" in readme and f"`{PACKAGE}/`" in readme and "`entmax`" in readme
    assert "wrote" in capsys.readouterr().err
    (tmp_path / "m" / "model.safetensors").write_bytes(b"garbage")
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model.safetensors was altered" in err and not (tmp_path / "f").exists()
    assert main(["export", "--out", str(tmp_path / "g")]) == 2
    assert "--model" in capsys.readouterr().err and not (tmp_path / "g").exists()


def test_the_entry_is_stable_for_a_gene_and_holds_no_attention_logic():
    text = attention_source("dot|entmax15|highway|adaptive|pos=alibi|abias=rel|kvh=2", 16, 4, 12)
    assert text == attention_source("dot|entmax15|highway|adaptive|pos=alibi|abias=rel|kvh=2", 16, 4, 12)
    assert 'GENE = "dot|entmax15|highway|adaptive|bias|0.10|pos=alibi|abias=rel|kvh=2"' in text
    assert "D_MODEL, N_HEADS, MAX_SEQ_LEN = 16, 4, 12" in text
    assert "import evo_attention" not in text and "from evo_attention" not in text
    tree = ast.parse(text)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert defined == {"_import_package", "EvolvedAttention", "layer_state"}
    init = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    assert [n.name for n in init if isinstance(n, ast.FunctionDef)] == ["__init__"]  # forward etc.: the library's


def test_the_docs_name_the_shipped_modules_and_the_entrys_constants():
    text = (Path(__file__).resolve().parents[1] / "docs" / "export.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith(f"| `{PACKAGE}/` |"))
    shipped = {path for path in module_sources(ATTENTION_ROOTS) if not path.endswith("__init__.py")}
    assert set(re.findall(r"`([\w/]+\.py)`", row)) - {"__init__.py"} == shipped
    block = text.split("### A real export", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    constants = re.compile(r"^([A-Z_, ]+) = ", re.M)
    assert constants.findall(block) == constants.findall(attention_source("dot|softmax|none|fixed", 16, 4, 12))
