import itertools
import re

import pytest
import torch

from evo_attention import AttentionGene, EvolvedAttention, TinyTransformer, components
from evo_attention.nn.spec import ModelSpec
from evo_attention.genes import AXIS_DEFAULTS, CATEGORICAL_FIELDS, violation


def every_gene():
    """All valid combinations of the four categorical components (bias and dropout vary along)."""
    options = [AttentionGene.SIMILARITY_FUNCS, AttentionGene.NORMALIZATIONS, AttentionGene.GATING,
               AttentionGene.TEMPERATURE_MODES]
    for i, combo in enumerate(itertools.product(*options)):
        values = {**dict(zip(CATEGORICAL_FIELDS, combo)), "use_bias": i % 2 == 0, "attention_dropout": 0.1}
        if violation({**AXIS_DEFAULTS, **values}) is None:
            yield AttentionGene(gene_dict=values)


def _randomize_component_params(model):
    """Zero-initialised component weights (adaptive temperature) would hide a causality leak."""
    g = torch.Generator().manual_seed(0)
    for block in model.blocks:
        for module in (block.attn.temperature, block.attn.gating, block.attn.similarity):
            for p in module.parameters():
                with torch.no_grad():
                    p.add_(torch.randn(p.shape, generator=g) * 0.5)


def test_every_gene_is_causal_and_finite(tiny_config):
    genes = list(every_gene())
    # 2 kernel normalizations need one of the 2 dot-product similarities
    assert len(genes) == 4 * 5 * 4 * 3 + 2 * 2 * 4 * 3
    torch.manual_seed(0)
    ids = torch.randint(0, tiny_config.vocab_size, (2, 10))
    t = 6
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % tiny_config.vocab_size
    for gene in genes:
        model = TinyTransformer(tiny_config, gene)
        _randomize_component_params(model)
        model.eval()
        a, b = model(ids), model(changed)
        assert torch.equal(a[:, :t], b[:, :t]), f"{gene.key} leaks the future"
        assert not torch.equal(a[:, t:], b[:, t:]), f"{gene.key} ignores its input"
        model.train()
        logits = model(ids)
        assert torch.isfinite(logits).all(), gene.key
        logits.logsumexp(-1).mean().backward()
        for name, p in model.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), f"{gene.key}: {name}"


def test_gradient_never_flows_from_the_future(tiny_config):
    """d logits[:, i] / d embedding[:, j] == 0 for j > i, for a sample of genes in training mode."""
    for key in ["dot|softmax|none|adaptive", "additive|sparsemax|highway|learned", "cosine|entmax15|input_gate|adaptive",
                "multiplicative|sigmoid|output_gate|fixed", "dot|relu_norm|highway|adaptive"]:
        model = TinyTransformer(tiny_config, AttentionGene.parse(key).replace(attention_dropout=0.0))
        _randomize_component_params(model)
        x = torch.randn(1, 8, tiny_config.d_model, requires_grad=True)
        h = x
        for block in model.blocks:
            h, _ = block(h)
        h[0, 3].sum().backward()
        assert (x.grad[0, 4:] == 0).all(), key
        assert (x.grad[0, :4] != 0).any(), key


@pytest.mark.parametrize("key", ["dot|softmax|none|fixed", "dot|softmax|output_gate|learned",
                                 "cosine|softmax|highway|adaptive", "dot|softmax|input_gate|adaptive|nobias|0.00"])
def test_fused_kernel_path_equals_plain_path(key):
    torch.manual_seed(0)
    attn = EvolvedAttention(32, 4, AttentionGene.parse(key))
    with torch.no_grad():
        for p in attn.temperature.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    attn.eval()
    assert attn.can_fuse
    x = torch.randn(2, 7, 32, requires_grad=True)
    fused = attn(x)
    g_fused = torch.autograd.grad(fused.square().sum(), x)[0]
    attn.fused = False
    plain = attn(x)
    g_plain = torch.autograd.grad(plain.square().sum(), x)[0]
    assert torch.allclose(fused, plain, atol=1e-5)
    assert torch.allclose(g_fused, g_plain, atol=1e-4)


def test_attention_mask_combines_with_causal():
    attn = EvolvedAttention(16, 2, AttentionGene.parse("dot|sparsemax|none|fixed"))
    attn.eval()
    x = torch.randn(1, 5, 16)
    key_mask = torch.tensor([[False, True, True, True, True]])
    _, w = attn(x, mask=key_mask, need_weights=True)
    assert (w[..., 0] == 0)[..., 1:].all()
    assert (w.triu(1) == 0).all()
    assert (w[0, :, 0] == 0).all()  # query 0 may see only key 0, which is masked: an all-zero row


@pytest.mark.parametrize("program", [
    "o(mix(w.softmax(s.dot(q,k)),shift(v)))", "o(mix(w.softmax(s.dot(dconv3(q),k)),v))",
    "o(mix(w.softmax(s.dot(q,k)),decay(v)))", "o(kmix(elu1(q),elu1(cumsum(k)),v))",
    "o(mix(w.softmax(s.dot(q,k)),cummean(v)))"])
def test_a_key_mask_keeps_masked_positions_from_ops_along_time(program):
    """An op along time reads other positions' values, which zero weights do not stop: a row padded
    before its positions gives what it gives alone (a padded position moves nothing), one padded after
    them needs nothing, and masked keys between allowed ones are refused, naming program and op."""
    torch.manual_seed(0)
    attn = EvolvedAttention(16, 2, f"prog={program}|nobias|0.00|pos=rope").eval()
    with torch.no_grad():
        for p in attn.program.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # a convolution away from its identity start
        x = torch.randn(2, 6, 16)
        mask = torch.ones(2, 6, dtype=torch.bool)
        mask[0, :2] = mask[1, 5] = False  # row 0 padded on the left, row 1 on the right
        out, weights = attn(x, mask=mask), attn(x, mask=mask, need_weights=True)[1]
        moved = x.clone()
        moved[0, :2] += 5.0
        torch.testing.assert_close(out[0, 2:], attn(x[:1, 2:])[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(out[1, :5], attn(x[1:, :5])[0], rtol=0, atol=1e-6)
        assert torch.equal(attn(moved, mask=mask)[0, 2:], out[0, 2:])
        assert (weights[0, ..., :2] == 0).all() and (weights[1, ..., 5] == 0).all()
        mask[0, 3] = False
        with pytest.raises(ValueError, match=rf"program {re.escape(program)} reads .* through \w+.*one at"):
            attn(x, mask=mask)
        attn = EvolvedAttention(16, 2, "prog=o(mix(w.softmax(s.dot(q,k)),v))|nobias|0.00").eval()
        assert (attn(x, mask=mask, need_weights=True)[1][0, ..., 3] == 0).all()  # no op along time: zero weight


def test_attention_maps_shapes_and_rows(tiny_config):
    model = TinyTransformer(tiny_config, AttentionGene.parse("dot|sparsemax|output_gate|learned"))
    ids = torch.randint(0, tiny_config.vocab_size, (3, 9))
    maps = model.attention_maps(ids)
    assert len(maps) == tiny_config.n_layers
    for m in maps:
        assert m.shape == (3, tiny_config.n_heads, 9, 9)
        assert torch.allclose(m.sum(-1), torch.ones(3, tiny_config.n_heads, 9), atol=1e-5)
        assert (m.triu(1) == 0).all()
    assert model.training  # restored


def test_per_layer_genes(tiny_config):
    genes = [AttentionGene.parse("dot|softmax|none|fixed"), AttentionGene.parse("additive|entmax15|highway|adaptive")]
    model = TinyTransformer(tiny_config, genes)
    assert [b.attn.gene for b in model.blocks] == genes
    assert torch.isfinite(model(torch.randint(0, 50, (1, 8)))).all()
    with pytest.raises(ValueError, match="3 genes for 2 layers"):
        TinyTransformer(tiny_config, genes + genes[:1])


def test_default_parameter_count_is_about_1_69M():
    model = TinyTransformer(ModelSpec(), AttentionGene.vanilla())
    # 10000x128 tied embedding + 128x128 positions + 2 x 198,272 per layer + final LayerNorm
    assert model.num_parameters() == 1_693_184


def test_parameter_counts_of_components():
    base = TinyTransformer(ModelSpec(), AttentionGene.vanilla()).num_parameters()
    count = lambda key: TinyTransformer(ModelSpec(), AttentionGene.parse(key)).num_parameters()
    assert count("dot|softmax|none|fixed|nobias|0.10") == base - 2 * (3 * 128 + 128)
    assert count("dot|softmax|output_gate|fixed") == base + 2 * (128 * 128 + 128)
    assert count("dot|softmax|none|learned") == base + 2 * 4
    assert count("dot|softmax|none|adaptive") == base + 2 * (128 * 4 + 4)
    assert count("additive|softmax|none|fixed") == base + 2 * (2 * 4 * 32 * 32 + 4 * 32)


def test_too_long_input_is_a_clear_error(tiny_config):
    model = TinyTransformer(tiny_config, AttentionGene.vanilla())
    with pytest.raises(ValueError, match="longer than max_seq_len 12"):
        model(torch.zeros(1, 13, dtype=torch.long))


@pytest.fixture
def squared_relu():
    @components.register_normalization("squared_relu")
    def squared_relu(scores, mask):
        return components.row_normalize(torch.relu(scores.float()) ** 2, mask).to(scores.dtype)

    yield "squared_relu"
    components.unregister("normalization", "squared_relu")


def test_custom_component_joins_the_search_space_and_trains_a_step(squared_relu, tiny_config):
    import random

    assert "squared_relu" in AttentionGene.NORMALIZATIONS
    rng = random.Random(0)
    drawn = {AttentionGene(rng=rng).normalization for _ in range(300)}
    assert "squared_relu" in drawn
    gene = AttentionGene.parse("dot|squared_relu|none|fixed")
    model = TinyTransformer(tiny_config, gene)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 50, (4, 12))
    losses = []
    for _ in range(5):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
