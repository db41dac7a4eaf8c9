"""EvolvedAttention: the frame in which a gene's program computes multi-head causal self-attention.

Every gene is a program (``nn.program``, the one attention engine): a classic gene's four
components are ``programs.classic_program`` of them, e.g. the vanilla gene is
``o(mix(w.softmax(t.fixed(s.dot(q,k))),v))``. This module holds what every program reads:

    q, k, v      = split(W_qkv h)       # h = x, or pin's first argument; one fused projection (or low rank)
    q, k         = rotary(q, k)         # position=rope only
    k, v         = repeat each K/V head for its group   # kv_heads K < H: grouped-query attention
    q, k, v      = dconv(q), dconv(k), dconv(v)          # qkv_conv only
    bias         = alibi + relative bias                 # added to the scores of every w.* op
    allowed      = causal (& window) (& an external mask)
    o(y)         = W_o y

and a classic gene's components under their own names (``similarity``, ``temperature``,
``gating``, ``kernel``: the program's component ops are bound to them), so its checkpoints, keys and
exports are those of every earlier version.

With ``qkv_rank`` r > 0 the Q/K/V projection is factorised (``LowRankQKV``). With ``kv_heads`` K
(dividing the H heads) the keys and values have K heads, each shared by H / K query heads
(grouped-query attention; K = 1 is multi-query attention). With ``window`` W > 0 each query attends
only to its last W keys, itself included (sliding-window attention).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from evo_attention import programs
from evo_attention.genes import (KERNEL_NORMALIZATIONS, AttentionGene, canonical_program, mechanism_of, program_grammar,
                                 size_problem)
from evo_attention.nn import components, positions
from evo_attention.nn.program import CausalConv, InputCache, KernelState, KVCache, ProgramCore
from evo_attention.nn.spec import SHORT_CONV_WIDTHS
from evo_attention.util.errors import UserError, check_argument


def causal_mask(t: int, device=None, window: int = 0) -> torch.Tensor:
    """Bool [T, T], True where query i may attend key j: j <= i, and with a ``window`` W > 0 also
    i - j < W (the query's last W keys, itself included)."""
    return decode_mask(0, t, device, window)


def decode_mask(start: int, t: int, device=None, window: int = 0) -> torch.Tensor:
    """Bool [T, start + T]: the rows of ``causal_mask`` for queries start..start+T-1 over keys
    0..start+T-1 (T new tokens after ``start`` cached ones)."""
    i = torch.arange(start, start + t, device=device)[:, None]
    j = torch.arange(start + t, device=device)[None, :]
    allowed = j <= i
    return allowed & (i - j < window) if window > 0 else allowed


class QKVConv(nn.Module):
    """``qkv_conv`` W: a depthwise causal convolution of width W along time on each of q, k and v,
    per head and channel (Primer's multi-DConv-head attention), each initialised to the identity
    (``nn.program.CausalConv``, which also folds into batches)."""

    def __init__(self, n_heads: int, d_head: int, width: int):
        super().__init__()
        self.q, self.k, self.v = (CausalConv(n_heads, d_head, width) for _ in range(3))

    def forward(self, q, k, v):
        return self.q(q), self.k(k), self.v(v)


class LowRankQKV(nn.Module):
    """Factorised Q/K/V projection: h [B, T, d] -> [B, T, 3d] = [U_q D_q h, U_kv D_kv h], separate
    rank-r latents for the query and the key/value pair (as DeepSeek-V2's multi-head latent attention;
    the up-projections carry the bias). Its output has the variance of a full N(0, 0.02) projection of
    a unit-variance input: D ~ N(0, 1/d), U ~ N(0, 0.02^2 d / r)."""

    def __init__(self, d_model: int, rank: int, bias: bool, std: float = 0.02, kv_dim: int | None = None):
        super().__init__()
        self.rank = rank
        self.q_down = nn.Linear(d_model, rank, bias=False)
        self.q_up = nn.Linear(rank, d_model, bias=bias)
        self.kv_down = nn.Linear(d_model, rank, bias=False)
        self.kv_up = nn.Linear(rank, 2 * (kv_dim or d_model), bias=bias)  # kv_dim < d_model: grouped K/V heads
        for down, up in ((self.q_down, self.q_up), (self.kv_down, self.kv_up)):
            nn.init.normal_(down.weight, std=d_model ** -0.5)
            nn.init.normal_(up.weight, std=std * (d_model / rank) ** 0.5)
            if up.bias is not None:
                nn.init.zeros_(up.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.cat((self.q_up(self.q_down(h)), self.kv_up(self.kv_down(h))), dim=-1)


class EvolvedAttention(nn.Module):
    """Causal multi-head self-attention built from ``gene``: the frame of its program (module docstring).

    ``max_seq_len`` is needed only by ``attn_bias=rel`` (the size of its table of offsets);
    ``kernel_features`` is the number of random features of ``favor``; ``fused=False`` keeps every
    softmax off PyTorch's fused kernel (tests compare the two).
    """

    # the attributes that hold a classic gene's registered components, and the gene field each one is
    COMPONENTS = {"similarity": "similarity", "kernel": "normalization", "temperature": "temperature_mode",
                  "gating": "gating"}

    def __init__(self, d_model: int, n_heads: int, gene: AttentionGene | str, *, fused: bool = True,
                 max_seq_len: int | None = None, kernel_features: int = 64, input_conv: int = 0):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads)):
            check_argument(name, value, int, "a positive integer")
            if value < 1:
                raise UserError(f"{name} {value} must be a positive integer")
        if d_model % n_heads:
            raise UserError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        for name, value, low in (("max_seq_len", max_seq_len, 1), ("kernel_features", kernel_features, 1),
                                 ("input_conv", input_conv, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise UserError(f"{name} must be a whole number >= {low}, not {value!r}")
        if input_conv and input_conv not in SHORT_CONV_WIDTHS:
            raise UserError(f"input_conv {input_conv} is not a convolution width: use 0 (none) or "
                            f"{SHORT_CONV_WIDTHS[0]} to {SHORT_CONV_WIDTHS[-1]}")
        self.gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
        problem = size_problem(self.gene, d_model=d_model, n_heads=n_heads)  # kv_heads, qkv_rank
        if problem:
            raise UserError(str(problem))
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.kv_heads = self.gene.kv_heads or n_heads
        self.kv_dim = self.kv_heads * self.d_head
        self.window = self.gene.window
        bias = self.gene.use_bias
        if self.gene.qkv_rank:
            self.qkv = LowRankQKV(d_model, self.gene.qkv_rank, bias, kv_dim=self.kv_dim)
        else:
            self.qkv = nn.Linear(d_model, d_model + 2 * self.kv_dim, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = positions.build_rotary(self.gene.position, self.d_head)
        self.score_biases = positions.build_score_biases(self.gene.position, self.gene.attn_bias, n_heads, max_seq_len)
        program, bound = self._components(kernel_features)
        self.dropout_p = self.gene.attention_dropout
        self.fused = fused
        # input_conv W > 0 (the model's short_conv): a depthwise causal convolution along time over the channels
        # of what the projections read (Zoology's short convolution before attention)
        self.input_conv = CausalConv(1, d_model, input_conv) if input_conv else None
        # qkv_conv W > 0: depthwise causal convolutions of the rotated q, k and of v (after grouped heads are shared)
        self.qkv_conv = QKVConv(n_heads, self.d_head, self.gene.qkv_conv) if self.gene.qkv_conv else None
        self.program = ProgramCore(program, program_grammar(), d_model=d_model, n_heads=n_heads, d_head=self.d_head,
                                   kernel_features=kernel_features, bound=bound)

    def _components(self, kernel_features: int):
        """The gene's program and the component ops bound to this module's attributes: a classic
        gene's components are built here, under their names; a program gene's are the defaults
        (they compute nothing) and its ops hold their own weights."""
        gene = self.gene
        self.similarity = components.SIMILARITIES[gene.similarity](self.d_head, self.n_heads)
        normalization = components.NORMALIZATIONS[gene.normalization]
        # a kernel normalization is a module (it may hold random features); the others are functions
        kernel = getattr(normalization, "kernel", False)
        self.kernel = normalization(self.d_head, self.n_heads, kernel_features) if kernel else None
        self.temperature = components.TEMPERATURES[gene.temperature_mode](self.d_model, self.n_heads, self.d_head)
        self.gating = components.GATINGS[gene.gating](self.d_model)
        if gene.program is not None:
            return canonical_program(gene.program), {}
        if kernel and gene.similarity not in ("dot", "cosine"):
            raise UserError(f"kernel normalization {gene.normalization} reads the prepared q and k of the dot or "
                            f"cosine similarity, not of {gene.similarity}", setting="search_space")
        text = programs.classic_program(gene.similarity, gene.normalization, gene.gating, gene.temperature_mode,
                                        kernels=KERNEL_NORMALIZATIONS)
        bound = {f"s.{gene.similarity}": "similarity", f"t.{gene.temperature_mode}": "temperature",
                 f"g.{gene.gating}": "gating", f"gi.{gene.gating}": "gating", f"kmix.{gene.normalization}": "kernel"}
        return canonical_program(text), bound

    @property
    def fold_key(self) -> str:
        """What folding tells attentions apart by (``nn.fold``): the mechanism of the gene (its recipe
        parts change no computation)."""
        return mechanism_of(self.gene).key

    @property
    def can_fuse(self) -> bool:
        """Whether the heads are softmax over a dot-product similarity (PyTorch's fused kernel)."""
        form = self.program.forms.get(getattr(self.program.heads_node, "text", None))
        return form is not None and form[0] == "mix" and form[1] == "softmax" and form[4]

    def allowed_keys(self, t: int, device=None, mask: torch.Tensor | None = None, start: int = 0) -> torch.Tensor:
        """Bool [T, start + T] (or broadcast with ``mask``): the keys each of the T queries after
        ``start`` positions may see, causal and within the window, and where ``mask`` allows."""
        allowed = decode_mask(start, t, device, self.window)
        return allowed if mask is None else allowed & mask.bool()

    def score_bias(self, t: int, device=None, start: int = 0) -> torch.Tensor | None:
        """The float bias added to the logits of the T queries start..start+T-1 over the keys
        0..start+T-1: [H, T, start + T] (None without alibi / attn_bias). ``start`` > 0: new
        positions after a cache; ``forward`` and ``decode`` both take their bias from here."""
        bias = None
        for module in self.score_biases:
            term = module(t, device, start)
            bias = term if bias is None else bias + term
        return bias

    def project(self, x: torch.Tensor):
        """x [B, T, d_model] -> q, k, v [B, H, T, d_head] (rotated; grouped K/V heads repeated;
        convolved along time with ``qkv_conv``)."""
        q, k, v = self.rotated_heads(x)
        k, v = self.share_kv(k, v)
        return (q, k, v) if self.qkv_conv is None else self.qkv_conv(q, k, v)

    def rotated_heads(self, h: torch.Tensor, start: int = 0):
        """h [B, T, d_model] of positions start..start+T-1 (what the projections read) -> q [B, H, T,
        d_head] and k, v [B, kv_heads, T, d_head] (grouped K/V heads not yet repeated), rotated for
        their positions."""
        b, t, _ = h.shape
        if self.input_conv is not None:
            h = self.input_conv(h.unsqueeze(1)).squeeze(1)
        if self.kv_heads == self.n_heads:  # one view of the fused projection, as the step has always taken
            q, k, v = self.qkv(h).view(b, t, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = self.qkv(h).split((self.d_model, self.kv_dim, self.kv_dim), dim=-1)
            q = q.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
            k, v = (z.view(b, t, self.kv_heads, self.d_head).transpose(1, 2) for z in (k, v))
        if self.rotary is not None:
            q, k = self.rotary(q, k, start)
        return q, k, v

    def share_kv(self, k: torch.Tensor, v: torch.Tensor):
        """Each group of n_heads / kv_heads query heads shares one K/V head: repeat them per group."""
        if self.kv_heads == self.n_heads:
            return k, v
        group = self.n_heads // self.kv_heads
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False):
        """x [B, T, d_model] -> [B, T, d_model] (and the [B, H, T, T] weights if need_weights).

        ``mask``: optional bool tensor broadcastable to [B, H, T, T] (or a [B, T] key mask), True
        where attention is allowed; it is combined with the causal mask, never replaces it. A program that
        reads along time runs a row padded before its allowed keys on its own positions, and refuses masked
        keys between allowed ones (``ProgramCore.padding``)."""
        if x.dim() != 3 or x.shape[-1] != self.d_model or not x.is_floating_point():
            raise ValueError(f"x must be floating-point [batch, time, d_model={self.d_model}], not {x.dtype} of shape "
                             f"{tuple(x.shape)}")
        b, t, _ = x.shape
        given = mask
        if mask is not None and mask.dim() == 2 and mask.shape == (b, t):
            mask = mask[:, None, None, :]
        if mask is not None and (mask.dtype != torch.bool or mask.dim() > 4 or any(
                m not in (1, n) for m, n in zip(reversed(mask.shape), (t, t, self.n_heads, b)))):
            raise ValueError(f"mask must be a bool tensor [batch, time] or broadcastable to [batch={b}, heads="
                             f"{self.n_heads}, time={t}, time={t}], not {given.dtype} of shape {tuple(given.shape)}")
        out, weights = self.program(self, x, mask, need_weights)
        return (out, weights) if need_weights else out

    def new_cache(self) -> "KVCache | KernelState | InputCache":
        """An empty cache for ``decode`` (``ProgramCore.new_cache``)."""
        return self.program.new_cache(self)

    def decode(self, x: torch.Tensor, cache: "KVCache | KernelState | InputCache") -> torch.Tensor:
        """x [B, T, d_model] of T new positions after the ``cache.length`` ones in ``cache`` ->
        [B, T, d_model], the rows ``forward`` gives for them on the whole sequence; the cache takes
        them in. Inference only: never fused, never dropped out."""
        return self.program.decode(self, x, cache)

    def extra_repr(self) -> str:
        return f"gene={self.gene.key}, d_model={self.d_model}, n_heads={self.n_heads}, kv_heads={self.kv_heads}"
