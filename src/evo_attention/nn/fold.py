"""Folding: K same-shape models run as one model on a batch of K * B rows.

``fold_models(models)`` stacks the K models' parameters along a new leading dimension and rewires a
copy of the first model to run on the stacked weights: activations are [K * B, ...], model-major
(rows k*B .. k*B+B-1 are model k's), so every part that computes each batch row from that row alone
runs unchanged on the folded batch. Afterwards every parameter of model k is a view of slice k of
its stacked parameter (the members keep their own model objects).

How a part folds is declared where the part is written, never in a list of known parts:

- A part with no parameters of its own and buffers equal in every model needs nothing: it is
  shared, and its children fold by these rules.
- A part that holds weights declares its folded form with a method ``fold(self, folding: Folding)``
  returning the module that replaces it (``components.LearnedTemperature``): ``folding.param(name)``
  is the stacked [K, ...] parameter of its own parameter ``name``, ``folding.buffers(name)`` its K
  buffers stacked, ``folding.rows`` the rows per model of the current batch.
- PyTorch's own weighted layers fold by the table ``TORCH_FOLDS`` below.

Anything else is refused with ``Unfoldable`` naming the part and why; the trainer then trains those
trials one by one. A folded form computes, for the rows of model k, exactly what model k's part computes.

Models that differ in a part fold too: where the copies' ``fold_key`` differ (a part's declaration of
what it computes, e.g. the attention's gene; else its type and its own weights' shapes) the part
becomes a ``Split``: each group of equal parts folded among its own models and run on their rows
only. Every other part must be the same in all models. A group's stacked parameters hold only its
models' slices (``Fold.owners``), which the optimizer, the clipping and the dropout masks
(``Rows.members``) follow.
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
    what the folded parts that never see an activation (position tables, biases) broadcast to; and
    inside a ``Split``'s group, ``members``: the models (positions in the fold) whose rows run (None:
    every model's)."""

    def __init__(self):
        self.batch = 1
        self.members: list[int] | None = None


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
        return torch.stack([c.get_buffer(name) for c in self.copies])


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


def _bias(module: nn.Module, f: Folding) -> nn.Parameter | None:
    return f.param("bias") if module.bias is not None else None


TORCH_FOLDS: dict[type, Callable[[nn.Module, Folding], nn.Module]] = {
    nn.Linear: lambda module, f: StackedLinear(f.param("weight"), _bias(module, f)),
    nn.LayerNorm: lambda module, f: StackedLayerNorm(f.param("weight"), _bias(module, f), module.normalized_shape,
                                                     module.eps),
    nn.RMSNorm: lambda module, f: StackedRMSNorm(f.param("weight"), module.normalized_shape, module.eps),
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


def fold_key(module: nn.Module):
    """What ``module`` computes, as far as folding tells parts apart: its ``fold_key`` where it
    declares one (the attention: its gene), else its type and its own weights' and buffers' shapes."""
    key = getattr(module, "fold_key", None)
    if key is not None:
        return key
    own = tuple((n, tuple(p.shape)) for n, p in module.named_parameters(recurse=False) if p is not None)
    buffers = tuple((n, tuple(b.shape)) for n, b in module.named_buffers(recurse=False) if b is not None)
    return type(module).__name__, own, buffers


class Split(nn.Module):
    """A part that differs between the folded models: one folded part per group of models with equal
    parts (``members``: their positions, ascending), each run on its own models' rows only."""

    def __init__(self, groups: Sequence[tuple[list[int], nn.Module]], rows: Rows):
        super().__init__()
        self.parts = nn.ModuleList(part for _, part in groups)
        self.members = [list(members) for members, _ in groups]
        self.rows = rows

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        k = sum(len(m) for m in self.members)
        per = per_model(x, k)
        outs, order = [], []
        for members, part in zip(self.members, self.parts):
            first = members[0]
            if members == list(range(first, first + len(members))):
                rows = per[first:first + len(members)]
            else:
                rows = per.index_select(0, torch.tensor(members, device=x.device))
            self.rows.members = members  # the dropout masks of these models' rows
            try:
                y = part(rows.flatten(0, 1), *args, **kwargs)
            finally:
                self.rows.members = None
            if not isinstance(y, torch.Tensor):
                raise TypeError("a part that differs between folded models gives one tensor: attention weights "
                                "are read from one model at a time")
            outs.append(per_model(y, len(members)))
            order += members
        out = torch.cat(outs) if len(outs) > 1 else outs[0]
        if order != sorted(order):  # back into the models' order
            out = out.index_select(0, torch.tensor(sorted(range(k), key=order.__getitem__), device=x.device))
        return out.flatten(0, 1)

    def keep_models(self, index: list[int], device) -> None:
        groups = []
        for members, part in zip(self.members, self.parts):
            local = [j for j, m in enumerate(members) if m in index]
            if local:
                _keep_parts(part, local, device)
                groups.append(([index.index(members[j]) for j in local], part))
        self.parts = nn.ModuleList(part for _, part in groups)
        self.members = [members for members, _ in groups]


def _keep_parts(module: nn.Module, index: list[int], device) -> None:
    """The folded parts' own ``keep_models`` (stacked buffers), outside and inside splits."""
    if isinstance(module, Split):
        module.keep_models(index, device)
        return
    if callable(getattr(module, "keep_models", None)):
        module.keep_models(torch.tensor(index, dtype=torch.long, device=device))
    for child in module.children():
        _keep_parts(child, index, device)


class Fold:
    """K models folded into ``model``. ``stacked``: its parameters by name, [K, ...], or for a
    group's part [K_g, ...] holding the slices of ``owners[name]`` (positions, ascending); ``slots``:
    for each model, its own parameter names -> stacked names."""

    def __init__(self, model: nn.Module, stacked: dict[str, nn.Parameter], owners: dict[str, list[int]],
                 slots: list[dict[str, str]]):
        self.model, self.stacked, self.owners, self.slots = model, stacked, owners, slots

    def slice_of(self, k: int, name: str) -> tuple[str, int]:
        """Where model k's parameter ``name`` lives: (stacked name, slice)."""
        key = self.slots[k][name]
        owners = self.owners.get(key)
        return key, k if owners is None else owners.index(k)

    def bind(self, models: Sequence[nn.Module]) -> None:
        """Every parameter of model k becomes a view of its slice."""
        for k, m in enumerate(models):
            for name, p in m.named_parameters():
                key, j = self.slice_of(k, name)
                p.data = self.stacked[key].data[j]

    def keep(self, index: list[int]) -> dict[str, torch.Tensor]:
        """Only the models at ``index`` (positions, ascending) stay. Returns each remaining stacked
        parameter's kept slices (the optimizer keeps the same moments); a group's parameters whose
        models all left are gone."""
        device = next(iter(self.stacked.values())).device
        kept = {}
        for name, p in list(self.stacked.items()):
            owners = self.owners.get(name)
            local = index if owners is None else [j for j, m in enumerate(owners) if m in index]
            if not local:
                del self.stacked[name], self.owners[name]
                continue
            if owners is not None:
                self.owners[name] = [index.index(owners[j]) for j in local]
            kept[name] = torch.tensor(local, dtype=torch.long, device=device)
            p.grad = None
            p.data = p.data.index_select(0, kept[name])
        self.slots = [self.slots[i] for i in index]
        _keep_parts(self.model, index, device)
        return kept


def fold_problem(model: nn.Module) -> Unfoldable | None:
    """Why ``model`` cannot be folded (its first part without a folded form), or None. Folds it
    alone: its parameters become views of their stacked copies, so give it a model to spare."""
    try:
        fold_models([model], Rows())
    except Unfoldable as exc:
        return exc
    return None


def _inside(name: str, paths) -> str | None:
    return next((p for p in paths if name.startswith(p + ".")), None)


def fold_models(models: Sequence[nn.Module], rows: Rows) -> Fold:
    """One model running all of ``models`` (the same shape; parts may differ where their
    ``fold_key`` says so) on a [K * B, ...] batch. Afterwards every parameter of model k is a view of
    its slice of the fold's stacked parameters (tied parameters share one). Raises ``Unfoldable``."""
    copies = [dict(m.named_modules()) for m in models]
    skeleton = copy.deepcopy(models[0])
    splits: list[str] = []  # the outermost parts that differ between the models
    for path, _ in skeleton.named_modules():
        if _inside(path, splits):
            continue
        absent = next((k for k, c in enumerate(copies) if path not in c), None)
        if absent is not None:
            raise Unfoldable(f"model {absent} has no {path} (folded models differ only in parts that declare it)", path)
        keys = [fold_key(c[path]) for c in copies]
        if any(key != keys[0] for key in keys[1:]):
            if not path:
                raise Unfoldable("the models differ as a whole")
            splits.append(path)
    named = [dict(m.named_parameters()) for m in models]
    shared = [name for name in named[0] if not _inside(name, splits)]
    for k, n in enumerate(named[1:], 1):
        theirs = [name for name in n if not _inside(name, splits)]
        if theirs != shared or any(n[name].shape != named[0][name].shape for name in shared):
            raise Unfoldable(f"model {k} has other parameters than model 0 outside the parts that differ "
                             f"({', '.join(splits) or 'none'})")
    stacked = {name: nn.Parameter(torch.stack([n[name].detach() for n in named])) for name in shared}
    owners: dict[str, list[int]] = {}
    # a tied parameter (the head's weight is the token table) folds to the same stacked tensor
    first = {id(p): name for name, p in named[0].items()}
    aliases = {name: first[id(p)] for name, p in models[0].named_parameters(remove_duplicate=False)
               if not _inside(name, splits)}
    by_path = {name: stacked[source] for name, source in aliases.items()}
    slots = [{name: aliases.get(name, name) for name in shared} for _ in models]
    used: set[str] = set()
    replacements = []
    for path in splits:
        groups: dict = {}
        for k, c in enumerate(copies):
            groups.setdefault(fold_key(c[path]), []).append(k)
        parts = []
        for g, members in enumerate(groups.values()):
            inner = fold_models([copies[k][path] for k in members], rows)
            prefix = f"{path}.parts.{g}."
            for name, p in inner.stacked.items():
                stacked[prefix + name] = p
                inner_owners = inner.owners.get(name)
                owners[prefix + name] = members if inner_owners is None else [members[j] for j in inner_owners]
            for j, k in enumerate(members):
                slots[k].update({f"{path}.{name}": prefix + key for name, key in inner.slots[j].items()})
            parts.append((members, inner.model))
        replacements.append((path, Split(parts, rows)))
    for path, module in skeleton.named_modules():
        if path in splits or any(path.startswith(done + ".") for done, _ in replacements):
            continue  # a split (replaced below) or inside a folded part
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
    missing = sorted(set(shared) - {aliases[name] for name in used})
    if missing:
        raise Unfoldable(f"parameters without a folded form: {', '.join(missing)}")
    # the stacked parameters in model 0's order, every group's at the place of its part (the order of
    # each model's own parameters, as its clipping alone sums their norms)
    ordered = []
    for name in named[0]:
        path = _inside(name, splits)
        ordered += [name] if path is None else [key for key in stacked if key.startswith(f"{path}.parts.")]
    ordered = list(dict.fromkeys(ordered + list(stacked)))  # each at its first place
    fold = Fold(skeleton, {key: stacked[key] for key in ordered}, owners, slots)
    fold.bind(models)
    return fold
