"""The optimizer rules of a training, written once for one model and for K folded models.

The rules: AdamW with ``BETAS`` and ``ADAM_EPS``; weight decay on the matrices (``decays``: two or
more dimensions, embeddings excepted), none on biases, norms, embeddings and scalars; gradients
clipped to the recipe's ``grad_clip`` by their global norm. Both optimizers below follow them:

- ``SingleAdamW``: one model, PyTorch's own ``AdamW`` (fused on CUDA) and ``clip_grad_norm_``;
  its state is PyTorch's, so a checkpoint holds ``torch.optim.AdamW.state_dict()``.
- ``StackedAdamW``: K models whose parameters are stacked [K, ...] (``nn.fold``; a part that differs
  between the models stacks only its group's slices, ``owners``), each with its own rate, weight
  decay and clipping: the operations of PyTorch's single-tensor AdamW (decoupled
  decay, then the moments, then ``param + (-step_size * exp_avg) / denom``) with each model's
  scalars as a [K, 1, ...] tensor, and ``clip_grad_norm_``'s arithmetic per model slice, so a
  model's update is bitwise the one its own ``SingleAdamW`` makes from the same gradient on a CPU.

Both take ``step(rates, weight_decays, max_norms)`` with one entry per model, after the gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def decays(name: str, p: torch.Tensor) -> bool:
    """Whether the parameter ``name`` is decayed: matrices, not embeddings (nor biases, norms, scalars)."""
    return p.dim() >= 2 and "emb" not in name


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """``model``'s parameters in AdamW's two groups: decayed with ``weight_decay``, and undecayed."""
    decayed, plain = [], []
    for name, p in model.named_parameters():
        (decayed if decays(name, p) else plain).append(p)
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def torch_adamw(model: nn.Module, learning_rate: float, weight_decay: float, device: torch.device, *,
                graphable: bool = False):
    """PyTorch's AdamW over ``model`` under the rules (fused on CUDA). ``graphable`` (CUDA): its
    rate a tensor on the device and ``capturable``, so that a CUDA graph can replay its step; the
    fused kernel reads the same float32 rate either way."""
    options = {"fused": True} if device.type == "cuda" else {}
    lr = learning_rate
    if graphable:
        lr, options["capturable"] = torch.tensor(learning_rate, dtype=torch.float32, device=device), True
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=BETAS, eps=ADAM_EPS, **options)


class SingleAdamW:
    """One model: PyTorch's AdamW and ``clip_grad_norm_``. ``graphable``: see ``torch_adamw``;
    ``set_rate`` then writes the rate into the device tensor a CUDA graph's ``update`` reads."""

    def __init__(self, model: nn.Module, learning_rate: float, weight_decay: float, device: torch.device, *,
                 graphable: bool = False):
        self.model, self.device, self.graphable = model, device, graphable
        self.torch = torch_adamw(model, learning_rate, weight_decay, device, graphable=graphable)

    def zero_grad(self) -> None:
        self.torch.zero_grad(set_to_none=True)

    def set_rate(self, rate: float) -> None:
        for group in self.torch.param_groups:
            if not self.graphable:
                group["lr"] = rate
            elif isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(rate)  # in place: a captured step reads this tensor
            else:  # a loaded state_dict's float rate: a tensor again, before any capture
                group["lr"] = torch.tensor(rate, dtype=torch.float32, device=self.device)

    def update(self, max_norm: float) -> None:
        """Clip the gradients and take AdamW's step at the rate set last (what a CUDA graph captures)."""
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.torch.step()

    def step(self, rates: Sequence[float], weight_decays: Sequence[float], max_norms: Sequence[float]) -> None:
        (rate,), (max_norm,) = rates, max_norms  # the weight decay is the group's, set at construction
        self.set_rate(rate)
        self.update(max_norm)


class StackedAdamW:
    """K AdamW optimizers over stacked parameters [K, ...] (see the module docstring)."""

    def __init__(self, stacked: dict[str, nn.Parameter], owners: dict[str, list[int]] | None = None):
        self.stacked, self.owner_lists = stacked, owners if owners is not None else {}
        self.exp_avg = {n: torch.zeros_like(p) for n, p in stacked.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in stacked.items()}
        self.steps = 0
        self._index()

    def _index(self) -> None:
        self.names = list(self.stacked)
        self.params = [self.stacked[n] for n in self.names]
        self.decayed = [decays(n, p[0]) for n, p in zip(self.names, self.params)]
        self.owners = [None if n not in self.owner_lists else
                       torch.tensor(self.owner_lists[n], dtype=torch.long, device=p.device)
                       for n, p in zip(self.names, self.params)]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def keep_models(self, kept: dict[str, torch.Tensor]) -> None:
        """Keep each remaining parameter's moments of its kept slices (``nn.fold.Fold.keep``)."""
        self.exp_avg = {n: self.exp_avg[n].index_select(0, index) for n, index in kept.items()}
        self.exp_avg_sq = {n: self.exp_avg_sq[n].index_select(0, index) for n, index in kept.items()}
        self._index()

    def moments(self, slots: dict[str, tuple[str, int]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """One model's AdamW moments by its parameter names (copies); ``slots``: its parameter names
        -> (stacked name, slice)."""
        return {name: (self.exp_avg[key][j].clone(), self.exp_avg_sq[key][j].clone())
                for name, (key, j) in slots.items()}

    def step(self, rates: Sequence[float], weight_decays: Sequence[float], max_norms: Sequence[float]) -> None:
        clip_per_model(self.params, max_norms, self.owners)
        self._adamw(rates, weight_decays)

    @torch.no_grad()
    def _adamw(self, rates: Sequence[float], weight_decays: Sequence[float]) -> None:
        beta1, beta2 = BETAS
        self.steps += 1
        step = float(self.steps)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        first = self.params[0]
        # each model's scalars, rounded to the parameters' dtype as torch rounds a Python scalar
        step_size = torch.tensor([-(r / bias_correction1) for r in rates], dtype=first.dtype, device=first.device)
        decay = None
        if any(d != 0 for d in weight_decays):
            decay = torch.tensor([1 - r * d for r, d in zip(rates, weight_decays)], dtype=first.dtype,
                                 device=first.device)
        for name, p, owners, decayed in zip(self.names, self.params, self.owners, self.decayed):
            if p.grad is None:
                continue
            g, m, v = p.grad, self.exp_avg[name], self.exp_avg_sq[name]
            shape = (p.shape[0],) + (1,) * (p.dim() - 1)
            size = step_size if owners is None else step_size.index_select(0, owners)
            if decayed and decay is not None:
                p.mul_((decay if owners is None else decay.index_select(0, owners)).view(shape))
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(ADAM_EPS)
            p.add_(m * size.view(shape) / denom)  # addcdiv's (value * exp_avg) / denom


@torch.no_grad()
def clip_per_model(params: Sequence[nn.Parameter], max_norms: Sequence[float],
                   owners: Sequence[torch.Tensor | None] | None = None) -> None:
    """``clip_grad_norm_`` of each model separately: model k's gradients (its slice of every stacked
    gradient) scaled by ``min(1, max_norm_k / (norm_k + 1e-6))``, where norm_k is the norm of its
    parameters' norms in their order, as ``clip_grad_norm_`` computes it. ``owners``: per parameter,
    the models whose slices it holds (None: every model's); a model owns no slice of the others'."""
    owners = owners if owners is not None else [None] * len(params)
    grads = [(p.grad, index) for p, index in zip(params, owners) if p.grad is not None]
    if not grads:
        return
    k = len(max_norms)
    columns = []
    for g, index in grads:
        norm = torch.linalg.vector_norm(g.reshape(g.shape[0], -1), 2.0, dim=1)
        columns.append(norm if index is None else norm.new_zeros(k).index_copy_(0, index, norm))
    norms = torch.stack(columns, dim=1)  # [K, P]
    # where a model lacks slices, its own norms alone, in its order: zeros for the others' slices in between would
    # add its squares in another order (off the CPU, picking them would wait for the device)
    if norms.device.type == "cpu" and any(index is not None for _, index in grads):
        owned = torch.stack([torch.ones(k, dtype=torch.bool) if index is None else
                             torch.zeros(k, dtype=torch.bool).index_fill_(0, index, True) for _, index in grads], 1)
        total = torch.stack([torch.linalg.vector_norm(row[own], 2.0) for row, own in zip(norms, owned)])
    else:
        total = torch.linalg.vector_norm(norms, 2.0, dim=1)
    limit = torch.tensor([float(n) for n in max_norms], dtype=total.dtype, device=total.device)
    coef = torch.clamp((total + CLIP_EPS).reciprocal() * limit, max=1.0)  # max_norm / (total + eps), as torch does it
    for g, index in grads:
        g.mul_((coef if index is None else coef.index_select(0, index)).view((g.shape[0],) + (1,) * (g.dim() - 1)))


def adamw_state(model: nn.Module, learning_rate: float, weight_decay: float, device: torch.device, steps: int,
                moments: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.optim.AdamW:
    """PyTorch's AdamW over ``model`` holding ``moments`` after ``steps`` steps: a folded model's
    optimizer state as its own ``SingleAdamW`` would hold it (to continue it alone)."""
    optimizer = torch_adamw(model, learning_rate, weight_decay, device)
    for name, p in model.named_parameters():
        if name in moments:
            exp_avg, exp_avg_sq = moments[name]
            optimizer.state[p] = {"step": torch.tensor(float(steps), dtype=torch.float32),
                                  "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()}
    return optimizer
