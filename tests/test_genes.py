import pickle
import random

import pytest

from evo_attention import AttentionGene, SearchSpace
from evo_attention.genes import FIELDS


def test_class_attributes_match_the_original():
    assert AttentionGene.SIMILARITY_FUNCS == ["dot", "multiplicative", "additive", "cosine"]
    assert AttentionGene.NORMALIZATIONS == ["softmax", "sparsemax", "relu_norm", "sigmoid", "entmax15", "linear", "favor"]
    assert AttentionGene.GATING == ["none", "input_gate", "output_gate", "highway"]
    assert AttentionGene.TEMPERATURE_MODES == ["fixed", "learned", "adaptive"]
    # the default search space is the original's: the efficient families join only when listed
    assert SearchSpace().options("normalization") == ["softmax", "sparsemax", "relu_norm", "sigmoid", "entmax15"]


def test_str_key_and_parse_round_trip():
    g = AttentionGene.parse("dot|sparsemax|output_gate|learned")
    assert str(g) == "Attn(dot|sparsemax|output_gate|learned)"
    assert g.key == "dot|sparsemax|output_gate|learned|bias|0.10"
    assert g.use_bias is True and g.attention_dropout == 0.1
    assert AttentionGene.parse(g.key) == g
    assert AttentionGene.parse(str(g)) == g
    full = AttentionGene.parse("cosine|entmax15|highway|adaptive|nobias|0.25")
    assert full.use_bias is False and full.attention_dropout == 0.25
    assert AttentionGene.parse(full.key).key == full.key


def test_random_genes_round_trip_and_hash_by_key():
    rng = random.Random(0)
    for _ in range(200):
        g = AttentionGene(rng=rng)
        again = AttentionGene.parse(g.key)
        assert again == g and hash(again) == hash(g)
        assert AttentionGene(gene_dict=g.to_dict()) == g
        assert pickle.loads(pickle.dumps(g)) == g
        assert 0.0 <= g.attention_dropout <= 0.3
    assert len({AttentionGene.vanilla(), AttentionGene.parse("dot|softmax|none|fixed")}) == 1


def test_genes_are_immutable():
    g = AttentionGene.vanilla()
    with pytest.raises(AttributeError):
        g.similarity = "cosine"
    assert g.replace(similarity="cosine").similarity == "cosine"
    assert g.similarity == "dot"


def test_seeded_draws_are_reproducible():
    a = [AttentionGene(rng=random.Random(7)).key for _ in range(3)]
    b = [AttentionGene(rng=random.Random(7)).key for _ in range(3)]
    assert a == b
    r1, r2 = random.Random(1), random.Random(1)
    assert [AttentionGene(rng=r1) for _ in range(20)] == [AttentionGene(rng=r2) for _ in range(20)]


def test_module_rng_draw():
    random.seed(3)
    a = AttentionGene()
    random.seed(3)
    assert AttentionGene() == a


def test_mutation_rate_zero_changes_nothing_and_one_resamples():
    rng = random.Random(0)
    g = AttentionGene.parse("additive|sigmoid|highway|adaptive|nobias|0.30")
    for _ in range(50):
        assert g.mutate(0.0, rng) == g
    # rate 1 resamples every field: over many draws every option of every field shows up
    seen = {name: set() for name in FIELDS}
    for _ in range(400):
        child = g.mutate(1.0, rng)
        for name in FIELDS:
            seen[name].add(getattr(child, name))
    space = SearchSpace()
    for name in FIELDS:
        assert seen[name] == set(space.options(name)), name


def test_mutation_rate_is_per_component():
    rng = random.Random(0)
    g = AttentionGene.vanilla()
    space = SearchSpace()
    changed = 0
    trials = 3000
    for _ in range(trials):
        changed += g.mutate(0.3, rng).similarity != g.similarity
    # P(resampled) * P(new value differs) = 0.3 * 3/4
    assert abs(changed / trials - 0.3 * (1 - 1 / len(space.options("similarity")))) < 0.03


def test_crossover_takes_each_field_from_a_parent():
    rng = random.Random(0)
    a = AttentionGene.parse("dot|softmax|none|fixed|bias|0.00")
    b = AttentionGene.parse("cosine|entmax15|highway|adaptive|nobias|0.30")
    from_a = {name: 0 for name in FIELDS}
    for _ in range(400):
        child = a.crossover(b, rng)
        for name in FIELDS:
            value = getattr(child, name)
            assert value in (getattr(a, name), getattr(b, name))
            from_a[name] += value == getattr(a, name)
    for name in FIELDS:
        assert 120 < from_a[name] < 280  # uniform crossover: about half from each parent
    assert a.crossover(b, random.Random(5)) == a.crossover(b, random.Random(5))


@pytest.mark.parametrize(
    "make, bad",
    [
        (lambda: AttentionGene.parse("dot|sparsemaxx|none|fixed"), "sparsemaxx"),
        (lambda: AttentionGene.parse("dott|softmax|none|fixed"), "dott"),
        (lambda: AttentionGene(gene_dict={"gating": "gate"}), "gate"),
        (lambda: AttentionGene(gene_dict={"temperature_mode": "hot"}), "hot"),
        (lambda: AttentionGene(gene_dict={"similarity": "dot", "colour": "red"}), "colour"),
        (lambda: AttentionGene.parse("dot|softmax|none|fixed|bias|0.9"), "0.9"),
        (lambda: AttentionGene.parse("dot|softmax|none|fixed|maybe|0.1"), "maybe"),
        (lambda: AttentionGene.parse("dot|softmax|none"), "dot|softmax|none"),
        (lambda: SearchSpace(normalization=("softmax", "topk")), "topk"),
    ],
)
def test_bad_names_are_rejected_with_one_line_naming_them(make, bad):
    with pytest.raises(ValueError) as err:
        make()
    message = str(err.value)
    assert bad in message and "\n" not in message


def test_unknown_component_message_lists_valid_options():
    with pytest.raises(ValueError, match="valid options are softmax, sparsemax, relu_norm, sigmoid, entmax15"):
        AttentionGene.parse("dot|topk|none|fixed")


def test_restricted_search_space():
    space = SearchSpace(similarity=("dot",), normalization=("softmax", "sparsemax"), attention_dropout=(0.1,))
    rng = random.Random(0)
    genes = [AttentionGene.random(rng, space) for _ in range(100)]
    assert {g.similarity for g in genes} == {"dot"}
    assert {g.normalization for g in genes} == {"softmax", "sparsemax"}
    assert all(g.mutate(1.0, rng, space).similarity == "dot" for g in genes)
    assert space.size() == 1 * 2 * 4 * 3 * 2 * 1
    assert SearchSpace.from_dict(space.to_dict()).to_dict() == space.to_dict()


def test_the_operators_and_from_dict_name_an_argument_of_the_wrong_type():
    from evo_attention.util.errors import UserError

    gene = AttentionGene.vanilla()
    with pytest.raises(TypeError, match="^rng must be a random.Random, not 42"):
        gene.crossover(gene, rng=42)
    with pytest.raises(TypeError, match="^space must be a SearchSpace"):
        gene.crossover(gene, space={"normalization": ["softmax"]})
    with pytest.raises(UserError, match=r"^search_space \[1\] must be a mapping of fields to options"):
        SearchSpace.from_dict([1])


def test_an_attention_dropout_off_the_key_s_two_decimals_is_refused():
    from evo_attention.util.errors import UserError

    for value in (0.123, 0.125, "0.101"):
        with pytest.raises(UserError, match=r"^attention_dropout .* is not a multiple of 0.01 \(a gene key holds"):
            AttentionGene(attention_dropout=value)
    assert AttentionGene(attention_dropout=0.1 + 0.2).key.endswith("|0.30")  # float noise is no other value
    assert AttentionGene.parse(AttentionGene(attention_dropout=0.05).key).attention_dropout == 0.05
