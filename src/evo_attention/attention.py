"""EvolvedAttention: multi-head causal self-attention assembled from a gene.

    h            = gating.gate_input(x)                 # identity unless input_gate
    q, k, v      = split(W_qkv h)                       # one fused projection
    scores       = similarity(q, k) / temperature(x)    # [B, H, T, T]
    weights      = normalization(scores, causal & mask) # exact zeros on masked keys
    y            = W_o (dropout(weights) @ v)
    out          = gating(x, y)

When the similarity is a plain dot product of (possibly transformed) q and k and the
normalization is softmax, the same function is computed by PyTorch's fused
``scaled_dot_product_attention`` (the temperature folds into q, since it depends on the query
position at most). ``fused=False`` forces the plain path, which tests compare against.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import components
from .errors import UserError
from .genes import AttentionGene


def causal_mask(t: int, device=None) -> torch.Tensor:
    """Bool [T, T], True where query i may attend key j (j <= i)."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


class EvolvedAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, gene: AttentionGene | str, *, fused: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise UserError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        bias = self.gene.use_bias
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.similarity = components.SIMILARITIES[self.gene.similarity](self.d_head, n_heads)
        self.normalize = components.NORMALIZATIONS[self.gene.normalization]
        self.temperature = components.TEMPERATURES[self.gene.temperature_mode](d_model, n_heads, self.d_head)
        self.gating = components.GATINGS[self.gene.gating](d_model)
        self.dropout_p = self.gene.attention_dropout
        self.fused = fused

    @property
    def can_fuse(self) -> bool:
        return bool(getattr(self.similarity, "dot_form", False)) and self.gene.normalization == "softmax"

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False):
        """x [B, T, d_model] -> [B, T, d_model] (and the [B, H, T, T] weights if need_weights).

        ``mask``: optional bool tensor broadcastable to [B, H, T, T] (or a [B, T] key mask), True
        where attention is allowed; it is combined with the causal mask, never replaces it.
        """
        b, t, _ = x.shape
        h = self.gating.gate_input(x)
        q, k, v = self.qkv(h).view(b, t, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        tau = self.temperature(x)
        dropout_p = self.dropout_p if self.training else 0.0
        weights = None
        if self.fused and self.can_fuse and mask is None and not need_weights:
            q, k = self.similarity.prepare(q, k)
            q = q / tau.to(q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=1.0)
        else:
            allowed = causal_mask(t, x.device)
            if mask is not None:
                if mask.dim() == 2 and mask.shape == (b, t):
                    mask = mask[:, None, None, :]
                allowed = allowed & mask.bool()
            scores = self.similarity(q, k) / tau.to(q.dtype)
            weights = self.normalize(scores, allowed)
            y = F.dropout(weights, dropout_p, self.training).to(v.dtype) @ v
        y = self.out(y.transpose(1, 2).reshape(b, t, self.d_model))
        out = self.gating(x, y)
        return (out, weights) if need_weights else out

    def extra_repr(self) -> str:
        return f"gene={self.gene.key}, d_model={self.d_model}, n_heads={self.n_heads}"
