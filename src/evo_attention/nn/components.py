"""The building blocks a gene names, kept in four registries.

A gene is a choice of one entry from each registry:

========================  ===========================================================
``SIMILARITIES``          how a query meets a key: ``(q, k) -> scores [B, H, T, T]``
``NORMALIZATIONS``        how scores become weights over the last dim, given a mask
``TEMPERATURES``          what the scores are divided by (per head / per query)
``GATINGS``               how the attention output is gated and mixed with its input
========================  ===========================================================

The decorators ``register_similarity`` etc. add a factory under a name, which joins the search space
at once, so a user adds a component without editing the library::

    @register_normalization("squared_relu")
    def squared_relu(scores, mask):
        w = torch.relu(scores) ** 2
        return row_normalize(w, mask)

Contracts (tests hold every registered component to them):

- Causality: nothing reads a future position; the attention module masks future keys before
  normalizing. A component that reads earlier positions too (found when registered:
  ``ACROSS_POSITIONS``) decodes by recomputing instead of from a key/value cache.
- Normalizations return non-negative weights whose rows sum to 1 over allowed keys, exactly zero
  weight on masked keys, and no NaN in forward or backward (a row whose allowed scores all map to
  zero gets all-zero weights). ``row_normalize``'s (``relu_norm``, ``sigmoid``) is approximate: a row
  sums to S / (S + 1e-6). ``register_normalization`` refuses one that reads or weighs masked keys
  (``check_masking``).
- Row independence: each batch row is computed from that row alone (registration probes a plugin's
  component), so K models fold into one batch (``nn.fold``); a component with weights declares its
  folded form, a ``fold(self, folding)`` method (``LearnedTemperature``), or trains one trial at a time.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
from typing import Callable, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F

from evo_attention import genes
from evo_attention.genes import OPTIONS
from evo_attention.nn.fold import Folding, broadcast_rows, per_model
from evo_attention.util.errors import UserError

SIMILARITIES: Dict[str, Callable[..., nn.Module]] = {}
NORMALIZATIONS: Dict[str, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]] = {}
TEMPERATURES: Dict[str, Callable[..., nn.Module]] = {}
GATINGS: Dict[str, Callable[..., nn.Module]] = {}

# The option names live in ``genes.OPTIONS`` (the grammar, which knows the built-in names below without
# importing this module; see its module docstring): registering a new name adds it there.

_REGISTRIES = {
    "similarity": SIMILARITIES,
    "normalization": NORMALIZATIONS,
    "gating": GATINGS,
    "temperature_mode": TEMPERATURES,
}


def _registrar(kind: str):
    def register(name: str, *, default_space: bool = True):
        """``default_space=False``: a search space includes ``name`` only when it lists it."""
        # a gene key is read back by names split on '|' and '=' and stripped of whitespace
        if not isinstance(name, str) or name.split() != [name] or "|" in name or "=" in name or "/" in name:
            raise UserError(f"component name {name!r} must be a non-empty string without whitespace, '|', '=' or '/'")

        def decorator(factory):
            module = kind != "normalization"  # a similarity, temperature or gating is built as an nn.Module
            if not (isinstance(factory, type) and issubclass(factory, nn.Module) if module else callable(factory)):
                raise TypeError(f"register_{kind.split('_')[0]}({name!r}) decorates "
                                f"{'an nn.Module class' if module else 'a class or function'} that builds "
                                f"the component, not {factory!r} ({type(factory).__name__})")
            if name in _REGISTRIES[kind] and _REGISTRIES[kind][name] is not factory:
                where = getattr(_REGISTRIES[kind][name], "__module__", "?")
                raise UserError(f"{kind} {name!r} is registered already (by {where}): choose another name, or "
                                "unregister the existing one first")
            # a plugin's normalization is probed before it joins the registry (the built-ins here are held to
            # the contracts by the tests; a kernel's is a module of features, no function of scores)
            plugin = getattr(factory, "__module__", None) != __name__
            if kind == "normalization" and plugin and not getattr(factory, "kernel", False):
                check_masking(name, factory)
            elif kind != "normalization" and plugin and not check_causal(kind, name, factory):
                ACROSS_POSITIONS.update(f"{prefix}.{name}" for prefix in _OP_PREFIXES[kind])
            _REGISTRIES[kind][name] = factory
            if name not in OPTIONS[kind]:
                OPTIONS[kind].append(name)
            if not default_space:
                genes.OPT_IN[kind].add(name)
            if kind == "similarity" and getattr(factory, "dot_form", False):
                genes.DOT_FORM_SIMILARITIES.add(name)
            if kind == "normalization" and getattr(factory, "kernel", False):
                genes.KERNEL_NORMALIZATIONS.add(name)
            return factory

        return decorator

    register.__name__ = f"register_{kind.split('_')[0]}"
    register.__doc__ = f"Decorator: register a {kind} component under ``name`` (joins the search space)."
    return register


register_similarity = _registrar("similarity")


def check_masking(name: str, normalize: Callable) -> None:
    """UserError unless ``normalize`` gives masked keys exactly zero weight and does not read their
    scores (a probe: causal [4, 4] scores, then the same with the masked ones changed): a model with
    it would otherwise read future positions. One that raises on the probe is left to fail in use."""
    scores = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    try:
        weights, moved = normalize(scores, mask), normalize(torch.where(mask, scores, scores + 3.0), mask)
        fine = weights.shape == scores.shape and bool((weights.masked_select(~mask) == 0).all()) and torch.equal(
            weights, moved)
    except Exception:  # its own error: a training with it fails and is recorded so (status error)
        return
    if not fine:
        raise UserError(f"normalization {name!r} weighs masked keys or reads their scores: give them exactly zero "
                        "weight from the allowed scores alone (mask the scores, or zero_masked / row_normalize)")


PROBE_LENGTHS = (4, 33)  # a probe's sequence lengths (a look-ahead up to 32 shows): the later half of each is moved
ACROSS_LENGTH = 129  # the length at which a read of earlier positions is looked for again (up to 128 back shows)
# The program ops (a component's s.NAME, t.NAME, g.NAME, gi.NAME, or a registered op) whose value at a position
# reads other positions than its own (causally; a probe at registration finds them): a program with one decodes
# by recomputing its forward, as a key/value cache holds no more than each position's own values.
ACROSS_POSITIONS: set = set()
_OP_PREFIXES = {"similarity": ("s",), "temperature_mode": ("t",), "gating": ("g", "gi"), "normalization": ()}


def probe_values(kind: str, draw: torch.Generator, length: int) -> tuple:
    """A probe's value of program type ``kind`` (X [2, T, 8]; H, F [2, 2, T, 4]; S, W [2, 2, T, T];
    C 0.5), a copy whose later entries changed (positions T // 2 on, and for scores also every key
    after its query) and a copy whose batch row 1 changed."""
    if kind == "C":  # a constant: the same number in all
        return 0.5, 0.5, 0.5
    value = torch.randn((2, length, 8) if kind == "X" else (2, 2, length, length if kind in "SW" else 4),
                        generator=draw)
    later = torch.zeros(value.shape[-2:], dtype=torch.bool)
    later[length // 2:] = True
    if kind in ("S", "W"):
        later |= ~_lower(length)
        later[:, length // 2:] = True
    return value, torch.where(later, value + 3.0, value), torch.cat((value[:1], value[1:] + 3.0))


def _lower(n: int) -> torch.Tensor:
    """Bool [n, n], True on and below the diagonal (no Tensor.tril: on a busy CPU its threads cost ~10 ms)."""
    return torch.arange(n)[:, None] >= torch.arange(n)


def _as_scores(value: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """Scores (or a temperature broadcast to them) as [B, 2, rows, length]."""
    return torch.broadcast_to(value, (value.shape[0] if value.dim() == 4 else 1, 2, rows, length))


def _earlier(value: torch.Tensor, kind: str, length: int, cut: int | None = None) -> torch.Tensor:
    """What a causal output of type ``kind`` keeps when a ``probe_values`` changes: positions before
    ``cut`` (T // 2), and for scores (or a temperature broadcast to them) their keys 0..i."""
    cut = length // 2 if cut is None else cut
    if kind in ("S", "W"):
        return _as_scores(value, length, length)[..., :cut, :cut].masked_select(_lower(cut))
    return value[..., :cut, :]


def _later(value: torch.Tensor, kind: str, length: int) -> torch.Tensor:
    """The rows from T // 2 on of an output of type ``kind`` that holds every row or only those (a
    temperature's may be broadcast); for scores their keys 0..i."""
    rows = length - length // 2
    if kind not in ("S", "W"):
        return value[..., -rows:, :]
    held = length if value.dim() > 1 and value.shape[-2] == length else rows
    return _as_scores(value, held, length)[..., -rows:, :].masked_select(_lower(length)[-rows:])


def probe(compute: Callable, arg_types: str, result_type: str, module: nn.Module | None = None,
          keys: tuple = ()) -> str | None:
    """The first contract ``compute`` (of ``probe_values`` of ``arg_types``; ``module``'s weights drawn
    at random first) breaks at a probe length it runs at, in eval mode then in train mode (``module``'s
    modes restored after): "reads future positions" (an earlier output changes when later inputs
    change) or "mixes batch rows" (batch row 0 changes when row 1 does), " in train mode" added where
    only train mode shows it; or "reads future positions (its value depends on the sequence length)"
    if its outputs before T // 2 differ when computed from the inputs there alone; else "rows" if its
    outputs at positions T // 2 on differ when computed from those positions' inputs alone (the arguments at
    indices ``keys`` whole: a similarity's keys), as decoding with a key/value cache computes them (also at
    ACROSS_LENGTH positions: a read up to ACROSS_LENGTH - 1 positions back shows); else None. Outputs are
    compared where both are finite (random weights may give NaN, e.g. a square root of a negative scale);
    where some were not, the probe is repeated at ``module``'s own weights. An error at every run is
    raised. Random draws inside ``compute`` repeat (the same seed before each call), and the global random
    state is restored afterwards."""
    modes = {m: m.training for m in module.modules()} if module is not None else {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        initial = copy.deepcopy(module.state_dict()) if module is not None else None
        try:
            found, finite = probe_at(compute, arg_types, result_type, module, keys, randomize=True)
            if not finite and found in (None, "rows") and module is not None:
                module.load_state_dict(initial)
                found = probe_at(compute, arg_types, result_type, module, keys, randomize=False)[0] or found
        finally:
            for part, training in modes.items():
                part.training = training
    return found


def _agree(a, b, rtol: float, atol: float) -> bool:
    """Whether ``a`` and ``b`` are close where both are finite (a NaN or inf judges nothing)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    both = torch.isfinite(a) & torch.isfinite(b)
    return torch.allclose(torch.where(both, a, 0.0), torch.where(both, b, 0.0), rtol=rtol, atol=atol)


def _finite(values) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in values if torch.is_tensor(v))


def probe_at(compute: Callable, arg_types: str, result_type: str, module: nn.Module | None, keys: tuple,
              randomize: bool) -> tuple:
    """``probe``'s verdict at ``module``'s weights drawn at random (``randomize``) or as they are, and
    whether every output was finite."""
    draw, failure, ran, found, finite = torch.Generator().manual_seed(0), None, False, None, True
    if module is not None and randomize:
        for weight in module.parameters():
            weight.copy_(torch.randn(weight.shape, generator=draw))

    def tail(given, length):  # the arguments from position T // 2 on (those at ``keys`` whole)
        return [v if i in keys or not torch.is_tensor(v) else v[..., length // 2:, :] for i, v in enumerate(given)]
    for mode, length in itertools.product(("eval", "train"), PROBE_LENGTHS):
        if module is not None:
            module.train(mode == "train")
        try:
            given, moved, other = zip(*(probe_values(kind, draw, length) for kind in arg_types))
            seen = []
            for values in (given, moved, other, tail(given, length))[:4 if mode == "eval" else 3]:
                torch.manual_seed(0)
                seen.append(compute(*values))
            earlier = [_earlier(value, result_type, length) for value in seen[:2]]
            first_row = [v[:1] if torch.is_tensor(v) and v.dim() else torch.as_tensor(v)
                         for v in (seen[0], seen[2])]
            later = [_later(v, result_type, length) for v in (seen[0], seen[3])] if mode == "eval" else []
        except Exception as exc:  # e.g. an op that needs more positions than the shorter probe has
            failure = exc
            continue
        ran, finite = True, finite and _finite(seen[:1])
        for fault, pair in (("reads future positions", earlier), ("mixes batch rows", first_row)):
            if not _agree(*pair, rtol=1e-5, atol=1e-6):
                return fault + (" in train mode" if mode == "train" else ""), finite
        cut, apart = length // 2, False
        with contextlib.suppress(Exception):  # e.g. too few positions for the op: judged on the longer probes
            if mode == "eval":  # the prefix alone, as decoding computes it (train mode: dropout draws differ)
                torch.manual_seed(0)
                head = _earlier(compute(*(v[..., :cut, :cut] if kind in "SW" else v[..., :cut, :]
                                          if kind != "C" else v for v, kind in zip(given, arg_types))),
                                result_type, cut, cut)  # to the values' scale: a sum's order may differ
                scale = earlier[0].nan_to_num(0.0, 0.0, 0.0).abs().max()
                apart = not _agree(earlier[0], head, rtol=0.0, atol=float(1e-4 * (1 + scale)))
        if apart:
            return "reads future positions (its value depends on the sequence length)", finite
        if later and not _agree(*later, rtol=1e-5, atol=1e-5):
            found = "rows"
    if not ran:
        raise failure
    if found is None:  # a read further back than the probes show: its later rows at a longer length alone
        if module is not None:
            module.train(False)
        with contextlib.suppress(Exception):  # e.g. an op that fails at that length: judged on the probes above
            given = [probe_values(kind, draw, ACROSS_LENGTH)[0] for kind in arg_types]
            seen = []
            for values in (given, tail(given, ACROSS_LENGTH)):
                torch.manual_seed(0)
                seen.append(_later(compute(*values), result_type, ACROSS_LENGTH))
            finite = finite and _finite(seen)
            found = None if _agree(*seen, rtol=1e-5, atol=1e-5) else "rows"
    return found, finite


def check_causal(kind: str, name: str, factory: Callable) -> bool:
    """UserError unless a similarity, temperature or gating, built with random weights at sizes
    d_head 4, 2 heads, d_model 8, reads no later position and no other batch row (``probe``): a model
    with it would. Whether its value at a position reads that position's inputs alone (a score
    [i, j]: query i, key j). One that cannot be built or run on any probe is left to fail in use."""
    with torch.random.fork_rng(devices=[]):  # building it draws its initial weights
        try:
            module = {"similarity": lambda: factory(4, 2), "gating": lambda: factory(8)}.get(
                kind, lambda: factory(8, 2, 4))()
            if kind == "gating":  # both of its uses: the projections' input, and the output it combines
                gate_input = getattr(module, "gate_input", lambda x: x)
                found = probe(lambda x, y: torch.cat([gate_input(x), module(x, y)], -1), "XX", "X", module)
            else:
                similarity = kind == "similarity"  # decoding meets new queries with every key so far
                found = probe(module, "HH" if similarity else "X", "S", module, keys=(1,) if similarity else ())
        except Exception:  # its own error: a training with it fails and is recorded so (status error)
            return True
    if found and found != "rows":
        raise UserError(f"{kind.split('_')[0]} {name!r} {found}: an output at position t of a batch row may "
                        "depend only on that row's inputs at positions <= t (and a score [i, j] on query i and key j)")
    return found is None


register_normalization = _registrar("normalization")
register_gating = _registrar("gating")
register_temperature = _registrar("temperature_mode")


def factory(kind: str, name: str):
    """The factory registered as ``name`` for gene field ``kind`` (e.g. ``"normalization"``), or None."""
    return _REGISTRIES[kind].get(name)


def unregister(kind: str, name: str) -> None:
    """Remove a registered component (``kind`` is a gene field, e.g. ``"normalization"``)."""
    _REGISTRIES[kind].pop(name, None)
    if name in OPTIONS[kind]:
        OPTIONS[kind].remove(name)
    genes.OPT_IN[kind].discard(name)
    ACROSS_POSITIONS.difference_update(f"{prefix}.{name}" for prefix in _OP_PREFIXES[kind])
    {"similarity": genes.DOT_FORM_SIMILARITIES, "normalization": genes.KERNEL_NORMALIZATIONS}.get(kind, set()).discard(name)


# -- similarities ----------------------------------------------------------------------------------
# Modules mapping q, k [B, H, T, d_head] to raw scores [B, H, T, T]. ``dot_form = True`` declares
# scores == prepare(q, k)[0] @ prepare(q, k)[1]^T, which lets the attention module use PyTorch's
# fused scaled_dot_product_attention kernel.


class Similarity(nn.Module):
    dot_form = False

    def __init__(self, d_head: int, n_heads: int):
        super().__init__()
        self.d_head, self.n_heads = d_head, n_heads

    def prepare(self, q: torch.Tensor, k: torch.Tensor):
        return q, k

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        q, k = self.prepare(q, k)
        return q @ k.transpose(-2, -1)


@register_similarity("dot")
class DotSimilarity(Similarity):
    """Plain dot product q . k."""

    dot_form = True


@register_similarity("multiplicative")
class MultiplicativeSimilarity(Similarity):
    """The dot score passed through s * sigmoid(s) (a self-gated dot product)."""

    def forward(self, q, k):
        s = q @ k.transpose(-2, -1)
        return s * torch.sigmoid(s)


class _AdditiveScores(torch.autograd.Function):
    """s[b,h,i,j] = sum_d v[h,d] tanh(a[b,h,i,d] + c[b,h,j,d]), in query blocks.

    Nothing of size [B, H, T, T, d] is kept: the backward pass recomputes tanh block by block.
    With ``causal``, a block of queries [i0, i1) only meets keys j < i1, and every score of a
    future key (j > i) is returned as exactly 0 (the attention masks those keys anyway).
    """

    @staticmethod
    def forward(ctx, a, c, v, block: int, causal: bool):
        t, s = a.shape[2], c.shape[2]
        out = a.new_zeros(a.shape[0], a.shape[1], t, s)
        v5 = v[None, :, None, :, None]  # [1, H, 1, d, 1]
        for i0 in range(0, t, block):
            i1 = min(t, i0 + block)
            j1 = i1 if causal else s
            hidden = torch.tanh(a[:, :, i0:i1, None, :] + c[:, :, None, :j1, :])  # [B, H, q, k, d]
            out[:, :, i0:i1, :j1] = (hidden @ v5).squeeze(-1)
        if causal:
            out.tril_()
        ctx.save_for_backward(a, c, v)
        ctx.block, ctx.causal = block, causal
        return out

    @staticmethod
    def backward(ctx, grad):
        a, c, v = ctx.saved_tensors
        t, s = a.shape[2], c.shape[2]
        if ctx.causal:
            grad = grad.tril()
        grad_a, grad_c, grad_v = torch.zeros_like(a), torch.zeros_like(c), torch.zeros_like(v)
        for i0 in range(0, t, ctx.block):
            i1 = min(t, i0 + ctx.block)
            j1 = i1 if ctx.causal else s
            hidden = torch.tanh(a[:, :, i0:i1, None, :] + c[:, :, None, :j1, :])
            g = grad[:, :, i0:i1, :j1].unsqueeze(-1)  # [B, H, q, k, 1]
            grad_v += (hidden * g).sum(dim=(0, 2, 3))
            d_pre = hidden.mul_(hidden).neg_().add_(1.0).mul_(g).mul_(v[None, :, None, None, :])
            grad_a[:, :, i0:i1] += d_pre.sum(dim=3)
            grad_c[:, :, :j1] += d_pre.sum(dim=2)
        return grad_a, grad_c, grad_v, None, None


@register_similarity("additive")
class AdditiveSimilarity(Similarity):
    """Bahdanau's v . tanh(Wq q + Wk k), per head: Wq q and Wk k are projected once per position
    ([B, H, T, d_head] each) and broadcast-added, so the [B, H, T, T, 2*d_head] concatenation of the
    textbook form never exists (``_AdditiveScores``: in query blocks, inside the attention module
    only the causal half)."""

    causal_skip = True  # forward(..., causal=True) may leave scores of future keys at 0
    block = 8  # queries per block: measured fastest of 8/16/32 at T=128 (causal waste grows with it)

    def __init__(self, d_head: int, n_heads: int):
        super().__init__(d_head, n_heads)
        self.w_q = nn.Parameter(torch.randn(n_heads, d_head, d_head) / math.sqrt(d_head))
        self.w_k = nn.Parameter(torch.randn(n_heads, d_head, d_head) / math.sqrt(d_head))
        self.v = nn.Parameter(torch.randn(n_heads, d_head) / math.sqrt(d_head))

    def forward(self, q, k, causal: bool = False):
        a = torch.einsum("bhtd,hde->bhte", q, self.w_q)  # [B, H, T, d]
        c = torch.einsum("bhtd,hde->bhte", k, self.w_k)
        dtype = torch.promote_types(a.dtype, self.v.dtype)
        return _AdditiveScores.apply(a.to(dtype), c.to(dtype), self.v.to(dtype), self.block, causal)

    def fold(self, folding: Folding) -> nn.Module:
        return _StackedAdditive(folding.param("w_q"), folding.param("w_k"), folding.param("v"), self.block)


class _StackedAdditive(nn.Module):
    """K additive similarities; the models become heads of one ``_AdditiveScores`` call."""

    causal_skip = True

    def __init__(self, w_q, w_k, v, block: int):
        super().__init__()
        self.w_q, self.w_k, self.v = w_q, w_k, v  # [K, H, d, d], [K, H, d, d], [K, H, d]
        self.block = block

    def forward(self, q, k, causal: bool = False):
        n_models, heads = self.w_q.shape[0], self.w_q.shape[1]
        a = torch.einsum("kbhtd,khde->kbhte", per_model(q, n_models), self.w_q)
        c = torch.einsum("kbhtd,khde->kbhte", per_model(k, n_models), self.w_k)
        dtype = torch.promote_types(a.dtype, self.v.dtype)
        m = a.shape[1]

        def as_heads(z):  # [K, M, H, T, d] -> [M, K * H, T, d]
            return z.transpose(0, 1).reshape(m, n_models * heads, *z.shape[3:]).to(dtype)

        s = _AdditiveScores.apply(as_heads(a), as_heads(c), self.v.reshape(n_models * heads, -1).to(dtype),
                                  self.block, causal)
        return s.view(m, n_models, heads, *s.shape[2:]).transpose(0, 1).reshape(n_models * m, heads, *s.shape[2:])


@register_similarity("cosine")
class CosineSimilarity(Similarity):
    """Cosine of q and k, times d_head, so after the fixed temperature sqrt(d_head) the logits
    span +-sqrt(d_head) (the range of unit-variance dot products) rather than a flat +-1."""

    dot_form = True

    def prepare(self, q, k):
        scale = math.sqrt(self.d_head)
        return F.normalize(q, dim=-1) * scale, F.normalize(k, dim=-1) * scale


# -- normalizations --------------------------------------------------------------------------------
# Functions (scores, mask) -> weights over the last dim. ``mask`` is a bool tensor broadcastable to
# scores, True where attention is allowed, or None (all allowed).


def wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least float32: half-precision scores are normalized in float32, float64 ones
    stay float64 (so a float64 model computes in float64 throughout, which tests rely on)."""
    return x if x.dtype == torch.float64 else x.float()


def zero_masked(weights: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


def row_normalize(weights: torch.Tensor, mask: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """Zero masked entries of non-negative ``weights`` and divide each row by its sum + eps.

    A row whose entries are all zero stays all zero (0 / eps), never NaN.
    """
    weights = zero_masked(weights, mask)
    return weights / (weights.sum(dim=-1, keepdim=True) + eps)


def _shift_for_sparse(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Subtract each row's max over allowed keys and put masked keys 10 below it.

    Sparsemax and entmax are shift invariant and give zero weight to anything more than 1
    (sparsemax) or 2 (1.5-entmax) below the row max, so this masks exactly and never feeds
    -inf into their sort/cumsum. Rows with no allowed key become all zeros here.
    """
    scores = wide(scores)
    if mask is None:
        return scores - scores.amax(dim=-1, keepdim=True).detach()
    row_max = scores.masked_fill(~mask, float("-inf")).amax(dim=-1, keepdim=True).detach()
    row_max = torch.nan_to_num(row_max, neginf=0.0)
    return (scores - row_max).masked_fill(~mask, -10.0)


@register_normalization("softmax")
def softmax_norm(scores, mask):
    """Softmax over allowed keys (masked keys get exactly 0)."""
    wide_scores = wide(scores)
    if mask is None:
        return torch.softmax(wide_scores, dim=-1).to(scores.dtype)
    weights = torch.softmax(wide_scores.masked_fill(~mask, float("-inf")), dim=-1)
    # A row with no allowed key is all -inf, where softmax gives NaN: it gets zeros. Any other NaN (a
    # score that overflowed) stays, so the loss is NaN and the training diverged.
    return zero_masked(weights, mask.any(dim=-1, keepdim=True)).to(scores.dtype)


# Partial sort: entmax's exact algorithms look at the k largest scores first and double k while the
# support is larger (exact for any k); k=16 made them 2-3x faster than a full sort on a CPU at T=128.
# Off the CPU a full sort: asking the device whether to double k would wait for it every step and
# keep the step from being captured as a CUDA graph (train/graph.py).
PARTIAL_SORT_K = 16


def _partial_k(scores: torch.Tensor) -> int | None:
    return PARTIAL_SORT_K if scores.shape[-1] > PARTIAL_SORT_K and scores.device.type == "cpu" else None


@register_normalization("sparsemax")
def sparsemax_norm(scores, mask):
    """Exact sparsemax (Martins & Astudillo, 2016): Euclidean projection onto the simplex."""
    return _entmax("sparsemax", scores, mask)


@register_normalization("relu_norm")
def relu_norm(scores, mask):
    """relu(scores) divided by the row sum (+eps: a row summing to S before sums to S / (S + eps))."""
    return row_normalize(torch.relu(wide(scores)), mask).to(scores.dtype)


@register_normalization("sigmoid")
def sigmoid_norm(scores, mask):
    """sigmoid(scores) divided by the row sum (+eps)."""
    return row_normalize(torch.sigmoid(wide(scores)), mask).to(scores.dtype)


@register_normalization("entmax15")
def entmax15_norm(scores, mask):
    """Exact 1.5-entmax (Peters et al., 2019), by sorting."""
    return _entmax("entmax15", scores, mask)


def _entmax(name: str, scores, mask):
    """The ``entmax`` package's ``name`` (sparsemax, entmax15) over the allowed keys."""
    import entmax

    shifted = _shift_for_sparse(scores, mask)
    # A row whose max is not finite (a NaN or +inf score) has no projection: entmax's sort fails on it
    # with an index error, so it gets NaN weights instead: the loss is NaN and the training diverged.
    bad = ~torch.isfinite(shifted.amax(dim=-1, keepdim=True))
    weights = getattr(entmax, name)(shifted.masked_fill(bad, 0.0), dim=-1, k=_partial_k(scores))
    return zero_masked(weights.masked_fill(bad, math.nan), mask).to(scores.dtype)


# -- kernel normalizations -------------------------------------------------------------------------
# weights[i, j] = phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j') over the allowed keys, with
# non-negative feature maps phi. They never form a score, so the causal output is a running sum:
# O(T m d) time and O(T d) memory (``causal_kernel_attention``) instead of a [T, T] matrix. The
# attention module hands them q s / tau and k / s with s = d_head^(1/4), whose dot product is the
# score q . k / tau (rules in genes.py keep them to dot-product similarities without score biases).
# A class registered with ``kernel = True`` is one of them.

KERNEL_CHUNK = 64  # positions per chunk of the running sum: O(T C) within chunks, O(T/C m d) states


class KernelNormalization(nn.Module):
    kernel = True

    def __init__(self, d_head: int, n_heads: int, n_features: int):
        super().__init__()
        self.d_head, self.n_heads = d_head, n_heads

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor):
        """q, k [B, H, T, d] -> phi(q), phi(k) [B, H, T, m], non-negative."""
        raise NotImplementedError


def safe_ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """numerator / denominator[..., None], and 0 (with zero gradient, never NaN) where the
    denominator is below finfo.max^(-1/2): there the gradient of 1 / denominator (1 / denominator^2)
    would overflow, so the row counts as seeing no key (a row whose allowed products all underflow,
    or nearly: about 5e-20 in float32, where a classic kernel's backward pass gave inf and NaN)."""
    ok = denominator > torch.finfo(denominator.dtype).max ** -0.5
    return torch.where(ok, 1.0 / torch.where(ok, denominator, 1.0), 0.0).unsqueeze(-1) * numerator


def kernel_weights(phi_q: torch.Tensor, phi_k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The explicit [B, H, T, T] weights of a kernel normalization: exactly zero on masked keys, rows
    summing to 1 (a row whose allowed products all vanish stays zero, never NaN)."""
    weights = zero_masked(phi_q @ phi_k.transpose(-2, -1), mask)
    return safe_ratio(weights, weights.sum(dim=-1))


def causal_kernel_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """sum_{j <= i} (phi_q[i] . phi_k[j]) v[j] / sum_{j <= i} phi_q[i] . phi_k[j] for every i, equal to
    ``kernel_weights(...) @ v`` under the causal mask: phi_q, phi_k [B, H, T, m], v [B, H, T, d] -> [B, H, T, d].
    In chunks of C = KERNEL_CHUNK positions: within one the products form a [C, C] lower triangle; earlier
    chunks enter through exclusive prefix sums S = sum phi_k v^T [m, d], z = sum phi_k [m] (so nothing of a
    later position is ever added)."""
    b, h, t, m = phi_q.shape
    d = v.shape[-1]
    c = min(KERNEL_CHUNK, t)
    n = -(-t // c)
    pad = n * c - t
    if pad:  # padding sits after every real position and its keys are zero: it changes nothing
        phi_q, phi_k, v = (F.pad(z, (0, 0, 0, pad)) for z in (phi_q, phi_k, v))
    fq, fk, vc = phi_q.view(b, h, n, c, m), phi_k.view(b, h, n, c, m), v.view(b, h, n, c, d)
    kv = fk.transpose(-2, -1) @ vc  # [B, H, n, m, d]: each chunk's sum of phi_k v^T
    ks = fk.sum(dim=-2)  # [B, H, n, m]
    state = torch.cat((torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1]), dim=2).cumsum(dim=2)  # chunks before
    total = torch.cat((torch.zeros_like(ks[:, :, :1]), ks[:, :, :-1]), dim=2).cumsum(dim=2)
    local = (fq @ fk.transpose(-2, -1)).tril()  # [B, H, n, C, C]: j <= i inside the chunk
    numerator = fq @ state + local @ vc
    denominator = (fq @ total.unsqueeze(-1)).squeeze(-1) + local.sum(dim=-1)
    y = safe_ratio(numerator, denominator)
    return y.reshape(b, h, n * c, d)[:, :, :t]


@register_normalization("linear", default_space=False)
class LinearKernel(KernelNormalization):
    """Causal linear attention (Katharopoulos et al., 2020): phi = elu + 1 on q and k. Exact: the
    running sum computes the same weights as the explicit quadratic form."""

    def feature_maps(self, q, k):
        return F.elu(q) + 1.0, F.elu(k) + 1.0


def orthogonal_features(n_features: int, d: int) -> torch.Tensor:
    """[m, d] random features for FAVOR+: blocks of d orthogonal directions (QR of a Gaussian
    matrix), each row scaled to the length of an independent Gaussian vector, so every row is
    marginally N(0, I) while rows within a block are orthogonal. Drawn from torch's global RNG."""
    blocks = [torch.linalg.qr(torch.randn(d, d))[0].T for _ in range(-(-n_features // d))]
    directions = torch.cat(blocks)[:n_features]
    return directions * torch.randn(n_features, d).norm(dim=1, keepdim=True)


@register_normalization("favor", default_space=False)
class FavorKernel(KernelNormalization):
    """Performer's FAVOR+ (Choromanski et al., 2021): an APPROXIMATION of softmax attention by m
    positive orthogonal random features, phi(x) = exp(w x - |x|^2 / 2), unbiased for exp(q . k).

    The features are drawn once per layer and head when the model is built, from torch's seeded RNG,
    and kept as a buffer (saved with the weights). Constant factors cancel in the ratio, so each
    query's exponents are shifted by their own max and every key's by the fixed max_i |w_i|^2 / 2,
    which bounds w x - |x|^2 / 2 from above: no exponent is positive, nothing overflows.
    """

    def __init__(self, d_head: int, n_heads: int, n_features: int):
        super().__init__(d_head, n_heads, n_features)
        if n_features < 1:
            raise UserError(f"favor needs at least one random feature, got {n_features}", setting="favor_features")
        w = torch.stack([orthogonal_features(n_features, d_head) for _ in range(n_heads)])  # [H, m, d]
        self.register_buffer("features", w)
        self.register_buffer("key_shift", w.square().sum(-1).amax(-1).div(2).view(1, n_heads, 1, 1))

    def feature_maps(self, q, k):
        return favor_features(q, k, self.features, self.key_shift)

    def fold(self, folding: Folding) -> nn.Module:
        return _StackedFavor(folding.buffers("features"), folding.buffers("key_shift"))


def favor_features(q, k, features, key_shift):
    """FAVOR+'s phi(q), phi(k) [..., T, m] of q, k [..., H, T, d] with ``features`` [..., H, m, d] and
    ``key_shift`` [..., 1, H, 1, 1] (leading dimensions broadcast: one model, or K stacked)."""
    w = features.to(q.dtype).transpose(-2, -1)  # [..., H, d, m]
    hq = q @ w - q.square().sum(-1, keepdim=True) / 2
    hk = k @ w - k.square().sum(-1, keepdim=True) / 2 - key_shift.to(k.dtype)
    return torch.exp(hq - hq.amax(-1, keepdim=True).detach()), torch.exp(hk)


class _StackedFavor(nn.Module):
    """K FAVOR+ kernels, each with the random features its model drew."""

    kernel = True

    def __init__(self, features: torch.Tensor, key_shift: torch.Tensor):
        super().__init__()
        self.register_buffer("features", features)  # [K, H, m, d]
        self.register_buffer("key_shift", key_shift)  # [K, 1, H, 1, 1]

    def keep_models(self, index: torch.Tensor) -> None:
        self.features = self.features.index_select(0, index)
        self.key_shift = self.key_shift.index_select(0, index)

    def feature_maps(self, q, k):
        n_models = self.features.shape[0]
        phi_q, phi_k = favor_features(per_model(q, n_models), per_model(k, n_models), self.features.unsqueeze(1),
                                      self.key_shift)
        return phi_q.reshape(*q.shape[:-1], phi_q.shape[-1]), phi_k.reshape(*k.shape[:-1], phi_k.shape[-1])


# -- temperatures ----------------------------------------------------------------------------------
# Modules x [B, T, d_model] -> a positive tensor broadcastable to [B, H, T, 1] that divides the scores.


@register_temperature("fixed")
class FixedTemperature(nn.Module):
    """The usual sqrt(d_head)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int):
        super().__init__()
        self.register_buffer("tau", torch.full((1, n_heads, 1, 1), math.sqrt(d_head)), persistent=False)

    def forward(self, x):
        return self.tau


@register_temperature("learned")
class LearnedTemperature(nn.Module):
    """A positive learned scalar per head, exp(log_tau), starting at sqrt(d_head)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int):
        super().__init__()
        self.log_tau = nn.Parameter(torch.full((1, n_heads, 1, 1), 0.5 * math.log(d_head)))

    def forward(self, x):
        return self.log_tau.exp()

    def fold(self, folding: Folding) -> nn.Module:
        return _StackedLearnedTemperature(folding.param("log_tau"))


class _StackedLearnedTemperature(nn.Module):
    """K learned temperatures: each model's per-head scalar over its own rows."""

    def __init__(self, log_tau):
        super().__init__()
        self.log_tau = log_tau  # [K, 1, H, 1, 1]

    def forward(self, x):
        k = self.log_tau.shape[0]
        tau = self.log_tau.exp().squeeze(1)  # [K, H, 1, 1]
        # per query position ([K * B, H, T, 1]): also right for the block-wise window path
        tau = tau.expand(k, tau.shape[1], x.shape[1], 1)
        return broadcast_rows(tau, x.shape[0] // k)


@register_temperature("adaptive")
class AdaptiveTemperature(nn.Module):
    """A temperature per head and per query position, from that position's own input only (causal):
    tau[b, h, t] = sqrt(d_head) * exp(2 * tanh(w_h . x[b, t] + c_h)), starting at sqrt(d_head)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int):
        super().__init__()
        self.proj = nn.Linear(d_model, n_heads)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        self.base = math.sqrt(d_head)

    def forward(self, x):
        z = wide(self.proj(x))  # [B, T, H]
        return (self.base * torch.exp(2.0 * torch.tanh(z))).transpose(1, 2).unsqueeze(-1)


# -- gatings ---------------------------------------------------------------------------------------
# Modules with gate_input(x) (applied before the Q/K/V projections) and forward(x, y) combining the
# block input x with the projected attention output y.


class Gating(nn.Module):
    gated = False  # True: holds ``gate``, a d_model -> d_model linear map of x

    def __init__(self, d_model: int):
        super().__init__()
        if self.gated:
            self.gate = nn.Linear(d_model, d_model)

    def gate_input(self, x):
        return x

    def forward(self, x, y):
        return y


@register_gating("none")
class NoGating(Gating):
    """The attention output as it is."""


@register_gating("input_gate")
class InputGate(Gating):
    """sigmoid(W x) * x feeds the Q/K/V projections (position-wise, so causal)."""

    gated = True

    def gate_input(self, x):
        return torch.sigmoid(self.gate(x)) * x


@register_gating("output_gate")
class OutputGate(Gating):
    """sigmoid(W x) * attention output."""

    gated = True

    def forward(self, x, y):
        return torch.sigmoid(self.gate(x)) * y


@register_gating("highway")
class HighwayGate(Gating):
    """g * attention output + (1 - g) * x with g = sigmoid(W x), initially leaning to attention."""

    gated = True

    def __init__(self, d_model: int):
        super().__init__(d_model)
        nn.init.constant_(self.gate.bias, 1.0)

    def forward(self, x, y):
        g = torch.sigmoid(self.gate(x))
        return g * y + (1.0 - g) * x
