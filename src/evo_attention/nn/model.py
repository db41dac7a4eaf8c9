"""TinyTransformer: a small pre-norm decoder-only language model whose attention is evolved.

token (+ learned position) embeddings -> N x [x + Attn(Norm(x)); x + FFN(Norm(x))] -> Norm -> tied head.
The embeddings and the model's own linear layers start at N(0, 0.02) (components keep their own
initialisation). Each layer may use a different gene.

The model is built from a ``ModelSpec`` (``nn.spec``; nanoGPT's ``GPT`` takes a ``GPTConfig``), kept as
``model.spec``. Two blocks surround the attention (``ModelSpec.block``); the attention itself is the
gene's in both:

- ``gpt2`` (the default, the seed's): LayerNorm (with bias), a GELU feed-forward 4 x d_model wide
  whose two linear layers have biases.
- ``llama``: RMSNorm (a learned scale, no bias) for every norm, and a SwiGLU feed-forward
  ``down(silu(gate(x)) * up(x))`` without biases, ``llama_ffn_dim(d_model)`` (about 8/3 d_model)
  wide. The attention keeps the gene's ``use_bias``: the block never overrides the gene.

The learned absolute position table exists only when the genes' ``position`` is ``learned`` (the
default; per-layer genes agree on it: ``genes.layers_violation``); with ``rope``, ``alibi`` or
``none`` each attention layer handles word order itself.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from evo_attention.nn.attention import EvolvedAttention
from evo_attention.nn.dropout import Dropout
from evo_attention.nn.spec import BLOCKS, LLAMA_FFN_MULTIPLE, ModelSpec, llama_ffn_dim  # noqa: F401 (re-exported)
from evo_attention.util.errors import UserError, check_argument
from evo_attention.genes import AttentionGene, LayerGenes


RMS_EPS = 1e-5  # the RMSNorm epsilon (LayerNorm's default too)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)
        self.act = nn.GELU()
        self.drop = Dropout(dropout)

    def forward(self, x):
        return self.drop(self.down(self.act(self.up(x))))


class SwiGLU(nn.Module):
    """The llama feed-forward: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)
        self.drop = Dropout(dropout)

    def forward(self, x):
        return self.drop(self.down(F.silu(self.gate(x)) * self.up(x)))


def block_kind(spec: ModelSpec) -> str:
    if spec.block not in BLOCKS:
        raise UserError(f"unknown block {spec.block!r}: valid options are {', '.join(BLOCKS)}", setting="block")
    return spec.block


def make_norm(kind: str, d_model: int) -> nn.Module:
    return nn.RMSNorm(d_model, eps=RMS_EPS) if kind == "llama" else nn.LayerNorm(d_model)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, gene: AttentionGene):
        super().__init__()
        kind = block_kind(spec)
        self.ln1 = make_norm(kind, spec.d_model)
        self.attn = EvolvedAttention(spec.d_model, spec.n_heads, gene, max_seq_len=spec.max_seq_len,
                                     kernel_features=spec.favor_features, input_conv=spec.short_conv)
        self.drop = Dropout(spec.dropout)
        self.ln2 = make_norm(kind, spec.d_model)
        ffn = SwiGLU if kind == "llama" else FeedForward
        self.ffn = ffn(spec.d_model, spec.ffn_dim, spec.dropout)

    def forward(self, x, need_weights: bool = False, cache=None):
        if cache is not None:  # incremental decoding: x holds only the new positions
            a, weights = self.attn.decode(self.ln1(x), cache), None
        elif need_weights:
            a, weights = self.attn(self.ln1(x), need_weights=True)
        else:
            a, weights = self.attn(self.ln1(x)), None
        x = x + self.drop(a)
        x = x + self.ffn(self.ln2(x))
        return x, weights


def _as_gene_list(gene, n_layers: int) -> list:
    check_argument("gene", gene, (AttentionGene, LayerGenes, str, list, tuple),
                   "an AttentionGene, a gene key, or one of those per layer")
    if isinstance(gene, str):
        gene = AttentionGene.parse(gene)  # a per-layer key becomes LayerGenes
    if isinstance(gene, LayerGenes):
        gene = list(gene.layers)
    if isinstance(gene, AttentionGene):
        genes = [gene] * n_layers
    else:
        genes = list(gene)
        if len(genes) != n_layers:
            raise UserError(f"got {len(genes)} genes for {n_layers} layers: give one gene or one per layer")
    return [AttentionGene.parse(g) if isinstance(g, str) else g for g in genes]


class TinyTransformer(nn.Module):
    def __init__(self, spec: ModelSpec, gene: AttentionGene | str | Sequence[AttentionGene | str]):
        super().__init__()
        if not all(hasattr(spec, name) for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len")):
            raise TypeError(f"spec must be a ModelSpec or a Config, not {spec!r} ({type(spec).__name__})")
        if spec.vocab_size is None:
            raise UserError("the model needs a concrete vocab_size: build it with the data's vocab_size")
        self.spec = spec
        self.genes = _as_gene_list(gene, spec.n_layers)
        LayerGenes(self.genes)  # refuses layers that disagree on learned absolute positions (the genes' rule)
        self.tok_emb = nn.Embedding(spec.vocab_size, spec.d_model)
        # absent (None) unless the genes use learned absolute positions (the layers agree on it)
        absolute = self.genes[0].uses_absolute_positions
        self.pos_emb = nn.Embedding(spec.max_seq_len, spec.d_model) if absolute else None
        self.drop = Dropout(spec.dropout)
        self.blocks = nn.ModuleList(Block(spec, g) for g in self.genes)
        self.ln_f = make_norm(block_kind(spec), spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self._init_own_weights()

    @property
    def gene(self) -> AttentionGene:
        """The gene of the first layer (all layers share it unless built with a list)."""
        return self.genes[0]

    def _init_own_weights(self):
        own_linears = []
        for block in self.blocks:  # a low-rank Q/K/V projection initialises itself
            qkv = [block.attn.qkv] if isinstance(block.attn.qkv, nn.Linear) else []
            # the feed-forward's layers in registration order (gpt2: up, down; llama: gate, up, down),
            # which fixes the order of the initialisation draws
            ffn = [m for m in block.ffn.modules() if isinstance(m, nn.Linear)]
            own_linears += qkv + [block.attn.out] + ffn
        for layer in own_linears:
            nn.init.normal_(layer.weight, mean=0.0, std=0.02)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=0.02)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        """Trainable parameters, each counted once (the tied head is not counted twice)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def hidden_states(self, ids: torch.Tensor, need_weights: bool = False, caches: Sequence | None = None):
        """Final hidden states [B, T, d_model] and the per-layer weights (with ``need_weights``).

        ``caches`` (``new_caches()``, one cache per layer: ``KVCache`` or ``KernelState``): ``ids`` are the next positions
        after those already in the caches, whose keys and values are reused and extended.
        """
        check_argument("ids", ids, torch.Tensor, "a tensor of token ids [batch, time]")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"ids must be integer token ids (torch.long), not a {ids.dtype} tensor")
        if ids.dim() != 2:
            raise UserError(f"ids must be token ids of shape [batch, time], not of shape {tuple(ids.shape)}: add a "
                            "batch dimension with ids.unsqueeze(0)")
        b, t = ids.shape
        start = 0 if caches is None else caches[0].length
        if start + t > self.spec.max_seq_len:
            raise UserError(f"sequence of {start + t} tokens is longer than max_seq_len {self.spec.max_seq_len}")
        x = self.tok_emb(ids)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + t, device=ids.device))
        x = self.drop(x)
        maps = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, need_weights, cache=None if caches is None else caches[i])
            maps.append(weights)
        return self.ln_f(x), maps

    def new_caches(self) -> list:
        """Empty key/value caches, one per layer, for ``decode``."""
        return [block.attn.new_cache() for block in self.blocks]

    def decode(self, ids: torch.Tensor, caches: Sequence) -> torch.Tensor:
        """Logits [B, T, vocab] of ``ids`` [B, T], the positions after those in ``caches`` (which
        grow by T): equal to the last T rows of ``forward`` on the whole sequence."""
        x, _ = self.hidden_states(self._in_vocabulary(ids), caches=caches)
        return self.head(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> logits [B, T, vocab]."""
        x, _ = self.hidden_states(self._in_vocabulary(ids))
        return self.head(x)

    def _in_vocabulary(self, ids):
        """``ids``, or a ValueError for a sequence of no positions or a token id outside the vocabulary:
        the public calls' front door (the trainer's compiled ``hidden_states`` never reads a value
        back). The ids' range on a CPU tensor only: on an accelerator reading it would cost a sync."""
        if isinstance(ids, torch.Tensor) and ids.dim() > 0 and ids.shape[-1] == 0:
            raise ValueError(f"ids of shape {tuple(ids.shape)} hold no positions: give at least one token")
        if isinstance(ids, torch.Tensor) and ids.device.type == "cpu" and ids.numel() and \
                not ids.is_floating_point() and not torch.compiler.is_compiling():
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.spec.vocab_size:
                raise ValueError(f"ids must be token ids in [0, {self.spec.vocab_size}) (the model's vocab_size), "
                                 f"got ids from {low} to {high}")
        return ids

    @torch.no_grad()
    def attention_maps(self, ids: torch.Tensor) -> list:
        """One [B, H, T, T] weight tensor per layer, computed in eval mode (no dropout); None for a
        layer whose program forms no weights (it mixes along time only, e.g. ``o(shift(v))``)."""
        was_training = self.training
        self.eval()
        try:
            _, maps = self.hidden_states(ids, need_weights=True)
        finally:
            self.train(was_training)
        return [None if m is None else m.float() for m in maps]
