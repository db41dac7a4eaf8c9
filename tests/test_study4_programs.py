"""Every program study 4 reports loads from its committed key, trains and exports both ways.

The programs are read from study 4's committed result files (docs/findings4): each search's
winner (``final_results.json``), every gene a validation trained (``validation*.json``: E4's top 5 of each
climb among them) and every gene of a plan the study wrote (``plans/*.yaml``). Each is
parsed from its key, built into a tiny two-layer model, trained a few steps, exported with
``export_hf`` (loaded back with ``AutoModelForCausalLM`` from the directory and generating as the
library's model does) and installed as a transformers attention function (``--format hf-attention``)
into a tiny Llama, trained and generating. The sizes differ from the study's: what is checked is that
the key alone rebuilds a program that trains and leaves the library both ways."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml

from evo_attention import TinyTransformer
from evo_attention.data.tokenizers import train_tokenizer
from evo_attention.genes import AttentionGene
from evo_attention.nn.spec import ModelSpec
from tests.conftest import train_a_few

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed")

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "findings4"
TEXT = "".join(f"the {a} sat on the {b} , and a {b} ran to the {a} .\n"
               for a in ("cat", "dog", "bird") for b in ("mat", "log", "tree"))


def reported() -> list[str]:
    genes = [json.loads(p.read_text())["top_5"][0]["gene"] for p in sorted(RESULTS.rglob("final_results.json"))]
    genes += [g["gene"] for p in sorted(RESULTS.rglob("validation*.json")) for g in json.loads(p.read_text())["genes"]]
    for plan in sorted((RESULTS / "plans").glob("*.yaml")):
        genes += [g.split("|lr=")[0] for g in yaml.safe_load(plan.read_text())["comparisons"]]
    return [g for g in dict.fromkeys(genes) if "prog=" in g]


def test_every_program_study4_reports_loads_from_its_key_trains_and_exports_both_ways(tmp_path, monkeypatch):
    genes = reported()
    if not genes:
        pytest.skip("study 4 has committed no result yet")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    from evo_attention.interop.hf import export_hf
    from evo_attention.interop.hf_attention import install, register
    from evo_attention.nn.decoding import generate

    logging.set_verbosity_error()
    tokenizer = train_tokenizer("word", TEXT, 40)
    vocab = tokenizer.vocab_size
    prompt = tokenizer.encode("the cat sat on").ids.tolist()
    for i, key in enumerate(genes):
        gene = AttentionGene.parse(key)
        assert gene.key == key  # the committed key is the gene's own
        torch.manual_seed(i)
        model = TinyTransformer(ModelSpec(vocab_size=vocab, d_model=32, n_heads=4, n_layers=2, max_seq_len=12,
                                          dropout=0.0), [key] * 2)
        losses = train_a_few(model, lambda ids: torch.nn.functional.cross_entropy(
            model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()), vocab, steps=3, length=10)
        assert all(loss == loss for loss in losses), key
        # one directory name for all: the exported code is the same for every gene (each gene is in its config and
        # weights), and transformers names the imported code by the directory's name, so it imports it once
        out = tmp_path / str(i) / "hf"
        export_hf(model, tokenizer, out)
        loaded = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
        ids = torch.tensor([prompt])
        with torch.no_grad():
            assert torch.allclose(loaded(ids).logits, model(ids), atol=1e-5), key
            ours = generate(model, prompt, 3, temperature=0, use_cache=False)
            theirs = loaded.generate(ids, max_new_tokens=3, do_sample=False, use_cache=False)
        assert theirs[0, len(prompt):].tolist() == ours, key
        # the attention function inside a transformers Llama: installed from the key, trains, generates
        llama = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                             max_position_embeddings=12,
                                             attn_implementation=register(f"evo_study4_{i}")))
        install(llama, key)
        losses = train_a_few(llama, lambda ids: llama(ids, labels=ids).loss, vocab, steps=3, length=10)
        assert all(loss == loss for loss in losses), key
        with torch.no_grad():
            new = llama.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        assert new.shape[1] == len(prompt) + 3, key


@pytest.mark.parametrize("short_conv, positions", [(3, 13), (0, 9)])
def test_study4s_discovery_reads_only_the_last_positions_of_its_window(short_conv, positions):
    """docs/findings.md reads climb 402's program as attention-free local mixing: the output at the last of
    64 positions of a two-layer model depends on the last 13 inputs with E2's width-3 short convolution
    (shift: 1 back, dconv4: 3 back, the short convolution 2 back, per layer) and on the last 9 without it.
    Random weights, so that no convolution tap is zero as at its initialisation."""
    torch.manual_seed(0)
    model = TinyTransformer(ModelSpec(vocab_size=16, d_model=16, n_heads=2, n_layers=2, max_seq_len=64,
                                      dropout=0.0, short_conv=short_conv),
                            ["dot|softmax|none|fixed|bias|0.10|prog=o(dconv4(sgate(shift(v))))"] * 2).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    embedding = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.num_embeddings == 16)
    inputs = embedding(torch.randint(0, 16, (1, 64))).detach().requires_grad_(True)
    hook = embedding.register_forward_hook(lambda *_: inputs)
    model(torch.zeros(1, 64, dtype=torch.long))[0, -1].sum().backward()
    hook.remove()
    read = (inputs.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert read == list(range(64 - positions, 64))
