"""The CPU dropout with 16-bit lanes: probability, scale, gradient, determinism, independence."""

import math

import pytest
import torch
import torch.nn.functional as F

from evo_attention.nn.dropout import Dropout, drop_threshold, dropout, keep_mask
import evo_attention.nn.dropout as dropout_module


def test_drop_rate_is_the_rounded_probability_within_binomial_noise():
    torch.manual_seed(0)
    n = 2_000_000
    for p in (0.1, 0.25, 0.5):
        q = drop_threshold(p) / 65536
        assert abs(q - p) <= 0.5 / 65536
        dropped = 1.0 - keep_mask((n,), p).double().mean().item()
        assert abs(dropped - q) < 5 * math.sqrt(q * (1 - q) / n), (p, dropped)


def test_kept_values_are_scaled_so_the_expectation_is_exact_and_grad_is_the_same_mask():
    torch.manual_seed(1)
    x = torch.randn(64, 4, 32, 32, requires_grad=True)
    y = dropout(x, 0.1)
    scale = 65536 / (65536 - drop_threshold(0.1))
    kept = y != 0
    assert torch.equal(y[kept], x.detach()[kept] * scale)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, kept.float() * scale)
    torch.manual_seed(2)
    ones = dropout(torch.ones(4_000_000), 0.2)
    assert abs(ones.double().mean().item() - 1.0) < 5 * math.sqrt(0.2 / 0.8 / 4_000_000)


def test_same_seed_same_mask_and_other_seed_other_mask():
    x = torch.ones(1000, 100)
    torch.manual_seed(7)
    a = dropout(x, 0.3)
    torch.manual_seed(7)
    b = dropout(x, 0.3)
    torch.manual_seed(8)
    c = dropout(x, 0.3)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_lanes_of_one_draw_are_uncorrelated():
    torch.manual_seed(3)
    m = keep_mask((1_000_000,), 0.5).double()
    for lag in (1, 2, 3, 4):  # lanes of the same 64-bit draw, and the next draw
        corr = torch.corrcoef(torch.stack([m[:-lag], m[lag:]]))[0, 1].item()
        assert abs(corr) < 0.006, (lag, corr)
    lanes = m.view(-1, 4).mean(0)  # each lane position is fair on its own
    assert torch.all((lanes - 0.5).abs() < 0.005)


def test_identity_and_edge_cases():
    x = torch.randn(3, 5)
    assert dropout(x, 0.5, training=False) is x or torch.equal(dropout(x, 0.5, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1e-7), x)  # below half a lane step: nothing is dropped
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert torch.equal(dropout(x, 1 - 1e-7), torch.zeros_like(x))
    odd = dropout(torch.ones(7, 3), 0.5)  # a size that is not a multiple of 4 lanes
    assert odd.shape == (7, 3) and set(odd.unique().tolist()) <= {0.0, 2.0}


def test_module_matches_the_function_and_follows_train_eval():
    layer = Dropout(0.2)
    x = torch.ones(100, 100)
    torch.manual_seed(5)
    a = layer(x)
    torch.manual_seed(5)
    assert torch.equal(a, dropout(x, 0.2))
    assert torch.equal(layer.eval()(x), x)
    assert "p=0.2" in repr(layer)
    with pytest.raises(ValueError):
        Dropout(1.5)


def test_other_devices_draw_the_same_cpu_mask(monkeypatch):
    # a trial's dropout stream must not depend on the device it trains on: off the CPU the mask
    # still comes from the seeded CPU generator (then moves), never from the device's generator
    calls = []
    monkeypatch.setattr(F, "dropout", lambda x, p, training: calls.append(p) or x)
    drawn = []
    real = dropout_module.keep_mask
    monkeypatch.setattr(dropout_module, "keep_mask", lambda shape, p, generator=None: drawn.append(tuple(shape))
                        or real(shape, p, generator))
    out = dropout(torch.empty(4, 4, device="meta"), 0.1)
    assert calls == [] and drawn == [(4, 4)] and out.device.type == "meta"
    torch.manual_seed(3)
    on_cpu = dropout(torch.ones(8, 8), 0.5)
    torch.manual_seed(3)
    mask = real((8, 8), 0.5)
    assert torch.equal(on_cpu != 0, mask)  # the mask a GPU training draws is this one, moved
