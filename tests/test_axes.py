"""The position / qkv_rank / attn_bias gene axes: keys, search space, causality, sizes, maths."""

import math
import random

import pytest
import torch

from evo_attention import AttentionGene, Config, EvolvedAttention, SearchSpace, TinyTransformer
from evo_attention.genes import ALL_FIELDS, AXIS_DEFAULTS, AXIS_FIELDS, violation
from evo_attention.nn.positions import ALiBi, RelativeBias, Rotary, alibi_slopes, parse_position

POSITIONS = ["learned", "rope", "rope:linear:2", "rope:ntk:4", "alibi", "none"]


def _randomize(model):
    """Zero-initialised parameters (relative bias, adaptive temperature) would hide a leak."""
    g = torch.Generator().manual_seed(0)
    for block in model.blocks:
        attn = block.attn
        for module in (attn.temperature, attn.gating, attn.similarity, attn.score_biases):
            for p in module.parameters():
                with torch.no_grad():
                    p.add_(torch.randn(p.shape, generator=g) * 0.5)


# -- keys ---------------------------------------------------------------------------------------
def test_default_axes_leave_keys_unchanged():
    g = AttentionGene.parse("dot|sparsemax|output_gate|learned")
    assert (g.position, g.qkv_rank, g.attn_bias) == ("learned", 0, "none")
    assert g.key == "dot|sparsemax|output_gate|learned|bias|0.10"
    assert AttentionGene.parse(g.key + "|pos=learned|rank=0|abias=none") == g


def test_key_round_trip_with_named_parts_in_any_order():
    g = AttentionGene.parse("dot|softmax|none|fixed|bias|0.10|abias=rel|rank=32|pos=rope:ntk:4.0")
    assert g.key == "dot|softmax|none|fixed|bias|0.10|pos=rope:ntk:4|rank=32|abias=rel"
    assert (g.position, g.qkv_rank, g.attn_bias) == ("rope:ntk:4", 32, "rel")
    assert AttentionGene.parse(g.key) == g
    assert AttentionGene.parse(str(g)) == g
    assert str(g) == "Attn(dot|softmax|none|fixed|pos=rope:ntk:4|rank=32|abias=rel)"
    assert AttentionGene.parse("cosine|entmax15|highway|adaptive|pos=alibi").key == \
        "cosine|entmax15|highway|adaptive|bias|0.10|pos=alibi"
    assert AttentionGene.parse("dot|softmax|none|fixed|pos=rope:none") == AttentionGene.parse("dot|softmax|none|fixed|pos=rope")
    assert AttentionGene(gene_dict=g.to_dict()) == g
    assert set(g.to_dict()) == set(ALL_FIELDS)
    assert g.differences(AttentionGene.vanilla()) == ["position", "qkv_rank", "attn_bias"]
    assert g.replace(qkv_rank=0).key == "dot|softmax|none|fixed|bias|0.10|pos=rope:ntk:4|abias=rel"


@pytest.mark.parametrize("text, bad", [
    ("dot|softmax|none|fixed|colour=red", "colour"),
    ("dot|softmax|none|fixed|pos=rotary", "rotary"),
    ("dot|softmax|none|fixed|pos=rope:cubic:2", "rope:cubic:2"),
    ("dot|softmax|none|fixed|pos=rope:linear:0.5", "rope:linear:0.5"),
    ("dot|softmax|none|fixed|pos=rope:ntk:x", "x"),
    ("dot|softmax|none|fixed|pos=alibi:linear:2", "alibi:linear:2"),
    ("dot|softmax|none|fixed|rank=-1", "-1"),
    ("dot|softmax|none|fixed|rank=abc", "abc"),
    ("dot|softmax|none|fixed|abias=qk", "qk"),
    ("dot|softmax|none|fixed|pos=rope|pos=alibi", "pos="),
    ("dot|softmax|none|pos=rope", "dot|softmax|none|pos=rope"),
])
def test_bad_axis_parts_are_one_line_errors(text, bad):
    with pytest.raises(ValueError) as err:
        AttentionGene.parse(text)
    assert bad in str(err.value) and "\n" not in str(err.value)


def test_error_messages_list_the_valid_options():
    with pytest.raises(ValueError, match="valid names are pos, rank, abias"):
        AttentionGene.parse("dot|softmax|none|fixed|posn=rope")
    with pytest.raises(ValueError, match="valid options are none, rel"):
        AttentionGene.parse("dot|softmax|none|fixed|abias=full")
    with pytest.raises(ValueError, match="valid options are learned, rope"):
        AttentionGene.parse("dot|softmax|none|fixed|pos=sinusoid")


# -- search space -------------------------------------------------------------------------------
def test_default_space_draws_exactly_what_it_drew_before_the_axes():
    # computed with the genes module as it was before the three axes existed
    rng = random.Random(123)
    draws = [AttentionGene(rng=rng).key for _ in range(4)]
    assert draws == ["dot|relu_norm|none|learned|nobias|0.00", "dot|sigmoid|output_gate|learned|bias|0.05",
                     "multiplicative|relu_norm|output_gate|adaptive|bias|0.05", "dot|sigmoid|none|adaptive|nobias|0.00"]
    a, b = AttentionGene.parse(draws[0]), AttentionGene.parse(draws[1])
    assert [a.mutate(0.5, rng).key for _ in range(3)] == [
        "cosine|softmax|input_gate|fixed|nobias|0.00", "dot|relu_norm|highway|adaptive|nobias|0.00",
        "dot|entmax15|highway|learned|bias|0.00"]
    assert [a.crossover(b, rng).key for _ in range(3)] == [
        "dot|sigmoid|none|learned|nobias|0.00", "dot|sigmoid|output_gate|learned|bias|0.00",
        "dot|sigmoid|none|learned|bias|0.00"]
    assert AttentionGene(rng=rng).key == "dot|relu_norm|highway|adaptive|bias|0.20"
    assert SearchSpace().size() == 4 * 5 * 4 * 3 * 2 * 7


def test_enabled_axes_are_drawn_mutated_and_crossed():
    space = Config(search_space={"position": ["learned", "rope", "rope:ntk:4.0"], "qkv_rank": [0, 16, 32],
                                 "attn_bias": ["none", "rel"]}).space()
    assert space.options("position") == ["learned", "rope", "rope:ntk:4"]
    rng = random.Random(0)
    genes = [AttentionGene.random(rng, space) for _ in range(300)]
    assert {g.position for g in genes} == {"learned", "rope", "rope:ntk:4"}
    assert {g.qkv_rank for g in genes} == {0, 16, 32}
    assert {g.attn_bias for g in genes} == {"none", "rel"}
    assert all(AttentionGene.parse(g.key) == g for g in genes)
    v = AttentionGene.vanilla()
    assert {v.mutate(1.0, rng, space).qkv_rank for _ in range(200)} == {0, 16, 32}
    other = v.replace(position="alibi", qkv_rank=8, attn_bias="rel", window=16, kv_heads=2)
    children = [v.crossover(other, rng) for _ in range(400)]
    for name in v.differences(other):
        from_v = sum(getattr(c, name) == getattr(v, name) for c in children)
        assert 120 < from_v < 280, name
    assert space.size() == SearchSpace().size() * 3 * 3 * 2
    assert SearchSpace.from_dict(space.to_dict()).to_dict() == space.to_dict()
    assert SearchSpace.from_dict({"position": "rope"}).options("position") == ["rope"]


@pytest.mark.parametrize("space, bad", [
    ({"position": ["learned", "sinusoid"]}, "sinusoid"),
    ({"qkv_rank": [0, -4]}, "-4"),
    ({"attn_bias": ["pairwise"]}, "pairwise"),
    ({"qkv_rank": []}, "qkv_rank"),
    ({"rope": ["ntk"]}, "rope"),
])
def test_bad_search_space_values(space, bad):
    with pytest.raises(ValueError) as err:
        Config(search_space=space).space()
    assert bad in str(err.value) and "\n" not in str(err.value)


# -- the model ----------------------------------------------------------------------------------
def test_every_position_and_normalization_is_causal_with_rank_and_bias(tiny_config):
    torch.manual_seed(0)
    ids = torch.randint(0, tiny_config.vocab_size, (2, 10))
    t = 6
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % tiny_config.vocab_size
    sims = AttentionGene.SIMILARITY_FUNCS
    i = 0
    for position in POSITIONS:
        for norm in AttentionGene.NORMALIZATIONS:
            for rank, abias in ((0, "none"), (4, "rel")):
                values = dict(similarity=sims[i % len(sims)], normalization=norm, position=position,
                              qkv_rank=rank, attn_bias=abias, temperature_mode="adaptive")
                i += 1
                if violation({**AXIS_DEFAULTS, **values}):
                    continue  # kernel forms with a score bias or a non-dot similarity: test_families covers them
                gene = AttentionGene(**values)
                model = TinyTransformer(tiny_config, gene)
                _randomize(model)
                model.eval()
                a, b = model(ids), model(changed)
                assert a.shape == (2, 10, tiny_config.vocab_size)
                assert torch.equal(a[:, :t], b[:, :t]), f"{gene.key} leaks the future"
                assert not torch.equal(a[:, t:], b[:, t:]), f"{gene.key} ignores its input"
                model.train()
                model(ids).logsumexp(-1).mean().backward()
                for name, p in model.named_parameters():
                    assert p.grad is None or torch.isfinite(p.grad).all(), f"{gene.key}: {name}"


@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
def test_non_learned_positions_see_order_through_attention(position, tiny_config):
    """Swapping two earlier tokens changes a later prediction only if the model sees order."""
    gene = AttentionGene(position=position, attention_dropout=0.0)
    torch.manual_seed(1)
    # one layer: the last query then attends to the *set* of earlier tokens (with two layers even
    # a model without positions sees order, through the causal mask)
    model = TinyTransformer(tiny_config.replace(n_layers=1), gene).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    swapped = torch.tensor([[2, 1, 3, 4, 5]])
    same = torch.allclose(model(ids)[0, -1], model(swapped)[0, -1], atol=1e-6)
    assert same == (position == "none")


def test_attention_maps_with_axes(tiny_config):
    model = TinyTransformer(tiny_config, "dot|sparsemax|none|learned|pos=alibi|rank=4|abias=rel")
    maps = model.attention_maps(torch.randint(0, 50, (3, 9)))
    for m in maps:
        assert m.shape == (3, tiny_config.n_heads, 9, 9)
        assert torch.allclose(m.sum(-1), torch.ones(3, tiny_config.n_heads, 9), atol=1e-5)
        assert (m.triu(1) == 0).all()


@pytest.mark.parametrize("key", ["dot|softmax|none|fixed|pos=rope", "dot|softmax|none|learned|pos=rope:linear:2|rank=4",
                                 "cosine|softmax|output_gate|adaptive|pos=alibi", "dot|softmax|none|fixed|abias=rel",
                                 "dot|softmax|highway|adaptive|pos=alibi|abias=rel|nobias|0.00"])
def test_fused_path_equals_plain_path_with_axes(key):
    torch.manual_seed(0)
    attn = EvolvedAttention(32, 4, AttentionGene.parse(key), max_seq_len=16)
    with torch.no_grad():
        for module in (attn.temperature, attn.score_biases):
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.3)
    attn.eval()
    assert attn.can_fuse
    x = torch.randn(2, 7, 32, requires_grad=True)
    params = [x] + list(attn.score_biases.parameters())
    fused = attn(x)
    g_fused = torch.autograd.grad(fused.square().sum(), params)
    attn.fused = False
    plain = attn(x)
    g_plain = torch.autograd.grad(plain.square().sum(), params)
    assert torch.allclose(fused, plain, atol=1e-5)
    for a, b in zip(g_fused, g_plain):
        assert torch.allclose(a, b, atol=1e-4)


def test_parameter_counts():
    cfg = Config()  # 128 dims, 2 layers, 4 heads, 128 positions
    count = lambda key: TinyTransformer(cfg, AttentionGene.parse(key)).num_parameters()
    base = count("dot|softmax|none|fixed")
    d, r, layers, L, H = 128, 16, 2, 128, 4
    # full Q/K/V: 3d^2 + 3d; factorised: d r + r d (q) + d r + 2 r d (kv) + 3d bias
    assert count(f"dot|softmax|none|fixed|rank={r}") == base - layers * (3 * d * d - 5 * d * r)
    assert count(f"dot|softmax|none|fixed|rank={r}") < count("dot|softmax|none|fixed|rank=32") < base
    assert count(f"dot|softmax|none|fixed|nobias|0.10|rank={r}") == count(f"dot|softmax|none|fixed|rank={r}") - layers * 4 * d
    for position in ("rope", "rope:ntk:4", "alibi", "none"):  # no position table
        assert count(f"dot|softmax|none|fixed|pos={position}") == base - L * d
    assert count("dot|softmax|none|fixed|abias=rel") == base + layers * H * L
    model = TinyTransformer(cfg, "dot|softmax|none|fixed|pos=rope")
    assert model.pos_emb is None


def test_per_layer_genes_must_agree_on_absolute_positions(tiny_config):
    with pytest.raises(ValueError, match="mix position=learned"):
        TinyTransformer(tiny_config, ["dot|softmax|none|fixed", "dot|softmax|none|fixed|pos=rope"])
    model = TinyTransformer(tiny_config, ["dot|softmax|none|fixed|pos=rope", "dot|softmax|none|fixed|pos=alibi"])
    assert model.pos_emb is None
    assert torch.isfinite(model(torch.randint(0, 50, (1, 8)))).all()


def test_rope_needs_an_even_head_dimension():
    with pytest.raises(ValueError, match="even head dimension"):
        EvolvedAttention(12, 4, "dot|softmax|none|fixed|pos=rope")


def test_relative_bias_needs_max_seq_len_and_fits_it():
    with pytest.raises(ValueError, match="max_seq_len"):
        EvolvedAttention(16, 2, "dot|softmax|none|fixed|abias=rel")
    bias = RelativeBias(2, 8)
    with pytest.raises(ValueError, match="longer than"):
        bias(9)


def test_saved_model_with_axes_loads_back(tmp_path, tiny_config):
    from evo_attention.train.saving import load_model, save_model

    model = TinyTransformer(tiny_config, "dot|softmax|none|fixed|pos=rope:linear:2|rank=4|abias=rel").eval()
    _randomize(model)
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m")
    ids = torch.randint(0, 50, (1, 8))
    assert torch.equal(model(ids), again(ids))


# -- the position maths -------------------------------------------------------------------------
@pytest.mark.parametrize("position", ["rope", "rope:linear:2", "rope:ntk:4"])
def test_rope_scores_depend_only_on_the_offset(position):
    torch.manual_seed(0)
    rotary = Rotary(16, parse_position(position))
    t = 12
    q = torch.randn(16).expand(1, 1, t, 16)  # equal content at every position
    k = torch.randn(16).expand(1, 1, t, 16)
    rq, rk = rotary(q, k)
    scores = (rq @ rk.transpose(-2, -1))[0, 0]
    for offset in range(-t + 1, t):
        diagonal = torch.diagonal(scores, offset=-offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-4), offset
    assert not torch.allclose(scores[5, 5], scores[5, 2])  # but it does depend on the offset
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5)  # a rotation


def test_rope_scaling_changes_the_frequencies():
    plain, linear, ntk = (Rotary(16, parse_position(p)) for p in ("rope", "rope:linear:2", "rope:ntk:4"))
    t = 10
    assert torch.allclose(linear.angles(t), plain.angles(t) / 2)
    a, b = plain.angles(t), ntk.angles(t)
    assert torch.allclose(a[:, 0], b[:, 0])  # the fastest rotation is kept
    assert torch.allclose(b[:, -1], a[:, -1] / 4, rtol=1e-4)  # the slowest one slows down by the factor


def test_alibi_slopes_and_bias():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    assert torch.allclose(alibi_slopes(4), torch.tensor([2.0 ** -i for i in (2, 4, 6, 8)]))
    assert torch.allclose(alibi_slopes(6), torch.tensor([2.0 ** -i for i in (2, 4, 6, 8, 1, 3)]))
    bias = ALiBi(4)(5)
    assert bias.shape == (4, 5, 5)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                expected = -slopes[h] * (i - j) if j <= i else 0.0
                assert math.isclose(float(bias[h, i, j]), float(expected), abs_tol=1e-6)


def test_relative_bias_is_one_scalar_per_head_and_offset():
    bias = RelativeBias(3, 8)
    with torch.no_grad():
        bias.table.copy_(torch.arange(24, dtype=torch.float32).view(3, 8))
    b = bias(6).detach()
    assert b.shape == (3, 6, 6)
    assert float(b[1, 4, 1]) == 8 + 3 and float(b[2, 5, 5]) == 16
    assert sum(p.numel() for p in bias.parameters()) == 3 * 8


# -- window and kv_heads -----------------------------------------------------------------------------
def test_window_and_kv_heads_keys_and_bad_values():
    g = AttentionGene.parse("dot|softmax|none|fixed|kvh=1|win=16")
    assert g.key == "dot|softmax|none|fixed|bias|0.10|win=16|kvh=1" and (g.window, g.kv_heads) == (16, 1)
    assert AttentionGene.parse("dot|softmax|none|fixed|win=0|kvh=0") == AttentionGene.parse("dot|softmax|none|fixed")
    for text, fragment in (("win=-1", "window '-1' is not a non-negative integer"), ("kvh=x", "kv_heads 'x'"),
                           (f"win={10**20}", "window '100000000000000000000' is too large")):
        with pytest.raises(ValueError, match=fragment):
            AttentionGene.parse(f"dot|softmax|none|fixed|{text}")
    with pytest.raises(ValueError, match="kv_heads 3 does not divide the 4 heads"):
        EvolvedAttention(16, 4, "dot|softmax|none|fixed|kvh=3")
    with pytest.raises(ValueError, match="kv_heads 3 in the search space does not divide"):
        Config(n_heads=4, d_model=16, search_space={"kv_heads": [0, 3]}).space()
    with pytest.warns(UserWarning, match="window 128 is at least max_seq_len 128: it is full attention"):
        Config(search_space={"window": [0, 128]}).space()


@pytest.mark.parametrize("window, kv_heads", [(0, 1), (0, 2), (3, 0), (3, 1), (1, 2)])
def test_every_component_is_causal_with_a_window_and_grouped_heads(window, kv_heads, tiny_config):
    config = tiny_config.replace(n_heads=4, d_model=16)
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (2, 10))
    t = 6
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % config.vocab_size
    for sim in AttentionGene.SIMILARITY_FUNCS:
        for norm in AttentionGene.NORMALIZATIONS:
            values = dict(similarity=sim, normalization=norm, temperature_mode="adaptive", gating="output_gate",
                          window=window, kv_heads=kv_heads, attn_bias="rel", position="rope")
            if violation(values | {"attn_bias": "none"}):
                continue  # a kernel normalization needs a dot-product similarity
            if violation(values):
                values["attn_bias"] = "none"  # and admits no score bias
            gene = AttentionGene(**values)
            model = TinyTransformer(config, gene)
            _randomize(model)
            model.eval()
            a, b = model(ids), model(changed)
            assert torch.equal(a[:, :t], b[:, :t]), f"{gene.key} leaks the future"
            for weights in model.attention_maps(ids):  # exactly zero outside the causal window
                i, j = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
                outside = (j > i) | ((i - j >= window) if window else torch.zeros_like(i, dtype=torch.bool))
                assert (weights[..., outside] == 0).all(), gene.key
            model.train()
            model(ids).logsumexp(-1).mean().backward()
            for name, p in model.named_parameters():
                assert p.grad is None or torch.isfinite(p.grad).all(), f"{gene.key}: {name}"


@pytest.mark.parametrize("key", ["dot|softmax|none|fixed|bias|0.00|win=4", "dot|softmax|none|fixed|bias|0.00|kvh=2",
                                 "cosine|softmax|none|learned|bias|0.00|win=3|kvh=1|pos=alibi|abias=rel|rank=8"])
def test_window_and_grouped_heads_fused_equals_plain(key):
    torch.manual_seed(1)
    fused = EvolvedAttention(32, 4, key, max_seq_len=16).double().eval()
    plain = EvolvedAttention(32, 4, key, max_seq_len=16, fused=False).double().eval()
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    assert fused.can_fuse and torch.allclose(fused(x), plain(x), atol=1e-6)


def test_grouped_heads_cut_the_projection_and_equal_repeated_full_heads():
    d, h = 32, 4
    full = EvolvedAttention(d, h, "dot|softmax|none|fixed|bias|0.00")
    mqa = EvolvedAttention(d, h, "dot|softmax|none|fixed|bias|0.00|kvh=1")
    gqa = EvolvedAttention(d, h, "dot|softmax|none|fixed|bias|0.00|kvh=2")
    count = lambda m: sum(p.numel() for p in m.qkv.parameters())  # noqa: E731
    assert count(full) == 3 * d * d + 3 * d
    assert count(mqa) == d * d + 2 * d * (d // h) + d + 2 * (d // h)
    assert count(gqa) == d * d + 2 * d * (2 * d // h) + d + 2 * (2 * d // h)
    # multi-query attention is full attention whose K/V heads are all equal: copy the one head into each
    with torch.no_grad():
        w, b = mqa.qkv.weight, mqa.qkv.bias
        dh = d // h
        full.qkv.weight.copy_(torch.cat([w[:d]] + [w[d:d + dh]] * h + [w[d + dh:]] * h))
        full.qkv.bias.copy_(torch.cat([b[:d]] + [b[d:d + dh]] * h + [b[d + dh:]] * h))
        full.out.load_state_dict(mqa.out.state_dict())
    x = torch.randn(2, 7, d)
    assert torch.allclose(full.eval()(x), mqa.eval()(x), atol=1e-5)
