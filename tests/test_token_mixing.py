"""Token mixing before attention: the dconv= gene axis (Primer's depthwise convolutions of q, k, v)
and the model's short_conv setting (a depthwise convolution of the attention's input)."""

import pytest
import torch

from evo_attention import AttentionGene, Config, TinyTransformer
from evo_attention.data import data_from_config
from evo_attention.train import trainer as engine
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_batched, run_training
from evo_attention.util.errors import UserError

CASES = [("dot|softmax|none|fixed|bias|0.10|dconv=3", 0), ("dot|softmax|none|fixed|bias|0.10", 3),
         ("cosine|linear|none|learned|bias|0.00|pos=rope|dconv=4", 2)]


def _model(gene, short_conv):
    config = Config(d_model=32, n_heads=4, n_layers=2, vocab_size=40, max_seq_len=16, short_conv=short_conv)
    torch.manual_seed(0)
    model = TinyTransformer(config.model, gene).eval()
    with torch.no_grad():
        for p in model.parameters():  # an identity-initialised convolution would hide a leak
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.mark.parametrize("gene,short_conv", CASES)
def test_token_mixing_is_causal_and_decodes_as_its_forward_pass(gene, short_conv):
    model = _model(gene, short_conv)
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 40
    with torch.no_grad():
        a, b = model(ids), model(changed)
        assert torch.equal(a[:, :7], b[:, :7]) and not torch.equal(a[:, 7:], b[:, 7:])
        caches = model.new_caches()
        parts = [model.decode(ids[:, :5], caches)] + [model.decode(ids[:, i:i + 1], caches) for i in range(5, 12)]
    assert torch.allclose(torch.cat(parts, dim=1), a, atol=1e-5)


@pytest.mark.parametrize("gene,short_conv", CASES[:2])
def test_token_mixing_folds_into_a_batch_as_trained_alone(gene, short_conv):
    config = Config(data="recall", vocab_size=32, max_seq_len=32, recall={"num_pairs": 4, "train_examples": 500,
                                                                         "eval_examples": 100},
                    d_model=32, n_heads=4, n_layers=2, batch_size=8, eval_batch_size=100, train_steps=6,
                    log_every=2, precision="fp32", short_conv=short_conv)
    data = data_from_config(config)
    trials = [Trial.from_config(gene, config.replace(seed=s), data=data) for s in (1, 2)]
    batch, alone = run_batched(trials, data), [run_training(t, data) for t in trials]
    for b, a in zip(batch, alone):
        assert b.record.extra["batched"] == 2 and "batch_fallback" not in b.record.extra
        assert abs(b.record.val_loss - a.record.val_loss) <= engine.SAME_RESULT_RTOL["fp32"] * a.record.val_loss


def test_the_settings_are_checked_and_keys_stay_as_they_were():
    assert AttentionGene.parse("dot|softmax|none|fixed").key == "dot|softmax|none|fixed|bias|0.10"
    assert AttentionGene.parse("dot|softmax|none|fixed|dconv=3").key == "dot|softmax|none|fixed|bias|0.10|dconv=3"
    with pytest.raises(UserError, match="not a convolution width"):
        AttentionGene.parse("dot|softmax|none|fixed|dconv=5")
    with pytest.raises(UserError, match="short_conv 1 is not a convolution width"):
        Config(short_conv=1)
    assert "short_conv" not in Trial.from_config("dot|softmax|none|fixed", Config()).settings()  # omitted at 0
