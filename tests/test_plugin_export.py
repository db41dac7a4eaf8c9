"""Exports carry a plugin's ops and components: the plugin's module ships beside the library's
(its imports of the library made relative, names from the front door read from the modules that
define them), the entry imports it before it builds anything, and the export runs in a fresh
interpreter where evo_attention cannot be imported; a plugin that cannot be shipped is refused in one
line before anything is written (tests/plugins/example_plugin.py registers the op ``hgate``)."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from evo_attention.cli import main
from evo_attention.interop.export import export_attention, module_sources, plugin_source
from evo_attention.interop.hf import export_hf
from evo_attention.nn import components
from evo_attention.nn.decoding import generate
from evo_attention.nn.model import TinyTransformer
from evo_attention.nn.program import register_op, unregister_op
from evo_attention.nn.spec import ModelSpec
from evo_attention.train.saving import load_model, load_tokenizer, save_model
from evo_attention.util.errors import UserError

PLUGINS = Path(__file__).resolve().parent / "plugins"
GENE = "prog=o(hgate(mix(w.softmax(t.fixed(s.dot(q,k))),v)))"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

BLOCK = r'''
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "evo_attention":
            raise ImportError("evo_attention must not be needed")
sys.meta_path.insert(0, Block())
'''

# the standalone attention.py of each case, on the saved input: the largest difference from the library
STANDALONE = BLOCK + r'''
import importlib.util, json
import torch
from safetensors.torch import load_file
result = {}
for case in json.loads(sys.argv[1]):
    spec = importlib.util.spec_from_file_location(f"exported{len(result)}", case["dir"] + "/attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weights, io = load_file(case["dir"] + "/attention.safetensors"), load_file(case["dir"] + "/io.safetensors")
    attn = module.EvolvedAttention().eval()
    attn.load_state_dict(module.layer_state(weights, 0), strict=True)
    with torch.no_grad():
        result[case["dir"]] = float((attn(io["x"]) - io["y"]).abs().max())
assert "evo_attention" not in sys.modules
print("RESULT", json.dumps(result))
'''

HF = BLOCK + r'''
import json
import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging
logging.set_verbosity_error()
d = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True)
io = torch.load(d + "/io.pt")
with torch.no_grad():
    error = float((model(io["ids"]).logits - io["logits"]).abs().max())
out = model.generate(io["ids"][:1, :4], max_new_tokens=6, do_sample=False)[0, 4:]
assert "evo_attention" not in sys.modules
print("RESULT", json.dumps({"error": error, "generated": out.tolist(), "genes": model.config.genes}))
'''


def _env(tmp_path) -> dict:
    return {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1"}


def _run(script: str, arg: str, tmp_path) -> dict:
    done = subprocess.run([sys.executable, "-I", "-c", script, arg], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(tmp_path), stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ")[-1])


def _scramble(model: TinyTransformer) -> TinyTransformer:
    """Weights far from their initialisation (the gate's logits away from 0), so that every piece matters."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def test_the_plugin_ships_with_its_library_imports_resolved(plugin):
    shipped = plugin_source("example_plugin")
    assert shipped.name == "plugins.example_plugin" and shipped.path == "plugins/example_plugin.py"
    original = (PLUGINS / "example_plugin.py").read_text().splitlines()
    lines = shipped.text.splitlines()
    assert len(lines) == len(original)  # the line count kept: the plugin's tracebacks point at its lines
    # the front door's names come from the modules that define them, made relative as the library's modules are
    assert "from ..nn.program import register_op; from ..data.synthetic import register_task" in lines
    assert "from ..data.base import IGNORE_INDEX; from ..data.synthetic import Task" in lines
    assert "from ..nn.program import PerModel" in lines and "evo_attention" not in shipped.text
    assert {"evo_attention.nn.program", "evo_attention.data.synthetic", "evo_attention.data.base"} <= shipped.modules
    flat = plugin_source("example_plugin", flat=True)
    assert flat.path == "evo_attention_plugins_example_plugin.py"
    assert "from .evo_attention_nn_program import register_op; from .evo_attention_data_synthetic import register_task" \
        in flat.text.splitlines()
    sources = module_sources(["evo_attention.nn.attention"], plugins=["example_plugin"])
    assert "plugins/example_plugin.py" in sources and "data/synthetic.py" in sources and "plugins/__init__.py" in sources


def test_a_plugin_op_exports_as_hf_and_standalone_and_runs_without_the_library(plugin, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["baseline", "--preset", "quick", "--plugin", "example_plugin", "--gene", GENE, "--steps", "3",
                 "--d-model", "16", "--heads", "2", "--layers", "2", "--save-model", "--out", str(run),
                 "--quiet"]) == 0
    model = _scramble(load_model(run / "model"))
    assert model.config.plugins == ["example_plugin"]
    path = tmp_path / "scrambled"  # the trained model with its weights moved: exported through the command
    save_model(model, path, tokenizer=load_tokenizer(run / "model"), settings=model.config)
    assert any("logit" in name for name, _ in model.named_parameters())

    # standalone: attention.py imports the shipped plugin before it builds the attention
    std = tmp_path / "standalone"
    assert main(["export", "--model", str(path), "--out", str(std)]) == 0
    assert (std / "evo_attention_export" / "plugins" / "example_plugin.py").is_file()
    entry = (std / "attention.py").read_text()
    assert "PLUGINS = ('plugins.example_plugin',)" in entry
    assert "`plugins/example_plugin.py`" in (std / "README.md").read_text()
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        save_file({"x": x, "y": model.blocks[0].attn(x)}, str(std / "io.safetensors"))

    # a plugin component through the front door (register_normalization, row_normalize), exported by the function
    (tmp_path / "cubic_plugin.py").write_text(textwrap.dedent('''
        import torch
        from evo_attention import register_normalization, row_normalize

        @register_normalization("cubic_export_norm", default_space=False)
        def cubic(scores, mask):
            return row_normalize(torch.relu(scores.float()) ** 3, mask).to(scores.dtype)
    '''))
    sys.path.insert(0, str(tmp_path))
    try:
        import cubic_plugin  # noqa: F401

        spec = ModelSpec(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_seq_len=12, dropout=0.0)
        other = _scramble(TinyTransformer(spec, "cosine|cubic_export_norm|output_gate|learned"))
        export_attention(other, tmp_path / "component")
        with torch.no_grad():
            save_file({"x": x, "y": other.blocks[0].attn(x)}, str(tmp_path / "component" / "io.safetensors"))
        assert (tmp_path / "component" / "evo_attention_export" / "plugins" / "cubic_plugin.py").is_file()
    finally:
        sys.path.remove(str(tmp_path))
        components.unregister("normalization", "cubic_export_norm")
        sys.modules.pop("cubic_plugin", None)
    errors = _run(STANDALONE, json.dumps([{"dir": str(std)}, {"dir": str(tmp_path / "component")}]), tmp_path)
    assert max(errors.values()) <= 1e-5, errors

    # hf: the modeling file imports the flat plugin module; logits and generation as the library's
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed")
    hf = tmp_path / "hf"
    assert main(["export", "--model", str(path), "--format", "hf", "--out", str(hf)]) == 0
    assert (hf / "evo_attention_plugins_example_plugin.py").is_file()
    modeling = (hf / "modeling_evo_attention.py").read_text()
    assert "from .evo_attention_plugins_example_plugin import __name__" in modeling
    assert "`torch`" in (hf / "README.md").read_text()
    ids = torch.randint(1, model.spec.vocab_size, (2, model.spec.max_seq_len), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.save({"ids": ids, "logits": model(ids)}, hf / "io.pt")
    got = _run(HF, str(hf), tmp_path)
    assert got["error"] <= 1e-5, got["error"]
    assert got["genes"] == [g.key for g in model.genes] and len(got["generated"]) == 6
    expected = generate(model, ids[0, :4].tolist(), 6, temperature=0)
    assert got["generated"] == expected or got["generated"][0] == expected[0]  # greedy; near-ties may part later


def test_the_hf_attention_export_ships_the_plugin_too(plugin, tmp_path):
    from evo_attention.interop.hf_attention import export_hf_attention

    spec = ModelSpec(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_seq_len=12, dropout=0.0)
    export_hf_attention(TinyTransformer(spec, GENE), tmp_path / "out")
    assert (tmp_path / "out" / "evo_attention_export" / "plugins" / "example_plugin.py").is_file()
    assert "PLUGINS = ('plugins.example_plugin',)" in (tmp_path / "out" / "hf_attention.py").read_text()


def _bad_plugin(tmp_path, name: str, source: str):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("name,source,why", [
    ("train_plugin", '''
        from evo_attention.nn.program import register_op
        from evo_attention.train.config import Config

        register_op("xop", "H->H", "elementwise", apply=lambda call, z: z * 2.0)
    ''', "line 3 imports evo_attention.train.config, of the library's train layer"),
    ("init_plugin", '''
        from evo_attention.nn.program import register_op
        from evo_attention.data import register_dataset

        register_op("xop", "H->H", "elementwise", apply=lambda call, z: z * 2.0)
    ''', "line 3 imports register_dataset from evo_attention.data, whose __init__ defines it"),
    ("plain_import_plugin", '''
        import evo_attention.nn.program

        evo_attention.nn.program.register_op("xop", "H->H", "elementwise", apply=lambda call, z: z * 2.0)
    ''', "line 2 imports the library with 'import'"),
])
def test_a_plugin_that_cannot_be_shipped_is_one_line_and_nothing_is_written(tmp_path, name, source, why):
    _bad_plugin(tmp_path, name, source)
    try:
        spec = ModelSpec(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_seq_len=12, dropout=0.0)
        model = TinyTransformer(spec, "prog=o(xop(mix(w.softmax(t.fixed(s.dot(q,k))),v)))")
        for export in (lambda out: export_attention(model, out), lambda out: export_hf(model, _vocab(20), out)):
            with pytest.raises(UserError) as info:
                export(tmp_path / "out")
            message = str(info.value)
            assert message.startswith(f"plugin {name} (program op 'xop' of gene ") and why in message, message
            assert "\n" not in message and not (tmp_path / "out").exists()
    finally:
        unregister_op("xop")
        sys.modules.pop(name, None)


def test_a_plugin_that_is_no_file_is_refused(tmp_path):
    module = types.ModuleType("memory_plugin")  # a module made in memory: no source to ship
    sys.modules["memory_plugin"] = module
    exec(compile("def apply(call, z):\n    return z * 2.0\n", "<memory>", "exec"), module.__dict__)
    register_op("xop", "H->H", "elementwise", apply=module.apply)
    try:
        spec = ModelSpec(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_seq_len=12, dropout=0.0)
        model = TinyTransformer(spec, "prog=o(xop(mix(w.softmax(t.fixed(s.dot(q,k))),v)))")
        with pytest.raises(UserError, match=r"^plugin memory_plugin \(program op 'xop' of gene .*\) cannot be "
                                            r"exported: it is not a \.py file \(no file\)"):
            export_attention(model, tmp_path / "out")
        assert not (tmp_path / "out").exists()
    finally:
        unregister_op("xop")
        sys.modules.pop("memory_plugin", None)


def _vocab(n: int):
    from evo_attention.data.vocab import Vocab

    return Vocab([f"w{i}" for i in range(n)])
