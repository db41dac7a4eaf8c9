"""Normalizations are exact, masks give exactly zero weight, and nothing is NaN."""

import numpy as np
import pytest
import torch

from evo_attention import components
from evo_attention.nn.attention import causal_mask

SPARSE = ["sparsemax", "entmax15"]
ALL_NORMS = ["softmax", "sparsemax", "relu_norm", "sigmoid", "entmax15"]


def _bisect_threshold(z: np.ndarray, mass) -> float:
    """Find tau with sum(mass(z - tau)) == 1 by bisection (an algorithm independent of sorting)."""
    lo, hi = z.max() - 10.0, z.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        if mass(z - mid).sum() > 1:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def reference_sparsemax(z: np.ndarray) -> np.ndarray:
    """argmin_p ||p - z||^2 on the simplex: p = max(z - tau, 0) with sum 1."""
    mass = lambda d: np.maximum(d, 0.0)
    return mass(z - _bisect_threshold(z, mass))


def reference_entmax15(z: np.ndarray) -> np.ndarray:
    """1.5-entmax: p = max(z/2 - tau, 0)^2 with sum 1."""
    mass = lambda d: np.maximum(d, 0.0) ** 2
    return mass(z / 2 - _bisect_threshold(z / 2, mass))


REFERENCES = {"sparsemax": reference_sparsemax, "entmax15": reference_entmax15}


def test_sparsemax_is_the_projection_not_a_topk_softmax():
    w = components.NORMALIZATIONS["sparsemax"](torch.tensor([[-2.0, 0.0, 0.5]]), None)
    assert torch.allclose(w, torch.tensor([[0.0, 0.25, 0.75]]))
    w = components.NORMALIZATIONS["sparsemax"](torch.tensor([[1.0, 1.0, 1.0, 1.0]]), None)
    assert torch.allclose(w, torch.full((1, 4), 0.25))  # a top-k softmax would not give these


@pytest.mark.parametrize("name", SPARSE)
def test_sparse_normalizations_match_independent_reference_on_masked_rows(name):
    torch.manual_seed(0)
    t = 9
    scores = torch.randn(3, 2, t, t, dtype=torch.float64) * 3
    mask = causal_mask(t)
    weights = components.NORMALIZATIONS[name](scores, mask).double()
    for b in range(3):
        for h in range(2):
            for i in range(t):
                allowed = scores[b, h, i, : i + 1].numpy()
                expected = REFERENCES[name](allowed)
                got = weights[b, h, i].numpy()
                np.testing.assert_allclose(got[: i + 1], expected, atol=1e-6)
                assert (got[i + 1:] == 0).all()  # masked: exactly zero
    assert torch.allclose(weights.sum(-1), torch.ones(3, 2, t, dtype=torch.float64), atol=1e-6)
    # real sparsity among allowed entries, not just the masked ones
    full_rows = weights[:, :, -1, :]
    assert (full_rows == 0).sum() > 0


@pytest.mark.parametrize("name", ALL_NORMS)
def test_rows_sum_to_one_masked_zero_and_finite_gradients(name):
    torch.manual_seed(1)
    t = 16
    scores = (torch.randn(2, 4, t, t) * 4).requires_grad_()
    mask = causal_mask(t)
    weights = components.NORMALIZATIONS[name](scores, mask)
    assert (weights >= 0).all()
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
    sums = weights.sum(-1)
    if name in ("relu_norm", "sigmoid"):
        # map, then divide by the row sum + 1e-6: a row sums to S / (S + 1e-6), 0 for an all-zero row
        f = torch.relu if name == "relu_norm" else torch.sigmoid
        mass = f(scores.detach()).masked_fill(~mask, 0).sum(-1)
        assert torch.allclose(sums, mass / (mass + 1e-6), atol=1e-5)
    else:
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    (weights * torch.randn_like(weights)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad.masked_select(~mask.expand_as(weights)) == 0).all()


@pytest.mark.parametrize("name", ALL_NORMS)
def test_all_masked_but_one_row(name):
    scores = torch.tensor([[5.0, -3.0, 2.0, 0.5]], requires_grad=True)
    mask = torch.tensor([[False, True, False, False]])
    w = components.NORMALIZATIONS[name](scores, mask)
    expected_mass = 0.0 if name == "relu_norm" else 1.0  # relu of -3 is 0: an all-zero row
    assert torch.allclose(w, torch.tensor([[0.0, expected_mass, 0.0, 0.0]]), atol=1e-4)
    assert (w[0, [0, 2, 3]] == 0).all()
    w.sum().backward()
    assert torch.isfinite(scores.grad).all()


@pytest.mark.parametrize("name", ALL_NORMS)
def test_fully_masked_row_and_extreme_scores_give_no_nan(name):
    scores = torch.tensor([[1e6, -1e6, 3.0], [0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, True], [False, False, False]])
    w = components.NORMALIZATIONS[name](scores, mask)
    assert torch.isfinite(w).all()
    assert (w[1] == 0).all()
    w.sum().backward()
    assert torch.isfinite(scores.grad).all()


@pytest.mark.parametrize("name", [*SPARSE, "softmax"])
@pytest.mark.parametrize("t", [3, 40])  # a full sort and a partial one
def test_a_nan_or_infinite_score_gives_its_row_nan_weights_not_an_index_error(name, t):
    """A NaN loss then names the training diverged (docs/reliability.md); softmax's zeros for a row
    with no allowed key never hide such a row."""
    scores = torch.randn(3, t, t)
    scores[0, -1, 0], scores[1, -1, 0] = float("nan"), float("inf")
    for mask in (None, causal_mask(t)):
        w = components.NORMALIZATIONS[name](scores, mask)
        assert w[:2, -1].isnan().all() and torch.isfinite(w[:2, :-1]).all() and torch.isfinite(w[2]).all()


@pytest.mark.parametrize("name", ["relu_norm", "sigmoid"])
def test_elementwise_norms_divide_by_row_sum(name):
    scores = torch.tensor([[1.0, -2.0, 3.0]])
    w = components.NORMALIZATIONS[name](scores, None)
    f = torch.relu if name == "relu_norm" else torch.sigmoid
    raw = f(scores)
    assert torch.allclose(w, raw / (raw.sum(-1, keepdim=True) + 1e-6))


@pytest.mark.parametrize("name", ALL_NORMS)
def test_normalizations_accept_bf16(name):
    scores = torch.randn(2, 5, 5).bfloat16()
    w = components.NORMALIZATIONS[name](scores, causal_mask(5))
    assert w.dtype == torch.bfloat16 and torch.isfinite(w.float()).all()


def test_additive_similarity_equals_the_concatenation_form():
    torch.manual_seed(0)
    sim = components.SIMILARITIES["additive"](d_head=4, n_heads=2)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    got = sim(q, k)
    for h in range(2):
        for i in range(3):
            for j in range(3):
                w = torch.cat([sim.w_q[h], sim.w_k[h]], dim=0)  # [2d, d] acting on [q; k]
                hidden = torch.tanh(torch.cat([q[0, h, i], k[0, h, j]]) @ w)
                assert torch.allclose(got[0, h, i, j], hidden @ sim.v[h], atol=1e-5)


def test_multiplicative_and_cosine_similarity():
    q, k = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    s = q @ k.transpose(-2, -1)
    assert torch.allclose(components.SIMILARITIES["multiplicative"](8, 1)(q, k), s * torch.sigmoid(s))
    cos = components.SIMILARITIES["cosine"](8, 1)(q, k)
    assert cos.abs().max() <= 8 + 1e-4
    expected = torch.nn.functional.cosine_similarity(q[0, 0, :, None], k[0, 0, None, :], dim=-1) * 8
    assert torch.allclose(cos[0, 0], expected, atol=1e-5)


def test_temperatures_are_positive_and_start_at_sqrt_dhead():
    x = torch.randn(2, 5, 16)
    for name in ["fixed", "learned", "adaptive"]:
        tau = components.TEMPERATURES[name](16, 4, 4)(x)
        assert (tau > 0).all()
        assert torch.allclose(tau, torch.full_like(tau, 2.0))
        assert tau.dim() == 4 and tau.shape[1] == 4


def test_adaptive_temperature_reads_only_its_own_position():
    torch.manual_seed(0)
    temp = components.TEMPERATURES["adaptive"](16, 4, 4)
    torch.nn.init.normal_(temp.proj.weight)
    x = torch.randn(1, 6, 16)
    tau = temp(x)
    x2 = x.clone()
    x2[0, 4] += 1.0
    tau2 = temp(x2)
    assert torch.equal(tau[:, :, :4], tau2[:, :, :4]) and torch.equal(tau[:, :, 5:], tau2[:, :, 5:])
    assert not torch.equal(tau[:, :, 4], tau2[:, :, 4])


@pytest.mark.parametrize("kind", ["similarity", "temperature_mode", "gating"])
def test_every_built_in_component_passes_the_causality_probe(kind):
    """The probe a plugin's component meets (no later position, no other batch row, no dependence on
    the sequence length) passes each built-in one: it raises otherwise."""
    for name, factory in components._REGISTRIES[kind].items():
        components.check_causal(kind, name, factory)


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("scale", [0.02, 3.0])
def test_partial_sort_path_stays_exact_for_wide_and_narrow_supports(name, scale):
    """Rows longer than the partial-sort k, with supports both far above k and a few keys."""
    torch.manual_seed(2)
    t = 40
    scores = torch.randn(2, t, t, dtype=torch.float64) * scale
    weights = components.NORMALIZATIONS[name](scores, causal_mask(t)).double()
    support = (weights[:, -1] > 0).sum(-1)
    assert (support > components.PARTIAL_SORT_K).all() if scale < 1 else (support < components.PARTIAL_SORT_K).all()
    for b in range(2):
        for i in (0, 17, t - 1):
            expected = REFERENCES[name](scores[b, i, : i + 1].numpy())
            np.testing.assert_allclose(weights[b, i, : i + 1].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_blocked_additive_scores_and_gradients_match_the_direct_form(causal):
    torch.manual_seed(3)
    sim = components.SIMILARITIES["additive"](d_head=4, n_heads=2).double()
    sim.block = 3  # several blocks, the last one partial
    q = torch.randn(2, 2, 10, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 10, 4, dtype=torch.float64, requires_grad=True)
    a = torch.einsum("bhtd,hde->bhte", q, sim.w_q)
    c = torch.einsum("bhtd,hde->bhte", k, sim.w_k)
    direct = torch.einsum("bhijd,hd->bhij", torch.tanh(a[:, :, :, None] + c[:, :, None]), sim.v)
    got = sim(q, k, causal=causal)
    keep = causal_mask(10) if causal else torch.ones(10, 10, dtype=torch.bool)
    assert torch.allclose(got[..., keep], direct[..., keep], atol=1e-12)
    if causal:
        assert (got[..., ~keep] == 0).all()
    weights = torch.randn(2, 2, 10, 10, dtype=torch.float64) * keep
    params = (q, k, sim.w_q, sim.w_k, sim.v)
    expected = torch.autograd.grad((direct * weights).sum(), params)
    grads = torch.autograd.grad((got * weights).sum(), params)
    for e, g in zip(expected, grads):
        assert torch.allclose(e, g, atol=1e-10)
    assert torch.autograd.gradcheck(lambda q, k: sim(q, k, causal=causal), (q[:1, :1, :5], k[:1, :1, :5]))


def test_sparse_normalizations_sort_partially_only_on_the_cpu():
    """Off the CPU a full sort: the partial sort's 'sort further?' check waits for the device every
    step and keeps the step from being captured as a CUDA graph (train/graph.py)."""
    assert components._partial_k(torch.empty(2, 128)) == components.PARTIAL_SORT_K
    assert components._partial_k(torch.empty(2, 128, device="meta")) is None
    assert components._partial_k(torch.empty(2, 8)) is None  # a row no longer than k: one sort anyway
