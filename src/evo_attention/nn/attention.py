"""EvolvedAttention: multi-head causal self-attention assembled from a gene.

    h            = gating.gate_input(x)                 # identity unless input_gate
    q, k, v      = split(W_qkv h)                       # one fused projection (or low rank)
    q, k         = rotary(q, k)                         # position=rope only
    k, v         = repeat each K/V head for its group   # kv_heads K < H: grouped-query attention
    scores       = similarity(q, k) / temperature(x)    # [B, H, T, T]
           (+ bias)                                     # position=alibi and/or attn_bias=rel
    weights      = normalization(scores, allowed)       # causal (& window), exact zeros elsewhere
    y            = W_o (dropout(weights) @ v)
    out          = gating(x, y)

With ``qkv_rank`` r > 0 the Q/K/V projection is factorised as in DeepSeek's latent attention
(``LowRankQKV``): q = U_q (D_q h) and [k, v] = U_kv (D_kv h) with d_model -> r -> d_model maps,
5 d r weights instead of 3 d^2 (fewer when r < 0.6 d). Rotary embeddings then rotate the
up-projected q and k (nothing is absorbed, so no decoupled rope key is needed).

With ``kv_heads`` K (dividing the H heads) the keys and values have K heads of their own, each
shared by H / K query heads (grouped-query attention, Ainslie et al. 2023; K = 1 is multi-query
attention): the projection has d + 2 K d_head outputs instead of 3 d. With ``window`` W > 0 each
query attends only to its last W keys (itself included; sliding-window attention as in Longformer
or Mistral), for every similarity and normalization. The window is applied as a mask, so time and
memory stay those of full attention (O(T^2)); a window at least as long as the sequence is full
attention.

When the similarity is a plain dot product of (possibly transformed) q and k and the
normalization is softmax, the same function is computed by PyTorch's fused
``scaled_dot_product_attention`` (the temperature folds into q, since it depends on the query
position at most; rotary embeddings rotate q and k first; a score bias goes in as a float
attention mask with -inf on future keys). ``fused=False`` forces the plain path, which tests
compare against. On CPU, training with attention dropout also takes the plain path: SDPA's CPU
kernel cannot drop out, falls back to unfused math with PyTorch's dropout, and ``dropout.py``'s
mask is cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from evo_attention.nn import components, positions
from evo_attention.nn.dropout import dropout
from evo_attention.util.errors import UserError
from evo_attention.genes import AttentionGene


def causal_mask(t: int, device=None, window: int = 0) -> torch.Tensor:
    """Bool [T, T], True where query i may attend key j: j <= i, and with a ``window`` W > 0 also
    i - j < W (the query's last W keys, itself included)."""
    allowed = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    return allowed.triu(-(window - 1)) if 0 < window < t else allowed


def decode_mask(start: int, t: int, device=None, window: int = 0) -> torch.Tensor:
    """Bool [T, start + T]: the rows of ``causal_mask`` for queries start..start+T-1 over keys
    0..start+T-1 (T new tokens after ``start`` cached ones)."""
    i = torch.arange(start, start + t, device=device)[:, None]
    j = torch.arange(start + t, device=device)[None, :]
    allowed = j <= i
    return allowed & (i - j < window) if window > 0 else allowed


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


class LowRankQKV(nn.Module):
    """Factorised Q/K/V projection: h [B, T, d] -> [B, T, 3d] = [U_q D_q h, U_kv D_kv h].

    Separate rank-r latents for the query and for the key/value pair (as in DeepSeek-V2's
    multi-head latent attention); the up-projections carry the bias when ``bias``. Initialised so
    that its output has the variance of a full N(0, 0.02) projection of a unit-variance input:
    D ~ N(0, 1/d), U ~ N(0, 0.02^2 d / r).
    """

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
    """Causal multi-head self-attention built from ``gene``.

    ``max_seq_len`` is needed only by ``attn_bias=rel`` (the size of its table of offsets).
    """

    def __init__(self, d_model: int, n_heads: int, gene: AttentionGene | str, *, fused: bool = True,
                 max_seq_len: int | None = None):
        super().__init__()
        if d_model % n_heads:
            raise UserError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.kv_heads = self.gene.kv_heads or n_heads
        if n_heads % self.kv_heads:
            raise UserError(f"gene {self.gene.key}: kv_heads {self.kv_heads} does not divide the {n_heads} heads: "
                            "use a divisor (1 is multi-query attention)")
        self.kv_dim = self.kv_heads * self.d_head
        self.window = self.gene.window
        bias = self.gene.use_bias
        if self.gene.qkv_rank > d_model:
            raise UserError(f"gene {self.gene.key}: qkv_rank {self.gene.qkv_rank} is larger than d_model {d_model}: "
                            "a low-rank projection needs a rank r <= d_model")
        if self.gene.qkv_rank:
            self.qkv = LowRankQKV(d_model, self.gene.qkv_rank, bias, kv_dim=self.kv_dim)
        else:
            self.qkv = nn.Linear(d_model, d_model + 2 * self.kv_dim, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = positions.build_rotary(self.gene.position, self.d_head)
        self.score_biases = positions.build_score_biases(self.gene.position, self.gene.attn_bias, n_heads, max_seq_len)
        self.similarity = components.SIMILARITIES[self.gene.similarity](self.d_head, n_heads)
        self.normalize = components.NORMALIZATIONS[self.gene.normalization]
        self.temperature = components.TEMPERATURES[self.gene.temperature_mode](d_model, n_heads, self.d_head)
        self.gating = components.GATINGS[self.gene.gating](d_model)
        self.dropout_p = self.gene.attention_dropout
        self.fused = fused

    @property
    def can_fuse(self) -> bool:
        return bool(getattr(self.similarity, "dot_form", False)) and self.gene.normalization == "softmax"

    def score_bias(self, t: int, device=None) -> torch.Tensor | None:
        """The [H, T, T] float bias added to the logits (None without alibi / attn_bias)."""
        bias = None
        for module in self.score_biases:
            term = module(t, device)
            bias = term if bias is None else bias + term
        return bias

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False):
        """x [B, T, d_model] -> [B, T, d_model] (and the [B, H, T, T] weights if need_weights).

        ``mask``: optional bool tensor broadcastable to [B, H, T, T] (or a [B, T] key mask), True
        where attention is allowed; it is combined with the causal mask, never replaces it.
        """
        b, t, _ = x.shape
        h = self.gating.gate_input(x)
        if self.kv_heads == self.n_heads:
            q, k, v = self.qkv(h).view(b, t, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = self.qkv(h).split((self.d_model, self.kv_dim, self.kv_dim), dim=-1)
            q = q.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
            k, v = (z.view(b, t, self.kv_heads, self.d_head).transpose(1, 2) for z in (k, v))
        if self.rotary is not None:
            q, k = self.rotary(q, k)
        if self.kv_heads != self.n_heads:  # each group of n_heads / kv_heads query heads shares one K/V head
            group = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        windowed = 0 < self.window < t
        tau = self.temperature(x)
        bias = self.score_bias(t, x.device)
        dropout_p = self.dropout_p if self.training else 0.0
        weights = None
        # On CPU, SDPA with dropout falls back to unfused math with PyTorch's slower dropout mask
        fused = self.fused and self.can_fuse and mask is None and not need_weights
        if fused and not (dropout_p > 0 and x.device.type == "cpu"):
            q, k = self.similarity.prepare(q, k)
            q = q / tau.to(q.dtype)
            if bias is None and not windowed:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=1.0)
            else:
                base = bias if bias is not None else torch.zeros(t, t, device=x.device)
                float_mask = base.masked_fill(~causal_mask(t, x.device, self.window), float("-inf")).to(q.dtype)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, dropout_p=dropout_p, scale=1.0)
        else:
            allowed = causal_mask(t, x.device, self.window)
            if mask is not None:
                if mask.dim() == 2 and mask.shape == (b, t):
                    mask = mask[:, None, None, :]
                allowed = allowed & mask.bool()
            if getattr(self.similarity, "causal_skip", False):  # may skip future keys: masked below
                scores = self.similarity(q, k, causal=True)
            else:
                scores = self.similarity(q, k)
            scores = scores / tau.to(scores.dtype)
            if bias is not None:
                scores = scores + bias
            weights = self.normalize(scores, allowed)
            y = dropout(weights, dropout_p, self.training).to(v.dtype) @ v
        y = self.out(y.transpose(1, 2).reshape(b, t, self.d_model))
        out = self.gating(x, y)
        return (out, weights) if need_weights else out

    # -- incremental decoding (inference only: no dropout, no extra mask) -------------------------
    def _heads(self, h: torch.Tensor):
        """q [B, H, T, d_head] and k, v [B, kv_heads, T, d_head] of the projected input."""
        b, t, _ = h.shape
        q, k, v = self.qkv(h).split((self.d_model, self.kv_dim, self.kv_dim), dim=-1)
        q = q.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.d_head).transpose(1, 2) for z in (k, v))
        return q, k, v

    def decode(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x [B, T, d_model] of T new positions after the ``cache.length`` ones in ``cache`` ->
        [B, T, d_model], the rows ``forward`` gives for them on the whole sequence; their keys and
        values join ``cache``. Rotary angles, ALiBi and relative-bias rows start at the cache's
        length; the window and grouped K/V heads apply as in ``forward``; the temperature reads
        only the new positions' own input (every temperature is per query position at most)."""
        b, t, _ = x.shape
        start = cache.length
        q, k, v = self._heads(self.gating.gate_input(x))
        if self.rotary is not None:
            q, k = self.rotary(q, k, start)
        k, v = cache.append(k, v)
        if self.kv_heads != self.n_heads:
            group = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = self.similarity(q, k) / self.temperature(x).to(q.dtype)
        bias = None
        for module in self.score_biases:
            term = module(t, x.device, start)
            bias = term if bias is None else bias + term
        if bias is not None:
            scores = scores + bias
        weights = self.normalize(scores, decode_mask(start, t, x.device, self.window))
        y = (weights.to(v.dtype) @ v).transpose(1, 2).reshape(b, t, self.d_model)
        return self.gating(x, self.out(y))

    def extra_repr(self) -> str:
        return f"gene={self.gene.key}, d_model={self.d_model}, n_heads={self.n_heads}, kv_heads={self.kv_heads}"
