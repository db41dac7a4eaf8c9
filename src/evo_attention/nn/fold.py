"""Folding: K same-shape models run as one model on a batch of K * B rows.

``fold_models(models)`` stacks the K models' parameters along a new leading dimension and rewires a
copy of the first model to run on the stacked weights: activations are [K * B, ...], model-major
(rows k*B .. k*B+B-1 are model k's), so every part that computes each batch row from that row alone
runs unchanged on the folded batch, one kernel launch per op for all K models. Afterwards every
parameter of model k is a view of slice k of its stacked parameter (the members keep their own
model objects, for evaluation, checkpoints and saving).

How a part folds is declared where the part is written, never in a list of known parts:

- A part with no parameters of its own and buffers equal in every model (the attention module,
  masks, rotary tables, parameter-free similarities, every normalization function, dropout sites)
  needs nothing: it is shared, and its children fold by these rules.
- A part that holds weights declares its folded form with a method ``fold(self, folding: Folding)``
  returning the module that replaces it (written next to its single form: see
  ``components.LearnedTemperature``). ``folding.param(name)`` is the stacked [K, ...] parameter of
  its own parameter ``name``, ``folding.buffers(name)`` its K buffers stacked, ``folding.rows`` the
  rows per model of the current batch.
- PyTorch's own weighted layers fold by the table ``TORCH_FOLDS`` below (Linear, LayerNorm,
  RMSNorm, Embedding).

Anything else (a part with weights and no ``fold``, or buffers that differ between the models) is
refused with ``Unfoldable`` naming the part and why; the trainer then trains those trials one by
one. Contract of a folded form: given [K * B, ...] rows it computes for rows of model k exactly what
model k's part computes (the tests hold every registered component to it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


class Unfoldable(Exception):
    """A model with a part that cannot be folded; ``part`` is its path in the model."""

    def __init__(self, message: str, part: str = ""):
        super().__init__(message)
        self.part = part


class Rows:
    """The batch rows per model of the current step (set by the trainer before each forward pass):
    what the folded parts that never see an activation (position tables, biases) broadcast to."""

    def __init__(self):
        self.batch = 1


def per_model(x: torch.Tensor, k: int) -> torch.Tensor:
    """[K * M, ...] (model-major) -> [K, M, ...]."""
    return x.reshape(k, -1, *x.shape[1:])


def broadcast_rows(values: torch.Tensor, batch: int) -> torch.Tensor:
    """[K, ...] per-model values -> [K * batch, ...], each model's repeated over its rows."""
    k = values.shape[0]
    return values.unsqueeze(1).expand(k, batch, *values.shape[1:]).reshape(k * batch, *values.shape[1:])


class Folding:
    """What a part's ``fold`` reads: its K copies' parameters stacked, their buffers, the rows."""

    def __init__(self, path: str, copies: Sequence[nn.Module], stacked: dict[str, nn.Parameter],
                 used: set, rows: Rows):
        self.path, self.copies, self.rows = path, list(copies), rows
        self._stacked, self._used = stacked, used

    def param(self, name: str) -> nn.Parameter:
        """The stacked [K, ...] parameter of this part's own parameter ``name``."""
        full = f"{self.path}.{name}" if self.path else name
        self._used.add(full)
        return self._stacked[full]

    def buffers(self, name: str) -> torch.Tensor:
        """This part's buffer ``name`` of every model, stacked: [K, ...]."""
        return torch.stack([getattr(c, name) for c in self.copies])


# -- PyTorch's weighted layers ------------------------------------------------------------------

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
        parts, weights = per_model(x, self.weight.shape[0]).unbind(0), self.weight.unbind(0)
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


class StackedEmbedding(nn.Module):
    """K embedding tables. Ids with a batch dimension ([K * B, T]) index their own model's table (one
    [K * vocab, d] table, model k's ids offset by k * vocab); ids without one ([T] positions) are the
    same for every row, so each model's rows get its own rows of the table."""

    def __init__(self, weight, rows: Rows):
        super().__init__()
        self.weight, self.rows = weight, rows  # [K, n, d]

    def forward(self, ids):
        k, n, d = self.weight.shape
        if ids.dim() == 1:
            return broadcast_rows(self.weight[:, ids], self.rows.batch)  # [K * B, T, d]
        offsets = torch.arange(k, device=ids.device).mul_(n).view(k, 1)
        flat = ids.reshape(k, -1) + offsets
        return F.embedding(flat, self.weight.view(k * n, d)).view(*ids.shape, d)


def _linear(module: nn.Linear, f: Folding) -> nn.Module:
    return StackedLinear(f.param("weight"), f.param("bias") if module.bias is not None else None)


def _layer_norm(module: nn.LayerNorm, f: Folding) -> nn.Module:
    return StackedLayerNorm(f.param("weight"), f.param("bias") if module.bias is not None else None,
                            module.normalized_shape, module.eps)


def _rms_norm(module: nn.RMSNorm, f: Folding) -> nn.Module:
    return StackedRMSNorm(f.param("weight"), module.normalized_shape, module.eps)


TORCH_FOLDS: dict[type, Callable[[nn.Module, Folding], nn.Module]] = {
    nn.Linear: _linear,
    nn.LayerNorm: _layer_norm,
    nn.RMSNorm: _rms_norm,
    nn.Embedding: lambda module, f: StackedEmbedding(f.param("weight"), f.rows),
}


# -- the walk ---------------------------------------------------------------------------------------

def _folder(module: nn.Module, path: str):
    """How ``module`` folds: a function (module, Folding) -> replacement, None for a shared part,
    or Unfoldable."""
    fold = TORCH_FOLDS.get(type(module))
    if fold is not None:
        return fold
    if callable(getattr(module, "fold", None)):
        return lambda m, f: m.fold(f)
    own = [name for name, p in module.named_parameters(recurse=False) if p is not None]
    if own:
        raise Unfoldable(f"{type(module).__name__} at {path or 'the model'} holds weights ({', '.join(own)}) and "
                         "declares no folded form (a fold(folding) method)", path)
    return None


def fold_problem(model: nn.Module) -> Unfoldable | None:
    """Why ``model`` cannot be folded (its first part without a folded form), or None. Folds it
    alone: its parameters become views of their stacked copies, so give it a model to spare."""
    try:
        fold_models([model], Rows())
    except Unfoldable as exc:
        return exc
    return None


def fold_models(models: Sequence[nn.Module], rows: Rows) -> tuple[nn.Module, dict[str, nn.Parameter]]:
    """One model running all of ``models`` (same genome and shape) on a [K * B, ...] batch, and its
    stacked parameters by the models' parameter names (tied parameters share one). Afterwards every
    parameter of model k is a view of slice k of its stacked parameter. Raises ``Unfoldable``."""
    named = [dict(m.named_parameters()) for m in models]
    stacked = {name: nn.Parameter(torch.stack([n[name].detach() for n in named])) for name in named[0]}
    # a tied parameter (the head's weight is the token table) folds to the same stacked tensor
    first = {id(p): name for name, p in named[0].items()}
    aliases = {name: first[id(p)] for name, p in models[0].named_parameters(remove_duplicate=False)}
    by_path = {name: stacked[source] for name, source in aliases.items()}
    copies = [dict(m.named_modules()) for m in models]
    skeleton = copy.deepcopy(models[0])
    used: set[str] = set()
    replacements = []
    for path, module in skeleton.named_modules():
        if any(path.startswith(done + ".") for done, _ in replacements):
            continue  # inside a folded part
        fold = _folder(module, path)
        if fold is not None:
            folding = Folding(path, [c[path] for c in copies], by_path, used, rows)
            replacements.append((path, fold(module, folding)))
            continue
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and not all(torch.equal(buffer, getattr(c[path], name)) for c in copies[1:]):
                raise Unfoldable(f"{type(module).__name__} at {path or 'the model'} has a buffer {name!r} that "
                                 "differs between the models and declares no folded form", path)
    for path, new in replacements:
        parent_path, _, attr = path.rpartition(".")
        parent = skeleton.get_submodule(parent_path) if parent_path else skeleton
        setattr(parent, attr, new)
    missing = sorted(set(stacked) - {aliases[name] for name in used})
    if missing:
        raise Unfoldable(f"parameters without a folded form: {', '.join(missing)}")
    for k, n in enumerate(named):
        for name, p in n.items():
            p.data = stacked[name].data[k]
    return skeleton, stacked


def keep_models(model: nn.Module, stacked: dict[str, nn.Parameter], index: torch.Tensor) -> None:
    """Only the models at ``index`` stay in the folded ``model``: every stacked parameter (and the
    stacked buffers of folded parts, through their ``keep_models``) keeps those slices."""
    for p in stacked.values():
        p.grad = None
        p.data = p.data.index_select(0, index)
    for module in model.modules():
        if callable(getattr(module, "keep_models", None)):
            module.keep_models(index)
