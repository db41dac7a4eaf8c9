"""The efficient attention families: linear and FAVOR+ kernels, blockwise sliding windows, validity."""

import random

import pytest
import torch

from evo_attention import AttentionGene, Config, EvolvedAttention, SearchSpace, TinyTransformer
from evo_attention.genes import violation
from evo_attention.nn import components

KERNELS = ["linear", "favor"]


def _perturbed(attn: EvolvedAttention, scale: float = 0.3) -> EvolvedAttention:
    """Zero-initialised parameters (adaptive temperature) would hide a leak or a wrong gradient."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return attn


@pytest.mark.parametrize("norm", KERNELS)
@pytest.mark.parametrize("extra", ["", "|pos=rope|kvh=2", "|pos=none|rank=8"])
def test_running_sum_equals_the_quadratic_form_with_gradients(norm, extra, monkeypatch):
    """Several chunks (T=23 in chunks of 4, the last one padded) against the explicit weights."""
    monkeypatch.setattr(components, "KERNEL_CHUNK", 4)
    torch.manual_seed(0)
    key = f"cosine|{norm}|output_gate|adaptive|bias|0.00{extra}" if norm == "favor" else f"dot|{norm}|none|adaptive|bias|0.00{extra}"
    attn = _perturbed(EvolvedAttention(32, 4, key, kernel_features=16).double().eval())
    x = torch.randn(2, 23, 32, dtype=torch.float64, requires_grad=True)
    fast = attn(x)
    g_fast = torch.autograd.grad(fast.square().sum(), [x] + list(attn.parameters()), allow_unused=True)
    slow, weights = attn(x, need_weights=True)  # the [T, T] form
    g_slow = torch.autograd.grad(slow.square().sum(), [x] + list(attn.parameters()), allow_unused=True)
    assert torch.allclose(fast, slow, atol=1e-10, rtol=0)
    for a, b in zip(g_fast, g_slow):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-9, rtol=0))
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 23, dtype=torch.float64))
    assert (weights.triu(1) == 0).all() and (weights >= 0).all()


def test_linear_weights_are_elu_plus_one_feature_products():
    torch.manual_seed(0)
    attn = EvolvedAttention(16, 2, "dot|linear|none|fixed|nobias|0.00").double().eval()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    _, weights = attn(x, need_weights=True)
    q, k, _ = attn.project(x)
    s = 8 ** 0.25  # d_head 8
    phi = lambda z: torch.nn.functional.elu(z) + 1
    raw = (phi(q * s / 8 ** 0.5) @ phi(k / s).transpose(-2, -1)).tril()
    assert torch.allclose(weights, raw / raw.sum(-1, keepdim=True), atol=1e-12)


def test_favor_converges_to_softmax_attention_as_features_grow():
    """The estimate is random: its error against exact softmax shrinks with the feature count."""
    torch.manual_seed(0)
    d, t = 16, 12
    q, k = torch.randn(1, 1, t, d, dtype=torch.float64) * 0.5, torch.randn(1, 1, t, d, dtype=torch.float64) * 0.5
    exact = torch.softmax((q @ k.transpose(-2, -1) / d ** 0.5).masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf")), -1)
    errors = []
    for m in (4, 64, 1024, 16384):
        torch.manual_seed(1)
        kernel = components.FavorKernel(d, 1, m).double()
        s = d ** 0.25
        phi_q, phi_k = kernel.feature_maps(q * s / d ** 0.5, k / s)
        approx = components.kernel_weights(phi_q, phi_k, torch.ones(t, t).tril().bool())
        errors.append((approx - exact).abs().max().item())
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert errors[-1] < 0.05


def test_favor_features_come_from_the_seed_and_are_saved():
    def build(seed):
        torch.manual_seed(seed)
        return EvolvedAttention(32, 4, "dot|favor|none|fixed", kernel_features=8)

    a, b, c = build(1), build(1), build(2)
    assert a.kernel.features.shape == (4, 8, 8)
    assert torch.equal(a.kernel.features, b.kernel.features)
    assert not torch.equal(a.kernel.features, c.kernel.features)
    assert "kernel.features" in a.state_dict()
    # orthogonal within a block of d_head rows
    w = a.kernel.features[0]
    directions = w / w.norm(dim=1, keepdim=True)
    assert torch.allclose(directions @ directions.T, torch.eye(8), atol=1e-5)


def test_favor_extreme_inputs_stay_finite():
    torch.manual_seed(0)
    attn = EvolvedAttention(32, 4, "dot|favor|none|fixed|bias|0.00").eval()
    x = torch.randn(2, 40, 32) * 200.0
    x.requires_grad_(True)
    y = attn(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("norm", KERNELS)
def test_kernel_families_are_causal_across_chunks_and_in_training(norm, tiny_config, monkeypatch):
    monkeypatch.setattr(components, "KERNEL_CHUNK", 4)
    config = tiny_config.replace(n_heads=4, d_model=16, max_seq_len=32)
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (2, 19))
    for t in (2, 9, 17):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % config.vocab_size
        for key in (f"dot|{norm}|highway|adaptive|bias|0.00|pos=rope|kvh=1", f"cosine|{norm}|input_gate|learned|bias|0.20",
                    f"dot|{norm}|output_gate|adaptive|nobias|0.00|win=3|rank=4"):
            model = TinyTransformer(config, key)
            for block in model.blocks:
                _perturbed(block.attn, 0.5)
            model.eval()
            a, b = model(ids), model(changed)
            assert torch.equal(a[:, :t], b[:, :t]), f"{key} leaks the future at {t}"
            assert not torch.equal(a[:, t:], b[:, t:]), key
    model.train()  # attention dropout 0.2 in training: the explicit form
    x = torch.randn(1, 12, 16, requires_grad=True)
    h = x
    for block in TinyTransformer(config, f"dot|{norm}|none|adaptive|bias|0.20").blocks:
        h, _ = block(h)
    h[0, 5].sum().backward()
    assert (x.grad[0, 6:] == 0).all() and (x.grad[0, :6] != 0).any()


def test_kernel_path_runs_in_float32_under_bf16_autocast():
    torch.manual_seed(0)
    attn = EvolvedAttention(32, 4, "dot|linear|none|fixed|bias|0.00").eval()
    x = torch.randn(2, 70, 32)
    exact = attn(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = attn(x)
    assert torch.isfinite(low).all()
    assert (low.float() - exact).abs().max() < 0.05


@pytest.mark.parametrize("gene", ["dot|linear|none|fixed", "dot|favor|none|fixed|win=4",
                                  "prog=o(tanh(kmix(elu1(q),elu1(k),v)))"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_kernel_gene_runs_in_a_model_cast_to_half_precision(gene, dtype):
    """Without autocast the kernel's float32 sums return in the model's dtype (a bf16 or fp16 model,
    e.g. a Hugging Face export loaded so): forward and decoding both run and stay close."""
    from evo_attention.nn.decoding import generate

    torch.manual_seed(0)
    model = TinyTransformer(Config(d_model=16, n_heads=2, n_layers=1, vocab_size=32, max_seq_len=16), gene).eval()
    ids = torch.randint(0, 32, (2, 9))
    exact = model(ids)
    low = model.to(dtype)(ids)
    assert low.dtype == dtype and (low.float() - exact).abs().max() < 0.05
    assert len(generate(model, [1, 2, 3], 5, temperature=0)) == 5


def test_an_elementwise_program_in_a_model_cast_to_fp16_stays_finite():
    """Its intermediates are computed in float32 (sdiv's b * b overflows fp16 at |b| = 1e4)."""
    torch.manual_seed(0)
    attn = EvolvedAttention(16, 2, "prog=o(sdiv(v,exp(v)))")
    with torch.no_grad():
        attn.qkv.weight.mul_(10)
    x = torch.randn(2, 12, 16)
    exact = attn(x)
    low = attn.half()(x.half())
    assert torch.isfinite(low).all() and (low.float() - exact).abs().max() < 0.05


# -- sliding windows in blocks --------------------------------------------------------------------
@pytest.mark.parametrize("key", [
    "dot|softmax|none|fixed|bias|0.00|win=4",
    "additive|sparsemax|highway|adaptive|bias|0.00|win=5|pos=alibi|abias=rel",
    "multiplicative|entmax15|none|adaptive|bias|0.00|win=3|abias=rel|kvh=2",
    "cosine|relu_norm|input_gate|learned|bias|0.00|win=6|pos=rope",
    "dot|sigmoid|output_gate|adaptive|bias|0.00|win=2|pos=none|rank=8",
    "dot|linear|none|adaptive|bias|0.00|win=4",
    "cosine|favor|none|fixed|bias|0.00|win=5|pos=rope",
])
def test_blockwise_window_equals_the_masked_full_form(key):
    """T=29 (not a multiple of W, so the last block is padded) against the [T, T] masked form."""
    torch.manual_seed(0)
    attn = _perturbed(EvolvedAttention(32, 4, key, max_seq_len=32, fused=False, kernel_features=8).double().eval())
    x = torch.randn(2, 29, 32, dtype=torch.float64, requires_grad=True)
    banded = attn(x)
    g_banded = torch.autograd.grad(banded.square().sum(), x)[0]
    full, weights = attn(x, need_weights=True)
    g_full = torch.autograd.grad(full.square().sum(), x)[0]
    # the score normalizations work in float32 (sums over rows of other lengths round differently)
    assert torch.allclose(banded, full, atol=1e-6, rtol=0)
    assert (g_banded - g_full).abs().max() <= 1e-5 * g_full.abs().max()
    i, j = torch.meshgrid(torch.arange(29), torch.arange(29), indexing="ij")
    assert (weights[..., (j > i) | (i - j >= attn.window)] == 0).all()
    if attn.can_fuse:
        attn.fused = True
        assert torch.allclose(attn(x), full, atol=1e-5)


def test_blockwise_window_keeps_memory_linear_in_length():
    """At T=512 and W=16 the blocked path never holds a [T, T] tensor: its peak is far below it."""
    torch.manual_seed(0)
    attn = EvolvedAttention(32, 4, "dot|sparsemax|none|fixed|bias|0.00|win=16").eval()
    x = torch.randn(1, 512, 32)
    from torch.profiler import ProfilerActivity, profile

    sizes = {}
    for name, need in (("blocked", False), ("full", True)):
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            attn(x, need_weights=need)
        sizes[name] = max(e.cpu_memory_usage for e in prof.key_averages())
    assert sizes["blocked"] * 4 < sizes["full"]


# -- validity -------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, rule", [
    ("additive|linear|none|fixed", "kernel-needs-dot-similarity"),
    ("multiplicative|favor|none|fixed", "kernel-needs-dot-similarity"),
    ("dot|favor|none|fixed|pos=alibi", "kernel-has-no-score-bias"),
    ("cosine|linear|none|fixed|abias=rel", "kernel-has-no-score-bias"),
])
def test_invalid_genes_are_refused_naming_the_rule(key, rule):
    with pytest.raises(ValueError) as err:
        AttentionGene.parse(key)
    assert rule in str(err.value) and "\n" not in str(err.value)


def test_search_never_proposes_an_invalid_gene_and_stays_deterministic():
    space = SearchSpace(normalization=("softmax", "linear", "favor"), position=("learned", "alibi"),
                        attn_bias=("none", "rel"))

    def run(seed):
        rng = random.Random(seed)
        genes = [AttentionGene.random(rng, space) for _ in range(40)]
        for _ in range(60):
            a, b = rng.choice(genes), rng.choice(genes)
            genes.append(a.crossover(b, rng).mutate(0.5, rng, space))
        return genes

    genes = run(7)
    assert all(violation(g.to_dict()) is None for g in genes)
    assert {g.normalization for g in genes} == {"softmax", "linear", "favor"}
    assert [g.key for g in genes] == [g.key for g in run(7)]


def test_a_space_with_no_valid_gene_is_a_one_line_error():
    with pytest.raises(ValueError) as err:
        Config(search_space={"similarity": ["additive"], "normalization": ["linear"]}).space()
    assert "no valid gene" in str(err.value) and "kernel-needs-dot-similarity" in str(err.value)


def test_zero_favor_features_is_refused():
    with pytest.raises(ValueError, match="favor_features must be a positive integer"):
        Config(favor_features=0)


# -- per-layer genomes ---------------------------------------------------------------------------
PER_LAYER = dict(data="recall", vocab_size=16, max_seq_len=16,
                 recall={"num_pairs": 2, "num_queries": 2, "train_examples": 128, "eval_examples": 32},
                 d_model=16, n_heads=2, n_layers=2, dropout=0.0, batch_size=8, eval_batch_size=32, eval_steps=None,
                 learning_rate=3e-3, train_steps=3, log_every=3, population_size=4, n_generations=2, elite_size=1,
                 genome="per_layer", search_space={"position": ["learned", "rope"]})


def test_per_layer_genome_keys_operators_and_rule():
    from evo_attention.genes import LayerGenes

    genome = AttentionGene.parse("dot|softmax|none|fixed / cosine|linear|output_gate|learned")
    assert isinstance(genome, LayerGenes) and len(genome.layers) == 2
    assert genome.key == "dot|softmax|none|fixed|bias|0.10 / cosine|linear|output_gate|learned|bias|0.10"
    assert AttentionGene.parse(genome.key) == genome
    space = Config(**PER_LAYER).space()
    assert space.layers == 2
    rng = random.Random(0)
    genomes = [space.random(rng) for _ in range(30)]
    children = [a.crossover(b, rng).mutate(0.4, rng, space) for a, b in zip(genomes, genomes[1:])]
    for g in genomes + children:
        assert isinstance(g, LayerGenes) and len(g.layers) == 2
        # the layers agree on absolute positions (learned vs rope), the rule every genome keeps
        assert len({layer.uses_absolute_positions for layer in g.layers}) == 1, g.key
    assert any(g.layers[0] != g.layers[1] for g in genomes)
    # crossover is per layer: each child layer comes from the same layer of a parent, field by field
    a, b = genomes[0], genomes[1]
    child = a.crossover(b, random.Random(5))
    for i, layer in enumerate(child.layers):
        for name, value in layer.to_dict().items():
            assert value in (getattr(a.layers[i], name), getattr(b.layers[i], name))
    with pytest.raises(ValueError, match="layers-share-absolute-positions"):
        AttentionGene.parse("dot|softmax|none|fixed / dot|softmax|none|fixed|pos=rope")
    with pytest.raises(ValueError, match="got 3 genes for 2 layers"):
        TinyTransformer(Config(vocab_size=16, d_model=16, n_heads=2, n_layers=2),
                        "dot|softmax|none|fixed / dot|softmax|none|fixed / dot|softmax|none|fixed")


def test_per_layer_search_end_to_end_counts_components_per_layer(tmp_path, capsys):
    import json

    from evo_attention.cli import main

    cfg = tmp_path / "per_layer.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump(PER_LAYER))
    assert main(["search", "--config", str(cfg), "--quiet", "--out", str(tmp_path / "run")]) == 0
    final = json.loads((tmp_path / "run" / "final_results.json").read_text())
    assert " / " in final["best_gene"]["key"] and len(final["best_gene"]["layers"]) == 2
    fields = (tmp_path / "run" / "component_analysis.csv").read_text()
    assert "L1.similarity" in fields and "L2.normalization" in fields
    assert main(["ablate", "--from-run", str(tmp_path / "run"), "--quiet"]) != 0
    assert "per-layer genome" in capsys.readouterr().err


def test_bench_long_context_writes_table_figure_and_json(tmp_path, capsys):
    import json

    from evo_attention.cli import main

    flags = ["bench", "--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "1",
             "--warmup", "1", "--tokens-per-step", "64", "--favor-features", "4"]
    assert main(flags + ["--seq-lens", "16,32", "--out", str(tmp_path / "lc")]) == 0
    out = capsys.readouterr().out
    assert "| T | batch | softmax ms/step | linear ms/step | favor ms/step | window ms/step |" in out
    rows = json.loads((tmp_path / "lc" / "long_context.json").read_text())["rows"]
    assert {(r["name"], r["seq_len"], r["batch_size"]) for r in rows} == {
        (n, t, 64 // t) for n in ("softmax", "linear", "favor", "window") for t in (16, 32)}
    assert all(r["ms_per_step"] > 0 for r in rows)
    assert {r["steps_timed"] for r in rows} == {1}  # --steps counts the timed steps here too
    assert (tmp_path / "lc" / "long_context.png").stat().st_size > 0
    for bad, words in ((["--seq-lens", "16,x"], "--seq-lens"), (["--seq-lens", "16", "--genes", "nope"], "nope"),
                       (["--seq-lens", "128"], "--tokens-per-step 64 is below")):
        assert main(flags + bad) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err


def test_tpe_and_nsga2_never_propose_an_invalid_gene():
    pytest.importorskip("optuna")
    from evo_attention.search import make_strategy

    space = SearchSpace(similarity=("dot", "additive"), normalization=("softmax", "linear"),
                        position=("learned", "alibi"))
    for name in ("tpe", "nsga2"):
        strategy = make_strategy(name, population_size=6, n_generations=4, elite_size=2, seed=3, space=space)
        while not strategy.done:
            genes = strategy.ask()
            assert all(violation(g.to_dict()) is None for g in genes), name
            # a structured fitness that favours the kernel family, so the samplers move towards the rules' edge
            strategy.tell([(g, 10.0 - 3 * (g.normalization == "linear") - (g.similarity == "dot")) for g in genes])
    with pytest.raises(ValueError, match="tpe samples one gene shared by every layer"):
        Config(**{**PER_LAYER, "strategy": "tpe"}).space() and make_strategy(
            "tpe", seed=1, space=Config(**PER_LAYER).space())


def test_transfer_refuses_a_per_layer_genome_at_another_depth():
    from evo_attention.studies.transfer import _check_genes_fit

    genome = "dot|softmax|none|fixed / cosine|linear|none|fixed"
    _check_genes_fit([genome], Config(d_model=64, n_heads=2, n_layers=2))
    with pytest.raises(ValueError, match="transfer a per-layer genome only to sizes with 2 layers"):
        _check_genes_fit([genome], Config(d_model=64, n_heads=2, n_layers=4))
    with pytest.raises(ValueError, match="kv_heads 3 does not divide"):
        _check_genes_fit(["dot|softmax|none|fixed|kvh=3 / dot|softmax|none|fixed"], Config(d_model=64, n_heads=2, n_layers=2))
