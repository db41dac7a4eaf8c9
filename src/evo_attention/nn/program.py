"""What an attention program computes (``evo_attention.programs`` is its grammar).

``ProgramCore`` runs one program inside an ``EvolvedAttention``: the attention module gives the
inputs (x, the gene's projections q, k, v with their rotary angles and grouped heads), the score
bias of its positions (alibi, ``abias=rel``), the keys each query may see (causal, the gene's
window, an external mask), its attention dropout and its output projection ``o``. Each op is
written once here, for one model and for K folded ones (``nn.fold``): ops with weights keep them
with a leading model dimension (``_PerModel``) or in PyTorch layers, and the registered components
(``s.*``, ``t.*``, ``w.*``, ``kmix.*``, ``g.*``, ``gi.*``) are the very modules and functions of
``nn.components``, so a classic gene and its program compute the same function.

Contracts (tests hold random programs to them):

- Each distinct subexpression is computed once per forward pass (nodes are keyed by their text).
- Causal: ops along time read only earlier positions (shifts and convolutions pad the past with
  zeros); weights are formed over the keys a query may see and are exactly zero elsewhere (``mix``
  masks them again, so no op between a weighting and ``mix`` can leak a future key).
- No NaN: every elementwise result is clipped to +-``programs.CLIP``; exp is taken of at most 20;
  divisions are safe (``sdiv``: a b / (b^2 + 0.01)); a kernel's ratio is ``components.safe_ratio``.
- Fast paths: ``mix(w.softmax(t.T(s.S(A,B))),C)`` with a dot-product similarity S runs in
  ``scaled_dot_product_attention`` (the attention module's own ``attend``) where the classic gene
  would; ``kmix`` runs as a running sum (``components.causal_kernel_attention``) unless explicit
  weights are needed (maps, a mask, a window, attention dropout in training).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from evo_attention import programs
from evo_attention.nn import components
from evo_attention.nn.dropout import dropout
from evo_attention.nn.fold import Folding, per_model

CLIP = programs.CLIP
EPS_DIV = 1e-2  # sdiv(a, b) = a b / (b^2 + EPS_DIV): |result| <= |a| / (2 sqrt(EPS_DIV))

UNARY = {
    "neg": torch.neg, "relu": F.relu, "sqrelu": lambda z: F.relu(z).square(), "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "exp": lambda z: torch.exp(z.clamp(max=20.0)), "softplus": F.softplus,
    "abs": torch.abs, "square": torch.square,
    "ssqrt": lambda z: torch.sign(z) * (torch.sqrt(z.abs() + 1e-4) - 1e-2),
    "slog1p": lambda z: torch.sign(z) * torch.log1p(z.abs()),
}


def _maximum(a, b):
    if not torch.is_tensor(a):
        a, b = b, a
    return a.clamp(min=b) if not torch.is_tensor(b) else torch.maximum(a, b)


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "sdiv": lambda a, b: a * b / (b * b + EPS_DIV), "max": _maximum,
}


# -- ops with weights ------------------------------------------------------------------------------
class _PerModel(nn.Module):
    """An op whose parameters carry a leading model dimension M: 1 alone, K once folded (the
    stacked [K, 1, ...] parameters are read as [K, ...]). Activations [M * B, ...] are viewed per
    model, [M, B, ...], so each model's rows meet its own parameters."""

    folded = False

    def p(self, name: str) -> torch.Tensor:
        value = getattr(self, name)
        return value.flatten(0, 1) if self.folded else value

    def fold(self, folding: Folding) -> nn.Module:
        clone = copy.deepcopy(self)
        for name, _ in self.named_parameters(recurse=False):
            setattr(clone, name, folding.param(name))
        clone.folded = True
        return clone


def _shape_of(kind: str, n_heads: int, d_head: int, d_model: int) -> tuple:
    """The per-model parameter shape of a scale or bias on a value of type ``kind``, broadcasting
    against its per-model view ([M, B, H, T, d], [M, B, T, D] or [M, B, H, T, T])."""
    return {"H": (1, n_heads, 1, d_head), "X": (1, 1, d_model), "S": (1, n_heads, 1, 1)}[kind]


class Affine(_PerModel):
    """``scale`` (init 1) or ``bias`` (init 0): a learned factor or offset per channel (per head
    for scores)."""

    def __init__(self, shape: tuple, multiply: bool):
        super().__init__()
        self.multiply = multiply
        self.weight = nn.Parameter(torch.full((1, *shape), 1.0 if multiply else 0.0))

    def forward(self, z):
        w = self.p("weight")
        zm = per_model(z, w.shape[0])
        out = zm * w.unsqueeze(1) if self.multiply else zm + w.unsqueeze(1)
        return out.reshape(z.shape)


class HeadMap(_PerModel):
    """``lfeat``: a learned d x d map of each head's channels (init identity)."""

    def __init__(self, n_heads: int, d_head: int):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(d_head).repeat(1, n_heads, 1, 1))  # [1, H, d, d]

    def forward(self, z):
        w = self.p("weight")
        zm = per_model(z, w.shape[0])  # [M, B, H, T, d]
        return torch.einsum("mbhtd,mhde->mbhte", zm, w.to(zm.dtype)).reshape(z.shape)


class CausalConv(_PerModel):
    """``dconvN``: a depthwise causal convolution of width N along time, per head and channel:
    y_t = sum_i w_i z_(t-i), positions before 0 read as zeros (init: y = z)."""

    def __init__(self, n_heads: int, d_head: int, width: int):
        super().__init__()
        weight = torch.zeros(1, n_heads, 1, d_head, width)
        weight[..., 0] = 1.0
        self.weight = nn.Parameter(weight)

    def forward(self, z):
        w = self.p("weight")
        m, width, t = w.shape[0], w.shape[-1], z.shape[2]
        zm = per_model(z, m)  # [M, B, H, T, d]
        padded = F.pad(zm, (0, 0, width - 1, 0))
        out = sum(padded[:, :, :, width - 1 - i:width - 1 - i + t] * w[..., i].unsqueeze(1) for i in range(width))
        return out.reshape(z.shape)


class Decay(_PerModel):
    """``decay`` (on vectors: y_t = (1 - l) sum_(j<=t) l^(t-j) z_j, an exponential moving average)
    or ``sdecay`` (on scores: s_ij l^(i-j) for j <= i), with a learned rate l = sigmoid(a) per head
    (init 0.9)."""

    def __init__(self, n_heads: int, scores: bool):
        super().__init__()
        self.scores = scores
        self.logit = nn.Parameter(torch.full((1, n_heads), math.log(9.0)))

    def matrix(self, t: int, device) -> torch.Tensor:
        """[M, 1, H, T, T]: l^(i-j) where j <= i, 0 elsewhere."""
        log_rate = F.logsigmoid(self.p("logit").float())  # [M, H]
        i = torch.arange(t, device=device)
        gap = (i[:, None] - i[None, :]).clamp(min=0).float()
        decay = torch.exp(log_rate[:, :, None, None] * gap)
        return decay.masked_fill(i[:, None] < i[None, :], 0.0).unsqueeze(1)

    def forward(self, z):
        m = self.p("logit").shape[0]
        t = z.shape[2]
        d = self.matrix(t, z.device).to(z.dtype)
        zm = per_model(z, m)
        if self.scores:
            return (zm * d).reshape(z.shape)
        rate = torch.sigmoid(self.p("logit")).to(z.dtype)[:, None, :, None, None]
        return ((1 - rate) * (d @ zm)).reshape(z.shape)


class XGate(nn.Module):
    """``sgate``: the value times sigmoid of a new projection of the block input x (on heads: a
    gate per head and channel, as in gated attention; on X: per channel)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, heads: bool):
        super().__init__()
        self.heads, self.n_heads, self.d_head = heads, n_heads, d_head
        self.proj = nn.Linear(d_model, n_heads * d_head if heads else d_model)

    def forward(self, z, x):
        g = torch.sigmoid(self.proj(x))  # [B, T, out]
        if self.heads:
            b, t, _ = g.shape
            g = g.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        return z * g.to(z.dtype)


# -- one program ---------------------------------------------------------------------------------------
class _Pass:
    """What one forward pass of a program reads from its attention module, computed when first needed."""

    def __init__(self, attn, x, mask, need_weights):
        self.attn, self.x, self.mask, self.need_weights = attn, x, mask, need_weights
        self.t = x.shape[1]
        self.dropout_p = attn.dropout_p if attn.training else 0.0
        self.projected = None
        self.values: dict = {}
        self.weights = None
        self._allowed = None
        self._bias = False

    def qkv(self, h):
        if self.projected is None:
            q, k, v = self.attn.rotated_heads(h)
            k, v = self.attn.share_kv(k, v)
            if self.attn.qkv_conv is not None:
                q, k, v = self.attn.qkv_conv(q, k, v)
            self.projected = {"q": q, "k": k, "v": v}
        return self.projected

    @property
    def windowed(self) -> bool:
        return 0 < self.attn.window < self.t

    @property
    def allowed(self) -> torch.Tensor:
        if self._allowed is None:
            self._allowed = self.attn.allowed_keys(self.t, self.x.device, self.mask)
        return self._allowed

    @property
    def bias(self):
        if self._bias is False:
            self._bias = self.attn.score_bias(self.t, self.x.device)
        return self._bias


class ProgramCore(nn.Module):
    """One program's ops and weights; ``forward(attn, x, mask, need_weights)`` -> (out, weights)."""

    def __init__(self, program: programs.Program, grammar: programs.Grammar, *, d_model: int, n_heads: int,
                 d_head: int, kernel_features: int = 64):
        super().__init__()
        self.program = program
        self.nodes = program.nodes()
        memo: dict = {}
        grammar.type_of(program.root, memo)
        types = {text: t for (text, _), t in memo.items()}
        self.ops = nn.ModuleDict()
        for i, node in enumerate(self.nodes):
            module = _build(node, types, grammar, d_model, n_heads, d_head, kernel_features)
            if module is not None:
                self.ops[f"n{i}"] = module
        self.index = {node.text: i for i, node in enumerate(self.nodes)}
        self.fusable = {node.text: pattern for node in self.nodes if (pattern := self._fused_form(node))}

    def _module(self, node):
        return self.ops[f"n{self.index[node.text]}"]

    def _fused_form(self, node):
        """(similarity node, temperature node or None) when ``node`` is mix(w.softmax(t(s(A,B))),C)
        with a dot-product similarity."""
        if node.op != "mix" or node.args[0].op != "w.softmax":
            return None
        scores, temperature = node.args[0].args[0], None
        if scores.op.startswith("t."):
            scores, temperature = scores.args[0], scores
        if not scores.op.startswith("s."):
            return None
        if not getattr(components.factory("similarity", scores.op[2:]), "dot_form", False):
            return None
        return scores, temperature

    def forward(self, attn, x, mask=None, need_weights: bool = False):
        run = _Pass(attn, x, mask, need_weights)
        return self.value(self.program.root, run), run.weights

    def heads(self, attn, x, projected: dict, mask=None):
        """The value of the root ``o(...)``'s argument, [B, H, T, d], with the given projections
        ({"q", "k", "v"} [B, H, T, d]) in place of the attention module's (a host model's own,
        ``nn.hf_attention``)."""
        run = _Pass(attn, x, mask, False)
        run.projected = projected
        return self.value(self.program.root.args[0], run)

    def value(self, node, run: _Pass):
        """The value of ``node`` in this pass: computed when first asked for, then kept (a node that
        only a fused path would have read is never computed)."""
        found = run.values.get(node.text)
        if found is None:
            found = run.values[node.text] = self._value(node, run)
        return found

    def _value(self, node, run: _Pass):
        op = node.op
        if op == "const":
            return node.value
        if not node.args:
            if op == "x":
                return run.x
            root = self.program.root
            return run.qkv(self.value(root.args[0], run) if root.op == "pin" else run.x)[op]
        if op == "mix" and node.text in self.fusable and self._fuses(run):
            return self._fused_mix(node, run)
        args = [self.value(a, run) for a in node.args]
        if op in UNARY:
            return UNARY[op](args[0]).clamp(-CLIP, CLIP)
        if op in BINARY:
            value = BINARY[op](*args)
            return value.clamp(-CLIP, CLIP) if torch.is_tensor(value) else value
        if op in ("scale", "bias", "lfeat", "dconv2", "dconv3", "dconv4", "decay", "sdecay"):
            return self._module(node)(args[0])
        if op == "sgate":
            return self._module(node)(args[0], run.x)
        if op == "lin":
            return self._module(node)(args[0])
        if op == "l2n":
            return F.normalize(args[0], dim=-1) * math.sqrt(args[0].shape[-1])
        if op == "rmsn":
            return F.rms_norm(args[0], (args[0].shape[-1],), eps=1e-6)
        if op == "elu1":
            return F.elu(args[0]) + 1.0
        if op == "shift":
            return F.pad(args[0], (0, 0, 1, 0))[:, :, :-1]
        if op == "cumsum":
            return args[0].cumsum(dim=2).clamp(-CLIP, CLIP)
        if op == "cummean":
            n = torch.arange(1, args[0].shape[2] + 1, device=args[0].device, dtype=args[0].dtype)
            return args[0].cumsum(dim=2) / n[:, None]
        if op == "o":
            b, t, _ = run.x.shape
            return run.attn.out(args[0].transpose(1, 2).reshape(b, t, run.attn.d_model))
        if op == "pin":
            return args[1]
        prefix, _, name = op.partition(".")
        if prefix == "s":
            similarity = self._module(node)
            if getattr(similarity, "causal_skip", False):  # scores of future keys may stay 0: masked later
                return similarity(*args, causal=True)
            return similarity(*args)
        if prefix == "t":
            tau = self._module(node)(run.x)
            return args[0] / tau.to(args[0].dtype)
        if prefix == "w":
            scores = args[0] if run.bias is None else args[0] + run.bias
            if name == "none":
                return components.zero_masked(scores, run.allowed)
            return components.NORMALIZATIONS[name](scores, run.allowed)
        if op == "mix":
            return self._mix(node, args, run)
        if prefix == "kmix":
            return self._kernel_mix(node, args, run)
        if prefix == "g":
            return self._module(node)(run.x, args[0])
        if prefix == "gi":
            return self._module(node).gate_input(args[0])
        raise ValueError(f"program op {op!r} has no implementation")  # the grammar admits no such op

    @staticmethod
    def _fuses(run: _Pass) -> bool:
        """Whether this pass may take the fused path (as the classic gene would: no maps, no
        external mask, no attention dropout)."""
        return run.attn.fused and run.mask is None and not run.need_weights and not run.dropout_p > 0

    def _fused_mix(self, node, run: _Pass):
        """mix(w.softmax(t(s(A,B))),C) in ``scaled_dot_product_attention``: the temperature divides
        the prepared queries, the score bias goes in as a float mask (``EvolvedAttention.attend``)."""
        scores, temperature = self.fusable[node.text]
        a, b = (self.value(arg, run) for arg in scores.args)
        tau = self._module(temperature)(run.x) if temperature is not None else torch.ones((), device=a.device)
        y, _ = run.attn.attend(a, b, self.value(node.args[1], run), tau, run.bias, run.allowed, 0.0, fused=True,
                               full_causal=not run.windowed, aligned=True, similarity=self._module(scores))
        return y

    def _mix(self, node, args, run: _Pass):
        weights = components.zero_masked(args[0], run.allowed)
        if run.weights is None and run.need_weights:
            run.weights = weights
        return dropout(weights, run.dropout_p, run.attn.training).to(args[1].dtype) @ args[1]

    def _kernel_mix(self, node, args, run: _Pass):
        """kmix.NAME(A, B, C): the registered kernel's features of A d^(1/4) and B / d^(1/4); kmix(F, F, C):
        the features as given. Weights phi(a_i) . phi(b_j) over the keys a query may see, in at least float32."""
        a, b, v = args
        with torch.autocast(a.device.type, enabled=False):
            dtype = torch.promote_types(a.dtype, torch.float32)
            a, b, v = a.to(dtype), b.to(dtype), v.to(dtype)
            if node.op != "kmix":
                s = a.shape[-1] ** 0.25
                a, b = self._module(node).feature_maps(a * s, b / s)
            explicit = run.need_weights or run.mask is not None or run.windowed or run.dropout_p > 0
            if not explicit:
                return components.causal_kernel_attention(a, b, v)
            weights = components.kernel_weights(a, b, run.allowed)
            if run.weights is None and run.need_weights:
                run.weights = weights
            return dropout(weights, run.dropout_p, run.attn.training).to(v.dtype) @ v


def _build(node, types, grammar, d_model: int, n_heads: int, d_head: int, kernel_features: int):
    """The module of an op with weights or a registered component (None for the others)."""
    op = node.op
    if not node.args:
        return None
    if op in ("scale", "bias"):
        return Affine(_shape_of(types[node.args[0].text] if types[node.args[0].text] != "F" else "H",
                                n_heads, d_head, d_model), multiply=op == "scale")
    if op == "lfeat":
        return HeadMap(n_heads, d_head)
    if op.startswith("dconv"):
        return CausalConv(n_heads, d_head, int(op[5:]))
    if op in ("decay", "sdecay"):
        return Decay(n_heads, scores=op == "sdecay")
    if op == "sgate":
        return XGate(d_model, n_heads, d_head, heads=types[node.text] == "H")
    if op == "lin":
        return nn.Linear(d_model, d_model)
    prefix, _, name = op.partition(".")
    if prefix == "s":
        return components.SIMILARITIES[name](d_head, n_heads)
    if prefix == "t":
        return components.TEMPERATURES[name](d_model, n_heads, d_head)
    if prefix == "kmix" and name:
        return components.NORMALIZATIONS[name](d_head, n_heads, kernel_features)
    if prefix in ("g", "gi"):
        return components.GATINGS[name](d_model)
    return None
