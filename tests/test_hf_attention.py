"""A gene as a transformers attention function (interop.hf_attention, export --format hf-attention):
registered through AttentionInterface, installed into a tiny LlamaForCausalLM and a GPT-2 built from
a config, trained a few steps, and compared with the library's own EvolvedAttention on the same
weights (fp32, within 1e-5)."""

import importlib.util
import subprocess
import sys

import pytest
import torch

from evo_attention.cli import main
from evo_attention.nn.attention import EvolvedAttention
from tests.conftest import train_a_few

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed")

TOLERANCE = 1e-5


def _llama(name, kv_heads=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=16,
                         attn_implementation=name)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _train(model, steps=4):
    return train_a_few(model, lambda ids: model(ids, labels=ids).loss, 32, steps)


def _captured(layer, run):
    """The input and output of ``layer`` while ``run()`` runs."""
    seen = {}

    def before(module, args, kwargs):  # first: the layer's input before the gene's input gate
        seen["x"] = (args[0] if args else kwargs["hidden_states"]).detach()

    def after(module, args, kwargs, output):  # last: after the gene's output gating
        seen["y"] = (output[0] if isinstance(output, tuple) else output).detach()

    handles = [layer.register_forward_pre_hook(before, with_kwargs=True, prepend=True),
               layer.register_forward_hook(after, with_kwargs=True)]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return seen["x"], seen["y"]


def _library_attention(gene, layer, qkv_weight, out_weight, max_seq_len=16):
    """The library's EvolvedAttention of ``gene`` with the host layer's projections and the gene's
    parameters the layer trained."""
    attention = EvolvedAttention(32, 4, gene, max_seq_len=max_seq_len).eval()
    state = {f"qkv.weight": qkv_weight, "out.weight": out_weight}
    state.update(layer.evo_attention.state_dict())
    missing, unexpected = attention.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("bias") or "inv_freq" in k for k in missing), missing
    return attention


@pytest.mark.parametrize("gene", [
    "cosine|softmax|input_gate|adaptive|nobias|0.00|pos=rope|kvh=2",
    "dot|entmax15|output_gate|learned|nobias|0.00|pos=rope|kvh=2|abias=rel",
    "dot|linear|highway|fixed|nobias|0.00|pos=rope|kvh=2",
    "dot|softmax|none|fixed|nobias|0.00|pos=rope|kvh=2|win=3",
])
def test_a_trained_llama_with_the_gene_matches_the_library_attention(gene):
    from evo_attention.interop.hf_attention import install, register

    name = register("evo_test")
    model = _llama(name)
    install(model, gene)
    params = {n for n, _ in model.named_parameters()}
    assert any(".self_attn.evo_attention." in n for n in params) or gene.split("|")[2] == "none"
    losses = _train(model)
    assert all(l == l for l in losses)  # finite: the gene trains inside the host
    layer = model.model.layers[0].self_attn
    ids = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(2))
    x, y = _captured(layer, lambda: model(ids))
    qkv = torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight])
    attention = _library_attention(gene, layer, qkv, layer.o_proj.weight)
    with torch.no_grad():
        expected = attention(x)
    assert (y - expected).abs().max() <= TOLERANCE
    # generation with the host's cache runs the decode pieces: the same tokens as without it
    with torch.no_grad():
        cached = model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False)
        plain = model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)


def test_gpt2_built_from_a_config_runs_the_gene():
    from transformers import GPT2Config, GPT2LMHeadModel

    from evo_attention.interop.hf_attention import install, register

    gene = "additive|sigmoid|output_gate|learned|bias|0.00|pos=learned"
    config = GPT2Config(vocab_size=32, n_embd=32, n_layer=2, n_head=4, n_positions=16, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation=register("evo_test_gpt2"))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    install(model, gene)
    _train(model, steps=2)
    layer = model.transformer.h[0].attn
    ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(3))
    x, y = _captured(layer, lambda: model(ids))
    attention = _library_attention(gene, layer, layer.c_attn.weight.T, layer.c_proj.weight.T)
    attention.qkv.bias.data.copy_(layer.c_attn.bias)
    attention.out.bias.data.copy_(layer.c_proj.bias)
    with torch.no_grad():
        assert (y - attention(x)).abs().max() <= TOLERANCE


def test_install_refuses_what_it_cannot_host():
    from evo_attention.interop import hf_attention

    model = _llama(hf_attention.register("evo_test_refuse"))
    model.model.layers[0].self_attn.is_causal = False
    with pytest.raises(ValueError, match="not causal"):
        hf_attention.install(model, "dot|softmax|none|fixed|nobias|0.00|pos=rope")
    # a function that reads later positions is caught on load
    layer = _llama("evo_test_refuse").model.layers[1].self_attn
    layer.register_module("evo_attention", hf_attention.core_attention("dot|softmax|none|fixed|nobias|0.00", 32, 4))
    layer.evo_attention.program.heads = lambda attn, x, p, mask=None, start=0: (
        torch.softmax(p["q"] @ p["k"].transpose(-1, -2), -1) @ p["v"])
    with pytest.raises(ValueError, match="reads later positions"):
        hf_attention.check_causal(layer)


ENTRY_RUN = r'''
import sys, torch
sys.path.insert(0, sys.argv[1])
import importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "evo_attention":
            raise ImportError("evo_attention must not be needed")
sys.meta_path.insert(0, Block())
import hf_attention
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, max_position_embeddings=16, attn_implementation=hf_attention.register())
model = LlamaForCausalLM(config)
hf_attention.install(model)
print("OK", hf_attention.NAME, float(model(torch.randint(0, 32, (1, 8)), labels=torch.randint(0, 32, (1, 8))).loss))
'''


def test_cli_export_format_hf_attention_runs_without_the_library(tmp_path):
    from evo_attention import TinyTransformer
    from evo_attention.nn.spec import ModelSpec
    from evo_attention.train.saving import save_model

    gene = "cosine|softmax|output_gate|learned|nobias|0.00|pos=rope"
    model = TinyTransformer(ModelSpec(vocab_size=32, d_model=32, n_heads=4, n_layers=2, max_seq_len=16), [gene] * 2)
    save_model(model, tmp_path / "model")
    out = tmp_path / "hf-attention"
    assert main(["export", "--model", str(tmp_path / "model"), "--format", "hf-attention", "--out", str(out)]) == 0
    assert (out / "hf_attention.py").is_file() and (out / "evo_attention_export" / "interop" / "hf_attention.py").is_file()
    done = subprocess.run([sys.executable, "-c", ENTRY_RUN, str(out)], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                               "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK" in done.stdout


def test_hf_attention_from_a_run_that_kept_no_model_needs_only_its_gene(tmp_path):
    run = tmp_path / "run"
    assert main(["search", "--preset", "quick", "--d-model", "32", "--heads", "4", "--layers", "1", "--steps", "2",
                 "--population", "3", "--generations", "1", "--elite", "1", "--keep-models", "0", "--quiet",
                 "--out", str(run)]) == 0
    from evo_attention.report import load_run

    best = load_run(run).ranking[0]["gene"]
    out = tmp_path / "hf-attention"
    assert main(["export", "--from-run", str(run), "--format", "hf-attention", "--out", str(out)]) == 0
    assert repr([best]) in (out / "hf_attention.py").read_text()  # the run's best gene, no weights
    done = subprocess.run([sys.executable, "-c", ENTRY_RUN, str(out)], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                               "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    # the standalone and hf formats carry trained weights: they still need a kept model
    assert main(["export", "--from-run", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2


def test_a_program_gene_runs_in_llama_and_matches_the_library_attention():
    from evo_attention.interop.hf_attention import core_attention, install, register

    gene = "prog=o(sgate(mix(w.softmax(t.learned(s.dot(dconv3(q),k))),v)))|nobias|0.00|pos=rope|kvh=2"
    model = _llama(register("evo_test_program"))
    install(model, gene)
    assert any(".self_attn.evo_attention.program." in n for n, _ in model.named_parameters())
    assert all(l == l for l in _train(model))
    layer = model.model.layers[0].self_attn
    ids = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(2))
    x, y = _captured(layer, lambda: model(ids))
    qkv = torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight])
    attention = _library_attention(gene, layer, qkv, layer.o_proj.weight)
    with torch.no_grad():
        assert (y - attention(x)).abs().max() <= TOLERANCE
        recomputed = model.generate(ids[:1, :4], max_new_tokens=3, do_sample=False, use_cache=False)
        assert not model.generation_config.use_cache  # install() made recomputation the default
        assert torch.equal(model.generate(ids[:1, :4], max_new_tokens=3, do_sample=False), recomputed)
        with pytest.raises(ValueError, match="use_cache=False"):
            model.generate(ids[:1, :4], max_new_tokens=3, do_sample=False, use_cache=True)
    with pytest.raises(Exception, match="only a program o"):
        core_attention("prog=g.output_gate(o(mix(w.softmax(s.dot(q,k)),v)))", 32, 4)


@pytest.mark.parametrize("gene, cached", [
    ("prog=o(sgate(mix(w.softmax(t.fixed(s.dot(q,k))),v)))", True),  # gated attention: x at the new position
    ("prog=o(hgate(mix(w.softmax(t.fixed(s.dot(scale(hgate(q)),k))),v)))", True),  # a plugin's op on q, output
    ("prog=o(mix(w.softmax(s.dot(q,l2n(scale(k)))),relu(v)))", True),  # applied to the cached keys, values
    ("prog=o(kmix.favor(t.learned(scale(q)),l2n(k),relu(v)))", True),
    ("dot|softmax|output_gate|learned|nobias|0.00|pos=rope", True),
    ("prog=o(mix(w.softmax(s.dot(q,hgate(k))),v))", False),  # a plugin's learned op may read x: not on keys
    ("prog=o(mix(w.softmax(s.dot(q,sgate(k))),v))", False),  # x of the new positions only
    ("prog=o(mix(w.softmax(s.dot(q,k)),shift(v)))", False),  # along time
])
def test_programs_whose_ops_read_one_position_generate_with_the_hosts_cache(gene, cached, plugin):
    """What decodes from the host's keys and values (the library's own KVCache too) gives the logits of
    recomputation; any other program is refused with the cache and decodes by recomputing."""
    from evo_attention.interop.hf_attention import cacheable, install, register
    from evo_attention.nn.attention import InputCache

    model = _llama(register("evo_test_cache"))
    install(model, gene)
    model.double().eval()  # float64: a cache that computes another function shows above rounding
    model.generation_config.eos_token_id = None  # every run generates all its tokens
    assert model.generation_config.use_cache == cached == cacheable(model.model.layers[0].self_attn.evo_attention)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # gene weights away from their identity start
        ids, runs = torch.tensor([[1, 5, 7, 2]]), {}
        for use_cache in (True, False) if cached else (False,):
            runs[use_cache] = model.generate(ids, max_new_tokens=5, do_sample=False, use_cache=use_cache,
                                             output_logits=True, return_dict_in_generate=True)
        if cached:
            assert torch.equal(runs[True].sequences, runs[False].sequences)
            assert max((a - b).abs().max() for a, b in zip(runs[True].logits, runs[False].logits)) <= 1e-10
        else:
            with pytest.raises(ValueError, match="use_cache=False"):
                model.generate(ids, max_new_tokens=2, do_sample=False, use_cache=True)
        attention = EvolvedAttention(16, 2, gene, max_seq_len=16).double().eval()
        x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        full, cache = attention(x), attention.new_cache()
        rows = [attention.decode(x[:, :3], cache)] + [attention.decode(x[:, i:i + 1], cache) for i in range(3, 12)]
    assert isinstance(cache, InputCache) != cached
    torch.testing.assert_close(torch.cat(rows, 1), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("gene", [
    "prog=o(mix(w.softmax(s.dot(q,shift(k))),v))|nobias|0.00|pos=rope",
    "prog=o(mix(w.softmax(s.dot(dconv3(q),k)),v))|nobias|0.00|pos=rope",
    "prog=o(decay(v))|nobias|0.00|pos=rope",
    "prog=o(kmix(elu1(q),elu1(cumsum(k)),v))|nobias|0.00|pos=rope",
    "prog=o(mix(w.softmax(s.dot(q,k)),cummean(v)))|nobias|0.00|pos=rope",
    "dot|softmax|none|fixed|nobias|0.00|pos=rope|dconv=3",
    "dot|softmax|none|fixed|nobias|0.00|pos=rope",  # decodes with the host's cache
])
def test_a_left_padded_batch_gives_each_row_what_it_gives_alone(gene):
    """An op along time (shift, dconv, decay, cumsum, cummean, qkv_conv) would read the padding before a
    row's tokens: each row runs on its own positions, so logits and greedy tokens are the row's alone."""
    from evo_attention.interop.hf_attention import install, register

    model = _llama(register("evo_test_pad"), kv_heads=4)
    install(model, gene)
    model.generation_config.eos_token_id = None  # every row generates all its tokens
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # gene weights away from their identity start
        ids = torch.randint(1, 32, (2, 7), generator=torch.Generator().manual_seed(1))
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[0, :3] = 0  # row 0: 3 pads, then its 4 tokens
        padded = ids.masked_fill(mask == 0, 0)
        logits = model(padded, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        assert (logits[0, 3:] - model(ids[:1, 3:]).logits[0]).abs().max() <= TOLERANCE
        assert (logits[1] - model(ids[1:]).logits[0]).abs().max() <= TOLERANCE
        new = model.generate(padded, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert torch.equal(new[0, 3:], model.generate(ids[:1, 3:], max_new_tokens=4, do_sample=False)[0])
        assert torch.equal(new[1], model.generate(ids[1:], max_new_tokens=4, do_sample=False)[0])


def test_padding_no_row_gives_alone_is_refused():
    """A hole between a row's tokens has no exact treatment under an op along time: refused in one line
    (the plain attention weighs the hole zero and runs); so is a gating that reads the padding's inputs."""
    from evo_attention.interop.hf_attention import install, register
    from evo_attention.nn import components

    ids, mask = torch.randint(1, 32, (1, 6), generator=torch.Generator().manual_seed(1)), torch.ones(1, 6).long()
    mask[0, 2] = 0
    left = torch.tensor([[0, 0, 1, 1, 1, 1]])
    model = _llama(register("evo_test_hole"), kv_heads=4)
    install(model, "prog=o(mix(w.softmax(s.dot(q,k)),shift(v)))|nobias|0.00|pos=rope")
    with torch.no_grad(), pytest.raises(ValueError, match=r"program o\(mix.*through shift.*one at a time"):
        model(ids, attention_mask=mask)
    install(model := _llama("evo_test_hole", kv_heads=4), "dot|softmax|none|fixed|nobias|0.00|pos=rope")
    with torch.no_grad():
        assert torch.isfinite(model(ids, attention_mask=mask).logits).all()

    class RunningGate(components.Gating):  # the output scaled by a running mean of |x|: reads earlier inputs
        def forward(self, x, y):
            return y * (x.abs().mean(-1).cumsum(-1) / torch.arange(1, x.shape[1] + 1))[..., None]

    components.register_gating("rungate_pad_probe")(RunningGate)
    try:
        install(model := _llama("evo_test_hole", kv_heads=4), "dot|softmax|rungate_pad_probe|fixed|nobias|0.00")
        with torch.no_grad(), pytest.raises(ValueError, match="gating rungate_pad_probe .* one at a time"):
            model(ids, attention_mask=left)
    finally:
        components.unregister("gating", "rungate_pad_probe")
