"""Dropout whose random mask costs a quarter of PyTorch's on CPU.

PyTorch's CPU dropout draws one number per element from the serial CPU generator (~10% of a training
step at the seed's config). Here each 64-bit draw gives four 16-bit lanes and element i is dropped
when its lane is below ``round(p * 65536)``:

- the drop probability is ``q = round(p * 65536) / 65536`` (0.1 -> 0.1000061), every element
  independently; kept elements are scaled by ``1 / (1 - q)``, so the expectation is exact;
- the mask comes from torch's global CPU generator, so a seed reproduces it exactly on every device
  (on a GPU it is drawn on the CPU and moved): a trial's dropout stream, and with it its result up to
  rounding, does not depend on where it trains (a trial's key leaves the device out), where PyTorch's
  own GPU dropout would draw another stream (docs/findings.md, Q3's replication);
- the gradient is the same mask and scale.

For p = 0 or eval mode this is ``torch.nn.functional.dropout``.

The trainer gives each model its own stream (a generator starting at the global state right after
the model is built, so K models folded into one batch each draw what they would alone): inside
``mask_source(fn)``, ``dropout`` takes its keep mask from ``fn(shape, p)`` (on any device) instead of
the global generator. The counter stream (``nn.dropout_counter``) is such a source, without a generator.
"""

from __future__ import annotations

import contextvars
import math
from contextlib import contextmanager
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

LANE_BITS = 16
LANES = 64 // LANE_BITS


def drop_threshold(p: float) -> int:
    """Lanes (uniform on [0, 2^16)) below this are dropped: q = threshold / 2^16."""
    return round(p * (1 << LANE_BITS))


# the keep-mask source of the current context (None: keep_mask from the global generator)
_MASK_SOURCE: contextvars.ContextVar = contextvars.ContextVar("evo_attention_dropout_masks", default=None)


def keep_mask(shape: torch.Size | tuple, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """A bool CPU tensor of ``shape``: True (keep) with probability 1 - q, independently; drawn from
    ``generator`` (default: torch's global CPU generator)."""
    n = math.prod(shape)
    draws = torch.empty((n + LANES - 1) // LANES, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1,
                                                                              generator=generator)
    lanes = draws.view(torch.int16)[:n]  # signed: lane - 2^15, uniform on [-2^15, 2^15)
    return (lanes >= drop_threshold(p) - (1 << (LANE_BITS - 1))).view(shape)


@contextmanager
def mask_source(source: Callable[[tuple, float], torch.Tensor]):
    """Within this context ``dropout`` takes its bool keep masks from ``source(shape, p)``."""
    token = _MASK_SOURCE.set(source)
    try:
        yield
    finally:
        _MASK_SOURCE.reset(token)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    source = _MASK_SOURCE.get()
    if not training or p == 0.0:
        return F.dropout(x, p, training)
    threshold = drop_threshold(p)
    if threshold == 0:  # p < 2^-17: nothing is dropped
        return x
    if threshold >= 1 << LANE_BITS:  # p > 1 - 2^-17: everything is
        return F.dropout(x, 1.0, True)
    scale = (1 << LANE_BITS) / ((1 << LANE_BITS) - threshold)
    # one multiply by (mask * scale), forward and backward: 3x faster here than a masked_fill
    mask = source(tuple(x.shape), p) if source is not None else keep_mask(x.shape, p)
    return x * mask.to(x.device, x.dtype).mul_(scale)


class Dropout(nn.Module):
    """``nn.Dropout`` with the cheaper CPU mask of ``dropout``."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
