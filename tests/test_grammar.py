"""The grammar's one table of fields, the rules' fields, the built-in names known without ``nn``, and
the model-size fit (``genes.size_problem``): each stated once, in ``genes``."""

import dataclasses
import itertools
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import evo_attention
from evo_attention import genes
from evo_attention.genes import (FIELD, GENE_FIELDS, AttentionGene, LayerGenes, Rule, SearchSpace, full_window_note,
                                 size_problem)
from evo_attention.nn import components

BUILTIN_OPTIONS = {
    "similarity": ["dot", "multiplicative", "additive", "cosine"],
    "normalization": ["softmax", "sparsemax", "relu_norm", "sigmoid", "entmax15", "linear", "favor"],
    "gating": ["none", "input_gate", "output_gate", "highway"],
    "temperature_mode": ["fixed", "learned", "adaptive"],
}


# -- one table ------------------------------------------------------------------------------------
def test_the_names_derived_from_the_table_keep_their_values():
    assert genes.CATEGORICAL_FIELDS == ("similarity", "normalization", "gating", "temperature_mode")
    assert genes.FIELDS == genes.CATEGORICAL_FIELDS + ("use_bias", "attention_dropout")
    assert genes.AXIS_FIELDS == ("position", "qkv_rank", "attn_bias", "window", "kv_heads", "qkv_conv", "program",
                                 "learning_rate", "warmup", "weight_decay")
    assert genes.RECIPE_FIELDS == ("learning_rate", "warmup", "weight_decay")
    assert genes.MECHANISM_FIELDS == genes.FIELDS + ("position", "qkv_rank", "attn_bias", "window", "kv_heads",
                                                     "qkv_conv", "program")
    assert genes.ALL_FIELDS == genes.FIELDS + genes.AXIS_FIELDS == tuple(f.name for f in GENE_FIELDS)
    assert genes.AXIS_DEFAULTS == {"position": "learned", "qkv_rank": 0, "attn_bias": "none", "window": 0,
                                   "kv_heads": 0, "qkv_conv": 0, "program": None, "learning_rate": None, "warmup": None,
                                   "weight_decay": None}
    assert genes.KEY_PARTS == {"position": "pos", "qkv_rank": "rank", "attn_bias": "abias", "window": "win",
                               "kv_heads": "kvh", "qkv_conv": "dconv", "program": "prog", "learning_rate": "lr",
                               "warmup": "wu",
                               "weight_decay": "wd"}
    assert genes.VANILLA_KEY == "dot|softmax|none|fixed|bias|0.10"
    assert AttentionGene(gene_dict={}).key == genes.VANILLA_KEY  # the table's defaults are the vanilla gene


def test_the_search_space_fields_come_from_the_table():
    fields = dataclasses.fields(SearchSpace)
    assert [f.name for f in fields] == list(genes.ALL_FIELDS) + ["layers"]
    space = SearchSpace()
    assert space.use_bias == (True, False) and space.attention_dropout == genes.DROPOUT_CHOICES
    assert space.similarity == () and space.position == ("learned",) and space.kv_heads == (0,)
    assert space.layers == 0
    assert repr(space).startswith("SearchSpace(similarity=(), normalization=()")
    wide = SearchSpace(position=("rope", "rope:none", "alibi"), kv_heads=1, layers=2)
    assert wide.position == ("rope", "alibi") and wide.kv_heads == (1,)  # canonical, deduplicated, bare values
    assert pickle.loads(pickle.dumps(wide)) == wide and hash(wide) == hash(dataclasses.replace(wide))
    assert dataclasses.replace(wide, layers=0).layers == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        wide.layers = 3


def test_every_field_checks_and_writes_its_values():
    gene = AttentionGene.parse("cosine|entmax15|highway|adaptive|nobias|0.25|kvh=1|pos=rope:ntk:4.0|rank=8")
    assert gene.key == "cosine|entmax15|highway|adaptive|nobias|0.25|pos=rope:ntk:4|rank=8|kvh=1"
    for f in GENE_FIELDS:
        assert f.canonical(getattr(gene, f.name)) == getattr(gene, f.name)
        assert f.canonical(f.default) == f.default
    for name, bad, words in (("use_bias", "maybe", "use_bias 'maybe' is not a boolean: use true/false"),
                             ("attention_dropout", "x", "attention_dropout 'x' is not a number: use a float"),
                             ("window", -1, "window -1 is not a non-negative integer: use 0"),
                             ("similarity", "nope", "unknown similarity 'nope': valid options are dot,")):
        with pytest.raises(ValueError, match=words):
            FIELD[name].canonical(bad)


# -- the rules' fields ----------------------------------------------------------------------------
def test_each_rule_reads_only_the_fields_it_names():
    assert genes.rule_fields() == ("similarity", "normalization", "gating", "temperature_mode", "position",
                                   "attn_bias", "program")
    space = SearchSpace(normalization=tuple(BUILTIN_OPTIONS["normalization"]), position=("learned", "rope", "alibi"),
                        attn_bias=("none", "rel"), program=(None, "o(kmix(elu1(q),elu1(k),v))"))
    for rule in genes.RULES:
        broken = 0
        for values in _combinations(space, rule.fields):  # a KeyError here: the rule reads an unnamed field
            if rule.broken(values):
                broken += 1
                assert rule.explain(values)
        assert broken, rule.name


def test_a_rule_reading_another_field_is_checked_by_the_space(monkeypatch):
    no_highway = Rule("no-highway", lambda v: v["gating"] == "highway", lambda v: "highway is out", fields=("gating",))
    monkeypatch.setattr(genes, "RULES", genes.RULES + (no_highway,))
    assert "gating" in genes.rule_fields()
    with pytest.raises(ValueError, match=r"holds no valid gene: highway is out \(rule no-highway\)"):
        SearchSpace(gating=("highway",))
    assert SearchSpace(gating=("highway", "none")).options("gating") == ["highway", "none"]
    # a rule that does not name its fields may read any of them
    assert Rule("any", lambda v: False, lambda v: "").fields == genes.ALL_FIELDS


def _combinations(space, names):
    for combo in itertools.product(*(space.options(n) for n in names)):
        yield dict(zip(names, combo))


# -- the built-in names without nn ----------------------------------------------------------------
# sha256[:16] of the keys of seeded draws, mutations and crossovers over these spaces, computed with
# the code before the field table (git 90bd18a): the results of every existing seed.
GOLDEN_DIGESTS = {
    "default": "bc0a3af69d90caa7",
    "axes": "f67a2dfc5609d08b",
    "kernels": "48a8dbad3f6430d3",
    "small": "96081cf9bae0524a",
    "layers3": "cb6c2858dff6b620",
    "layers2_kernels": "2ab869da9ae81d8c",
}
GOLDEN_FIRST = {  # the first two draws of seed 0, for a readable failure
    "default": ["cosine|sigmoid|none|learned|nobias|0.15", "additive|sigmoid|output_gate|adaptive|bias|0.20"],
    "axes": ["cosine|sigmoid|none|learned|nobias|0.15|pos=rope:ntk:4|rank=16|abias=rel|kvh=2",
             "multiplicative|relu_norm|input_gate|fixed|nobias|0.20|pos=none|abias=rel|kvh=2"],
    "kernels": ["cosine|sparsemax|none|learned|nobias|0.15|pos=alibi|abias=rel",
                "cosine|softmax|output_gate|learned|nobias|0.20|pos=rope"],
    "small": ["cosine|softmax|none|learned|bias|0.20|win=8", "cosine|softmax|input_gate|adaptive|bias|0.20"],
    "layers3": ["cosine|entmax15|none|learned|nobias|0.10|pos=alibi / cosine|sigmoid|output_gate|fixed|bias|0.00|"
                "pos=alibi|kvh=1 / dot|entmax15|highway|learned|bias|0.25|pos=rope",
                "multiplicative|entmax15|input_gate|fixed|bias|0.30|pos=alibi|kvh=1 / dot|softmax|output_gate|"
                "adaptive|nobias|0.00|pos=rope|kvh=1 / dot|entmax15|output_gate|adaptive|bias|0.30|pos=alibi|kvh=1"],
    "layers2_kernels": ["additive|entmax15|input_gate|adaptive|nobias|0.15|pos=alibi / additive|softmax|none|fixed|"
                        "nobias|0.25|pos=alibi",
                        "dot|entmax15|highway|learned|bias|0.25|pos=none / dot|softmax|input_gate|fixed|bias|0.30|"
                        "pos=alibi"],
}

# Run in a fresh interpreter. ``import evo_attention.genes`` would run the package's __init__, which
# imports nn; a bare package module stands in for it, so genes is imported alone, as a worker might.
PROBE = r'''
import hashlib, json, random, sys, types
pkg = types.ModuleType("evo_attention")
pkg.__path__ = [sys.argv[1]]
sys.modules["evo_attention"] = pkg
import evo_attention.genes as g

SPACES = {
    "default": {},
    "axes": dict(position=["learned", "rope", "rope:ntk:4", "alibi", "none"], qkv_rank=[0, 16, 32],
                 attn_bias=["none", "rel"], window=[0, 32], kv_heads=[0, 1, 2]),
    "kernels": dict(normalization=["softmax", "linear", "favor", "sparsemax"], position=["learned", "alibi", "rope"],
                    attn_bias=["none", "rel"]),
    "small": dict(similarity=["dot", "cosine"], normalization=["softmax"], use_bias=[True],
                  attention_dropout=[0.1, 0.2], window=[0, 8]),
    "layers3": dict(layers=3, position=["learned", "rope", "alibi"], kv_heads=[0, 1]),
    "layers2_kernels": dict(layers=2, normalization=["softmax", "linear", "entmax15"],
                            position=["learned", "none", "alibi"]),
}

def draws(name):
    spec = dict(SPACES[name])
    layers = spec.pop("layers", 0)
    space = g.SearchSpace(**{k: tuple(v) for k, v in spec.items()}, layers=layers)
    # the recipe fields came later: at their single default option a space reads as it did before them
    keys = [repr(space).replace(", qkv_conv=(0,), program=(None,)", "")
            .replace(", learning_rate=(None,), warmup=(None,), weight_decay=(None,)", ""),
            str(space.size())]
    for seed in (0, 1):
        rng = random.Random(seed)
        genomes = [space.random(rng) for _ in range(200)]
        keys += [x.key for x in genomes]
        keys += [x.mutate(rate, rng, space).key for rate in (0.3, 1.0) for x in genomes[:100]]
        keys += [a.crossover(b, rng).key for a, b in zip(genomes[::2], genomes[1::2])]
        keys.append(repr(rng.random()))
    return keys

def snapshot():
    return {"options": g.OPTIONS, "opt_in": {k: sorted(v) for k, v in g.OPT_IN.items()},
            "dot_form": sorted(g.DOT_FORM_SIMILARITIES), "kernel": sorted(g.KERNEL_NORMALIZATIONS),
            "digests": {n: hashlib.sha256("\n".join(draws(n)).encode()).hexdigest()[:16] for n in SPACES},
            "first": {n: draws(n)[2:4] for n in SPACES},
            "torch": "torch" in sys.modules}

alone = snapshot()
import evo_attention.nn.components
print(json.dumps({"alone": alone, "with_nn": snapshot()}))
'''


@pytest.fixture(scope="module")
def probe():
    src = str(Path(evo_attention.__file__).parent)
    out = subprocess.run([sys.executable, "-c", PROBE, src], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_genes_alone_knows_the_built_in_names(probe):
    alone, with_nn = probe["alone"], probe["with_nn"]
    assert not alone["torch"] and with_nn["torch"]  # genes alone imported neither torch nor nn
    assert alone["options"] == BUILTIN_OPTIONS  # in registration order: seeded draws index into it
    assert alone["opt_in"] == {"similarity": [], "normalization": ["favor", "linear"], "gating": [],
                               "temperature_mode": []}
    assert (alone["dot_form"], alone["kernel"]) == (["cosine", "dot"], ["favor", "linear"])
    for name in ("options", "opt_in", "dot_form", "kernel"):  # registering the built-ins adds nothing
        assert with_nn[name] == alone[name], name


def test_seeded_draws_are_those_of_every_existing_seed(probe):
    for state in ("alone", "with_nn"):
        assert probe[state]["first"] == GOLDEN_FIRST
        assert probe[state]["digests"] == GOLDEN_DIGESTS


def test_nn_implements_exactly_the_built_in_names_as_the_grammar_describes_them():
    registries = {"similarity": components.SIMILARITIES, "normalization": components.NORMALIZATIONS,
                  "gating": components.GATINGS, "temperature_mode": components.TEMPERATURES}
    for name, registry in registries.items():
        builtins = FIELD[name].builtins
        assert list(builtins) == BUILTIN_OPTIONS[name]
        assert genes.OPTIONS[name][:len(builtins)] == list(builtins)
        assert all(getattr(registry[o], "__module__", "") == components.__name__ for o in builtins)
    sims, norms = components.SIMILARITIES, components.NORMALIZATIONS
    assert {o for o in FIELD["similarity"].builtins if getattr(sims[o], "dot_form", False)} == {"dot", "cosine"}
    assert {o for o in FIELD["normalization"].builtins if getattr(norms[o], "kernel", False)} == {"linear", "favor"}
    assert genes.OPT_IN["normalization"] >= {"linear", "favor"}


def test_registering_a_plugin_name_appends_it_once():
    before = list(genes.OPTIONS["gating"])

    @components.register_gating("grammar_test_gate", default_space=False)
    class Gate(components.Gating):
        pass

    try:
        components.register_gating("grammar_test_gate", default_space=False)(Gate)  # the same factory again
        assert genes.OPTIONS["gating"] == before + ["grammar_test_gate"]
        assert "grammar_test_gate" in genes.OPT_IN["gating"]
        assert "grammar_test_gate" not in SearchSpace().options("gating")
    finally:
        components.unregister("gating", "grammar_test_gate")
    assert genes.OPTIONS["gating"] == before and "grammar_test_gate" not in genes.OPT_IN["gating"]


# -- fitting a model size -------------------------------------------------------------------------
def test_size_problem_of_a_gene_a_genome_and_a_space():
    assert size_problem(AttentionGene.vanilla(), d_model=16, n_heads=4) is None
    problem = size_problem("dot|softmax|none|fixed|kvh=3", d_model=16, n_heads=4)
    assert problem.field == "kv_heads"
    assert str(problem) == ("gene dot|softmax|none|fixed|bias|0.10|kvh=3: kv_heads 3 does not divide the 4 heads: "
                            "use a divisor of the heads (1 is multi-query attention)")
    genome = LayerGenes(["dot|softmax|none|fixed", "dot|softmax|none|fixed|rank=32"])
    problem = size_problem(genome, d_model=16, n_heads=4, size="16x2")
    assert problem.field == "qkv_rank"
    assert problem.problem == ("gene dot|softmax|none|fixed|bias|0.10|rank=32: qkv_rank 32 is larger than d_model 16 "
                               "of size 16x2")
    assert size_problem(genome, d_model=32, n_heads=4) is None
    space = SearchSpace(qkv_rank=(0, 8), kv_heads=(0, 1, 2, 3))
    assert size_problem(space, d_model=16, n_heads=6) is None
    assert str(size_problem(space, d_model=16, n_heads=4)).startswith("kv_heads 3 in the search space does not "
                                                                      "divide the 4 heads")
    assert size_problem(space, d_model=4, n_heads=6).problem == ("qkv_rank 8 in the search space is larger than "
                                                                 "d_model 4")


def test_full_window_note():
    space = SearchSpace(window=(0, 64, 128))
    assert full_window_note(space, max_seq_len=129) is None
    assert full_window_note(space, max_seq_len=128) == ("window 128 is at least max_seq_len 128: it is full "
                                                        "attention (the same as window 0)")
    assert full_window_note("dot|softmax|none|fixed|win=8", max_seq_len=8).startswith(
        "gene dot|softmax|none|fixed|bias|0.10|win=8: window 8 is at least max_seq_len 8")


def test_the_model_and_the_attention_refuse_with_the_genes_messages(tiny_config):
    from evo_attention.nn.attention import EvolvedAttention
    from evo_attention.nn.model import TinyTransformer

    key = "dot|softmax|none|fixed|rank=17"
    with pytest.raises(ValueError, match=r"qkv_rank 17 is larger than d_model 16: a low-rank projection needs"):
        EvolvedAttention(16, 4, key)
    mixed = ["dot|softmax|none|fixed", "dot|softmax|none|fixed|pos=rope"]
    with pytest.raises(ValueError) as refused:
        TinyTransformer(tiny_config, mixed)
    with pytest.raises(ValueError) as parsed:
        LayerGenes(mixed)
    assert str(refused.value) == str(parsed.value) and "(rule layers-share-absolute-positions)" in str(parsed.value)
