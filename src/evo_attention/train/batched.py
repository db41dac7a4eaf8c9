"""Train several same-shape trials as one: K models folded into one batch, one optimizer step for all.

``run_batched(trials, data)`` trains K trials that share the genome's mechanism, the model, the task,
the steps (and budget), the split and the batch recipe, and differ in seed and/or the TrainSpec fields
that change no shape (``VARYING_TRAIN_FIELDS``: rate, weight decay, warm-up, schedule, its decay
fraction, gradient clipping), set by the config or by a genome's recipe parts (``Trial.recipe``). It
returns one ``TrainingResult`` per trial, whose record is keyed by the trial as ``run_training``
would key it, and says ``batched: K`` in ``record.extra``. The local executors call it for the
trials of one call that can share a batch (``batch_models``; see
``search.executors.base.plan_batches``); ``models_per_batch`` says how many (``auto``: measured per
machine and shape, at the end of this module).

The mechanism: folding the model dimension into the batch
----------------------------------------------------------
Every trial's model is built exactly as ``Trainer`` builds it (``torch.manual_seed(seed)``, then
``TinyTransformer``), then its parameters are stacked along a new leading model dimension K and a
copy of the model is rewired to run on the stacked weights (``fold_models``): each ``nn.Linear``
becomes a ``baddbmm``/``bmm`` over the K weight matrices, each norm keeps each model's weights (see
below), the token table is one [K * vocab, d] table indexed with per-model offsets, and the few
components that hold weights of their own (learned temperature, relative bias, additive similarity,
FAVOR features) have folded twins here. Activations are [K * B, ...] (model-major), so every
parameter-free part of the model -- the attention's similarity, normalisation, masks, windows,
fused SDPA, kernels, dropout sites -- runs unchanged on the folded batch: one kernel launch per op
for all K models. The loss is the fused chunked loss of ``nn.losses`` with batched products
(``batched_linear_cross_entropy``), one mean per model. The alternative, ``torch.func.vmap`` over
``functional_call`` with stacked weights, was measured at 0.98x on this CPU (the project issue):
the CPU SDPA kernel has no batching rule and falls back to a loop over the models; the fused loss
(an ``autograd.Function`` with a ``ctx`` forward) has no vmap rule either, and vmap's random ops
cannot give each model its own dropout stream. Folding needs no batching rules: every op already
takes a batch, and the per-model parts are explicit.

What stays per model: its batches (its own seeded generator: exactly the batches its single
trainer draws), its dropout stream, its rate/decay/clip (``StackedAdamW`` with per-model rates and
per-model gradient norms), its learning curve and its divergence (a diverged model leaves the batch:
its slice of every stacked tensor is dropped, the others go on).

Same trial, same result
-----------------------
Dropout: the single trainer seeds torch's global generator, builds the model, and then draws every
dropout mask from the global generator. Here each model's generator starts at the global state
right after its own model was built, and ``nn.dropout.mask_source`` makes every dropout site draw
model k's part of the mask from generator k with the single trainer's shape: the masks are exactly
those of ``run_training`` (by construction; ``run_training`` is unchanged), on every device, since
the single trainer also draws its masks from the CPU generator on a GPU (``nn.dropout``).

The optimizer (``StackedAdamW``) and the gradient clipping repeat torch's AdamW and
``clip_grad_norm_`` operation for operation, so with equal gradients the updates are bitwise equal.
Norms run per model slice (layer norm: one native call per model) or as the single model's own
composite graph (RMS norm), so their gradients are the single model's too. The batched matrix
products gave bitwise the single model's results at the model's shapes, except the weight
gradients of thin products (a few outputs: the adaptive temperature's projection, low-rank Q/K/V
projections), and the learned temperature's gradient is summed in another order (its per-model
scalar is broadcast over the folded batch). Those are floating-point reassociation, one rounding of
a few gradients, which training then amplifies as it amplifies any rounding.

Measured on the 2-core AMD EPYC with AVX512-BF16 (one thread; seeds and rates differing, dropout
0.1 and attention dropout on, 2-layer 32-dim models on the recall task), the largest relative
difference between a trial batched and alone, of its final val_loss / of any point of its loss
curve:

- 30 steps, the 9 genes of the tests' covering list (every component and axis), K = 2: fp32 9 of
  the 18 trials bitwise equal, the largest difference 1.1e-3 / 1.9e-3 (additive, relu_norm,
  adaptive temperature); bf16 all bitwise equal.
- 300 steps, 10 genes, K = 3: fp32 6 genes bitwise equal, the others up to 3.5e-2 / 2.4e-2 (cosine,
  entmax15, highway, adaptive temperature); bf16 7 genes bitwise equal, the others up to 1.1e-2 /
  1.2e-2 (the seed's best gene, learned temperature). For scale: the same fp32 trial trained alone
  with one thread and with two differs by up to 2.6e-2 / 2.8e-2 (that gene, 300 steps).

The tests hold the vanilla gene (gpt2 and llama blocks, fp32 and bf16) to bitwise equality and every
gene of the covering list to ``SAME_RESULT_RTOL`` after 8 steps.

What a record measures
----------------------
``params`` and ``flops_per_step`` are per model, as the single trainer gives them: the FLOPs of the
batch's first step (PyTorch's flop counter, the single trainer's SDPA formulas) divided by K, which
equals the single count since every counted product is linear in the batch (a test holds them
equal). ``latency_ms`` is measured per model after training by the single trainer's own
``measure_latency`` on that model alone. ``train_time_s`` is the model's share of the batch's
training time (each step's wall time divided by the models in the batch at that step), so
``tokens_per_s`` is its share of the batch's throughput; ``time_s`` is its share of building and
training plus its own evaluation; ``extra["batch_time_s"]`` is the whole batch's wall time.
``peak_memory_mb`` is the process peak while the batch trained: the whole batch's, larger than one
training's. ``compiled`` is False (the batch runs eager).

Genomes whose components are not all built-in (a plugin's), and a learned relative bias with a
block-wise sliding window (its bias is indexed per block for one model), are not folded: their
trials train one after the other through ``run_training`` (``batch_problem`` says why; the records
say ``batch_fallback``). So does a batch that fails as a whole (out of memory, say): its trials
then train alone, so that a record never depends on the batch it was planned in.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from evo_attention.data.base import IGNORE_INDEX, TaskData
from evo_attention.genes import mechanism_of
from evo_attention.nn import components, positions
from evo_attention.nn.attention import EvolvedAttention, LowRankQKV
from evo_attention.nn.dropout import Dropout, keep_mask, mask_source
from evo_attention.nn.losses import DEFAULT_CHUNK, WEIGHT_GROUP
from evo_attention.nn.model import Block, FeedForward, SwiGLU, TinyTransformer
from evo_attention.train.config import Config, batch_models_value
from evo_attention.train.environment import (_probe_path, _probe_shape, _read_probe, _write_probe_once, autocast,
                                             available_memory_mb, choose_precision, is_oom, matmul_dtype,
                                             memory_in_use_mb, peak_memory_mb, reset_peak_memory, resolve_device,
                                             synchronize, versions)
from evo_attention.train.record import EvaluationRecord, Status
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import (ProgressFn, Trainer, TrainingResult, _sdpa_formulas, evaluate_into,
                                         run_training, state_to_bytes)
from evo_attention.util.errors import UserError

# TrainSpec fields the trials of one batch may differ in: they change no shape
VARYING_TRAIN_FIELDS = ("learning_rate", "weight_decay", "warmup_steps", "lr_schedule", "lr_decay_fraction",
                        "grad_clip")

# The bound the tests hold a batched trial to against the same trial alone (relative, final val_loss
# and every loss-curve point) for short trainings (up to 30 steps measured: 1.9e-3 fp32, 0 bf16); the
# genes whose parts all fold exactly are bitwise equal. Longer trainings amplify the rounding of the
# other genes like any rounding (300 steps: up to 3.5e-2 fp32, 1.2e-2 bf16; see the module docstring).
SAME_RESULT_RTOL = {"fp32": 5e-3, "bf16": 5e-3}

BETAS = (0.9, 0.95)  # the single trainer's AdamW
ADAM_EPS = 1e-8
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


# ---------------------------------------------------------------------------------------------
# Which trials make one batch
# ---------------------------------------------------------------------------------------------

def _compared_fields(spec) -> list[str]:
    return [f.name for f in dataclasses.fields(spec) if f.compare]


def shape_difference(trials: Sequence[Trial]) -> tuple[str, str] | None:
    """``(field, message)`` for the first field in which a trial differs from the first one where the
    trials of a batch must agree, or None when they can train as one batch."""
    first = trials[0]
    for i, trial in enumerate(trials[1:], 1):
        for name in ("genome", "steps", "budget", "eval_split"):
            mine, theirs = getattr(first, name), getattr(trial, name)
            if name == "genome":  # the recipe parts (lr=, wu=, wd=) change no shape: the mechanism must agree
                mine, theirs = mechanism_of(mine).key, mechanism_of(theirs).key
            if mine != theirs:
                return name, f"trial {i} has {name} {theirs!r} where trial 0 has {mine!r}"
        for group in ("model", "task", "train"):
            a, b = getattr(first, group), getattr(trial, group)
            for name in _compared_fields(a):
                if group == "train" and name in VARYING_TRAIN_FIELDS:
                    continue
                mine, theirs = getattr(a, name), getattr(b, name)
                if mine != theirs:
                    return name, f"trial {i} has {group}.{name} {theirs!r} where trial 0 has {mine!r}"
    return None


def check_batchable(trials: Sequence[Trial]) -> None:
    """UserError naming the field in which the trials differ where one batch needs them equal."""
    difference = shape_difference(trials)
    if difference is not None:
        name, message = difference
        config_fields = {f.name for f in dataclasses.fields(Config)}
        raise UserError(f"these trials cannot train as one batch: {message} (a batch shares everything but the "
                        f"seed and {', '.join(VARYING_TRAIN_FIELDS)})",
                        setting=name if name in config_fields else None)


_BUILTIN_NORMALIZE = {components.softmax_norm, components.sparsemax_norm, components.relu_norm,
                      components.sigmoid_norm, components.entmax15_norm}
_BUILTIN_COMPONENTS = {
    "similarity": {"dot": components.DotSimilarity, "multiplicative": components.MultiplicativeSimilarity,
                   "additive": components.AdditiveSimilarity, "cosine": components.CosineSimilarity},
    "normalization": {"softmax": components.softmax_norm, "sparsemax": components.sparsemax_norm,
                      "relu_norm": components.relu_norm, "sigmoid": components.sigmoid_norm,
                      "entmax15": components.entmax15_norm, "linear": components.LinearKernel,
                      "favor": components.FavorKernel},
    "temperature_mode": {"fixed": components.FixedTemperature, "learned": components.LearnedTemperature,
                         "adaptive": components.AdaptiveTemperature},
    "gating": {"none": components.NoGating, "input_gate": components.InputGate,
               "output_gate": components.OutputGate, "highway": components.HighwayGate},
}


def batch_problem(trial: Trial, seq_len: int | None = None) -> str | None:
    """Why the genome of ``trial`` cannot be folded into a batch (its trials then train one by one),
    or None. ``seq_len``: the data's window (default: the model's max_seq_len)."""
    from evo_attention.genes import layers_of

    t = seq_len or trial.model.max_seq_len
    for gene in layers_of(trial.gene):
        for field, builtins in _BUILTIN_COMPONENTS.items():
            name = getattr(gene, field)
            if builtins.get(name) is None or components._REGISTRIES[field].get(name) is not builtins[name]:
                return f"{field} {name!r} is not a built-in component"
        if gene.attn_bias == "rel" and 0 < gene.window and 2 * gene.window < t:
            return "a relative bias with a block-wise sliding window"
    return None


# ---------------------------------------------------------------------------------------------
# The folded model: stacked weights, activations [K * B, ...] (model-major)
# ---------------------------------------------------------------------------------------------

class Unfoldable(Exception):
    """A model with a part this module cannot fold (its trials train alone)."""


class Fold:
    """What the folded parts that never see an activation need: the rows per model of the batch."""

    def __init__(self):
        self.batch = 1


def _per_model(x: torch.Tensor, k: int) -> torch.Tensor:
    """[K * M, ...] (model-major) -> [K, M, ...]."""
    return x.reshape(k, -1, *x.shape[1:])


def _broadcast_rows(rows: torch.Tensor, batch: int) -> torch.Tensor:
    """[K, ...] per-model values -> [K * batch, ...], each model's repeated over its rows."""
    k = rows.shape[0]
    return rows.unsqueeze(1).expand(k, batch, *rows.shape[1:]).reshape(k * batch, *rows.shape[1:])


class StackedLinear(nn.Module):
    """K linear layers: [K * M, ..., in] -> [K * M, ..., out], one batched product."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None):
        super().__init__()
        self.weight, self.bias = weight, bias  # [K, out, in], [K, out]

    def forward(self, x):
        k, out, n_in = self.weight.shape
        x3 = x.reshape(k, -1, n_in)
        wt = self.weight.transpose(1, 2)
        y = torch.bmm(x3, wt) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), x3, wt)
        return y.view(*x.shape[:-1], out)


class StackedLayerNorm(nn.Module):
    """K layer norms, one native call per model slice: the normalisation is cheap, and the native
    kernel's weight and bias gradients (its own summation order) stay those of the single model."""

    def __init__(self, weight, bias, normalized_shape, eps: float):
        super().__init__()
        self.weight, self.bias = weight, bias  # [K, d]
        self.normalized_shape, self.eps = tuple(normalized_shape), eps

    def forward(self, x):
        parts, weights = _per_model(x, self.weight.shape[0]).unbind(0), self.weight.unbind(0)
        biases = self.bias.unbind(0) if self.bias is not None else [None] * len(weights)
        return torch.cat([F.layer_norm(part, self.normalized_shape, w, b, self.eps)
                          for part, w, b in zip(parts, weights, biases)])


class StackedRMSNorm(nn.Module):
    """K RMS norms. On a CPU ``F.rms_norm`` is a composite (x * rsqrt(mean(x^2) + eps), then * weight),
    so one call without the weight followed by each model's weight is the single model's graph, and
    the input's three gradient terms (the residual, pow, mul) add up in the same order."""

    def __init__(self, weight, normalized_shape, eps):
        super().__init__()
        self.weight = weight  # [K, d]
        self.normalized_shape, self.eps = tuple(normalized_shape), eps

    def forward(self, x):
        y = F.rms_norm(x, self.normalized_shape, None, self.eps)
        k = self.weight.shape[0]
        return (y.reshape(k, -1, y.shape[-1]) * self.weight.unsqueeze(1)).view(y.shape)


class StackedTokenEmbedding(nn.Module):
    """K token tables as one [K * vocab, d] table: model k's ids are offset by k * vocab."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight  # [K, vocab, d] (also the tied output layer)

    def forward(self, ids):
        k, vocab, d = self.weight.shape
        offsets = torch.arange(k, device=ids.device).mul_(vocab).view(k, 1)
        flat = ids.reshape(k, -1) + offsets
        return F.embedding(flat, self.weight.view(k * vocab, d)).view(*ids.shape, d)


class StackedPositionEmbedding(nn.Module):
    def __init__(self, weight, fold: Fold):
        super().__init__()
        self.weight, self.fold = weight, fold  # [K, max_seq_len, d]

    def forward(self, positions_):
        return _broadcast_rows(self.weight[:, positions_], self.fold.batch)  # [K * B, T, d]


class StackedLearnedTemperature(nn.Module):
    def __init__(self, log_tau):
        super().__init__()
        self.log_tau = log_tau  # [K, 1, H, 1, 1]

    def forward(self, x):
        k = self.log_tau.shape[0]
        tau = self.log_tau.exp().squeeze(1)  # [K, H, 1, 1]
        # per query position ([K * B, H, T, 1]): also right for the block-wise window path
        tau = tau.expand(k, tau.shape[1], x.shape[1], 1)
        return _broadcast_rows(tau, x.shape[0] // k)


class StackedRelativeBias(nn.Module):
    def __init__(self, table, max_seq_len: int, fold: Fold):
        super().__init__()
        self.table, self.max_seq_len, self.fold = table, max_seq_len, fold  # [K, H, max_seq_len]

    def forward(self, t: int, device=None, start: int = 0):
        if start + t > self.max_seq_len:
            raise UserError(f"sequence of {start + t} tokens is longer than the relative bias table "
                            f"({self.max_seq_len})")
        return _broadcast_rows(self.table[:, :, positions._offsets(t, device, start)], self.fold.batch)


class StackedAdditive(nn.Module):
    """K additive similarities; the models become heads of one ``_AdditiveScores`` call."""

    causal_skip = True
    dot_form = False

    def __init__(self, w_q, w_k, v, block: int):
        super().__init__()
        self.w_q, self.w_k, self.v = w_q, w_k, v  # [K, H, d, d], [K, H, d, d], [K, H, d]
        self.block = block

    def prepare(self, q, k):
        return q, k

    def forward(self, q, k, causal: bool = False):
        n_models, heads = self.w_q.shape[0], self.w_q.shape[1]
        a = torch.einsum("kbhtd,khde->kbhte", _per_model(q, n_models), self.w_q)
        c = torch.einsum("kbhtd,khde->kbhte", _per_model(k, n_models), self.w_k)
        dtype = torch.promote_types(a.dtype, self.v.dtype)
        m = a.shape[1]

        def as_heads(z):  # [K, M, H, T, d] -> [M, K * H, T, d]
            return z.transpose(0, 1).reshape(m, n_models * heads, *z.shape[3:]).to(dtype)

        s = components._AdditiveScores.apply(as_heads(a), as_heads(c), self.v.reshape(n_models * heads, -1).to(dtype),
                                             self.block, causal)
        return s.view(m, n_models, heads, *s.shape[2:]).transpose(0, 1).reshape(n_models * m, heads, *s.shape[2:])


class StackedFavor(nn.Module):
    """K FAVOR+ kernels, each with the random features its model drew."""

    kernel = True

    def __init__(self, features: torch.Tensor, key_shift: torch.Tensor):
        super().__init__()
        self.register_buffer("features", features)  # [K, H, m, d]
        self.register_buffer("key_shift", key_shift)  # [K, 1, H, 1, 1]

    def keep_models(self, index: torch.Tensor) -> None:
        self.features = self.features.index_select(0, index)
        self.key_shift = self.key_shift.index_select(0, index)

    def feature_maps(self, q, k):
        n_models = self.features.shape[0]
        w = self.features.to(q.dtype).transpose(-2, -1).unsqueeze(1)  # [K, 1, H, d, m]
        qs, ks = _per_model(q, n_models), _per_model(k, n_models)
        hq = qs @ w - qs.square().sum(-1, keepdim=True) / 2
        hk = ks @ w - ks.square().sum(-1, keepdim=True) / 2 - self.key_shift.to(k.dtype)
        phi_q, phi_k = torch.exp(hq - hq.amax(-1, keepdim=True).detach()), torch.exp(hk)
        return phi_q.reshape(*q.shape[:-1], phi_q.shape[-1]), phi_k.reshape(*k.shape[:-1], phi_k.shape[-1])


# parts kept as they are: no weights of their own, and buffers equal in every model
_SHARED_TYPES = (TinyTransformer, Block, FeedForward, SwiGLU, EvolvedAttention, LowRankQKV, Dropout, nn.ModuleList,
                 nn.GELU, positions.Rotary, positions.ALiBi, components.DotSimilarity,
                 components.MultiplicativeSimilarity, components.CosineSimilarity, components.LinearKernel,
                 components.FixedTemperature, components.AdaptiveTemperature, components.NoGating,
                 components.InputGate, components.OutputGate, components.HighwayGate)


def fold_models(models: Sequence[TinyTransformer], fold: Fold, *,
                seq_len: int) -> tuple[TinyTransformer, dict[str, nn.Parameter]]:
    """One model running all of ``models`` (same genome and shape) on a [K * B, T] batch, and its
    stacked parameters by the models' parameter names. Afterwards every parameter of model k is a
    view of its stacked parameter's slice k. Raises ``Unfoldable`` for a part it cannot fold."""
    named = [dict(m.named_parameters()) for m in models]
    params = {name: nn.Parameter(torch.stack([n[name].detach() for n in named])) for name in named[0]}
    modules = [dict(m.named_modules()) for m in models]
    skeleton = copy.deepcopy(models[0])
    used: set[str] = set()

    def take(path: str, attr: str) -> nn.Parameter:
        used.add(f"{path}.{attr}")
        return params[f"{path}.{attr}"]

    def folded(path: str, module: nn.Module) -> nn.Module | None:
        kind = type(module)
        if kind is nn.Linear:
            return StackedLinear(take(path, "weight"), take(path, "bias") if module.bias is not None else None)
        if kind is nn.LayerNorm and module.weight is not None:
            return StackedLayerNorm(take(path, "weight"), take(path, "bias") if module.bias is not None else None,
                                    module.normalized_shape, module.eps)
        if kind is nn.RMSNorm and module.weight is not None:
            return StackedRMSNorm(take(path, "weight"), module.normalized_shape, module.eps)
        if kind is nn.Embedding and path == "tok_emb":
            return StackedTokenEmbedding(take(path, "weight"))
        if kind is nn.Embedding and path == "pos_emb":
            return StackedPositionEmbedding(take(path, "weight"), fold)
        if kind is components.LearnedTemperature:
            return StackedLearnedTemperature(take(path, "log_tau"))
        if kind is positions.RelativeBias:
            return StackedRelativeBias(take(path, "table"), module.max_seq_len, fold)
        if kind is components.AdditiveSimilarity:
            return StackedAdditive(take(path, "w_q"), take(path, "w_k"), take(path, "v"), module.block)
        if kind is components.FavorKernel:
            return StackedFavor(torch.stack([m[path].features for m in modules]),
                                torch.stack([m[path].key_shift for m in modules]))
        if kind not in _SHARED_TYPES or any(p is not None for p in module._parameters.values()):
            raise Unfoldable(f"{kind.__name__} at {path or 'the model'} has no folded form")
        for name, buffer in module._buffers.items():
            if buffer is not None and not all(torch.equal(buffer, m[path]._buffers[name]) for m in modules[1:]):
                raise Unfoldable(f"buffer {path}.{name} differs between the models")
        if isinstance(module, EvolvedAttention):
            if module.normalize is not None and module.normalize not in _BUILTIN_NORMALIZE:
                raise Unfoldable(f"the normalization at {path} is not a built-in one")
            banded = 0 < module.window and 2 * module.window < seq_len
            if banded and any(isinstance(b, positions.RelativeBias) for b in module.score_biases):
                raise Unfoldable("a relative bias with a block-wise sliding window")
        return None

    replacements = []
    for path, module in skeleton.named_modules():
        if path == "head":  # tied to the token table: the loss reads the stacked table
            replacements.append((path, None))
            continue
        if any(path.startswith(done + ".") for done, _ in replacements):
            continue  # inside a folded part
        new = folded(path, module)
        if new is not None:
            replacements.append((path, new))
    for path, new in replacements:
        parent_path, _, attr = path.rpartition(".")
        parent = skeleton.get_submodule(parent_path) if parent_path else skeleton
        setattr(parent, attr, new)
    if used != set(params):
        raise Unfoldable(f"parameters without a folded form: {', '.join(sorted(set(params) - used))}")
    stacked = {id(p) for p in params.values()}
    stray = [name for name, p in skeleton.named_parameters() if id(p) not in stacked]
    if stray:
        raise Unfoldable(f"parameters without a folded form: {', '.join(stray)}")
    for k, n in enumerate(named):
        for name, p in n.items():
            p.data = params[name].data[k]
    return skeleton, params


# ---------------------------------------------------------------------------------------------
# The loss: nn.losses' fused chunked loss with batched products, one mean per model
# ---------------------------------------------------------------------------------------------

def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class _BatchedLinearCrossEntropy(torch.autograd.Function):
    """``nn.losses._LinearCrossEntropy`` for K models at once: hidden [K, N, d], weight [K, V, d],
    targets [K, N] -> the K mean losses; the same chunks, the same operations, batched products."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, dtype):
        acc = _acc(dtype)
        n_models, n_rows = targets.shape
        vocab, dev = weight.shape[1], hidden.device
        scored_all = targets != IGNORE_INDEX
        n = scored_all.sum(1).clamp(min=1).to(acc)  # [K]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(dtype)
        wt = w.transpose(1, 2)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=dev) if need_w else None
        total = torch.zeros(n_models, dtype=acc, device=dev)
        group = max(chunk, WEIGHT_GROUP)
        rows = min(chunk, n_rows)
        narrow = torch.empty(n_models, rows, vocab, dtype=dtype, device=dev)
        logits = torch.empty(n_models, rows, vocab, dtype=acc, device=dev) if acc != dtype else narrow
        probs = torch.empty(n_models, rows, vocab, dtype=acc, device=dev)
        diff = torch.empty(n_models, min(group, n_rows), vocab, dtype=dtype, device=dev) if need_w else None
        model_index = torch.arange(n_models, device=dev)[:, None]
        for g0 in range(0, n_rows, group):
            hg, tg = hidden[:, g0:g0 + group].to(dtype), targets[:, g0:g0 + group]
            for s in range(0, hg.shape[1], chunk):
                h, t = hg[:, s:s + chunk], tg[:, s:s + chunk]
                k = t.shape[1]
                scored, safe = (t != IGNORE_INDEX).to(acc), t.clamp(min=0)
                full = k == rows  # the preallocated buffers; a shorter last chunk gets its own
                zn = narrow if full else torch.empty(n_models, k, vocab, dtype=dtype, device=dev)
                torch.bmm(h, wt, out=zn)
                if acc != dtype:  # widen to the accumulation precision
                    z = logits if full else torch.empty(n_models, k, vocab, dtype=acc, device=dev)
                    z.copy_(zn)
                else:
                    z = zn
                top = z.amax(dim=-1)
                picked = z.gather(2, safe.unsqueeze(2)).squeeze(2)
                p = torch.softmax(z, dim=-1, out=probs if full else torch.empty_like(z))
                total += ((top - picked - p.amax(dim=-1).log()) * scored).sum(1)
                if not (need_h or need_w):
                    continue
                p[model_index, torch.arange(k, device=dev)[None, :], safe] -= scored  # softmax - onehot
                q = diff[:, s:s + k] if need_w else zn
                q.copy_(p)
                if need_h:
                    at = g0 + s
                    grad_h[:, at:at + k] = (torch.bmm(q, w).to(acc) * (scored / n[:, None])[..., None]).to(hidden.dtype)
            if need_w:
                masked = hg * scored_all[:, g0:g0 + group, None].to(dtype)
                grad_w += torch.bmm(diff[:, :hg.shape[1]].transpose(1, 2), masked).to(acc)
        if need_w:
            grad_w /= n[:, None, None]
        ctx.save_for_backward(*(g for g in (grad_h, grad_w) if g is not None))
        ctx.has = (need_h, need_w)
        ctx.weight_dtype = weight.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        need_h, need_w = ctx.has
        scale = grad_out[:, None, None]
        grad_h = saved.pop(0) * scale if need_h else None
        grad_w = (saved.pop(0) * scale).to(ctx.weight_dtype) if need_w else None
        return grad_h, grad_w, None, None, None


def batched_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                                 chunk: int = DEFAULT_CHUNK, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The K mean cross-entropies of ``hidden[k] @ weight[k].T`` against ``targets[k]``:
    hidden [K, ..., d], weight [K, vocab, d], targets [K, ...] -> [K]."""
    k = weight.shape[0]
    return _BatchedLinearCrossEntropy.apply(hidden.reshape(k, -1, hidden.shape[-1]), weight,
                                            targets.reshape(k, -1), chunk, dtype)


# ---------------------------------------------------------------------------------------------
# K AdamW optimizers over stacked parameters
# ---------------------------------------------------------------------------------------------

class StackedAdamW:
    """K AdamW optimizers over stacked parameters [K, ...], model k with its own rate and weight
    decay: the operations of torch's single-tensor AdamW (decoupled decay, then the moments, then
    ``param + (-step_size * exp_avg) / denom``) with each model's scalars as a [K, 1, ...] tensor, so
    a model's update is bitwise the one its own ``torch.optim.AdamW`` makes from the same gradient."""

    def __init__(self, params: Sequence[nn.Parameter], decayed: Sequence[bool], betas=BETAS, eps: float = ADAM_EPS):
        self.params = list(params)
        self.decayed = list(decayed)
        self.betas, self.eps = betas, eps
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = 0

    def keep_models(self, index: torch.Tensor) -> None:
        self.exp_avg = [m.index_select(0, index) for m in self.exp_avg]
        self.exp_avg_sq = [v.index_select(0, index) for v in self.exp_avg_sq]

    @torch.no_grad()
    def step(self, rates: Sequence[float], decays: Sequence[float]) -> None:
        beta1, beta2 = self.betas
        self.steps += 1
        step = float(self.steps)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        k = len(rates)
        first = self.params[0]
        # each model's scalars, rounded to the parameters' dtype as torch rounds a Python scalar
        step_size = torch.tensor([-(r / bias_correction1) for r in rates], dtype=first.dtype, device=first.device)
        decay = None
        if any(d != 0 for d in decays):
            decay = torch.tensor([1 - r * d for r, d in zip(rates, decays)], dtype=first.dtype, device=first.device)
        for p, m, v, decayed in zip(self.params, self.exp_avg, self.exp_avg_sq, self.decayed):
            if p.grad is None:
                continue
            g = p.grad
            shape = (k,) + (1,) * (p.dim() - 1)
            if decayed and decay is not None:
                p.mul_(decay.view(shape))
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.add_(m * step_size.view(shape) / denom)  # addcdiv's (value * exp_avg) / denom


@torch.no_grad()
def clip_per_model(params: Sequence[nn.Parameter], max_norms: Sequence[float]) -> None:
    """``clip_grad_norm_`` of each model separately: model k's gradients (slice k of every stacked
    gradient) scaled by ``min(1, max_norm_k / (norm_k + 1e-6))``, where norm_k is the norm of its
    parameters' norms in their order, as ``clip_grad_norm_`` computes it."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    k = len(max_norms)
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), 2.0, dim=1) for g in grads], dim=1)  # [K, P]
    total = torch.linalg.vector_norm(norms, 2.0, dim=1)
    limit = torch.tensor([float(n) for n in max_norms], dtype=total.dtype, device=total.device)
    coef = torch.clamp((total + CLIP_EPS).reciprocal() * limit, max=1.0)  # max_norm / (total + eps), as torch does it
    for g in grads:
        g.mul_(coef.view((k,) + (1,) * (g.dim() - 1)))


# ---------------------------------------------------------------------------------------------
# The trainers
# ---------------------------------------------------------------------------------------------

class MemberTrainer(Trainer):
    """One trial of a batch, seen as its own ``Trainer``: its model (its weights, once the batch is
    done), data, recipe, step, curve, counters and divergence, so ``evaluate``, ``measure_latency``,
    ``state_dict`` (to continue it alone: ``Trainer.load_state_dict``) and ``.model`` (to keep it)
    work as for a single training. It is built like ``Trainer`` builds its model, but trains only
    inside its ``BatchedTrainer``."""

    def __init__(self, trial: Trial, data: TaskData, *, device: torch.device, spec, precision: str,
                 precision_reason: str):
        # no Trainer.__init__: the same model, built the same way, without an optimizer of its own
        self.trial, self.gene, self.data, self.seed = trial, trial.gene, data, trial.seed
        self.recipe = trial.recipe  # as Trainer: the genome's own rate, warm-up and weight decay where set
        self.train_steps = trial.schedule_steps
        self.device, self.spec = device, spec
        self.precision, self.precision_reason = precision, precision_reason
        self.config = Config.from_trial(trial, spec)
        torch.manual_seed(self.seed)
        self.model = TinyTransformer(self.config, self.gene).to(device)
        # dropout: the global stream its single trainer would draw from after building the model
        self.dropout_generator = torch.Generator()
        self.dropout_generator.set_state(torch.get_rng_state())
        self.compiled = False
        self._forward = self.model.hidden_states
        self.optimizer = None  # built from the batch's moments by state_dict()
        self.adam_state: dict | None = None
        self.generator = torch.Generator().manual_seed(self.seed)
        self.batches = data.train_batches(self.recipe.batch_size, self.generator)
        self.step = 0
        self.curve: list = []
        self.train_time = 0.0
        self.tokens_seen = 0
        self.flops_per_step: int | None = None
        self.diverged = False
        self.divergence: str | None = None
        self.named = dict(self.model.named_parameters())

    def train(self, until_step: int | None = None, progress=None) -> str:
        raise NotImplementedError("a batched trial trains in its BatchedTrainer; to continue it alone, load "
                                  "its state_dict() into a Trainer")

    def detach_weights(self) -> None:
        """Give the model weights of its own (they were views of the batch's stacked weights)."""
        for p in self.named.values():
            p.data = p.data.clone()

    def state_dict(self) -> dict:
        """``Trainer.state_dict`` of this trial: its weights, an AdamW state of the batch's moments
        for its parameters, and its dropout stream as the RNG state (the batch keeps the moments
        when ``BatchedTrainer.train(keep_moments=True)``)."""
        if self.adam_state is None:
            raise RuntimeError("the batch did not keep this trial's optimizer moments (train(keep_moments=True))")
        optimizer = torch.optim.AdamW(self._param_groups(), lr=self.recipe.learning_rate, betas=BETAS,
                                      **({"fused": True} if self.device.type == "cuda" else {}))
        steps, moments = self.adam_state["steps"], self.adam_state["moments"]
        for name, p in self.named.items():
            if name in moments:
                exp_avg, exp_avg_sq = moments[name]
                optimizer.state[p] = {"step": torch.tensor(float(steps), dtype=torch.float32),
                                      "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()}
        if self.step:
            for group in optimizer.param_groups:
                group["lr"] = self.lr_at(self.step - 1)
        self.optimizer = optimizer
        state = super().state_dict()
        state["model"] = {k: v.clone() for k, v in state["model"].items()}
        state["rng"] = self.dropout_generator.get_state()
        state["cuda_rng"] = None
        return state


class BatchedTrainer:
    """Trains K same-shape trials as one folded model (see the module docstring)."""

    def __init__(self, trials: Sequence[Trial], data: TaskData, *, device: str | torch.device | None = None):
        check_batchable(trials)
        self.trials = list(trials)
        first = self.trials[0]
        self.data = data
        self.recipe = first.train
        self.steps = first.steps
        self.device = resolve_device(device if device is not None else self.recipe.device)
        self.spec = first.model.with_data(data.vocab_size, data.seq_len)
        self.precision, self.precision_reason = choose_precision(self.recipe.precision, self.device, self.spec,
                                                                 seq_len=data.seq_len,
                                                                 batch_size=self.recipe.batch_size)
        if self.device.type == "cpu":
            torch.set_flush_denormal(True)  # as the single trainer
        problem = batch_problem(first, data.seq_len)
        if problem:
            raise Unfoldable(problem)
        self.members = [MemberTrainer(t, data, device=self.device, spec=self.spec, precision=self.precision,
                                      precision_reason=self.precision_reason) for t in self.trials]
        self.fold = Fold()
        self.model, self.params = fold_models([m.model for m in self.members], self.fold, seq_len=data.seq_len)
        self.model.train()
        groups = self.members[0]._param_groups()  # the single trainer's decay rule
        decayed = {id(p) for p in groups[0]["params"]}
        names = list(self.params)
        self.decayed = [id(self.members[0].named[n]) in decayed for n in names]
        self.optimizer = StackedAdamW([self.params[n] for n in names], self.decayed)
        self.active = list(self.members)
        self.step = 0
        self.flops_per_step: int | None = None

    @property
    def size(self) -> int:
        return len(self.members)

    # -- one step ----------------------------------------------------------------------------
    def _masks(self, shape: tuple, p: float) -> torch.Tensor:
        """The dropout keep mask of the folded batch: model k's rows from model k's stream."""
        gens = [m.dropout_generator for m in self.active]
        if shape[0] % len(gens):
            raise RuntimeError(f"a dropout site of {shape[0]} rows does not split over {len(gens)} models")
        part = (shape[0] // len(gens), *shape[1:])
        return torch.cat([keep_mask(part, p, generator=g) for g in gens])

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        k = len(self.active)
        rates = [m.lr_at(self.step) for m in self.active]
        self.fold.batch = x.shape[0] // k
        with mask_source(self._masks), autocast(self.device, self.precision):
            hidden, _ = self.model.hidden_states(x)
        losses = batched_linear_cross_entropy(hidden, self.params["tok_emb.weight"], y,
                                              dtype=matmul_dtype(self.precision))
        for p in self.params.values():
            p.grad = None
        losses.sum().backward()
        clip_per_model(list(self.params.values()), [m.recipe.grad_clip for m in self.active])
        self.optimizer.step(rates, [m.recipe.weight_decay for m in self.active])
        return losses.detach()

    def _count_flops(self, x, y) -> torch.Tensor:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False, custom_mapping=_sdpa_formulas()) as counter:
            loss = self._step(x, y)
        self.flops_per_step = int(round(counter.get_total_flops() / len(self.active)))
        for m in self.active:
            m.flops_per_step = self.flops_per_step
        return loss

    def _finite(self, i: int) -> bool:
        return all(bool(torch.isfinite(p[i]).all()) for p in self.params.values())

    def _drop(self, keep: list[int]) -> None:
        """Only the models at ``keep`` (indices into ``active``) train on."""
        for i, m in enumerate(self.active):
            if i not in keep:
                m.detach_weights()
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for p in self.params.values():
            p.grad = None
            p.data = p.data.index_select(0, index)
        self.optimizer.keep_models(index)
        for module in self.model.modules():
            if hasattr(module, "keep_models"):
                module.keep_models(index)
        self.active = [self.active[i] for i in keep]
        for k, m in enumerate(self.active):
            for name, p in m.named.items():
                p.data = self.params[name].data[k]

    # -- training ------------------------------------------------------------------------------
    def train(self, *, keep_moments: bool = False, until_step: int | None = None,
              progress: Sequence[ProgressFn | None] | None = None) -> None:
        """Train every model to the trials' steps (or until it diverges); afterwards each member
        holds its own weights (and, with ``keep_moments``, its optimizer moments for ``state_dict``).
        ``until_step``: stop there, to continue with another call (the members then hold views of
        the batch's weights until the last call). ``progress``: one ``ProgressFn`` (or None) per
        member, called where its single trainer calls it (after each log interval)."""
        until = self.steps if until_step is None else min(until_step, self.steps)
        report = {id(m): fn for m, fn in zip(self.members, progress or ()) if fn is not None}
        every = self.recipe.log_every
        n = len(self.active)
        window_sum = torch.zeros(n, device=self.device)
        window_n = 0
        finite = torch.ones(n, dtype=torch.bool, device=self.device)
        pending = None
        while self.step < until and self.active:
            if pending is None:
                pairs = [next(m.batches) for m in self.active]
                xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
            else:
                (xs, ys), pending = pending, None
            x = torch.cat(xs).to(self.device, non_blocking=True)
            y = torch.cat(ys).to(self.device, non_blocking=True)
            streams = [m.dropout_generator.get_state() for m in self.active]
            start = time.perf_counter()
            try:
                loss = self._count_flops(x, y) if self.flops_per_step is None else self._step(x, y)
            except Exception as exc:  # NaN weights make e.g. sparsemax's sort fail: that is divergence
                bad = [i for i in range(len(self.active)) if not self._finite(i)]
                if not bad:
                    raise
                text = str(exc).splitlines()[0][:200] if str(exc) else ""
                for i in bad:
                    self.active[i]._diverge(f"non-finite weights at step {self.step + 1} "
                                            f"({type(exc).__name__}: {text})")
                keep = [i for i in range(len(self.active)) if i not in bad]
                for i in keep:  # the step again for the others, with their batches and dropout masks
                    self.active[i].dropout_generator.set_state(streams[i])
                pending = ([xs[i] for i in keep], [ys[i] for i in keep])
                window_sum, finite = window_sum[keep], finite[keep]
                self._drop(keep)
                continue
            elapsed = time.perf_counter() - start
            self.step += 1
            for i, m in enumerate(self.active):
                m.step += 1
                m.tokens_seen += xs[i].numel()
                m.train_time += elapsed / len(self.active)
            window_sum += loss
            window_n += 1
            finite &= torch.isfinite(loss)
            if self.step % every == 0 or self.step == until:
                means = (window_sum / window_n).tolist()  # the one host sync per log interval
                finites = finite.tolist()
                for i, m in enumerate(self.active):  # each model by the single trainer's rule
                    m.close_interval(means[i], bool(finites[i]), self.step - window_n + 1, self.step)
                    if id(m) in report:
                        report[id(m)](self.step, m.train_steps, means[i])
                window_sum.zero_()
                window_n = 0
                keep = [i for i, m in enumerate(self.active) if not m.diverged]
                if len(keep) < len(self.active):
                    window_sum, finite = window_sum[keep], finite[keep]
                    self._drop(keep)
        if self.step < self.steps and self.active:
            return  # to be continued: the members' weights stay views of the batch's
        if keep_moments:
            for k, m in enumerate(self.active):
                m.adam_state = {"steps": self.optimizer.steps, "moments": {
                    name: (self.optimizer.exp_avg[j][k].clone(), self.optimizer.exp_avg_sq[j][k].clone())
                    for j, name in enumerate(self.params)}}
        for m in self.active:
            m.detach_weights()


# ---------------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------------

def _alone(trials: Sequence[Trial], data: TaskData, device: torch.device, keep_state: bool,
           note: str, progress: Sequence[ProgressFn | None]) -> list[TrainingResult]:
    results = []
    for trial, report in zip(trials, progress):
        result = run_training(trial, data, device=device, keep_state=keep_state, progress=report)
        result.record.extra["batch_fallback"] = note
        results.append(result)
    return results


def _member_record(member: MemberTrainer, trial: Trial, data: TaskData, device: torch.device, *, size: int,
                   shared_s: float, batch_s: float, keep_state: bool) -> TrainingResult:
    """The record ``run_training`` writes, for one member of a trained batch."""
    start = time.perf_counter()
    record = EvaluationRecord(
        gene=trial.genome, seed=trial.seed, steps=trial.steps, data=data.name, data_fingerprint=data.fingerprint,
        context=trial.context, eval_split=trial.eval_split, device=str(device), versions=versions(),
        settings=trial.record_settings(), budget=trial.budget, resumed_from=0 if trial.budget is not None else None)
    record.precision = member.precision
    record.extra["precision_reason"] = member.precision_reason
    record.compiled = False
    record.params = member.model.num_parameters()
    blob = None
    try:
        status = Status.DIVERGED if member.diverged else Status.OK
        if keep_state and status == Status.OK:
            blob = state_to_bytes(member.state_dict())
        evaluate_into(record, member, status, trial.eval_split)
    except (KeyboardInterrupt, UserError):
        raise
    except Exception as exc:  # a failing gene must never crash the search
        record.status = Status.OOM if is_oom(exc) else Status.ERROR
        record.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        blob = None
    record.train_loss = member.recent_train_loss()
    record.trained_steps = member.step
    record.curve = member.curve
    record.flops_per_step = member.flops_per_step
    record.train_time_s = member.train_time
    record.tokens_per_s = member.tokens_seen / member.train_time if member.train_time > 0 else None
    record.time_s = shared_s / size + (time.perf_counter() - start)
    record.peak_memory_mb = peak_memory_mb(device)
    record.extra["batched"] = size
    record.extra["batch_time_s"] = batch_s
    return TrainingResult(record, member, blob)


def run_batched(trials: Sequence[Trial], data: TaskData, *, device: str | None = None,
                keep_state: bool = False,
                progress: Sequence[ProgressFn | None] | None = None) -> list[TrainingResult]:
    """Train ``trials`` (same genome, model, task, steps, split and batch recipe; seeds and rates may
    differ: ``check_batchable``) as one batch on ``data``; one ``TrainingResult`` per trial, in order.

    Never raises for a failing gene: a diverged model is recorded as diverged while the others
    train on. UserError for trials that cannot share a batch (naming the field) and for bad input.
    ``keep_state``: each successful trial's trainer state, as ``run_training`` gives it (a single
    ``Trainer`` continues it exactly). Trials whose genome cannot be folded, and the trials of a batch
    that fails as a whole, train alone through ``run_training`` (their records say
    ``batch_fallback``). ``progress``: one ``ProgressFn`` (or None) per trial, called as
    ``run_training`` calls its ``progress``.
    """
    trials = [t if t.task.fingerprint is not None else t.with_data(data) for t in trials]
    if not trials:
        return []
    check_batchable(trials)
    progress = list(progress) if progress is not None else [None] * len(trials)
    if len(progress) != len(trials):
        raise ValueError(f"progress has {len(progress)} entries for {len(trials)} trials")
    dev = resolve_device(device if device is not None else trials[0].train.device)
    reset_peak_memory(dev)
    start = time.perf_counter()
    try:
        batch = BatchedTrainer(trials, data, device=dev)
        batch.train(keep_moments=keep_state, progress=progress)
    except (KeyboardInterrupt, UserError):
        raise
    except Unfoldable as exc:
        return _alone(trials, data, dev, keep_state, f"not batched: {exc}", progress)
    except Exception as exc:  # the batch as a whole failed (out of memory, say): the trials alone
        return _alone(trials, data, dev, keep_state,
                      f"the batch of {len(trials)} failed ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); trained alone", progress)
    shared = time.perf_counter() - start
    del batch.model, batch.params, batch.optimizer  # the members hold their own weights now
    return [_member_record(m, t, data, dev, size=batch.size, shared_s=shared, batch_s=shared, keep_state=keep_state)
            for m, t in zip(batch.members, trials)]


# ---------------------------------------------------------------------------------------------
# How many models one batch holds: the ``batch_models`` setting
# ---------------------------------------------------------------------------------------------
# Whether batching pays depends on the machine and the model's shape: K folded models share every
# kernel launch, which pays where a step is many small operations and not where it is a few large
# matrix products that already fill the machine. So ``auto`` is measured per machine and shape, like
# ``precision auto`` (environment.choose_precision), and kept beside its answers in the same cache
# (``batch-models-*.json``): a short probe times training steps of the shape's vanilla gene with
# K = 1 (the single Trainer) and K = 2, 4, 8 (a BatchedTrainer), and ``auto`` takes the K of the
# most trainings per hour (K / seconds per step of the batch) if it beats K = 1 by at least
# BATCH_PROBE_GAIN, else 1 (no batching). Memory bounds K: the peak memory of one model's training
# (measured with K = 1) times K must stay within MEMORY_FRACTION of the memory available (free
# device memory on CUDA, available RAM otherwise), shared by the trainings that run at once; a K
# beyond it is neither probed nor chosen. The file keeps the times and the memory of one model;
# the bound is applied with the memory available when a K is chosen. Per shape, not per genome (as
# the precision probe): every gene of a study at one size batches alike. A probe on a busy machine
# may choose wrongly, and its answer is kept: delete the ``batch-models-*.json`` files of the cache
# directory to measure again, or set batch_models (or EVO_ATTENTION_BATCH_MODELS, which decides what
# ``auto`` means: off, K, or auto to measure).
BATCH_PROBE_VERSION = 1
BATCH_PROBE_KS = (1, 2, 4, 8)
BATCH_PROBE_GAIN = 0.10  # a batch must give 10% more trainings per hour than one model alone
BATCH_PROBE_REPEATS = 2  # timed repeats per K, the fastest kept (other work only slows a repeat down)
BATCH_PROBE_STEPS = 2  # timed steps per repeat, after one untimed step
BATCH_PROBE_SLOW_STEP_S = 0.5  # building one model and its untimed step slower than this: 1 repeat of 1 step
MEMORY_FRACTION = 0.5
ENV_BATCH_MODELS = "EVO_ATTENTION_BATCH_MODELS"
_BATCH_PROBES: dict[str, dict] = {}  # cache file -> its entry, per process


def models_per_batch(setting: str | int, trial: Trial, data: TaskData, *, device: str | torch.device | None = None,
                     share: int = 1) -> tuple[int, str]:
    """How many trials of ``trial``'s shape (on ``data``) train as one batch, and why.

    ``off``: 1; K: K; ``auto``: what ``EVO_ATTENTION_BATCH_MODELS`` says where it is set (off or
    K), else the K measured for this shape on this machine (``probed_batch_times``, within the
    memory bound; ``share``: how many trainings share the memory). Never raises for a failing
    probe: auto is then 1, and nothing is kept."""
    setting = batch_models_value(setting)
    if setting != "auto":
        return (1, "batch_models off") if setting == "off" else (setting, f"batch_models {setting}")
    forced = os.environ.get(ENV_BATCH_MODELS, "").strip()
    if forced and forced.lower() != "auto":
        value = batch_models_value(forced, ENV_BATCH_MODELS)
        return (1 if value == "off" else value), f"auto: {ENV_BATCH_MODELS}={forced}"
    dev = resolve_device(device if device is not None else trial.train.device)
    if dev.type != "cpu" and dropout_in(trial):
        # off the CPU a batched trial's dropout masks are not its single trainer's (module docstring):
        # auto never lets the way a trial ran change its result
        return 1, f"auto: dropout on {dev.type} draws other masks in a batch than alone, so each trial trains alone"
    try:
        entry, name = probed_batch_times(trial, data, dev, share=share)
    except (KeyboardInterrupt, UserError):
        raise
    except Exception as exc:  # the trainings themselves will say what is wrong with the shape
        return 1, f"auto: the probe failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
    return choose_models(entry, available_memory_mb(dev), share, source=name)


def dropout_in(trial: Trial) -> bool:
    """Whether ``trial`` draws dropout masks (model dropout or any layer's attention dropout)."""
    from evo_attention.genes import layers_of

    return trial.model.dropout > 0 or any(g.attention_dropout > 0 for g in layers_of(trial.gene))


def choose_models(entry: dict, available_mb: float | None, share: int = 1, *, source: str = "") -> tuple[int, str]:
    """The K of a probe's ``entry`` (``{"seconds": {K: s per step of K models}, "step_memory_mb"}``):
    the most trainings per hour within the memory bound, if at least BATCH_PROBE_GAIN above K = 1."""
    seconds = {int(k): float(v) for k, v in entry["seconds"].items()}
    memory = entry.get("step_memory_mb")
    cap = MEMORY_FRACTION * available_mb / max(1, share) if available_mb is not None and memory else None
    rates = {k: k / s for k, s in seconds.items() if k == 1 or cap is None or memory * k <= cap}
    best = max(rates, key=lambda k: (rates[k], -k))
    gain = rates[best] / rates[1]
    measured = ", ".join(f"K={k} {1000 * s:.1f} ms" for k, s in sorted(seconds.items()))
    where = f"; {source}" if source else ""
    if best == 1 or gain < 1.0 + BATCH_PROBE_GAIN:
        return 1, (f"auto: no batch pays here (best K={best}, {gain:.2f}x the trainings per hour; per step "
                   f"{measured}{where})")
    return best, f"auto: K={best} gives {gain:.2f}x the trainings per hour (per step {measured}{where})"


def _batch_entry(entry: dict) -> bool:
    seconds = entry.get("seconds")
    return (isinstance(seconds, dict) and "1" in seconds
            and all(k.isdigit() and isinstance(v, (int, float)) and v > 0 for k, v in seconds.items())
            and (entry.get("step_memory_mb") is None or isinstance(entry.get("step_memory_mb"), (int, float))))


def _batch_shape(trial: Trial, data: TaskData, device: torch.device) -> dict:
    spec = trial.model.with_data(data.vocab_size, data.seq_len)
    precision = choose_precision(trial.train.precision, device, spec, seq_len=data.seq_len,
                                 batch_size=trial.train.batch_size)[0]
    shape = {**_probe_shape(spec, data.seq_len, trial.train.batch_size), "precision": precision}
    if device.type == "cuda":
        shape["gpu"] = torch.cuda.get_device_name(device)
    return shape


def probed_batch_times(trial: Trial, data: TaskData, device: torch.device, *, share: int = 1) -> tuple[dict, str]:
    """The probe's entry for ``trial``'s shape on this machine and the name of its cache file: read
    from the cache, or probed now (``probe_batch_times``) and kept (the first answer written wins,
    as for the precision probe)."""
    path = _probe_path(_batch_shape(trial, data, device), device, kind="batch-models", version=BATCH_PROBE_VERSION)
    key = str(path)
    if key not in _BATCH_PROBES:
        found = _read_probe(path, _batch_entry)
        if found is None:
            available = available_memory_mb(device)
            budget = MEMORY_FRACTION * available / max(1, share) if available is not None else None
            measured = probe_batch_times(trial, data, device, memory_budget_mb=budget)
            entry = {"seconds": {str(k): v for k, v in measured["seconds"].items()},
                     "step_memory_mb": measured["step_memory_mb"], "gain": BATCH_PROBE_GAIN,
                     "threads": torch.get_num_threads(), "torch": torch.__version__}
            found = _write_probe_once(path, entry, _batch_entry)
        _BATCH_PROBES[key] = found
    return _BATCH_PROBES[key], path.name


def step_seconds(trials: Sequence[Trial], data: TaskData, *, device: torch.device, warmup: int = 1, steps: int = 2,
                 repeats: int = 1):
    """``(trainer, seconds per step)`` of ``trials`` trained together: one by the single ``Trainer``,
    several by a ``BatchedTrainer``; after ``warmup`` untimed steps, the fastest of ``repeats``
    timings of ``steps`` steps (the trials must span at least ``warmup + repeats * steps`` steps)."""
    trainer = Trainer(trials[0], data, device=device) if len(trials) == 1 else BatchedTrainer(trials, data,
                                                                                              device=device)
    trainer.train(until_step=warmup)
    synchronize(device)
    best, done = math.inf, warmup
    for _ in range(repeats):
        done += steps
        start = time.perf_counter()
        trainer.train(until_step=done)
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / steps)
    return trainer, best


def probe_batch_times(trial: Trial, data: TaskData, device: torch.device, *, ks: Sequence[int] = BATCH_PROBE_KS,
                      repeats: int = BATCH_PROBE_REPEATS, steps: int = BATCH_PROBE_STEPS,
                      memory_budget_mb: float | None = None) -> dict:
    """Seconds per training step of K models of ``trial``'s shape (its vanilla gene, seeds 0..K-1,
    eager) for each K of ``ks`` (1 first), and the peak memory in MB of one model's training (K = 1;
    None where it cannot be measured). A K whose models would not fit in ``memory_budget_mb``, or
    that runs out of memory, ends the probe. Torch's global RNG is left as it was."""
    from evo_attention.genes import AttentionGene

    slow = None
    seconds: dict[int, float] = {}
    memory = None
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
    devices = [index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for k in sorted(ks):
            if k > 1 and memory is not None and memory_budget_mb is not None and memory * k > memory_budget_mb:
                break
            n_repeats, n_steps = (1, 1) if slow else (repeats, steps)
            total = 1 + n_repeats * n_steps
            base = trial.replace(genome=AttentionGene.vanilla().key, steps=total, budget=None,
                                 train=trial.train.replace(compile="off", log_every=total, lr_schedule="constant"))
            trials = [base.replace(seed=i) for i in range(k)]
            before = memory_in_use_mb(device)
            reset_peak_memory(device)
            try:
                start = time.perf_counter()
                trainer, per_step = step_seconds(trials, data, device=device, warmup=1, steps=n_steps,
                                                 repeats=n_repeats)
            except Exception as exc:
                if k > 1 and is_oom(exc):
                    break
                raise
            if trainer.step != total:
                raise RuntimeError(f"the probe's training of {k} model(s) stopped at step {trainer.step} of {total}")
            if k == 1:
                if before is not None:
                    memory = max(0.0, peak_memory_mb(device) - before)
                slow = (time.perf_counter() - start) - n_repeats * n_steps * per_step > BATCH_PROBE_SLOW_STEP_S
            seconds[k] = per_step
            del trainer
    return {"seconds": seconds, "step_memory_mb": memory}

