"""A plain fp32 eager implementation of the seed's model: the yardstick for speed and numerics.

Written the way a first implementation usually is: separate Q, K and V projections, scores
materialised as [B, H, T, T], masked_fill(-inf) + softmax, full-vocabulary logits into
``F.cross_entropy``. Same architecture and parameters as ``TinyTransformer`` with the vanilla
gene, so ``PlainTransformer.from_tiny(model)`` copies a model's weights and both must compute the
same loss and gradients (tests/test_speed.py holds the optimized path to that). Benchmarks time it
next to the real training step in the same run (bench_speed.py). It lives beside the benchmarks, not
in the package: the package has one implementation of the model.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from evo_attention.nn.spec import ModelSpec
from evo_attention.data.base import IGNORE_INDEX


class PlainAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        split = lambda z: z.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        weights = self.dropout(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1))
        return self.out((weights @ v).transpose(1, 2).reshape(b, t, d))


class PlainBlock(nn.Module):
    def __init__(self, spec: ModelSpec, attention_dropout: float):
        super().__init__()
        d = spec.d_model
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = PlainAttention(d, spec.n_heads, attention_dropout)
        self.up, self.down = nn.Linear(d, spec.ffn_dim), nn.Linear(spec.ffn_dim, d)
        self.drop = nn.Dropout(spec.dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.down(F.gelu(self.up(self.ln2(x)))))


class PlainTransformer(nn.Module):
    def __init__(self, spec: ModelSpec, attention_dropout: float = 0.1):
        super().__init__()
        self.tok_emb = nn.Embedding(spec.vocab_size, spec.d_model)
        self.pos_emb = nn.Embedding(spec.max_seq_len, spec.d_model)
        self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(PlainBlock(spec, attention_dropout) for _ in range(spec.n_layers))
        self.ln_f = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight

    def forward(self, ids):
        x = self.drop(self.tok_emb(ids) + self.pos_emb(torch.arange(ids.shape[1], device=ids.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    @classmethod
    def from_tiny(cls, model) -> "PlainTransformer":
        """A plain copy of a vanilla-gene TinyTransformer (same weights)."""
        plain = cls(model.spec, attention_dropout=model.gene.attention_dropout)
        with torch.no_grad():
            for name in ("tok_emb", "pos_emb", "ln_f"):
                getattr(plain, name).load_state_dict(getattr(model, name).state_dict())
            for mine, theirs in zip(plain.blocks, model.blocks):
                mine.ln1.load_state_dict(theirs.ln1.state_dict())
                mine.ln2.load_state_dict(theirs.ln2.state_dict())
                mine.up.load_state_dict(theirs.ffn.up.state_dict())
                mine.down.load_state_dict(theirs.ffn.down.state_dict())
                mine.attn.out.load_state_dict(theirs.attn.out.state_dict())
                w, b = theirs.attn.qkv.weight.chunk(3, dim=0), theirs.attn.qkv.bias.chunk(3, dim=0)
                for proj, wi, bi in zip((mine.attn.q, mine.attn.k, mine.attn.v), w, b):
                    proj.weight.copy_(wi)
                    proj.bias.copy_(bi)
        return plain


def plain_loss(model: PlainTransformer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=IGNORE_INDEX)


def plain_train_step(model: PlainTransformer, optimizer, x, y, grad_clip: float = 1.0) -> torch.Tensor:
    loss = plain_loss(model, x, y)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.detach()
