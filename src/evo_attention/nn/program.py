"""The attention engine: what a program computes (``evo_attention.programs`` is its grammar).

Every gene is a program (a classic gene is ``programs.classic_program`` of its four components),
and ``ProgramCore`` is the only thing that computes attention, in its frame
``nn.attention.EvolvedAttention`` (x, q, k, v, the score bias, the window, the attention dropout,
``o``, a classic gene's components); a program's ops with weights live here. ``register_op`` puts an
op into the grammar (``programs.OPS``) and gives its computation here, for one model and for K folded
ones; the registered components give the ops ``s.*``, ``t.*``, ``w.*``, ``kmix.*``, ``g.*``, ``gi.*``.

Contracts (tests hold every registered op to them through random programs):

- Each distinct subexpression is computed once per forward pass (nodes are keyed by their text).
- Causal: ops along time read only earlier positions (shifts and convolutions pad the past with
  zeros); weights are formed over the keys a query may see and are exactly zero elsewhere (``mix``
  masks them again unless they come straight from a ``w.*``, which zeroes them itself).
- No NaN: every elementwise result is clipped to +-``programs.CLIP``; exp is taken of at most 20;
  divisions are safe (``sdiv``: a b / (b^2 + 0.01)); a kernel's ratio is ``components.safe_ratio``.

Fast paths are patterns the engine recognises, each computing the same function as the plain one:

- ``mix(w.softmax(t.T(s.S(A,B))),C)`` with a dot-product similarity S: PyTorch's fused
  ``scaled_dot_product_attention``, unless weights are needed (maps, a mask, attention dropout in
  training: ``nn.dropout`` draws its masks the same on every device, SDPA's dropout would not).
- ``mix(w.N(t.T(s.S(A,B))),C)`` and ``kmix.N(...)`` with a window W, 2W < T: block by block, each
  block of W queries meeting the 2W keys of its own and the previous block (O(T W)).
- ``kmix``: running sums over positions (``components.causal_kernel_attention``, O(T)) unless
  explicit weights are needed (maps, a mask, a window, attention dropout in training).
- Decoding: a program whose ops each read one position (none along time, none in
  ``components.ACROSS_POSITIONS``), whose queries and x meet keys and values only in its similarities and
  mixing ops, and whose ops on keys and values read no x (entry by entry, over a head's channels, ``scale``,
  ``bias``) decodes with a key/value cache: those ops run on the cached keys and values (running sums for
  one kernel without a window); any other recomputes its forward over the positions so far and keeps the
  new rows (every op is causal).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from evo_attention import programs
from evo_attention.nn import components
from evo_attention.nn.dropout import dropout
from evo_attention.nn.fold import Folding, Unfoldable, per_model

CLIP = programs.CLIP
EPS_DIV = 1e-2  # sdiv(a, b) = a b / (b^2 + EPS_DIV): |result| <= |a| / (2 sqrt(EPS_DIV))


# -- the op registry -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shapes:
    """What ``build`` reads: the layer's sizes and the op node's argument and result types."""

    d_model: int
    n_heads: int
    d_head: int
    kernel_features: int
    arg_types: tuple
    result_type: str


@dataclass(frozen=True)
class Call:
    """What ``apply`` reads besides its arguments: the op's module (None without ``build``), the
    block input x [B, T, d_model] and the attention frame (its ``out`` projection, sizes)."""

    module: nn.Module | None
    x: torch.Tensor
    attn: nn.Module


@dataclass(frozen=True)
class Implementation:
    apply: Callable  # (Call, *argument values) -> value
    build: Callable | None = None  # (Shapes) -> nn.Module with the op's weights, or None


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register_op(name: str, signatures, kind: str, *, apply: Callable, build: Callable | None = None,
                commutative: bool = False, fold: Callable | None = None) -> None:
    """Add the op ``name`` to the program language, everywhere at once.

    ``signatures``: one or more of ``"H->H"``, ``"H,H->S"`` (argument types -> result type; the
    types are ``programs.TYPES``, ``T`` any of X, H, S); ``kind``: ``elementwise`` (entry by entry;
    results are clipped to +-CLIP; ``fold`` gives its value on numbers for constant folding),
    ``learned`` (per position, with weights), ``feature`` (over a head's channels) or ``time``
    (reads earlier positions only: it makes a program mix tokens; it must never read a later one).
    ``apply(call, *args)`` computes it on tensors of any leading batch size (K folded models are
    one batch of K * B rows, model-major); ``build(shapes)`` returns the module holding its weights
    (subclass ``PerModel`` or give it a ``fold`` method so that it folds), as ``call.module``."""
    if not callable(apply) or (build is not None and not callable(build)):
        raise programs.ProgramError(f"program op {name!r}: apply (and build, if given) must be functions")
    sigs = [signatures] if isinstance(signatures, str) else list(signatures) if isinstance(
        signatures, (list, tuple)) else []
    if not sigs or not isinstance(name, str):
        raise programs.ProgramError(f"program op {name!r}: give a name (a string) and one or more signatures "
                                    f"such as 'H->H' (signatures {signatures!r})")
    op = programs.Op(name, tuple(programs.signature(s) for s in sigs), kind, commutative, fold)
    if name in IMPLEMENTATIONS and name in programs.OPS:  # again: harmless only as the same code
        if not (_same(IMPLEMENTATIONS[name].apply, apply) and _same(IMPLEMENTATIONS[name].build, build)
                and _same(programs.OPS[name].fold, fold)):
            raise programs.op_taken(name, "with another implementation")
        op = replace(op, fold=programs.OPS[name].fold)
    across: list = []
    fault = _probe(op, Implementation(apply, build), across)  # probed first: a refused op changes nothing
    if fault:
        raise programs.ProgramError(f"program op {name!r} {fault}")
    programs.add_op(op)
    _own(name, apply, build)
    (components.ACROSS_POSITIONS.add if across else components.ACROSS_POSITIONS.discard)(name)


def _probe(op: programs.Op, impl: Implementation, across: list | None = None) -> str | None:
    """What ``op`` does wrong on the first typing of its signatures (T as X, H and S) where it returns
    no finite tensor of its result type's shape and its inputs' dtype (an F: non-negative) at its initial
    weights on any input of the probe (a random weight, such as a negative scale under a square root, may
    give NaN where training never would), or, with
    random weights, reads a later position or another batch row (``components.probe``, the block input x
    moved with the inputs; the frame and the op's module in eval, then train mode); None if nothing.
    ``across`` collects the typings whose value at a position reads other positions. A typing the op
    raises on at every probe is left to fail in use."""
    apply = _clipped(impl.apply) if op.kind == "elementwise" else impl.apply  # as the engine computes it
    for args, _ in op.signatures:
        for typed in ("X", "H", "S") if "T" in args else ("T",):
            types = tuple(typed if a == "T" else a for a in args)
            out = op.result(types)
            typing, wrong = f"{','.join(types)}->{out}", []

            def compute(x, *values):
                value = apply(Call(module, x, frame), *values)
                if not checking:
                    return value
                b, t = x.shape[:2]  # a score's keys: its scores argument's, else the positions
                keys = next((v.shape[-1] for v, kind in zip(values, types) if kind in ("S", "W")), t)
                due = {"X": (b, t, 8), "H": (b, 2, t, 4), "F": (b, 2, t, -1)}.get(out, (b, 2, t, keys))
                if out != "C" and not (torch.is_tensor(value) and value.dim() == len(due) and all(
                        d in (-1, n) for d, n in zip(due, value.shape))):
                    got = f"shape {tuple(value.shape)}" if torch.is_tensor(value) else repr(value)[:40]
                    wrong.append(f"returns {got} as {typing}, where a tensor of {_LAYOUTS[out]} is due")
                elif torch.is_tensor(value) and value.dtype != x.dtype:
                    wrong.append(f"returns {value.dtype} as {typing} on {x.dtype} inputs: keep its inputs' dtype")
                elif torch.is_tensor(value) and not torch.isfinite(value).all():
                    wrong.append(f"gives NaN or inf as {typing} at its initial weights on random inputs: keep its "
                                 "values finite")
                elif out == "F" and (value < 0).any():
                    wrong.append(f"gives negative values as {typing} at its initial weights on random inputs: keep "
                                 "its features (F) non-negative")
                return value
            checking, found = True, None
            with torch.random.fork_rng(devices=[]), torch.no_grad():  # building draws initial weights
                try:
                    module = impl.build(Shapes(8, 2, 4, 4, types, out)) if impl.build else None
                    frame = nn.Module()  # the attention frame; the op's module in it takes its mode
                    frame.out, frame.op, frame.d_model, frame.n_heads, frame.d_head = nn.Linear(8, 8), module, 8, 2, 4
                except Exception:
                    continue
                modes = {m: m.training for m in frame.modules()}
                # an op with weights is checked at its initial weights on every input the probe feeds it (its
                # outputs zeroed, so that no verdict there ends the probe early); one without, on the probe's calls
                with contextlib.suppress(Exception):  # e.g. too few positions at every probe length: fails in use
                    if module is not None:
                        components.probe_at(lambda *values: 0 * compute(*values), "X" + "".join(types), out, frame,
                                            (), randomize=False)
                for part, training in modes.items():
                    part.training = training
                checking = module is None
                with contextlib.suppress(Exception):
                    if not wrong:
                        found = components.probe(compute, "X" + "".join(types), out, frame)
            if wrong:
                return wrong[0]
            if found and found != "rows":
                return (f"{found} as {typing}: its value at position t of a batch row may depend only on that "
                        "row's inputs at positions <= t (and a score [i, j] on query i, key j); list only the "
                        "signatures where it does so")
            if found and across is not None:
                across.append(typing)
    return None


_LAYOUTS = {"X": "[B, T, d_model]", "H": "[B, heads, T, d_head]", "F": "[B, heads, T, features]",
            "S": "[B, heads, T, keys]", "W": "[B, heads, T, keys]"}


def _same(a: Callable | None, b: Callable | None) -> bool:
    """Whether two functions compute the same: one function, or equal code of a module of one name
    (the same plugin imported again, also from another path such as an export's copy of it)."""
    a, b = inspect.unwrap(a) if a else a, inspect.unwrap(b) if b else b
    return a is b or (hasattr(a, "__code__") and hasattr(b, "__code__") and a.__code__ == b.__code__
                      and a.__module__ == b.__module__)


def unregister_op(name: str) -> None:
    """Remove an op ``register_op`` added."""
    programs.remove_op(name)
    IMPLEMENTATIONS.pop(name, None)
    components.ACROSS_POSITIONS.discard(name)


def _clipped(apply: Callable) -> Callable:
    """An elementwise op clipped to +-CLIP; on fp16 values (a model cast to fp16) computed in float32
    first, as fp16's range (65504) holds the clipped result but not every intermediate (b * b)."""
    @functools.wraps(apply)  # keeps apply's __module__: an export finds the plugin that defines it there
    def clipped(call, *args):
        half = any(torch.is_tensor(a) and a.dtype == torch.float16 for a in args)
        value = apply(call, *(a.float() if half and torch.is_tensor(a) else a for a in args))
        if not torch.is_tensor(value):
            return value
        return value.clamp(-CLIP, CLIP).to(torch.float16 if half else value.dtype)  # an int stays one (refused)
    return clipped


# -- ops with weights ------------------------------------------------------------------------------
class PerModel(nn.Module):
    """An op whose parameters carry a leading model dimension M: 1 alone, K once folded (the
    stacked [K, 1, ...] parameters are read as [K, ...]). Activations [M * B, ...] are viewed per
    model, [M, B, ...], so each model's rows meet its own parameters. Its own buffers with a leading
    dimension of 1 (e.g. features drawn per seed at build) fold the same way, each model's stacked; any
    other buffer is shared, and one that differs between the models refuses the fold."""

    folded = False
    stacked_buffers: tuple[str, ...] = ()

    def p(self, name: str) -> torch.Tensor:
        value = getattr(self, name)
        return value.flatten(0, 1) if self.folded else value

    def fold(self, folding: Folding) -> nn.Module:
        clone = copy.deepcopy(self)
        for name, _ in self.named_parameters(recurse=False):
            setattr(clone, name, folding.param(name))
        clone.stacked_buffers = tuple(n for n, b in self.named_buffers() if "." not in n and b.shape[:1] == (1,))
        for name, buffer in self.named_buffers():
            stacked = folding.buffers(name)
            if name in clone.stacked_buffers:
                setattr(clone, name, stacked)
            elif not all(torch.equal(b, buffer) for b in stacked):
                raise Unfoldable(f"{type(self).__name__} at {folding.path} has a buffer {name!r} that differs between "
                                 "the models and no leading model dimension of 1", folding.path)
        clone.folded = True
        return clone

    def keep_models(self, index: torch.Tensor) -> None:
        for name in self.stacked_buffers:
            setattr(self, name, getattr(self, name).index_select(0, index))


def _shape_of(kind: str, s: Shapes) -> tuple:
    """The per-model parameter shape of a scale or bias on a value of type ``kind``, broadcasting
    against its per-model view ([M, B, H, T, d], [M, B, T, D] or [M, B, H, T, T])."""
    return {"H": (1, s.n_heads, 1, s.d_head), "F": (1, s.n_heads, 1, s.d_head), "X": (1, 1, s.d_model),
            "S": (1, s.n_heads, 1, 1)}[kind]


class Affine(PerModel):
    """``scale`` (init 1) or ``bias`` (init 0): a learned factor or offset per channel (per head
    for scores)."""

    def __init__(self, shape: tuple, multiply: bool):
        super().__init__()
        self.multiply = multiply
        self.weight = nn.Parameter(torch.full((1, *shape), 1.0 if multiply else 0.0))

    def forward(self, z):
        w = self.p("weight")
        zm = per_model(z, w.shape[0])
        # w is [M, 1, ...] (its own batch axis, ``_shape_of``): it lines up with zm as it is
        return (zm * w if self.multiply else zm + w).reshape(z.shape)


class HeadMap(PerModel):
    """``lfeat``: a learned d x d map of each head's channels (init identity)."""

    def __init__(self, n_heads: int, d_head: int):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(d_head).repeat(1, n_heads, 1, 1))  # [1, H, d, d]

    def forward(self, z):
        w = self.p("weight")
        zm = per_model(z, w.shape[0])  # [M, B, H, T, d]
        return torch.einsum("mbhtd,mhde->mbhte", zm, w.to(zm.dtype)).reshape(z.shape)


class CausalConv(PerModel):
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


class Decay(PerModel):
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
        d = self.matrix(z.shape[2], z.device).to(z.dtype)
        zm = per_model(z, d.shape[0])
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


# -- the built-in ops --------------------------------------------------------------------------------
def _maximum(a, b):
    if not torch.is_tensor(a):
        a, b = b, a
    return a.clamp(min=b) if not torch.is_tensor(b) else torch.maximum(a, b)


def _own(name: str, apply: Callable, build: Callable | None = None) -> None:
    """The computation of an op whose signature is in ``programs.OPS`` already."""
    kind = programs.OPS[name].kind
    IMPLEMENTATIONS[name] = Implementation(_clipped(apply) if kind == "elementwise" else apply, build)


for _name, _fn in {
    "neg": torch.neg, "relu": F.relu, "sqrelu": lambda z: F.relu(z).square(), "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "exp": lambda z: torch.exp(z.clamp(max=20.0)), "softplus": F.softplus,
    "abs": torch.abs, "square": torch.square,
    "ssqrt": lambda z: torch.sign(z) * (torch.sqrt(z.abs() + 1e-4) - 1e-2),
    "slog1p": lambda z: torch.sign(z) * torch.log1p(z.abs()),
}.items():
    _own(_name, lambda call, a, fn=_fn: fn(a))
for _name, _fn in {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "sdiv": lambda a, b: a * b / (b * b + EPS_DIV), "max": _maximum,
}.items():
    _own(_name, lambda call, a, b, fn=_fn: fn(a, b))
for _name in ("scale", "bias"):
    _own(_name, lambda call, z: call.module(z),
         lambda s, multiply=_name == "scale": Affine(_shape_of(s.arg_types[0], s), multiply=multiply))
for _width in (2, 3, 4):
    _own(f"dconv{_width}", lambda call, z: call.module(z), lambda s, w=_width: CausalConv(s.n_heads, s.d_head, w))
_own("lfeat", lambda call, z: call.module(z), lambda s: HeadMap(s.n_heads, s.d_head))
_own("decay", lambda call, z: call.module(z), lambda s: Decay(s.n_heads, scores=False))
_own("sdecay", lambda call, z: call.module(z), lambda s: Decay(s.n_heads, scores=True))
_own("sgate", lambda call, z: call.module(z, call.x),
     lambda s: XGate(s.d_model, s.n_heads, s.d_head, heads=s.result_type == "H"))
_own("lin", lambda call, z: call.module(z), lambda s: nn.Linear(s.d_model, s.d_model))
_own("l2n", lambda call, z: F.normalize(z, dim=-1) * math.sqrt(z.shape[-1]))
_own("rmsn", lambda call, z: F.rms_norm(z, (z.shape[-1],), eps=1e-6))
_own("elu1", lambda call, z: F.elu(z) + 1.0)
_own("shift", lambda call, z: F.pad(z, (0, 0, 1, 0))[:, :, :-1])
_own("cumsum", lambda call, z: z.cumsum(dim=2).clamp(-CLIP, CLIP))
_own("cummean", lambda call, z: z.cumsum(dim=2) / torch.arange(1, z.shape[2] + 1, device=z.device,
                                                                   dtype=z.dtype)[:, None])
_own("o", lambda call, y: call.attn.out(y.transpose(1, 2).reshape(*call.x.shape[:2], call.attn.d_model)))
_own("pin", lambda call, projected_input, out: out)
# the engine computes mix, kmix and w.* itself (its fast paths); the component ops build from their registries
_COMPONENT_BUILDS = {
    "s": lambda name, s: components.SIMILARITIES[name](s.d_head, s.n_heads),
    "t": lambda name, s: components.TEMPERATURES[name](s.d_model, s.n_heads, s.d_head),
    "kmix": lambda name, s: components.NORMALIZATIONS[name](s.d_head, s.n_heads, s.kernel_features),
    "g": lambda name, s: components.GATINGS[name](s.d_model),
    "gi": lambda name, s: components.GATINGS[name](s.d_model),
}


# -- caches for decoding -----------------------------------------------------------------------------
@dataclass
class KVCache:
    """One layer's keys and values of the positions decoded so far, [B, kv_heads, T, d_head] each
    (keys after the rotary rotation; grouped K/V heads are stored once, not repeated per group)."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new positions' keys and values; the keys and values of every position so far."""
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        return self.k, self.v


@dataclass
class KernelState:
    """One layer's running sums for a kernel without a window: s = sum phi(k) v^T [B, H, m, d_head]
    and z = sum phi(k) [B, H, m] over the positions decoded so far. Its size does not grow with the
    sequence (the recurrent form of linear attention)."""

    s: torch.Tensor | None = None
    z: torch.Tensor | None = None
    length: int = 0


@dataclass
class InputCache:
    """One layer's inputs x [B, T, d_model] of the positions decoded so far (a program decoded by
    recomputation)."""

    x: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.x is None else self.x.shape[1]

    def append(self, x: torch.Tensor) -> torch.Tensor:
        self.x = x if self.x is None else torch.cat((self.x, x), dim=1)
        return self.x


# -- the attention kernels ------------------------------------------------------------------------------
def fused_attention(q, k, v, tau, bias, allowed, dropout_p: float, similarity, *, full_causal: bool):
    """softmax(prepare(q) prepare(k)^T / tau + bias) v over the ``allowed`` keys in PyTorch's
    fused kernel: y [.., Tq, d]."""
    q, k = similarity.prepare(q, k)
    q = q / tau.to(q.dtype)
    if bias is None and full_causal:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=1.0)
    base = bias if bias is not None else torch.zeros((), device=q.device)
    float_mask = torch.where(allowed, base, float("-inf")).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, dropout_p=dropout_p, scale=1.0)


def _blocks(z: torch.Tensor, w: int, pad: int, fill: float = 0.0) -> torch.Tensor:
    """[B, X, T, e] -> [B * n, X, W, e]: the sequence cut into n blocks of W positions (the last one
    padded with ``fill``)."""
    z = F.pad(z, (0, 0, 0, pad), value=fill) if pad else z
    b, x, t, e = z.shape
    return z.view(b, x, t // w, w, e).transpose(1, 2).reshape(b * (t // w), x, w, e)


def _bands(z: torch.Tensor, w: int, pad: int) -> torch.Tensor:
    """[B, X, T, e] -> [B * n, X, 2W, e]: for each block, the W positions before it and its own."""
    z = F.pad(z, (0, 0, 0, pad)) if pad else z
    b, x, t, e = z.shape
    z = z.view(b, x, t // w, w, e)
    z = torch.cat((F.pad(z[:, :, :-1], (0, 0, 0, 0, 1, 0)), z), dim=3)  # the first block's "before" is zeros
    return z.transpose(1, 2).reshape(b * (t // w), x, 2 * w, e)


def banded(q, k, v, w: int, tau, bias, weigh: Callable) -> torch.Tensor:
    """Sliding-window attention in blocks: the queries of block c (positions cW .. cW + W - 1)
    meet the keys of blocks c - 1 and c, of which query cW + a may see keys a + 1 .. a + W of the
    band. ``weigh(q, k, v, tau, bias, allowed)`` -> y on the blocks; returns y [B, H, T, d]."""
    b, h, t, d = q.shape
    n = -(-t // w)
    pad = n * w - t
    a = torch.arange(w, device=q.device)[:, None]
    j = torch.arange(2 * w, device=q.device)[None, :]
    allowed = ((j > a) & (j <= a + w)).expand(n, w, 2 * w).clone()
    allowed[0, :, :w] = False  # the first block's band starts before position 0
    allowed = allowed.unsqueeze(1).repeat(b, 1, 1, 1)  # [B * n, 1, W, 2W], b-major like _blocks
    if bias is not None:  # rows of the queries, columns of the band's keys (clamped ones are masked)
        pos_q = torch.arange(n * w, device=q.device).clamp(max=t - 1).view(n, w)
        pos_k = (torch.arange(n, device=q.device)[:, None] * w - w + j).clamp(0, t - 1)
        if bias.dim() == 3:  # [H, T, T], the same for every row -> [B * n, H, W, 2W]
            bias = bias[:, pos_q[:, :, None], pos_k[:, None, :]].transpose(0, 1).repeat(b, 1, 1, 1)
        else:  # [B, H, T, T], a bias per row (models folded into one batch) -> [B * n, H, W, 2W]
            bias = bias[:, :, pos_q[:, :, None], pos_k[:, None, :]].transpose(1, 2).reshape(b * n, h, w, 2 * w)
    if tau is not None and tau.dim() == 4 and tau.shape[2] == t:  # per-query temperature [B, H, T, 1]
        tau = _blocks(tau.expand(b, -1, -1, -1), w, pad, fill=1.0)  # padded queries: no division by 0
    y = weigh(_blocks(q, w, pad), _bands(k, w, pad), _bands(v, w, pad), tau, bias, allowed)
    return y.view(b, n, h, w, -1).transpose(1, 2).reshape(b, h, n * w, -1)[:, :, :t]


def decode_running(phi_q, phi_k, v, state: KernelState) -> torch.Tensor:
    """The new positions' outputs from the running sums of the earlier ones plus their own causal
    triangle; the sums then take the new positions in."""
    local = (phi_q @ phi_k.transpose(-2, -1)).tril()
    numerator, denominator = local @ v, local.sum(dim=-1)
    if state.s is not None:
        numerator = numerator + phi_q @ state.s
        denominator = denominator + (phi_q @ state.z.unsqueeze(-1)).squeeze(-1)
    kv, ks = phi_k.transpose(-2, -1) @ v, phi_k.sum(dim=-2)
    state.s, state.z = (kv, ks) if state.s is None else (state.s + kv, state.z + ks)
    state.length += phi_q.shape[2]
    return components.safe_ratio(numerator, denominator)


# -- one forward pass ---------------------------------------------------------------------------------
class _Pass:
    """What one pass of a program reads from its frame, computed when first needed. Decoding
    (``cache`` a KVCache or KernelState): x holds the new positions start..start+T-1 only, and the
    keys are the cache's."""

    def __init__(self, attn, x, mask, need_weights, cache=None):
        self.attn, self.x, self.mask, self.need_weights, self.cache = attn, x, mask, need_weights, cache
        self.t = x.shape[1]
        self.start = cache.length if cache is not None else 0
        self.dropout_p = attn.dropout_p if attn.training and cache is None else 0.0
        self.projected = None
        self.values: dict = {}
        self.weights = None
        # kept by hand, not functools.cached_property: before Python 3.12 that takes a lock, and
        # torch.compile breaks its graph at every first access
        self._allowed = None
        self._bias = False

    @property
    def decoding(self) -> bool:
        return self.cache is not None

    def qkv(self, h):
        if self.projected is None:
            attn = self.attn
            q, k, v = attn.rotated_heads(h, self.start)
            if isinstance(self.cache, KVCache):
                k, v = self.cache.append(k, v)
            k, v = attn.share_kv(k, v)
            if attn.qkv_conv is not None:  # never while decoding (such a gene recomputes)
                q, k, v = attn.qkv_conv(q, k, v)
            self.projected = {"q": q, "k": k, "v": v}
        return self.projected

    @property
    def windowed(self) -> bool:
        return 0 < self.attn.window < self.t and not self.decoding

    @property
    def allowed(self) -> torch.Tensor:
        if self._allowed is None:
            self._allowed = self.attn.allowed_keys(self.t, self.x.device, self.mask, self.start)
        return self._allowed

    @property
    def bias(self):
        if self._bias is False:
            self._bias = self.attn.score_bias(self.t, self.x.device, self.start)
        return self._bias

    @property
    def explicit(self) -> bool:
        """Whether weights must be formed as a matrix (maps, a mask, attention dropout)."""
        return self.need_weights or self.mask is not None or self.dropout_p > 0

    def banded(self) -> bool:
        """Whether a windowed mixing op runs block by block (2W < T, no [T, T] form needed)."""
        return self.windowed and 2 * self.attn.window < self.t and self.mask is None and not self.need_weights


class ProgramCore(nn.Module):
    """One program's ops and weights. ``bound``: {op name: attribute of the frame} for component
    ops whose modules the frame holds (a classic gene's); every other op with weights has its
    module here, ``ops.n<i>``."""

    def __init__(self, program: programs.Program, grammar: programs.Grammar, *, d_model: int, n_heads: int,
                 d_head: int, kernel_features: int = 64, bound: dict | None = None):
        super().__init__()
        self.program = program
        self.nodes = program.nodes()
        self.bound = dict(bound or {})
        memo: dict = {}
        grammar.type_of(program.root, memo)
        types = {text: t for (text, _), t in memo.items()}
        self.ops = nn.ModuleDict()
        for i, node in enumerate(self.nodes):
            if node.args and node.op not in self.bound:
                shapes = Shapes(d_model, n_heads, d_head, kernel_features,
                                tuple(types[a.text] for a in node.args), types[node.text])
                module = _build(node.op, shapes)
                if module is not None:
                    self.ops[f"n{i}"] = module
        self.index = {node.text: i for i, node in enumerate(self.nodes)}
        self.module_keys = {node.text: f"n{i}" for i, node in enumerate(self.nodes) if f"n{i}" in self.ops}
        self.forms = {node.text: form for node in self.nodes if (form := _attention_form(node))}
        self.heads_node = _heads_node(program.root)
        self.cacheable = _decoded(program.root, grammar, {}) == "new"
        # the ops whose value at a position reads other positions' values, which a mask's zero weights do not
        # stop (sdecay weighs a score by its distance alone)
        self.along_time = [node.op for node in self.nodes if node.args and node.op != "sdecay" and (
            grammar.op(node.op).kind == "time" or node.op in components.ACROSS_POSITIONS)]

    def _module(self, node, run: _Pass):
        attr = self.bound.get(node.op)
        if attr is not None:
            return getattr(run.attn, attr)
        key = self.module_keys.get(node.text)  # an op with weights of its own (decided when built)
        return None if key is None else self.ops[key]

    # -- entry points -----------------------------------------------------------------------------------
    def forward(self, attn, x, mask=None, need_weights: bool = False):
        """(out [B, T, d_model], the first mixing op's weights when ``need_weights``)."""
        starts = self.padding(attn, mask, *x.shape[:2])
        if starts is not None:
            return _by_rows(starts, mask, x.shape[1],
                            lambda rows, p, m: self.forward(attn, x[rows, p:], m, need_weights))
        run = _Pass(attn, x, mask, need_weights)
        return self.value(self.program.root, run), run.weights

    def heads(self, attn, x, projected: dict, mask=None, start: int = 0):
        """The value of the heads node (the argument of ``o``), [B, H, T, d], with the given
        projections ({"q", "k", "v"}) in place of the frame's (a host model's own, ``interop.hf_attention``).
        ``start`` > 0: T new queries after ``start`` positions whose keys and values ``projected``
        holds too (the host's cache); only a ``cacheable`` program can do that. The frame's ``qkv_conv``
        convolves the given projections here."""
        starts = None if start else self.padding(attn, mask, *x.shape[:2])
        if starts is not None:
            return _by_rows(starts, mask, x.shape[1], lambda rows, p, m: (self.heads(attn, x[rows, p:], {
                name: z[rows, :, p:] for name, z in projected.items()}, m), None))[0]
        if attn.qkv_conv is not None:  # never after a cache (such a gene is not cacheable)
            projected = dict(zip("qkv", attn.qkv_conv(projected["q"], projected["k"], projected["v"])))
        cache = _HostCache(start) if start else None
        run = _Pass(attn, x, mask, False, cache)
        run.projected = projected
        return self.value(self.heads_node, run)

    def padding(self, attn, mask, b: int, t: int) -> list | None:
        """Each row's first allowed key where ``mask`` (bool, broadcastable to [B, H, T, T]) masks keys before a
        row's allowed ones and values read other positions (``along_time``, the frame's convolutions), which
        zero weights do not stop: each row then runs alone from there, as it gives alone. None where the zero
        weights suffice; ValueError where nothing is exact (keys masked between allowed ones, no key mask)."""
        reads = self.along_time + [name for name in ("qkv_conv", "input_conv") if getattr(attn, name) is not None]
        if mask is None or not reads:
            return None
        m = torch.broadcast_to(mask, (b, mask.shape[-3] if mask.dim() > 2 else 1, t, t))
        keys = m[:, :1, -1:]  # [B, 1, 1, T]: the last query's, to which every key is causal
        starts = (~keys).flatten(1).int().cummin(1).values.sum(1)
        rises = (keys[..., 1:] & ~keys[..., :-1]).flatten(1).sum(1)  # an allowed key after a masked one
        # a key mask on each real query's causal keys, masked keys only before and after a row's allowed ones
        seen = torch.ones(t, t, dtype=torch.bool, device=m.device).tril() & keys.transpose(-1, -2)
        if bool(((m != keys) & seen).any()) or bool((rises != ((starts > 0) & (starts < t)).int()).any()):
            raise ValueError(f"mask leaves out keys between a row's allowed ones (or differs between queries or "
                             f"heads), and program {self.program} reads other positions through {reads[0]}, so a "
                             "masked position would reach the others: pass each row's real positions alone "
                             "(unpadded rows one at a time), or pad only before and after them")
        starts = starts.masked_fill(starts == t, 0)  # a row with no allowed key has no real position to keep
        return starts.tolist() if bool(starts.any()) else None

    def new_cache(self, attn):
        """An empty cache for ``decode``: running sums where the one mixing op is a kernel without a
        window, keys and values for another cacheable program, the inputs so far otherwise."""
        if not self.cacheable or attn.qkv_conv is not None or attn.input_conv is not None:
            return InputCache()
        mixing = {node.text: node.op for node in self.nodes if node.op == "mix" or node.op.startswith("kmix")}
        kernel = len(mixing) == 1 and "mix" not in mixing.values()  # one state holds one kernel's sums
        return KernelState() if kernel and not attn.window else KVCache()

    def decode(self, attn, x, cache):
        """x [B, T, d_model] of T new positions after ``cache.length`` -> their rows of the forward
        on the whole sequence (module docstring, Decoding)."""
        t = x.shape[1]
        if isinstance(cache, InputCache):
            return self.forward(attn, cache.append(x))[0][:, -t:]
        return self.value(self.program.root, _Pass(attn, x, None, False, cache))

    # -- evaluation -------------------------------------------------------------------------------------
    def value(self, node, run: _Pass):
        """The value of ``node`` in this pass: computed when first asked for, then kept (a node that
        only a fast path would have read is never computed)."""
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
        form = self.forms.get(node.text)
        if form is not None and form[0] == "mix" and (run.banded() or self._fuses(form, run)):
            return self._attention(node, form, run)
        prefix, _, name = op.partition(".")
        if prefix == "kmix":  # kmix.N(...) or kmix(F, F, C)
            return self._kernel_mix(node, run)
        if op == "mix":
            weights, v = self.value(node.args[0], run), self.value(node.args[1], run)
            return self._mix(weights, v, run, masked=node.args[0].op.startswith("w.") and node.args[0].op != "w.none")
        args = [self.value(a, run) for a in node.args]
        if prefix == "s":
            return _scores(self._module(node, run), args[0], args[1], aligned=not run.decoding)
        if prefix == "t":
            return args[0] / self._module(node, run)(run.x).to(args[0].dtype)
        if prefix == "w":
            scores = args[0] if run.bias is None else args[0] + run.bias
            if name == "none":
                return components.zero_masked(scores, run.allowed)
            return components.NORMALIZATIONS[name](scores, run.allowed)
        if prefix == "g":
            return self._module(node, run)(run.x, args[0])
        if prefix == "gi":
            return self._module(node, run).gate_input(args[0])
        impl = IMPLEMENTATIONS.get(op)
        if impl is None:
            raise ValueError(f"program op {op!r} has no implementation (register it with register_op)")
        return impl.apply(Call(self._module(node, run), run.x, run.attn), *args)

    @staticmethod
    def _fuses(form, run: _Pass) -> bool:
        """Whether a softmax over a dot-product similarity may run fused in this pass: no maps, no
        external mask, no attention dropout, not decoding."""
        return form[1] == "softmax" and form[4] and run.attn.fused and not run.explicit and not run.decoding

    def _mix(self, weights, v, run: _Pass, masked: bool):
        """weights @ v, the weights exactly zero on keys a query may not see (``masked``: already)."""
        if not masked:
            weights = components.zero_masked(weights, run.allowed)
        if run.weights is None and run.need_weights:
            run.weights = weights
        return dropout(weights, run.dropout_p, run.attn.training).to(v.dtype) @ v

    def _attention(self, node, form, run: _Pass):
        """mix(w.N(t.T(s.S(A,B))),C) fused, or block by block under a window (module docstring)."""
        _, normalization, scores, temperature, _ = form
        a, b = (self.value(arg, run) for arg in scores.args)
        c = self.value(node.args[1], run)
        similarity = self._module(scores, run)
        tau = self._module(temperature, run)(run.x) if temperature is not None else torch.ones((), device=a.device)
        fused = self._fuses(form, run)
        if not run.banded():
            return fused_attention(a, b, c, tau, run.bias, run.allowed, 0.0, similarity, full_causal=not run.windowed)
        normalize = components.NORMALIZATIONS[normalization]

        def weigh(q, k, v, tau, bias, allowed):
            if fused:
                return fused_attention(q, k, v, tau, bias, allowed, run.dropout_p, similarity, full_causal=False)
            s = _scores(similarity, q, k, aligned=False) / tau.to(q.dtype)
            weights = normalize(s if bias is None else s + bias, allowed)
            return dropout(weights, run.dropout_p, run.attn.training).to(v.dtype) @ v

        return banded(a, b, c, run.attn.window, tau, run.bias, weigh)

    def _kernel_mix(self, node, run: _Pass):
        """kmix.NAME(t.T(A), B, C): the registered kernel's features of A d^(1/4) / tau and B / d^(1/4)
        (kmix(F, F, C): the features as given). Weights phi(a_i) . phi(b_j) over the keys a query may
        see, in at least float32 (a kernel's sums must not lose precision to bf16); the result in
        the dtype of the values where no autocast chooses (a model cast to bf16 or fp16)."""
        kept = torch.is_autocast_enabled(run.x.device.type)
        mixed = self._kernel_sums(node, run)
        return mixed if kept else mixed.to(self.value(node.args[2], run).dtype)

    def _kernel_sums(self, node, run: _Pass):
        with torch.autocast(run.x.device.type, enabled=False):
            first = node.args[0]
            temperature = first if first.op.startswith("t.") and node.op != "kmix" else None
            a = self.value(temperature.args[0] if temperature is not None else first, run)
            b, v = self.value(node.args[1], run), self.value(node.args[2], run)
            dtype = torch.promote_types(a.dtype, torch.float32)
            if node.op != "kmix":
                s = a.shape[-1] ** 0.25
                a = a.to(dtype) * s
                if temperature is not None:
                    a = a / self._module(temperature, run)(run.x).to(dtype)
                a, b = self._module(node, run).feature_maps(a, b.to(dtype) / s)
            a, b, v = a.to(dtype), b.to(dtype), v.to(dtype)
            if isinstance(run.cache, KernelState):
                return decode_running(a, b, v, run.cache)
            if not (run.explicit or run.windowed or run.decoding):
                return components.causal_kernel_attention(a, b, v)
            if run.banded():
                def weigh(q, k, v, tau, bias, allowed):
                    weights = components.kernel_weights(q, k, allowed)
                    return dropout(weights, run.dropout_p, run.attn.training).to(v.dtype) @ v
                return banded(a, b, v, run.attn.window, None, None, weigh)
            return self._mix(components.kernel_weights(a, b, run.allowed), v, run, masked=True)


def _by_rows(starts: list, mask, t: int, run):
    """Each row alone on its positions from starts[row] on: ``run(rows, p, their mask or None)`` -> (y [1, ...,
    T - p, d], weights [1, H, T - p, T - p] or None); the rows' y and weights, zero before each row's start."""
    m = torch.broadcast_to(mask, (len(starts), mask.shape[-3] if mask.dim() > 2 else 1, t, t))
    ys, ws = [], []
    for row, p in enumerate(starts):
        sub = m[row:row + 1, :, p:, p:]
        y, w = run(slice(row, row + 1), p, None if bool(sub.all()) else sub)
        ys.append(F.pad(y, (0, 0, p, 0)))
        ws.append(None if w is None else F.pad(w, (p, 0, p, 0)))
    return torch.cat(ys), None if ws[0] is None else torch.cat(ws)


class _HostCache:
    """A host model's cache (``heads`` with ``start``): the keys are given, nothing is stored."""

    def __init__(self, length: int):
        self.length = length


def _scores(similarity, a, b, aligned: bool):
    """similarity(a, b); with ``aligned`` (query i and key i are one position) it may skip future keys."""
    if aligned and getattr(similarity, "causal_skip", False):  # scores of future keys may stay 0: masked later
        return similarity(a, b, causal=True)
    return similarity(a, b)


def _build(op: str, shapes: Shapes):
    """The module of an op with weights or a registered component (None for the others)."""
    impl = IMPLEMENTATIONS.get(op)
    if impl is not None:
        return impl.build(shapes) if impl.build is not None else None
    prefix, _, name = op.partition(".")
    build = _COMPONENT_BUILDS.get(prefix)
    if build is None or not name or (prefix in ("g", "gi") and name == "none"):
        return None
    return build(name, shapes)


def _attention_form(node):
    """For ``mix(w.N(t.T(s.S(A,B))),C)`` (the temperature optional): ("mix", N, the s node, the t
    node or None, whether S is a dot product); for ``kmix.N(...)``: ("kmix", N, ...); else None."""
    if node.op.startswith("kmix."):
        return ("kmix", node.op[5:], None, None, False)
    if node.op != "mix" or not node.args[0].op.startswith("w.") or node.args[0].op == "w.none":
        return None
    scores, temperature = node.args[0].args[0], None
    if scores.op.startswith("t."):
        scores, temperature = scores.args[0], scores
    if not scores.op.startswith("s."):
        return None
    dot = bool(getattr(components.factory("similarity", scores.op[2:]), "dot_form", False))
    return ("mix", node.args[0].op[2:], scores, temperature, dot)


def _heads_node(root):
    """The argument of the program's ``o`` under its gates: pin(P, g.G(o(Y))) -> Y (None when the
    root is something else)."""
    node = root.args[1] if root.op == "pin" else root
    while node.op.startswith("g.") and node.args:
        node = node.args[0]
    return node.args[0] if node.op == "o" else None


def _decoded(node, grammar, memo: dict) -> str | None:
    """Which positions ``node``'s value covers when new positions are decoded after a key/value cache: "new" (q, x,
    ops of them), "all" (k, v: the cache's keys and values, and ops of them), "scores" (new queries on all keys),
    "const"; None where that pass would not give the forward's rows: an op reading other positions (along time,
    ``components.ACROSS_POSITIONS``), an op meeting new and all positions, or one that may read x (the new positions'
    only) on keys or values (not entry by entry or over a head's channels)."""
    if node.text in memo:
        return memo[node.text]
    args = [_decoded(a, grammar, memo) for a in node.args]
    kind = grammar.op(node.op).kind if node.args else None
    if not node.args:
        found = "const" if node.op == "const" else "all" if node.op in ("k", "v") else "new"
    elif None in args or kind == "time" or node.op in components.ACROSS_POSITIONS:
        found = None
    elif node.op.startswith("s."):
        found = "scores" if args == ["new", "all"] else None
    elif kind == "mix":  # mix(W, V), kmix(A, B, V)
        found = "new" if args in (["scores", "all"], ["new", "all", "all"]) else None
    else:  # one position's op: its arguments cover the same positions
        seen = set(args) - {"const"}
        found = seen.pop() if len(seen) == 1 else "const" if not seen else None
        if found == "all" and kind not in ("elementwise", "feature") and node.op not in ("scale", "bias"):
            found = None
    memo[node.text] = found
    return found
