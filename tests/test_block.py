"""The block around the attention: gpt2 (the default, unchanged) and llama (RMSNorm + SwiGLU)."""

import pytest
import torch

from evo_attention import AttentionGene, Config, TinyTransformer
from evo_attention.cli import main
from evo_attention.data import data_from_config
from evo_attention.nn.model import SwiGLU, llama_ffn_dim
from evo_attention.train.saving import load_model, save_model
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_training


def settings_hash(config):
    return Trial.from_config("dot|softmax|none|fixed", config).context


def result_settings(config):
    return Trial.from_config("dot|softmax|none|fixed", config).settings()
from evo_attention.util.errors import UserError

# every option of every component at least once, and every axis
GENES = ["dot|softmax|none|fixed|bias|0.00", "multiplicative|sparsemax|input_gate|learned|nobias|0.00",
         "additive|relu_norm|output_gate|adaptive|bias|0.00", "cosine|sigmoid|highway|fixed|nobias|0.00",
         "dot|entmax15|none|adaptive|bias|0.00", "dot|softmax|none|fixed|bias|0.00|pos=rope|rank=8|win=4|kvh=1",
         "cosine|sparsemax|output_gate|learned|nobias|0.00|pos=alibi|abias=rel"]
TINY = dict(vocab_size=50, d_model=16, n_heads=2, n_layers=2, max_seq_len=12, dropout=0.0)
RECALL = dict(data="recall", vocab_size=16, max_seq_len=16, d_model=16, n_heads=2, n_layers=1, dropout=0.0,
              recall={"num_pairs": 2, "num_queries": 2, "train_examples": 128, "eval_examples": 32},
              batch_size=8, eval_batch_size=32, eval_steps=None, learning_rate=3e-3, train_steps=4, log_every=2)


def _randomize(model):
    """Zero-initialised parts (adaptive temperature, norms' unit scales) would hide a leak."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.mark.parametrize("block", ["gpt2", "llama"])
def test_both_blocks_are_causal_and_finite(block):
    config = Config(**TINY, block=block)
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 10))
    t = 6
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % 50
    for key in GENES:
        model = TinyTransformer(config, key)
        _randomize(model)
        model.eval()
        a, b = model(ids), model(changed)
        assert torch.equal(a[:, :t], b[:, :t]), f"{block} {key} leaks the future"
        assert not torch.equal(a[:, t:], b[:, t:]), f"{block} {key} ignores its input"
        model.train()
        x = torch.randn(1, 8, 16, requires_grad=True)
        h = x
        for layer in model.blocks:
            h, _ = layer(h)
        h[0, 3].sum().backward()
        assert (x.grad[0, 4:] == 0).all() and (x.grad[0, :4] != 0).any(), f"{block} {key}"
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters()), key


def test_llama_block_is_built_of_rmsnorm_and_bias_free_swiglu():
    model = TinyTransformer(Config(**TINY, block="llama"), "dot|softmax|none|fixed|bias|0.10")
    for layer in model.blocks:
        assert isinstance(layer.ln1, torch.nn.RMSNorm) and isinstance(layer.ln2, torch.nn.RMSNorm)
        assert isinstance(layer.ffn, SwiGLU)
        assert all(m.bias is None for m in (layer.ffn.gate, layer.ffn.up, layer.ffn.down))
        assert layer.ffn.up.out_features == llama_ffn_dim(16) == 48
        assert layer.attn.qkv.bias is not None and layer.attn.out.bias is not None  # the gene's bias field
    assert isinstance(model.ln_f, torch.nn.RMSNorm)
    gpt2 = TinyTransformer(Config(**TINY), "dot|softmax|none|fixed|bias|0.10")
    assert isinstance(gpt2.ln_f, torch.nn.LayerNorm) and gpt2.blocks[0].ffn.up.bias is not None


def test_llama_ffn_width():
    assert [llama_ffn_dim(d) for d in (16, 64, 128, 256, 384)] == [48, 176, 344, 688, 1024]
    assert Config(block="llama").ffn_dim == 344 and Config(block="llama", d_ff=300).ffn_dim == 300
    assert Config().ffn_dim == 512


def test_parameter_counts_by_hand():
    d, v, t, h = 128, 10000, 128, llama_ffn_dim(128)
    embeddings = v * d + t * d  # tied head: counted once
    attention = d * 3 * d + 3 * d + d * d + d  # fused qkv and output projection, with the gene's biases
    gpt2_layer = 2 * 2 * d + attention + (d * 4 * d + 4 * d) + (4 * d * d + d)  # LayerNorms: weight + bias
    llama_layer = 2 * d + attention + 3 * d * h  # RMSNorm: weight only; SwiGLU: no biases
    vanilla = AttentionGene.vanilla()
    assert TinyTransformer(Config(), vanilla).num_parameters() == embeddings + 2 * gpt2_layer + 2 * d
    assert TinyTransformer(Config(block="llama"), vanilla).num_parameters() == embeddings + 2 * llama_layer + d
    assert TinyTransformer(Config(block="llama"), vanilla).num_parameters() == 1_693_312
    nobias = "dot|softmax|none|fixed|nobias|0.10"  # the attention follows the gene in both blocks
    assert TinyTransformer(Config(block="llama"), nobias).num_parameters() == embeddings + 2 * (llama_layer - 4 * d) + d


def test_gpt2_default_keeps_its_cache_keys_and_weights():
    # a golden value: the cache key of the default settings from before the block existed
    assert settings_hash(Config()) == "3fe7a76cab98488e" == settings_hash(Config(block="gpt2"))
    assert "block" not in result_settings(Config())
    assert settings_hash(Config(block="llama")) != settings_hash(Config())
    assert result_settings(Config(block="llama"))["block"] == "llama"
    torch.manual_seed(0)
    default = TinyTransformer(Config(**TINY), "dot|softmax|none|fixed").state_dict()
    torch.manual_seed(0)
    explicit = TinyTransformer(Config(**TINY, block="gpt2"), "dot|softmax|none|fixed").state_dict()
    assert default.keys() == explicit.keys() and all(torch.equal(default[k], explicit[k]) for k in default)


def test_llama_trains_saves_and_loads(tmp_path):
    config = Config(**RECALL, block="llama")
    data = data_from_config(config)
    result = run_training(Trial.from_config("dot|sparsemax|output_gate|learned", config, seed=3), data)
    record = result.record
    assert record.status == "ok" and record.settings["block"] == "llama"
    assert record.context == settings_hash(config) and torch.isfinite(torch.tensor(record.val_loss))
    gpt2 = run_training(Trial.from_config("dot|sparsemax|output_gate|learned", config.replace(block="gpt2"), seed=3),
                        data).record
    assert gpt2.params != record.params and gpt2.context != record.context
    save_model(result.trainer.model, tmp_path / "m", vocab=data.vocab)
    loaded = load_model(tmp_path / "m")
    assert isinstance(loaded.ln_f, torch.nn.RMSNorm)
    x, _ = next(data.eval_batches("valid", 4))
    result.trainer.model.eval()
    assert torch.equal(loaded(x), result.trainer.model(x))


def test_block_is_a_validated_setting(tmp_path, capsys):
    with pytest.raises(UserError, match="unknown block 'bert': valid options are gpt2, llama") as info:
        Config(block="bert")
    assert info.value.settings == ("block",)
    config_file = tmp_path / "c.yaml"
    config_file.write_text("block: bert\n")
    assert main(["baseline", "--config", str(config_file), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown block 'bert'" in err and "block is set in config file" in err and not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:  # the flag's choices are checked by the parser
        main(["baseline", "--preset", "quick", "--block", "bert"])
    assert exit_info.value.code == 2 and "invalid choice: 'bert'" in capsys.readouterr().err


def test_resuming_a_run_stored_before_the_block_setting(tmp_path, capsys):
    from evo_attention.search.store import RunStore

    out = str(tmp_path / "run")
    flags = ["--preset", "quick", "--vocab-size", "16", "--seq-len", "16", "--d-model", "16", "--heads", "2",
             "--layers", "1", "--batch-size", "8", "--steps", "4", "--population", "2", "--generations", "1",
             "--elite", "1", "--quiet", "--out", out]
    assert main(["search", *flags]) == 0
    with RunStore.open(out) as store:  # as a run written before the field existed stored it
        stored = store.config()
        assert stored.pop("block") == "gpt2"
        store.set_meta("config", stored)
    assert main(["search", *flags, "--block", "gpt2", "--resume"]) == 0  # its default: no contradiction
    assert main(["search", *flags, "--block", "llama", "--resume"]) == 2
    assert "--block 'llama' contradicts the run" in capsys.readouterr().err
