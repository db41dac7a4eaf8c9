"""Memory-light language-model loss: the output projection and cross-entropy fused, in row chunks.

The plain way, ``F.cross_entropy(h @ W.T, y)``, materialises [N, vocab] logits, their log-softmax
and a zero-filled gradient (164 MB each at the seed's config). ``linear_cross_entropy`` walks over
chunks of rows instead: a chunk's logits, softmax, loss and -- when gradients are needed -- its
gradient (softmax - onehot) / n straight away, folded into dL/dh and dL/dW with two matrix products;
the backward pass only scales the stored gradients. Same FLOPs, a fraction of the memory traffic.

Targets equal to ``IGNORE_INDEX`` are never scored: they add nothing to the loss, the gradient,
or the count ``n`` of the mean.
"""

from __future__ import annotations

import torch

from evo_attention.data.base import IGNORE_INDEX

# Rows per softmax chunk and per weight-gradient group (measured at the seed's config on a CPU: a
# 256-row chunk's float32 buffer stays in the caches; a 1024-row group makes the weight gradient one
# product per group, its bf16 buffer still in L3: 141-169 ms against 190-216 ms with one 4096-row group).
DEFAULT_CHUNK = 256
WEIGHT_GROUP = 1024


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation precision: at least float32."""
    return torch.promote_types(dtype, torch.float32)


class _LinearCrossEntropy(torch.autograd.Function):
    """hidden [N, d], weight [V, d], targets [N] -> the mean loss; K models folded into one batch
    (hidden [K, N, d], weight [K, V, d], targets [K, N]) -> the K mean losses, with the same chunks and
    operations as batched products (each model's loss and gradients are bitwise those of its own call).

    Per chunk: logits in the matmul precision, widened once to at least float32; softmax (one fused
    kernel); the NLL as ``max - picked - log(max softmax)``, exact for every row because the largest
    probability is at least 1/vocab and never underflows, where ``-log(p[target])`` would; then
    softmax - onehot, narrowed once to the matmul precision, feeds dL/dh = (P @ W) / n and, per group
    of rows, dL/dW = P^T @ (scored h) / n with float32 accumulation across groups. Unscored rows
    are multiplied by exactly zero.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, dtype):
        acc = _acc(dtype)
        lead, n_rows = targets.shape[:-1], targets.shape[-1]  # lead: () for one model, (K,) for K
        vocab, dev = weight.shape[-2], hidden.device
        scored_all = targets != IGNORE_INDEX
        n = scored_all.sum(-1).clamp(min=1).to(acc)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(dtype)  # cast once per step, not per chunk
        wt = w.transpose(-2, -1)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=dev) if need_w else None
        total = torch.zeros(lead, dtype=acc, device=dev)
        group = max(chunk, WEIGHT_GROUP)
        rows = min(chunk, n_rows)
        # the chunk's buffers are allocated once per call: a fresh 10 MB tensor per chunk comes
        # from fresh pages, and their page faults cost as much as the softmax itself on a CPU
        narrow = torch.empty(*lead, rows, vocab, dtype=dtype, device=dev)
        logits = torch.empty(*lead, rows, vocab, dtype=acc, device=dev) if acc != dtype else narrow
        probs = torch.empty(*lead, rows, vocab, dtype=acc, device=dev)
        diff = torch.empty(*lead, min(group, n_rows), vocab, dtype=dtype, device=dev) if need_w else None
        models = [torch.arange(lead[0], device=dev)[:, None]] if lead else []
        for g0 in range(0, n_rows, group):
            hg, tg = hidden[..., g0:g0 + group, :].to(dtype), targets[..., g0:g0 + group]
            for s in range(0, hg.shape[-2], chunk):
                h, t = hg[..., s:s + chunk, :], tg[..., s:s + chunk]
                k = t.shape[-1]
                scored, safe = (t != IGNORE_INDEX).to(acc), t.clamp(min=0)
                full = k == rows  # the preallocated buffers; a shorter last chunk gets its own
                zn = narrow if full else torch.empty(*lead, k, vocab, dtype=dtype, device=dev)
                torch.matmul(h, wt, out=zn)
                if acc != dtype:  # widen to the accumulation precision
                    z = logits if full else torch.empty(*lead, k, vocab, dtype=acc, device=dev)
                    z.copy_(zn)
                else:
                    z = zn
                top = z.amax(dim=-1)
                picked = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
                p = torch.softmax(z, dim=-1, out=probs if full else torch.empty_like(z))
                total += ((top - picked - p.amax(dim=-1).log()) * scored).sum(-1)
                if not (need_h or need_w):
                    continue
                p[(*models, torch.arange(k, device=dev), safe)] -= scored  # softmax - onehot
                q = diff[..., s:s + k, :] if need_w else zn
                q.copy_(p)
                if need_h:
                    at = g0 + s
                    grad_h[..., at:at + k, :] = ((q @ w).to(acc) * (scored / n.unsqueeze(-1)).unsqueeze(-1)).to(
                        hidden.dtype)
            if need_w:
                masked = hg * scored_all[..., g0:g0 + group, None].to(dtype)
                grad_w += (diff[..., :hg.shape[-2], :].transpose(-2, -1) @ masked).to(acc)
        if need_w:
            grad_w /= n[..., None, None]
        ctx.save_for_backward(*(g for g in (grad_h, grad_w) if g is not None))
        ctx.has = (need_h, need_w)
        ctx.weight_dtype = weight.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        need_h, need_w = ctx.has
        scale = grad_out[..., None, None]
        grad_h = saved.pop(0) * scale if need_h else None
        grad_w = (saved.pop(0) * scale).to(ctx.weight_dtype) if need_w else None
        return grad_h, grad_w, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         chunk: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets`` over scored targets, in
    chunks of ``chunk`` rows (default ``DEFAULT_CHUNK``, read at each call: a benchmark may set it).

    One model: hidden [..., d], weight [vocab, d], targets [...] -> a scalar. K models folded into
    one batch (``nn.fold``): weight [K, vocab, d], hidden [K * B, ..., d] and targets [K * B, ...]
    model-major -> the K means [K]. ``dtype`` is the matmul precision (float32, or bfloat16/float16
    for mixed precision); log-sum-exp and the loss are always float32.
    """
    lead = weight.shape[:-2]  # (K,) for K folded models, () for one
    return _LinearCrossEntropy.apply(hidden.reshape(*lead, -1, hidden.shape[-1]), weight, targets.reshape(*lead, -1),
                                     DEFAULT_CHUNK if chunk is None else chunk, dtype)


@torch.no_grad()
def linear_nll_stats(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                     chunk: int = DEFAULT_CHUNK, dtype: torch.dtype = torch.float32):
    """(sum of NLL as float64, correct next-token predictions, scored tokens) without the full logits."""
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    nll = torch.zeros((), dtype=torch.float64, device=h.device)
    correct = torch.zeros((), dtype=torch.long, device=h.device)
    for start in range(0, h.shape[0], chunk):
        wanted = t[start:start + chunk]
        logits = (h[start:start + chunk].to(dtype) @ weight.to(dtype).t()).to(_acc(dtype))  # at least float32
        scored = wanted != IGNORE_INDEX
        picked = logits.gather(1, wanted.clamp(min=0)[:, None]).squeeze(1)
        nll += ((torch.logsumexp(logits, dim=-1) - picked) * scored).sum().double()
        correct += ((logits.argmax(-1) == wanted) & scored).sum()
    return nll, correct, (t != IGNORE_INDEX).sum()
