"""Incremental decoding with a key/value cache equals full recomputation, for every option."""

import pytest
import torch

from evo_attention.nn.attention import InputCache, KernelState

from evo_attention import Config, TinyTransformer
from evo_attention.nn.decoding import generate, sample
from evo_attention.util.errors import UserError

CONFIG = Config(vocab_size=30, d_model=16, n_heads=4, n_layers=2, max_seq_len=12, dropout=0.1)


def random_model(gene: str, seed: int = 0) -> TinyTransformer:
    """A float64 model whose every parameter is random: zero-initialised ones (relative bias,
    adaptive temperature) would hide a wrong offset."""
    torch.manual_seed(seed)
    model = TinyTransformer(CONFIG, gene).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


def test_cached_decoding_equals_recomputation_for_every_option(covering_genes):
    ids = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.max_seq_len), generator=torch.Generator().manual_seed(1))
    for gene in covering_genes():
        model = random_model(gene)
        with torch.no_grad():
            full = model(ids)
            caches = model.new_caches()
            parts = [model.decode(ids[:, :3], caches), model.decode(ids[:, 3:5], caches)]  # prefill, a chunk
            parts += [model.decode(ids[:, i:i + 1], caches) for i in range(5, ids.shape[1])]  # one at a time
        assert caches[0].length == ids.shape[1]
        torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-10, msg=gene)
        if isinstance(caches[0], KernelState):  # the recurrent form: sums of a fixed size, whatever the length
            d_head = CONFIG.d_model // CONFIG.n_heads
            assert caches[0].s.shape[::2] == (2, caches[0].z.shape[-1]) and caches[0].s.shape[-1] == d_head
        elif isinstance(caches[0], InputCache):  # a program: the inputs so far
            assert caches[0].x.shape == (2, ids.shape[1], CONFIG.d_model)
        else:  # grouped K/V heads are stored once
            assert model.blocks[0].attn.kv_heads * CONFIG.d_model // CONFIG.n_heads == caches[0].k.shape[1] * caches[0].k.shape[3]
    assert any(isinstance(c, KernelState) for gene in covering_genes() for c in random_model(gene).new_caches())


def test_decoding_runs_the_forward_passes_own_score_bias_and_weighing(monkeypatch):
    """One implementation: decode evaluates the gene's program, taking its bias from score_bias and
    weighing with the registered normalization, as forward does."""
    from evo_attention.nn import components
    from evo_attention.nn.attention import EvolvedAttention

    calls = []
    score_bias = EvolvedAttention.score_bias
    sparsemax = components.NORMALIZATIONS["sparsemax"]

    def counted_bias(self, *args, **kwargs):
        calls.append("score_bias")
        return score_bias(self, *args, **kwargs)

    def counted_sparsemax(scores, mask):
        calls.append("sparsemax")
        return sparsemax(scores, mask)

    monkeypatch.setattr(EvolvedAttention, "score_bias", counted_bias)
    monkeypatch.setitem(components.NORMALIZATIONS, "sparsemax", counted_sparsemax)
    model = random_model("dot|sparsemax|none|fixed|pos=alibi|abias=rel", seed=1)
    ids = torch.randint(0, CONFIG.vocab_size, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.decode(ids, model.new_caches())
    assert calls.count("score_bias") == CONFIG.n_layers and calls.count("sparsemax") == CONFIG.n_layers


def test_the_cache_refuses_to_grow_past_the_window():
    model = random_model("dot|softmax|none|fixed|pos=rope")
    caches = model.new_caches()
    model.decode(torch.zeros(1, CONFIG.max_seq_len, dtype=torch.long), caches)
    with pytest.raises(UserError, match="longer than max_seq_len"):
        model.decode(torch.zeros(1, 1, dtype=torch.long), caches)


@pytest.mark.parametrize("gene", ["dot|sparsemax|highway|adaptive|pos=alibi|abias=rel|win=5|kvh=2",
                                  "additive|entmax15|input_gate|learned|pos=learned|rank=4"])
def test_generation_with_the_cache_equals_generation_without(gene):
    model = random_model(gene)
    prompt = [3, 1, 4, 1, 5]
    for temperature, top_k in ((0.0, None), (1.0, 5)):  # greedy, then sampled; past the 12-token window
        runs = [generate(model, prompt, 15, temperature=temperature, top_k=top_k,
                         generator=torch.Generator().manual_seed(7), use_cache=cached) for cached in (True, False)]
        assert runs[0] == runs[1] and len(runs[0]) == 15


def test_sampling_rules():
    logits = torch.tensor([0.0, 5.0, 1.0, 4.0])
    assert sample(logits, 0.0) == 1
    drawn = {sample(logits, 1.0, top_k=2, generator=torch.Generator().manual_seed(s)) for s in range(40)}
    assert drawn == {1, 3}  # only the two most likely tokens
    for tiny in (1e-45, 1e-320):  # a tiny positive temperature is the arg max, never an overflow to inf / inf
        assert sample(logits * 100, tiny, generator=torch.Generator().manual_seed(0)) == 1
    model = random_model("dot|softmax|none|fixed")
    for kwargs, setting in (({"temperature": -1.0}, "temperature"), ({"temperature": float("nan")}, "temperature"),
                            ({"top_k": 0}, "top_k"), ({"top_k": CONFIG.vocab_size + 1}, "top_k")):
        with pytest.raises(UserError) as info:
            generate(model, [1], 2, **kwargs)
        assert info.value.setting == setting


def test_registered_components_and_ops_that_read_earlier_positions_decode_as_the_forward_pass():
    """A causal component or op whose value at a position reads earlier positions (q's running mean
    against k, a running-mean temperature, an input op over x's running sum) cannot decode from a
    cache of each position's own keys: registration finds it and such a program recomputes."""
    from evo_attention import register_op
    from evo_attention.nn import components
    from evo_attention.nn.attention import EvolvedAttention, KVCache
    from evo_attention.nn.program import unregister_op

    def running_mean(z, dim):
        return z.cumsum(dim) / torch.arange(1, z.shape[dim] + 1, dtype=z.dtype).view(-1, *[1] * (-dim - 1))

    class CumQ(components.Similarity):
        def forward(self, q, k):
            return running_mean(q, -2) @ k.transpose(-2, -1)

    class RunTemp(torch.nn.Module):
        def __init__(self, d_model, n_heads, d_head):
            super().__init__()

        def forward(self, x):
            return (1 + running_mean(x.abs().mean(-1), -1))[:, None, :, None]

    class Back40(torch.nn.Module):  # reads x 40 positions back alone: beyond the 33-position probes
        def __init__(self, d_model, n_heads, d_head):
            super().__init__()

        def forward(self, x):
            return (1 + torch.nn.functional.pad(x, (0, 0, 40, 0))[:, :x.shape[1]].abs().mean(-1))[:, None, :, None]

    class KeyNorm(components.Similarity):  # per position: query i, key j alone
        def forward(self, q, k):
            return q @ k.transpose(-2, -1) - 0.5 * k.square().sum(-1).unsqueeze(-2)

    components.register_similarity("cumq_probe")(CumQ)
    components.register_similarity("keynorm_probe")(KeyNorm)
    components.register_temperature("runtemp_probe")(RunTemp)
    components.register_temperature("back40_probe")(Back40)
    register_op("xrun_probe", "X->X", "learned", apply=lambda call, z: running_mean(z, -2))
    try:
        x = torch.randn(2, 48, 16, generator=torch.Generator().manual_seed(0))
        for gene, cached in (("cumq_probe|softmax|none|fixed", False), ("dot|softmax|none|runtemp_probe", False),
                             ("dot|softmax|none|back40_probe", False),
                             ("prog=o(mix(w.softmax(t.fixed(s.cumq_probe(q,k))),v))", False),
                             ("prog=pin(xrun_probe(x),o(mix(w.softmax(s.dot(q,k)),v)))", False),
                             ("keynorm_probe|softmax|none|fixed", True)):
            torch.manual_seed(0)
            attn = EvolvedAttention(16, 2, gene, max_seq_len=48).eval()
            with torch.no_grad():
                full, cache = attn(x), attn.new_cache()
                rows = torch.cat([attn.decode(x[:, :3], cache)] + [attn.decode(x[:, i:i + 1], cache)
                                                                   for i in range(3, 48)], 1)
            assert isinstance(cache, KVCache) == cached, gene
            torch.testing.assert_close(rows, full, rtol=0, atol=1e-6, msg=gene)
    finally:
        for kind, name in (("similarity", "cumq_probe"), ("similarity", "keynorm_probe"),
                           ("temperature_mode", "runtemp_probe"), ("temperature_mode", "back40_probe")):
            components.unregister(kind, name)
        unregister_op("xrun_probe")
    assert not components.ACROSS_POSITIONS & {"s.cumq_probe", "t.runtemp_probe", "t.back40_probe", "xrun_probe"}
