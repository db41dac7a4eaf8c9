"""Position information inside attention: rotary embeddings, ALiBi and a learned relative bias.

A gene's ``position`` says where a layer gets word order from:

==================  ==========================================================================
``learned``         absolute learned embeddings added to the token embeddings at the model input
                    (the original's design; the attention layer itself does nothing)
``rope``            rotary embeddings (Su et al., 2021): q and k are rotated by an angle
                    proportional to their position, so q_i . k_j depends on i - j only;
                    ``rope:linear:F`` divides positions by F (position interpolation),
                    ``rope:ntk:F`` raises the base to base * F^(d/(d-2)) ("NTK-aware" scaling)
``alibi``           a fixed per-head linear penalty -slope_h * (i - j) on the logits (Press et al.)
``none``            no position signal at all (a causal model can still infer order)
==================  ==========================================================================

A gene's ``attn_bias`` adds a *learned* term to the logits: ``rel`` is one scalar per head and per
causal offset ``i - j`` in ``0 .. max_seq_len - 1`` (T5-style, without buckets; the learned
generalisation of ALiBi), zero at the start.

Both score biases are added *after* the temperature division (``scores / tau + bias``), so ALiBi's
slopes keep their published meaning whatever the temperature gene does. Rotary embeddings rotate q
and k before the similarity, whatever it is. Future keys are masked by the attention module, so the
biases are 0 there and never matter.
"""

from __future__ import annotations


import torch
import torch.nn as nn

from evo_attention.genes import ATTN_BIASES, PositionSpec, parse_position
from evo_attention.nn.fold import broadcast_rows
from evo_attention.util.errors import UserError

ROPE_BASE = 10000.0


# -- rotary embeddings -----------------------------------------------------------------------------

class Rotary(nn.Module):
    """Rotate q and k [B, H, T, d_head] by position-dependent angles (the half-split layout:
    dimension i pairs with i + d_head/2, frequency base^(-2i/d_head))."""

    def __init__(self, d_head: int, spec: PositionSpec = PositionSpec("rope"), base: float = ROPE_BASE):
        super().__init__()
        if d_head % 2:
            raise UserError(f"rotary position embeddings need an even head dimension, got d_model/n_heads = {d_head}: "
                            "change d_model or n_heads")
        self.spec = spec
        if spec.scaling == "ntk":
            base = base * spec.factor ** (d_head / max(d_head - 2, 1))
        self.position_scale = 1.0 / spec.factor if spec.scaling == "linear" else 1.0
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def angles(self, t: int, device=None, start: int = 0) -> torch.Tensor:
        """[T, d_head/2] rotation angles of positions start..start+T-1."""
        pos = torch.arange(start, start + t, device=device, dtype=torch.float32) * self.position_scale
        return torch.outer(pos, self.inv_freq.to(device))

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, start: int = 0):
        """q and k of positions start..start+T-1 (start > 0: new tokens after a key/value cache)."""
        theta = self.angles(q.shape[-2], q.device, start)
        cos, sin = theta.cos().to(q.dtype), theta.sin().to(q.dtype)
        return self.rotate(q, cos, sin), self.rotate(k, cos.to(k.dtype), sin.to(k.dtype))

    def extra_repr(self) -> str:
        return str(self.spec)


# -- score biases ----------------------------------------------------------------------------------
# Modules returning a float [H, T, T] added to the logits (0 on future keys); with start > 0 the
# [H, T, start + T] rows of T new queries after ``start`` cached positions

def _offsets(t: int, device=None, start: int = 0, table: int | None = None) -> torch.Tensor:
    """[T, start + T] int64 causal offsets i - j of queries i = start..start+T-1 and keys
    j = 0..start+T-1, clamped to 0 for future keys (start > 0: the rows of new tokens after a cache).
    ``table``: the length of a relative bias table, which the positions may not pass."""
    if table is not None and start + t > table:
        raise UserError(f"sequence of {start + t} tokens is longer than the relative bias table ({table})")
    i = torch.arange(start, start + t, device=device)
    j = torch.arange(start + t, device=device)
    return (i[:, None] - j[None, :]).clamp(min=0)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ... for a power of two
    n; otherwise those of the nearest lower power of two followed by every other slope of the
    next power of two."""

    def geometric(n: int) -> list:
        ratio = 2.0 ** (-8.0 / n)
        return [ratio ** (i + 1) for i in range(n)]

    lower = 1 << (n_heads.bit_length() - 1)  # n_heads itself for a power of two
    return torch.tensor(geometric(lower) + geometric(2 * lower)[0::2][: n_heads - lower], dtype=torch.float32)


class ALiBi(nn.Module):
    """bias[h, i, j] = -slope_h * (i - j) for j <= i (no parameters)."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, t: int, device=None, start: int = 0) -> torch.Tensor:
        return -self.slopes.to(device)[:, None, None] * _offsets(t, device, start).float()


class RelativeBias(nn.Module):
    """A learned scalar per head and causal offset: bias[h, i, j] = table[h, i - j] (zero init)."""

    def __init__(self, n_heads: int, max_seq_len: int | None):
        super().__init__()
        if not max_seq_len:
            raise UserError("attn_bias rel needs the model's max_seq_len: pass max_seq_len= to EvolvedAttention")
        self.max_seq_len = int(max_seq_len)
        self.table = nn.Parameter(torch.zeros(n_heads, self.max_seq_len))

    def forward(self, t: int, device=None, start: int = 0) -> torch.Tensor:
        return self.table[:, _offsets(t, device, start, self.max_seq_len)]

    def fold(self, folding):
        return _StackedRelativeBias(folding.param("table"), self.max_seq_len, folding.rows)


class _StackedRelativeBias(nn.Module):
    """K relative biases: [K * B, H, T, start + T], each model's over its own rows."""

    def __init__(self, table, max_seq_len: int, rows):
        super().__init__()
        self.table, self.max_seq_len, self.rows = table, max_seq_len, rows  # [K, H, max_seq_len]

    def forward(self, t: int, device=None, start: int = 0):
        return broadcast_rows(self.table[:, :, _offsets(t, device, start, self.max_seq_len)], self.rows.batch)


def build_rotary(position, d_head: int) -> Rotary | None:
    spec = parse_position(position)
    return Rotary(d_head, spec) if spec.kind == "rope" else None


def build_score_biases(position, attn_bias: str, n_heads: int, max_seq_len: int | None) -> nn.ModuleList:
    biases = nn.ModuleList()
    if parse_position(position).kind == "alibi":
        biases.append(ALiBi(n_heads))
    if attn_bias == "rel":
        biases.append(RelativeBias(n_heads, max_seq_len))
    elif attn_bias != "none":
        raise UserError(f"unknown attn_bias {attn_bias!r}: valid options are {', '.join(ATTN_BIASES)}")
    return biases
