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
or Mistral), for every similarity and normalization. When 2W < T the queries go in blocks of W,
each meeting only the 2W keys of its own and the previous block (O(T W) time and memory); maps
and external masks use the [T, T] form with the window as a mask. A window at least as long as
the sequence is full attention.

A kernel normalization (``linear``, ``favor``; see ``components``) never forms scores: the
weights are phi(q s / tau) . phi(k / s) normalised over the allowed keys (s = d_head^(1/4)), and
the output is a running sum over positions, O(T m d) time and O(T d) memory, computed in at
least float32. Where explicit weights are needed (maps, a mask, a window, attention dropout in
training) the same weights are formed as a [T, T] matrix.

When the similarity is a plain dot product of (possibly transformed) q and k and the
normalization is softmax, the same function is computed by PyTorch's fused
``scaled_dot_product_attention`` (the temperature folds into q, since it depends on the query
position at most; rotary embeddings rotate q and k first; a score bias goes in as a float
attention mask with -inf on future keys). ``fused=False`` forces the plain path, which tests
compare against. Training with attention dropout also takes the plain path, on every device:
``dropout.py`` draws its masks from the seeded CPU generator wherever the model runs, so a trial's
dropout stream is the same on a CPU and a GPU (SDPA's fused dropout draws from the device's own
generator; on a CPU it falls back to unfused math anyway).

``decode`` (incremental decoding with a key/value cache, or running sums for a kernel) computes the
new positions' rows of the same function through the same pieces as ``forward``: the projection,
``score_bias``, the weighing (``attend``) and the output projection are each written once.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from evo_attention.nn import components, positions
from evo_attention.nn.dropout import dropout
from evo_attention.nn.program import CausalConv, ProgramCore
from evo_attention.util.errors import UserError
from evo_attention.genes import AttentionGene, canonical_program, program_grammar, size_problem


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


class QKVConv(nn.Module):
    """``qkv_conv`` W: a depthwise causal convolution of width W along time on each of q, k and v,
    per head and channel (Primer's multi-DConv-head attention), each initialised to the identity
    (``nn.program.CausalConv``, which also folds into batches)."""

    def __init__(self, n_heads: int, d_head: int, width: int):
        super().__init__()
        self.q, self.k, self.v = (CausalConv(n_heads, d_head, width) for _ in range(3))

    def forward(self, q, k, v):
        return self.q(q), self.k(k), self.v(v)


@dataclass
class InputCache:
    """One layer's inputs x [B, T, d_model] of the positions decoded so far. A program is decoded by
    running its forward over every position so far and keeping the new rows: every op is causal, so
    those rows are what the whole sequence gives them (O(T^2) per step; programs are small)."""

    x: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.x is None else self.x.shape[1]

    def append(self, x: torch.Tensor) -> torch.Tensor:
        self.x = x if self.x is None else torch.cat((self.x, x), dim=1)
        return self.x


@dataclass
class KernelState:
    """One layer's running sums for a kernel normalization without a window: s = sum phi(k) v^T
    [B, H, m, d_head] and z = sum phi(k) [B, H, m] over the positions decoded so far. Its size does
    not grow with the sequence (the recurrent form of linear attention)."""

    s: torch.Tensor | None = None
    z: torch.Tensor | None = None
    length: int = 0


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


class EvolvedAttention(nn.Module):
    """Causal multi-head self-attention built from ``gene``.

    ``max_seq_len`` is needed only by ``attn_bias=rel`` (the size of its table of offsets);
    ``kernel_features`` is the number of random features of ``favor``.
    """

    # the attributes that hold a gene's registered components, and the gene field each one is
    COMPONENTS = {"similarity": "similarity", "kernel": "normalization", "temperature": "temperature_mode",
                  "gating": "gating"}

    def __init__(self, d_model: int, n_heads: int, gene: AttentionGene | str, *, fused: bool = True,
                 max_seq_len: int | None = None, kernel_features: int = 64, input_conv: int = 0):
        super().__init__()
        if d_model % n_heads:
            raise UserError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
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
        self.similarity = components.SIMILARITIES[self.gene.similarity](self.d_head, n_heads)
        normalization = components.NORMALIZATIONS[self.gene.normalization]
        # a kernel normalization is a module (it may hold random features); the others are functions
        self.kernel = normalization(self.d_head, n_heads, kernel_features) if getattr(normalization, "kernel", False) else None
        self.normalize = None if self.kernel is not None else normalization
        self.temperature = components.TEMPERATURES[self.gene.temperature_mode](d_model, n_heads, self.d_head)
        self.gating = components.GATINGS[self.gene.gating](d_model)
        self.dropout_p = self.gene.attention_dropout
        self.fused = fused
        # input_conv W > 0 (the model's short_conv): a depthwise causal convolution along time over the channels
        # of what the projections read (Zoology's short convolution before attention)
        self.input_conv = CausalConv(1, d_model, input_conv) if input_conv else None
        # qkv_conv W > 0: depthwise causal convolutions of the rotated q, k and of v (after grouped heads are shared)
        self.qkv_conv = QKVConv(n_heads, self.d_head, self.gene.qkv_conv) if self.gene.qkv_conv else None
        self.program = None  # a gene with a program computes it (nn.program) in place of the four components
        if self.gene.program is not None:
            self.program = ProgramCore(canonical_program(self.gene.program), program_grammar(), d_model=d_model,
                                       n_heads=n_heads, d_head=self.d_head, kernel_features=kernel_features)

    @property
    def can_fuse(self) -> bool:
        return bool(getattr(self.similarity, "dot_form", False)) and self.gene.normalization == "softmax"

    def allowed_keys(self, t: int, device=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Bool [T, T] (or broadcast with ``mask``): the keys each query may see, causal and within
        the window, and where ``mask`` allows."""
        allowed = causal_mask(t, device, self.window)
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

    def rotated_heads(self, x: torch.Tensor, start: int = 0):
        """x [B, T, d_model] of positions start..start+T-1 -> q [B, H, T, d_head] and k, v
        [B, kv_heads, T, d_head] (grouped K/V heads not yet repeated), rotated for their positions."""
        b, t, _ = x.shape
        h = self.gating.gate_input(x)
        if self.input_conv is not None:
            h = self.input_conv(h.unsqueeze(1)).squeeze(1)
        if self.kv_heads == self.n_heads:  # one view of the fused projection, as the step has always taken
            q, k, v = self.qkv(h).view(b, t, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = self._heads(h)
        if self.rotary is not None:
            q, k = self.rotary(q, k, start)
        return q, k, v

    def kernel_features(self, q: torch.Tensor, k: torch.Tensor, tau: torch.Tensor):
        """phi(q s / tau), phi(k / s) with s = d_head^(1/4) (their dot product is the score q . k / tau),
        in at least float32: a kernel's sums must not lose precision to bf16."""
        q, k = self.similarity.prepare(q, k)
        dtype = torch.promote_types(q.dtype, torch.float32)
        s = self.d_head ** 0.25
        return self.kernel.feature_maps(q.to(dtype) * s / tau.to(dtype), k.to(dtype) / s)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False):
        """x [B, T, d_model] -> [B, T, d_model] (and the [B, H, T, T] weights if need_weights).

        ``mask``: optional bool tensor broadcastable to [B, H, T, T] (or a [B, T] key mask), True
        where attention is allowed; it is combined with the causal mask, never replaces it.

        Paths, all computing the same function: a kernel normalization runs as a running sum
        unless explicit weights are needed (maps, a mask, a window, or attention dropout); a
        window W with 2W < T attends block by block to the 2W keys around each block of W queries
        (O(T W) time and memory) unless maps or a mask need the [T, T] form; dot-product softmax
        runs in PyTorch's fused kernel.
        """
        b, t, _ = x.shape
        if mask is not None and mask.dim() == 2 and mask.shape == (b, t):
            mask = mask[:, None, None, :]
        if self.program is not None:
            out, weights = self.program(self, x, mask, need_weights)
            return (out, weights) if need_weights else out
        q, k, v = self.project(x)
        tau = self.temperature(x)
        with self._precision(x.device.type):
            y, weights = self._weigh(q, k, v, tau, mask, need_weights)
        out = self._output(x, y)
        return (out, weights) if need_weights else out

    # -- the pieces ``forward`` and ``decode`` share ----------------------------------------------
    def _precision(self, device_type: str):
        """The context the weighing runs in: a kernel's sums in at least float32 (autocast off),
        any other normalization under the caller's autocast."""
        return torch.autocast(device_type, enabled=False) if self.kernel is not None else nullcontext()

    def _weighing_inputs(self, q, k, v, tau, start: int = 0):
        """What the weighing reads: for a kernel normalization the feature maps phi(q), phi(k) (they
        take the scores' place, so there is no score bias) and v in their dtype; otherwise q, k, v
        and the score bias of the queries start..start+T-1."""
        if self.kernel is not None:
            q, k = self.kernel_features(q, k, tau)
            return q, k, v.to(q.dtype), None
        return q, k, v, self.score_bias(q.shape[2], q.device, start)

    def _output(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The heads' outputs y [B, H, T, d_head] through the output projection, gated with x."""
        b, t, _ = x.shape
        return self.gating(x, self.out(y.transpose(1, 2).reshape(b, t, self.d_model)))

    def _weigh(self, q, k, v, tau, mask, need_weights: bool):
        """The attention of q over k applied to v: y [B, H, T, d] and the weights (or None)."""
        t = q.shape[2]
        dropout_p = self.dropout_p if self.training else 0.0
        windowed = 0 < self.window < t
        q, k, v, bias = self._weighing_inputs(q, k, v, tau)
        if self.kernel is not None and not (need_weights or mask is not None or windowed or dropout_p > 0):
            return components.causal_kernel_attention(q, k, v), None
        if windowed and 2 * self.window < t and mask is None and not need_weights:
            return self._banded(q, k, v, tau, bias, dropout_p), None
        allowed = self.allowed_keys(t, q.device, mask)
        # attention dropout: the plain path's masks are the same on every device (module docstring)
        fused = self.fused and self.can_fuse and mask is None and not need_weights and not dropout_p > 0
        return self.attend(q, k, v, tau, bias, allowed, dropout_p, fused=fused, full_causal=not windowed,
                           aligned=True)

    def attend(self, q, k, v, tau, bias, allowed, dropout_p: float, *, fused: bool, full_causal: bool,
               aligned: bool, similarity=None):
        """Weights of queries q over keys k where ``allowed``, applied to v: y [.., Tq, d], weights.

        ``full_causal``: allowed is exactly the causal mask; ``aligned``: query i and key i are the
        same position (the similarity may then skip future keys); ``similarity``: another module
        than the gene's (a program's dot-product score on the fused path).
        """
        similarity = similarity or self.similarity
        if fused:
            q, k = similarity.prepare(q, k)
            q = q / tau.to(q.dtype)
            if bias is None and full_causal:
                return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=1.0), None
            base = bias if bias is not None else torch.zeros((), device=q.device)
            float_mask = torch.where(allowed, base, float("-inf")).to(q.dtype)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, dropout_p=dropout_p, scale=1.0), None
        if self.kernel is not None:
            weights = components.kernel_weights(q, k, allowed)
        else:
            if aligned and getattr(similarity, "causal_skip", False):  # may skip future keys: masked below
                scores = similarity(q, k, causal=True)
            else:
                scores = similarity(q, k)
            scores = scores / tau.to(scores.dtype)
            if bias is not None:
                scores = scores + bias
            weights = self.normalize(scores, allowed)
        return dropout(weights, dropout_p, self.training).to(v.dtype) @ v, weights

    def _banded(self, q, k, v, tau, bias, dropout_p: float) -> torch.Tensor:
        """Sliding-window attention in blocks: the queries of block c (positions cW .. cW + W - 1)
        meet the keys of blocks c - 1 and c, of which query cW + a may see keys a + 1 .. a + W of
        the band. Returns y [B, H, T, d]."""
        b, h, t, d = q.shape
        w = self.window
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
        if tau.shape[2] == t:  # per-query temperature [B, H, T, 1]
            tau = _blocks(tau.expand(b, -1, -1, -1), w, pad, fill=1.0)  # padded queries: no division by 0
        fused = self.fused and self.can_fuse and not dropout_p > 0
        y, _ = self.attend(_blocks(q, w, pad), _bands(k, w, pad), _bands(v, w, pad), tau, bias, allowed,
                           dropout_p, fused=fused, full_causal=False, aligned=False)
        return y.view(b, n, h, w, -1).transpose(1, 2).reshape(b, h, n * w, -1)[:, :, :t]

    # -- incremental decoding (inference only: no dropout, no extra mask) -------------------------
    def _heads(self, h: torch.Tensor):
        """q [B, H, T, d_head] and k, v [B, kv_heads, T, d_head] of the projected input."""
        b, t, _ = h.shape
        q, k, v = self.qkv(h).split((self.d_model, self.kv_dim, self.kv_dim), dim=-1)
        q = q.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.d_head).transpose(1, 2) for z in (k, v))
        return q, k, v

    def share_kv(self, k: torch.Tensor, v: torch.Tensor):
        """Each group of n_heads / kv_heads query heads shares one K/V head: repeat them per group."""
        if self.kv_heads == self.n_heads:
            return k, v
        group = self.n_heads // self.kv_heads
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def new_cache(self) -> "KVCache | KernelState | InputCache":
        """An empty cache for ``decode``: running sums for a kernel normalization without a window,
        the inputs so far for a program, keys and values otherwise."""
        if self.program is not None or self.qkv_conv is not None or self.input_conv is not None:
            return InputCache()
        return KernelState() if self.kernel is not None and not self.window else KVCache()

    def decode(self, x: torch.Tensor, cache: "KVCache | KernelState") -> torch.Tensor:
        """x [B, T, d_model] of T new positions after the ``cache.length`` ones in ``cache`` ->
        [B, T, d_model], the rows ``forward`` gives for them on the whole sequence; their keys and
        values join ``cache``. Rotary angles, ALiBi and relative-bias rows start at the cache's
        length; the window and grouped K/V heads apply as in ``forward``; the temperature reads
        only the new positions' own input (every temperature is per query position at most).

        It runs the forward's own pieces (projection, score bias, weighing, output); only the
        keys (the cache's) and the mask (``decode_mask``) differ. Never fused, never dropped out:
        decoding is inference and forms the few new rows of weights explicitly."""
        t = x.shape[1]
        if isinstance(cache, InputCache):  # a program or a convolution: the forward over every position so far, new rows
            return self.forward(cache.append(x))[:, -t:]
        start = cache.length
        q, k, v = self.rotated_heads(x, start)
        if isinstance(cache, KVCache):
            k, v = cache.append(k, v)
        k, v = self.share_kv(k, v)
        tau = self.temperature(x)
        with self._precision(x.device.type):
            q, k, v, bias = self._weighing_inputs(q, k, v, tau, start)
            if isinstance(cache, KernelState):
                y = self._decode_running(q, k, v, cache)
            else:  # queries start.. over keys 0..: not aligned, so the similarity computes every score
                y, _ = self.attend(q, k, v, tau, bias, decode_mask(start, t, x.device, self.window), 0.0,
                                   fused=False, full_causal=False, aligned=False)
        return self._output(x, y)

    @staticmethod
    def _decode_running(phi_q, phi_k, v, state: KernelState) -> torch.Tensor:
        """The new positions' outputs from the running sums of the earlier ones plus their own
        causal triangle; the sums then take the new positions in."""
        local = (phi_q @ phi_k.transpose(-2, -1)).tril()
        numerator, denominator = local @ v, local.sum(dim=-1)
        if state.s is not None:
            numerator = numerator + phi_q @ state.s
            denominator = denominator + (phi_q @ state.z.unsqueeze(-1)).squeeze(-1)
        kv, ks = phi_k.transpose(-2, -1) @ v, phi_k.sum(dim=-2)
        state.s, state.z = (kv, ks) if state.s is None else (state.s + kv, state.z + ks)
        state.length += phi_q.shape[2]
        return components.safe_ratio(numerator, denominator)

    def extra_repr(self) -> str:
        return f"gene={self.gene.key}, d_model={self.d_model}, n_heads={self.n_heads}, kv_heads={self.kv_heads}"
