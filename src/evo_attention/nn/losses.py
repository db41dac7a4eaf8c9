"""Memory-light language-model loss: the output projection and cross-entropy fused, in row chunks.

The plain way, ``F.cross_entropy(h @ W.T, y)``, materialises the [N, vocab] logits, a [N, vocab]
log-softmax for the backward pass and a zero-filled [N, vocab] gradient (at the seed's config
N=4096, vocab=10000: 164 MB each, a third of a CPU training step spent streaming them).
``linear_cross_entropy`` walks over chunks of rows instead: logits of a chunk, its log-sum-exp,
its loss, and -- when gradients are needed -- its gradient (softmax - onehot) / n straight away,
folded into dL/dh and dL/dW with two matrix products. The backward pass only scales the stored
gradients. Same FLOPs, same result up to summation order, a fraction of the memory traffic.

Targets equal to ``IGNORE_INDEX`` are never scored: they add nothing to the loss, the gradient,
or the count ``n`` of the mean.
"""

from __future__ import annotations

import torch

from evo_attention.data.base import IGNORE_INDEX

# Rows per chunk: one [chunk, vocab] buffer at a time. Measured on the 2-core CPU at the seed's
# config (median of 3 interleaved runs): output layer + loss forward/backward 372 ms with 4096 rows,
# 368 ms with 512, 335 ms with 256; whole training step (baseline / seed-best gene) 645 / 805 ms
# with 4096 rows, 599 / 773 ms with 512 (a 20 MB buffer instead of 164 MB, better for the caches).
DEFAULT_CHUNK = 512


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation precision: at least float32."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_stats(hidden, weight, targets, dtype):
    """Per chunk: logits (at least float32), log-sum-exp, the scored mask and the clamped targets."""
    logits = (hidden.to(dtype) @ weight.to(dtype).t()).to(_acc(dtype))
    lse = torch.logsumexp(logits, dim=-1)
    scored = targets != IGNORE_INDEX
    safe = targets.clamp(min=0)
    return logits, lse, scored, safe


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, dtype):
        acc = _acc(dtype)
        n = (targets != IGNORE_INDEX).sum().clamp(min=1).to(acc)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h, t = hidden[start:start + chunk], targets[start:start + chunk]
            logits = (h.to(dtype) @ weight.to(dtype).t()).to(acc)
            scored, safe = t != IGNORE_INDEX, t.clamp(min=0)
            picked = logits.gather(1, safe[:, None]).squeeze(1)
            row_max = logits.amax(dim=-1, keepdim=True)
            probs = logits.sub_(row_max).exp_()  # the one exp pass, in place of the logits
            row_sum = probs.sum(dim=-1, keepdim=True)
            lse = (row_max + row_sum.log()).squeeze(1)
            total += ((lse - picked) * scored).sum()
            if need_h or need_w:
                probs.mul_((scored / n)[:, None] / row_sum)  # softmax / n on scored rows, 0 elsewhere
                rows = torch.arange(len(t), device=t.device)
                probs[rows, safe] -= scored / n
                probs = probs.to(dtype)
                if need_h:
                    grad_h[start:start + chunk] = (probs @ weight.to(dtype)).to(hidden.dtype)
                if need_w:
                    grad_w.addmm_(probs.t().to(acc), h.to(acc))
        ctx.save_for_backward(*(g for g in (grad_h, grad_w) if g is not None))
        ctx.has = (need_h, need_w)
        ctx.weight_dtype = weight.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        need_h, need_w = ctx.has
        grad_h = saved.pop(0) * grad_out if need_h else None
        grad_w = (saved.pop(0) * grad_out).to(ctx.weight_dtype) if need_w else None
        return grad_h, grad_w, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         chunk: int = DEFAULT_CHUNK, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets`` over scored targets.

    hidden [..., d], weight [vocab, d], targets [...]; ``dtype`` is the matmul precision (float32,
    or bfloat16/float16 for mixed precision); log-sum-exp and the loss are always float32.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    return _LinearCrossEntropy.apply(h, weight, targets.reshape(-1), chunk, dtype)


@torch.no_grad()
def linear_nll_stats(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                     chunk: int = DEFAULT_CHUNK, dtype: torch.dtype = torch.float32):
    """(sum of NLL as float64, correct next-token predictions, scored tokens) without the full logits."""
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    nll = torch.zeros((), dtype=torch.float64, device=h.device)
    correct = torch.zeros((), dtype=torch.long, device=h.device)
    for start in range(0, h.shape[0], chunk):
        logits, lse, scored, safe = _chunk_stats(h[start:start + chunk], weight, t[start:start + chunk], dtype)
        picked = logits.gather(1, safe[:, None]).squeeze(1)
        nll += ((lse - picked) * scored).sum().double()
        correct += ((logits.argmax(-1) == t[start:start + chunk]) & scored).sum()
    return nll, correct, (t != IGNORE_INDEX).sum()
