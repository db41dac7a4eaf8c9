"""Export a gene's attention as a standalone PyTorch module: ``attention.py`` (imports only torch
and math), the trained weights of every layer (``attention.safetensors``) and a README showing how
to put it into a nanoGPT-style block.

The source is assembled from ``SNIPPETS``: one small piece of code per option of every component
and axis, each defining the one name the core module uses (``Similarity``, ``normalize``,
``Temperature``, ``Gating``, ``Rotary``, ``SCORE_BIASES``, ``make_qkv``). Supporting a new option is
one entry there; an option without an entry cannot be exported (``UserError`` naming it). The
parameter and buffer names are the library's, so ``EvolvedAttention.state_dict()`` of the library
loads into the exported module unchanged, and the exported module computes what the library's does
(the tests compare them in float64 to 1e-10 in a fresh interpreter where evo_attention cannot be
imported). Sparsemax and 1.5-entmax are written out in full (exact, sort-based); pure helpers the
library already has (ALiBi's slopes, the kernels' running sum) are copied from its source. The exported
module always takes the plain path (no fused kernel) and applies the gene's attention dropout with
``F.dropout`` in training mode.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from evo_attention.genes import AttentionGene, parse_position
from evo_attention.nn import components, positions
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir, write_bytes, write_text

ATTENTION_FILE = "attention.py"
WEIGHTS_FILE = "attention.safetensors"
README_FILE = "README.md"

_SIMILARITY_BASE = '''
class Similarity(nn.Module):
    def __init__(self, d_head, n_heads):
        super().__init__()
        self.d_head, self.n_heads = d_head, n_heads
'''

_ROW_NORMALIZE = '''
def _row_normalize(weights, mask, eps=1e-6):
    weights = weights.masked_fill(~mask, 0.0)
    return weights / (weights.sum(dim=-1, keepdim=True) + eps)
'''

_SPARSE_SHIFT = '''
def _shift_for_sparse(scores, mask):
    # subtract each row's max over allowed keys; masked keys go 10 below it, where the sparse maps
    # give exactly zero weight (sparsemax: anything 1 below the max, 1.5-entmax: 2 below)
    row_max = scores.masked_fill(~mask, float("-inf")).amax(dim=-1, keepdim=True).detach()
    row_max = torch.nan_to_num(row_max, neginf=0.0)
    return (scores - row_max).masked_fill(~mask, -10.0)
'''


def _library_source(*functions) -> str:
    """The source of pure library helpers (they use only torch, math, F and each other), copied into
    the export as they are, so each is written once."""
    return "\n\n".join(inspect.getsource(f) for f in functions)


_KERNEL = '''
normalize = None  # a kernel normalization: weights from feature maps phi(q) . phi(k), never from scores
KERNEL_CHUNK = %d  # positions per chunk of the running sum


def kernel_weights(phi_q, phi_k, mask):
    # the explicit [B, H, T, T] weights: exactly zero on masked keys, rows summing to 1
    weights = (phi_q @ phi_k.transpose(-2, -1)).masked_fill(~mask, 0.0)
    return safe_ratio(weights, weights.sum(dim=-1))


''' % components.KERNEL_CHUNK + _library_source(components.safe_ratio, components.causal_kernel_attention)

_GATING_BASE = '''
class Gating(nn.Module):
    def __init__(self, d_model):
        super().__init__()

    def gate_input(self, x):
        return x

    def forward(self, x, y):
        return y
'''

# field -> option -> source defining the name the core module uses for that field
SNIPPETS: dict[str, dict[str, str]] = {
    "similarity": {
        "dot": _SIMILARITY_BASE + '''
    def prepare(self, q, k):
        return q, k

    def forward(self, q, k):
        return q @ k.transpose(-2, -1)
''',
        "multiplicative": _SIMILARITY_BASE + '''
    def forward(self, q, k):
        s = q @ k.transpose(-2, -1)
        return s * torch.sigmoid(s)
''',
        "additive": _SIMILARITY_BASE + '''        self.w_q = nn.Parameter(torch.randn(n_heads, d_head, d_head) / math.sqrt(d_head))
        self.w_k = nn.Parameter(torch.randn(n_heads, d_head, d_head) / math.sqrt(d_head))
        self.v = nn.Parameter(torch.randn(n_heads, d_head) / math.sqrt(d_head))

    def forward(self, q, k):
        # s[b,h,i,j] = v_h . tanh(W_q q_i + W_k k_j), one block of queries at a time (memory T*T*d/block)
        a = torch.einsum("bhtd,hde->bhte", q, self.w_q)
        c = torch.einsum("bhtd,hde->bhte", k, self.w_k)
        dtype = torch.promote_types(a.dtype, self.v.dtype)
        a, c, v = a.to(dtype), c.to(dtype), self.v.to(dtype)[None, :, None, :, None]
        out = a.new_zeros(a.shape[0], a.shape[1], a.shape[2], c.shape[2])
        for i0 in range(0, a.shape[2], 8):
            hidden = torch.tanh(a[:, :, i0:i0 + 8, None, :] + c[:, :, None, :, :])
            out[:, :, i0:i0 + 8] = (hidden @ v).squeeze(-1)
        return out
''',
        "cosine": _SIMILARITY_BASE + '''
    def prepare(self, q, k):
        # cosine times d_head: after the temperature sqrt(d_head) the logits span +-sqrt(d_head)
        scale = math.sqrt(self.d_head)
        return F.normalize(q, dim=-1) * scale, F.normalize(k, dim=-1) * scale

    def forward(self, q, k):
        q, k = self.prepare(q, k)
        return q @ k.transpose(-2, -1)
''',
    },
    "normalization": {
        "softmax": '''
def normalize(scores, mask):
    weights = torch.softmax(_wide(scores).masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0).to(scores.dtype)
''',
        "relu_norm": _ROW_NORMALIZE + '''
def normalize(scores, mask):
    return _row_normalize(torch.relu(_wide(scores)), mask).to(scores.dtype)
''',
        "sigmoid": _ROW_NORMALIZE + '''
def normalize(scores, mask):
    return _row_normalize(torch.sigmoid(_wide(scores)), mask).to(scores.dtype)
''',
        "sparsemax": _SPARSE_SHIFT + '''
def normalize(scores, mask):
    # sparsemax (Martins & Astudillo, 2016): the Euclidean projection of each row onto the simplex,
    # max(z - tau, 0) with tau from the sorted row: the support is the k largest z where
    # 1 + k z_(k) > z_(1) + ... + z_(k)
    z = _shift_for_sparse(_wide(scores), mask)
    z_sorted = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    cumsum = z_sorted.cumsum(dim=-1)
    support = (1 + k * z_sorted > cumsum).sum(dim=-1, keepdim=True)
    tau = (cumsum.gather(-1, support - 1) - 1) / support.to(z.dtype)
    return torch.clamp(z - tau, min=0).masked_fill(~mask, 0.0).to(scores.dtype)
''',
        "linear": _KERNEL + '''
class Kernel(nn.Module):
    # causal linear attention (Katharopoulos et al., 2020): phi = elu + 1
    def __init__(self, d_head, n_heads, n_features):
        super().__init__()

    def feature_maps(self, q, k):
        return F.elu(q) + 1.0, F.elu(k) + 1.0
''',
        "favor": _KERNEL + '''
class Kernel(nn.Module):
    # Performer's FAVOR+ (Choromanski et al., 2021), an APPROXIMATION of softmax attention:
    # phi(x) = exp(w x - |x|^2 / 2) over the trained model's random features w (loaded with the
    # weights). Each query's exponents are shifted by their own max and every key's by the fixed
    # max_i |w_i|^2 / 2 (an upper bound of w x - |x|^2 / 2): both cancel in the ratio
    def __init__(self, d_head, n_heads, n_features):
        super().__init__()
        self.register_buffer("features", torch.zeros(n_heads, n_features, d_head))
        self.register_buffer("key_shift", torch.zeros(1, n_heads, 1, 1))

    def feature_maps(self, q, k):
        w = self.features.to(q.dtype).transpose(-2, -1)
        hq = q @ w - q.square().sum(-1, keepdim=True) / 2
        hk = k @ w - k.square().sum(-1, keepdim=True) / 2 - self.key_shift.to(k.dtype)
        return torch.exp(hq - hq.amax(-1, keepdim=True).detach()), torch.exp(hk)
''',
        "entmax15": _SPARSE_SHIFT + '''
def normalize(scores, mask):
    # 1.5-entmax (Peters et al., 2019): p = max(z/2 - tau, 0)^2 with tau such that the row sums to
    # 1, found exactly from the sorted row: for each support size k, the tau that makes the k
    # largest sum to 1; the support is the largest k whose tau lies below its k-th value
    z = _shift_for_sparse(_wide(scores), mask) / 2
    z_sorted = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    mean = z_sorted.cumsum(dim=-1) / k
    mean_sq = (z_sorted ** 2).cumsum(dim=-1) / k
    delta = (1 - k * (mean_sq - mean ** 2)) / k
    tau = mean - torch.sqrt(torch.clamp(delta, min=0))
    support = (tau <= z_sorted).sum(dim=-1, keepdim=True)
    tau_star = tau.gather(-1, support - 1)
    return (torch.clamp(z - tau_star, min=0) ** 2).masked_fill(~mask, 0.0).to(scores.dtype)
''',
    },
    "temperature_mode": {
        "fixed": '''
class Temperature(nn.Module):
    """sqrt(d_head)."""

    def __init__(self, d_model, n_heads, d_head):
        super().__init__()
        self.register_buffer("tau", torch.full((1, n_heads, 1, 1), math.sqrt(d_head)), persistent=False)

    def forward(self, x):
        return self.tau
''',
        "learned": '''
class Temperature(nn.Module):
    """A learned positive scalar per head, exp(log_tau)."""

    def __init__(self, d_model, n_heads, d_head):
        super().__init__()
        self.log_tau = nn.Parameter(torch.full((1, n_heads, 1, 1), 0.5 * math.log(d_head)))

    def forward(self, x):
        return self.log_tau.exp()
''',
        "adaptive": '''
class Temperature(nn.Module):
    """Per head and query position, from that position's own input: sqrt(d_head) * exp(2 tanh(W x + c))."""

    def __init__(self, d_model, n_heads, d_head):
        super().__init__()
        self.proj = nn.Linear(d_model, n_heads)
        nn.init.zeros_(self.proj.weight)  # starts at sqrt(d_head)
        nn.init.zeros_(self.proj.bias)
        self.base = math.sqrt(d_head)

    def forward(self, x):
        z = _wide(self.proj(x))
        return (self.base * torch.exp(2.0 * torch.tanh(z))).transpose(1, 2).unsqueeze(-1)
''',
    },
    "gating": {
        "none": _GATING_BASE,
        "input_gate": _GATING_BASE + '''

class InputGate(Gating):
    def __init__(self, d_model):
        super().__init__(d_model)
        self.gate = nn.Linear(d_model, d_model)

    def gate_input(self, x):
        return torch.sigmoid(self.gate(x)) * x


Gating = InputGate
''',
        "output_gate": _GATING_BASE + '''

class OutputGate(Gating):
    def __init__(self, d_model):
        super().__init__(d_model)
        self.gate = nn.Linear(d_model, d_model)

    def forward(self, x, y):
        return torch.sigmoid(self.gate(x)) * y


Gating = OutputGate
''',
        "highway": _GATING_BASE + '''

class HighwayGate(Gating):
    def __init__(self, d_model):
        super().__init__(d_model)
        self.gate = nn.Linear(d_model, d_model)
        nn.init.constant_(self.gate.bias, 1.0)  # leaning to the attention output at first

    def forward(self, x, y):
        g = torch.sigmoid(self.gate(x))
        return g * y + (1.0 - g) * x


Gating = HighwayGate
''',
    },
    "position": {  # learned absolute embeddings live at the model's input, outside attention
        "learned": "\nRotary = None\nPOSITION_BIASES = []\n",
        "none": "\nRotary = None\nPOSITION_BIASES = []\n",
        "rope": '''
class Rotary(nn.Module):
    """Rotary embeddings, half-split layout: dimension i pairs with i + d_head/2."""

    def __init__(self, d_head, base=10000.0):
        super().__init__()
        if ROPE_SCALING == "ntk":
            base = base * ROPE_FACTOR ** (d_head / max(d_head - 2, 1))
        self.position_scale = 1.0 / ROPE_FACTOR if ROPE_SCALING == "linear" else 1.0
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    @staticmethod
    def rotate(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def forward(self, q, k):
        pos = torch.arange(q.shape[-2], device=q.device, dtype=torch.float32) * self.position_scale
        theta = torch.outer(pos, self.inv_freq.to(q.device))
        cos, sin = theta.cos().to(q.dtype), theta.sin().to(q.dtype)
        return self.rotate(q, cos, sin), self.rotate(k, cos.to(k.dtype), sin.to(k.dtype))


POSITION_BIASES = []
''',
        "alibi": '''
Rotary = None


''' + _library_source(positions.alibi_slopes) + '''


class ALiBi(nn.Module):
    """bias[h, i, j] = -slope_h * (i - j) on the logits (Press et al.)."""

    def __init__(self, n_heads, max_seq_len):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, t, device):
        return -self.slopes.to(device)[:, None, None] * _offsets(t, device).float()


POSITION_BIASES = [ALiBi]
''',
    },
    "attn_bias": {
        "none": "\nSCORE_BIASES = POSITION_BIASES\n",
        "rel": '''
class RelativeBias(nn.Module):
    """A learned scalar per head and causal offset i - j."""

    def __init__(self, n_heads, max_seq_len):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(n_heads, max_seq_len))

    def forward(self, t, device):
        if t > self.table.shape[1]:
            raise ValueError(f"sequence of {t} tokens is longer than the relative bias table ({self.table.shape[1]})")
        return self.table[:, _offsets(t, device)]


SCORE_BIASES = POSITION_BIASES + [RelativeBias]
''',
    },
    "qkv_rank": {
        "full": '''
def make_qkv(d_model, kv_dim, bias):
    return nn.Linear(d_model, d_model + 2 * kv_dim, bias=bias)
''',
        "low": '''
class LowRankQKV(nn.Module):
    """Q/K/V through rank-QKV_RANK latents: [U_q D_q h, U_kv D_kv h]."""

    def __init__(self, d_model, rank, bias, kv_dim):
        super().__init__()
        self.q_down = nn.Linear(d_model, rank, bias=False)
        self.q_up = nn.Linear(rank, d_model, bias=bias)
        self.kv_down = nn.Linear(d_model, rank, bias=False)
        self.kv_up = nn.Linear(rank, 2 * kv_dim, bias=bias)
        for down, up in ((self.q_down, self.q_up), (self.kv_down, self.kv_up)):  # output variance of N(0, 0.02)
            nn.init.normal_(down.weight, std=d_model ** -0.5)
            nn.init.normal_(up.weight, std=0.02 * (d_model / rank) ** 0.5)
            if up.bias is not None:
                nn.init.zeros_(up.bias)

    def forward(self, h):
        return torch.cat((self.q_up(self.q_down(h)), self.kv_up(self.kv_down(h))), dim=-1)


def make_qkv(d_model, kv_dim, bias):
    return LowRankQKV(d_model, QKV_RANK, bias, kv_dim)
''',
    },
}

# the fields whose snippet is chosen by name, in the order the source lists them
_ORDER = ("qkv_rank", "position", "attn_bias", "similarity", "temperature_mode", "normalization", "gating")

_HEADER = '''"""{gene}: an attention mechanism found by evo-attention, as a standalone PyTorch module.

Made by `evo-attention export`{source}. Needs only PyTorch. Input and output are [B, T, d_model], as
nanoGPT's CausalSelfAttention; the module is causal. {position_note}

    from safetensors.torch import load_file
    attn = EvolvedAttention()                                  # d_model={d_model}, n_heads={n_heads}, max_seq_len={max_seq_len}
    attn.load_state_dict(layer_state(load_file("{weights}"), 0))   # the trained weights of layer 0
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

GENE = "{gene}"
D_MODEL, N_HEADS, MAX_SEQ_LEN = {d_model}, {n_heads}, {max_seq_len}
USE_BIAS = {use_bias}  # biases in the Q/K/V and output projections
ATTENTION_DROPOUT = {dropout}  # on the attention weights, in training mode
KV_HEADS = {kv_heads}  # key/value heads (0: one per head; K < N_HEADS: grouped-query attention)
WINDOW = {window}  # each query sees its last WINDOW keys (0: every earlier key)
QKV_RANK = {rank}  # rank of the factorised Q/K/V projection (0: full)
ROPE_SCALING, ROPE_FACTOR = {rope_scaling!r}, {rope_factor!r}  # rotary embeddings only
KERNEL_FEATURES = {kernel_features}  # random features per head (normalization favor only)
Kernel = None  # a kernel normalization defines it below


def _wide(x):
    # scores are normalized in at least float32 (float64 stays float64)
    return x if x.dtype == torch.float64 else x.float()


def _offsets(t, device):
    # [T, T] causal offsets i - j, clamped to 0 for future keys (which are masked anyway)
    i = torch.arange(t, device=device)
    return (i[:, None] - i[None, :]).clamp(min=0)


def layer_state(state, layer):
    """The weights of one layer from {weights} (keys "layers.<i>.<name>")."""
    prefix = f"layers.{{layer}}."
    return {{key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}}
'''

_CORE = '''

class EvolvedAttention(nn.Module):
    """Causal multi-head self-attention of the gene GENE."""

    def __init__(self, d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=MAX_SEQ_LEN):
        super().__init__()
        assert d_model % n_heads == 0 and n_heads % (KV_HEADS or n_heads) == 0
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.kv_heads = KV_HEADS or n_heads
        self.kv_dim = self.kv_heads * self.d_head
        self.qkv = make_qkv(d_model, self.kv_dim, USE_BIAS)
        self.out = nn.Linear(d_model, d_model, bias=USE_BIAS)
        self.rotary = Rotary(self.d_head) if Rotary is not None else None
        self.score_biases = nn.ModuleList(bias(n_heads, max_seq_len) for bias in SCORE_BIASES)
        self.similarity = Similarity(self.d_head, n_heads)
        self.kernel = Kernel(self.d_head, n_heads, KERNEL_FEATURES) if Kernel is not None else None
        self.temperature = Temperature(d_model, n_heads, self.d_head)
        self.gating = Gating(d_model)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.gating.gate_input(x)).split((self.d_model, self.kv_dim, self.kv_dim), dim=-1)
        q = q.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.d_head).transpose(1, 2) for z in (k, v))
        if self.rotary is not None:
            q, k = self.rotary(q, k)
        if self.kv_heads != self.n_heads:  # each group of query heads shares one key/value head
            group = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        i = torch.arange(t, device=x.device)
        allowed = i[None, :] <= i[:, None]  # key j <= query i
        if WINDOW > 0:
            allowed = allowed & (i[:, None] - i[None, :] < WINDOW)
        if self.kernel is not None:  # phi(q s / tau) . phi(k / s), s = d_head^(1/4): the score q . k / tau
            q, k = self.similarity.prepare(q, k)
            dtype, s = torch.promote_types(q.dtype, torch.float32), self.d_head ** 0.25
            phi_q, phi_k = self.kernel.feature_maps(q.to(dtype) * s / self.temperature(x).to(dtype), k.to(dtype) / s)
            if WINDOW == 0 and not (self.training and ATTENTION_DROPOUT > 0):
                y = causal_kernel_attention(phi_q, phi_k, v.to(dtype))
                return self.gating(x, self.out(y.transpose(1, 2).reshape(b, t, self.d_model)))
            weights, v = kernel_weights(phi_q, phi_k, allowed), v.to(dtype)
        else:
            scores = self.similarity(q, k) / self.temperature(x).to(q.dtype)
            for bias in self.score_biases:
                scores = scores + bias(t, x.device)
            weights = normalize(scores, allowed)
        weights = F.dropout(weights, ATTENTION_DROPOUT, self.training)
        y = (weights.to(v.dtype) @ v).transpose(1, 2).reshape(b, t, self.d_model)
        return self.gating(x, self.out(y))
'''


def _option(gene: AttentionGene, field: str) -> str:
    if field == "position":
        return parse_position(gene.position).kind
    if field == "qkv_rank":
        return "low" if gene.qkv_rank else "full"
    return str(getattr(gene, field))


def check_exportable(gene: AttentionGene) -> None:
    """UserError naming the first option of ``gene`` that has no export snippet."""
    for field in _ORDER:
        option = _option(gene, field)
        if option not in SNIPPETS[field]:
            raise UserError(f"gene {gene.key}: {field} {option!r} cannot be exported yet (no entry in "
                            f"nn/export.py SNIPPETS[{field!r}]): add its source there")


def attention_source(gene: AttentionGene | str, d_model: int, n_heads: int, max_seq_len: int, *,
                     source: str = "", kernel_features: int = 64) -> str:
    """The standalone ``attention.py`` of ``gene`` at these sizes (see the module docstring)."""
    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    check_exportable(gene)
    spec = parse_position(gene.position)
    position_note = {
        "learned": "The gene reads word order from learned absolute position embeddings added to the token "
                   "embeddings at the model's input (as nanoGPT's wpe); the attention itself uses none.",
        "none": "The gene uses no position signal at all: drop the model's position embedding (wpe).",
        "rope": "Word order comes from rotary embeddings inside the attention: drop the model's position "
                "embedding (wpe).",
        "alibi": "Word order comes from ALiBi biases inside the attention: drop the model's position embedding "
                 "(wpe).",
    }[spec.kind]
    header = _HEADER.format(gene=gene.key, source=f" from {source}" if source else "", position_note=position_note,
                            d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, weights=WEIGHTS_FILE,
                            use_bias=gene.use_bias, dropout=gene.attention_dropout, kv_heads=gene.kv_heads,
                            window=gene.window, rank=gene.qkv_rank, rope_scaling=spec.scaling,
                            rope_factor=float(spec.factor), kernel_features=kernel_features)
    parts = [header] + [SNIPPETS[field][_option(gene, field)] for field in _ORDER] + [_CORE]
    return "\n".join(part.strip("\n") + "\n" for part in parts).replace("\n\n\n\n", "\n\n\n")


def _readme(gene: AttentionGene, d_model: int, n_heads: int, max_seq_len: int, n_layers: int, source: str) -> str:
    uses_wpe = parse_position(gene.position).kind == "learned"
    wpe = ("keep `wpe`: this gene relies on learned absolute positions at the input" if uses_wpe
           else "remove `wpe` (and its addition in `GPT.forward`): the attention brings its own position signal"
           if parse_position(gene.position).kind in ("rope", "alibi") else "remove `wpe`: this gene uses no positions")
    return f"""# Exported attention: `{gene.key}`

{f"From {source}. " if source else ""}`attention.py` needs only PyTorch; `{WEIGHTS_FILE}` holds the trained
weights of all {n_layers} layer(s) (keys `layers.<i>.<name>`, read with `safetensors`). The module maps
[B, T, {d_model}] to [B, T, {d_model}] with {n_heads} heads and sees at most {max_seq_len} positions.

## In a nanoGPT-style block

```python
import torch.nn as nn
from safetensors.torch import load_file

from attention import EvolvedAttention, layer_state


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = EvolvedAttention(config.n_embd, config.n_head, config.block_size)  # was CausalSelfAttention
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


weights = load_file("{WEIGHTS_FILE}")
for i, block in enumerate(model.transformer.h):  # the trained attention weights, layer by layer
    block.attn.load_state_dict(layer_state(weights, i))
```

Positions: {wpe}. To train from scratch instead, skip the `load_state_dict` lines.
"""


def export_attention(model, out: str | Path, *, source: str = "") -> dict:
    """Write ``attention.py``, ``attention.safetensors`` (every layer's attention weights) and
    ``README.md`` for ``model`` (a ``TinyTransformer`` whose layers share one gene) into ``out``.
    Everything is checked before anything is written. Returns ``{"gene", "files": [...]}``."""
    genes = {g.key for g in model.genes}
    if len(genes) != 1:
        raise UserError(f"the model's layers use {len(genes)} different genes: export writes one attention module, "
                        "so export a model whose layers share a gene")
    gene = model.genes[0]
    config = model.config
    text = attention_source(gene, config.d_model, config.n_heads, config.max_seq_len, source=source,
                            kernel_features=getattr(config, "favor_features", 64))
    from safetensors.torch import save

    state = {f"layers.{i}.{name}": tensor.detach().cpu().contiguous()
             for i, block in enumerate(model.blocks) for name, tensor in block.attn.state_dict().items()}
    weights = save(state, metadata={"gene": gene.key, "layers": str(len(model.blocks))})
    readme = _readme(gene, config.d_model, config.n_heads, config.max_seq_len, len(model.blocks), source)
    out = output_dir(out)
    paths = [write_text(out / ATTENTION_FILE, text), write_bytes(out / WEIGHTS_FILE, weights),
             write_text(out / README_FILE, readme)]
    return {"gene": gene.key, "files": [str(p) for p in paths], "layers": len(model.blocks)}
