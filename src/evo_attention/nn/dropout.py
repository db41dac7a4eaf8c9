"""Dropout whose random mask costs a quarter of PyTorch's on CPU.

PyTorch's CPU dropout draws one number per element from the (serial, mt19937) CPU generator; at
the seed's config that is 7 masks and ~6.6M draws per training step, ~10% of the step (measured
with torch.profiler: ``aten::bernoulli_`` 72 ms of a 700 ms step). Here each 64-bit draw gives four
16-bit lanes and element i is dropped when its lane is below ``round(p * 65536)``:

- the drop probability is ``q = round(p * 65536) / 65536`` (0.1 -> 0.1000061), every element
  independently; kept elements are scaled by ``1 / (1 - q)``, so the expectation is exact;
- the mask comes from torch's global CPU generator, so a seed reproduces it exactly, on every
  device: on a GPU the mask is drawn on the CPU and moved, so a trial's dropout stream, and with it
  its result up to rounding, does not depend on where it trains (a trial's key leaves the device
  out). PyTorch's own dropout on a GPU draws from the device's generator: another stream, and on
  a chaotic task another outcome (docs/findings.md, Q3's replication);
- the gradient is the same mask and scale.

For p = 0 or eval mode this is ``torch.nn.functional.dropout``.

The trainer gives each model its own stream (its generator starts at the global state right after
the model is built, so a model alone draws what it would draw from the global generator, and K
models folded into one batch each draw their own): inside ``mask_source(fn)``, ``dropout`` takes
its keep mask from ``fn(shape, p)`` (on any device) instead of drawing it from the global
generator; outside it (evaluation, a plain forward pass) nothing changes.

The counter stream (``counter_keep_mask``; a training's ``dropout_stream: counter``) gives the same
lanes without a generator: lane i of a mask is a pure function of (seed, step, call, i), computed
with integer tensor ops on the device of the activations, so a GPU draws nothing on the CPU and
copies nothing, and every device gives the same bits:

- ``counter_key(seed, step, call)`` (plain Python integers: SplitMix64's finaliser, chained over the
  three) gives an odd multiplier ``a < 2^31`` and an offset ``b < 2^32``; ``call`` is the dropout
  call's number within the step (the order of the sites in a forward pass is fixed, so it names the
  layer and the site);
- element i of the mask takes lane ``i % 2`` (bits 0-15, then 16-31) of ``h(j)``, ``j = i // 2``,
  where ``h(j) = lowbias32((a * j + b) mod 2^32)``: the 32-bit multiply-xorshift finaliser of
  Wellons's hash-prospector (shifts 16, 15, 16; multipliers 0x7feb352d, 0x846ca68b); two lanes per
  hash;
- a lane is read as a signed 16-bit number, as the generator's lanes are, and kept when it is at
  least ``threshold - 2^15``: the same q and scale as above;
- K models folded into one batch (rows model-major) each hash their own rows with their own key,
  with i counted within the model's rows: model k's mask is the mask it gets alone.

Every step is exact in int64 on every device, with no overflow: values stay in [0, 2^32) between
steps; ``a * j + b < 2^31 * 2^31 + 2^32 < 2^63`` (a mask part holds fewer than 2^32 elements); a
32-bit multiplier c >= 2^31 is applied as ``c - 2^32`` (negative, |c - 2^32| < 2^31), so every
product has magnitude below 2^63 and is congruent to ``x * c`` mod 2^32, and ``& (2^32 - 1)`` of a
two's-complement integer is its residue mod 2^32; the shifts are of non-negative values. On the
CPU the same function runs as numpy uint32 arithmetic (unsigned, so it wraps modulo 2^32 by
definition: no masks, half the memory traffic), in cache-sized blocks; the tests hold both forms to
a plain-Python reference.
"""

from __future__ import annotations

import contextvars
import math
import sys
from contextlib import contextmanager
from typing import Callable, Sequence

import numpy as np
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


# -- the counter stream ------------------------------------------------------------------------------

_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1
# lowbias32 (C. Wellons, hash-prospector): x ^= x >> 16; x *= M0; x ^= x >> 15; x *= M1; x ^= x >> 16
_HASH_SHIFTS = (16, 15, 16)
_HASH_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
# the same multipliers as int64 factors of magnitude < 2^31, congruent mod 2^32 (module docstring)
_SIGNED_MULTIPLIERS = tuple(c - (1 << 32) if c >= 1 << 31 else c for c in _HASH_MULTIPLIERS)
# the most elements one model's part of a mask may hold: pair indices j stay below 2^31
MAX_COUNTER_ELEMENTS = 1 << 32


def _mix64(z: int) -> int:
    """SplitMix64's output function (Steele, Lea and Flood) on Python integers: exact everywhere."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def counter_key(seed: int, step: int, call: int) -> tuple[int, int]:
    """The key ``(a, b)`` of one dropout call of the counter stream: ``a`` odd, below 2^31; ``b``
    below 2^32. Distinct (seed, step, call) give unrelated keys."""
    z = _mix64(_mix64(_mix64(seed & _MASK64) ^ (step & _MASK64)) ^ (call & _MASK64))
    return (z & 0x7FFFFFFF) | 1, z >> 32


def _lowbias32_(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of every element of ``x`` (int64, values in [0, 2^32)), in place."""
    tmp = torch.empty_like(x)
    for shift, factor in zip(_HASH_SHIFTS, _SIGNED_MULTIPLIERS):
        x.bitwise_xor_(torch.bitwise_right_shift(x, shift, out=tmp))
        x.mul_(factor).bitwise_and_(_MASK32)
    return x.bitwise_xor_(torch.bitwise_right_shift(x, _HASH_SHIFTS[-1], out=tmp))


def _counter_lanes_torch(pairs: int, keys: Sequence[tuple[int, int]], device) -> torch.Tensor:
    """The lanes [K, 2 * pairs] (int16) of ``h(j)``, j < pairs, per key: int64 tensor ops on ``device``."""
    x = torch.arange(pairs, dtype=torch.int64, device=device)
    if len(keys) == 1:
        (a, b), = keys
        x = x.mul_(a).add_(b).unsqueeze(0)
    else:
        ab = torch.tensor(keys, dtype=torch.int64)  # [K, 2]
        if x.device.type == "cuda":  # copied without waiting for the device
            ab = ab.pin_memory().to(x.device, non_blocking=True)
        else:
            ab = ab.to(x.device)
        x = torch.addcmul(ab[:, 1:], x, ab[:, :1])  # [K, pairs]: a_k * j + b_k
    h = _lowbias32_(x.bitwise_and_(_MASK32))
    # little-endian int16 view: lane 0 is bits 0-15, lane 1 bits 16-31 (2 and 3 are zero)
    return h.view(torch.int16).unflatten(-1, (pairs, 4))[..., :2].flatten(-2)


# the CPU computes h in blocks of this many pairs: the block's two uint32 arrays stay in the core's cache
_CPU_BLOCK = 1 << 15


def _counter_lanes_numpy(pairs: int, keys: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The same lanes as ``_counter_lanes_torch``, on the CPU: numpy's uint32 arithmetic is exact
    modulo 2^32 (unsigned: defined to wrap), so no masking is needed, and half the bytes of int64."""
    out = np.empty((len(keys), 2 * pairs), dtype=np.int16)
    lanes = out.view(np.uint32)  # [K, pairs]: each uint32 is a hash, read back as two int16 lanes
    tmp = np.empty(min(pairs, _CPU_BLOCK), dtype=np.uint32)
    multipliers = [np.uint32(c) for c in _HASH_MULTIPLIERS]
    shifts = [np.uint32(s) for s in _HASH_SHIFTS]
    for k, (a, b) in enumerate(keys):
        for start in range(0, pairs, _CPU_BLOCK):
            x = lanes[k, start:start + _CPU_BLOCK]
            t = tmp[:len(x)]
            np.multiply(np.arange(start, start + len(x), dtype=np.uint32), np.uint32(a), out=x)
            np.add(x, np.uint32(b), out=x)
            for shift, factor in zip(shifts, multipliers):
                np.bitwise_xor(x, np.right_shift(x, shift, out=t), out=x)
                np.multiply(x, factor, out=x)
            np.bitwise_xor(x, np.right_shift(x, shifts[-1], out=t), out=x)
    if sys.byteorder != "little":  # lane 0 is bits 0-15 of the hash on every machine
        out.byteswap(inplace=True)
    return torch.from_numpy(out)


def counter_keep_mask(shape: torch.Size | tuple, p: float, keys: Sequence[tuple[int, int]],
                      device: torch.device | str | None = None) -> torch.Tensor:
    """A bool tensor of ``shape`` on ``device``, True (keep) with probability 1 - q: the counter
    stream (module docstring). Its rows (dimension 0) split model-major into ``len(keys)`` equal
    parts; part k is hashed with ``keys[k]`` (``counter_key``) and counts its elements from 0.
    On the CPU the hashes are numpy uint32 arithmetic, elsewhere int64 tensor ops on the device:
    the same function, the same bits."""
    shape = tuple(shape)
    models = len(keys)
    if models < 1 or (shape[0] if shape else 1) % models:
        raise RuntimeError(f"a dropout site of shape {shape} does not split over {models} models")
    n = math.prod(shape) // models  # elements per model
    if n >= MAX_COUNTER_ELEMENTS:
        raise RuntimeError(f"a dropout site of {n:,} elements per model is beyond the counter stream's "
                           f"{MAX_COUNTER_ELEMENTS:,}")
    pairs = (n + 1) // 2
    on_cpu = device is None or torch.device(device).type == "cpu"
    lanes = _counter_lanes_numpy(pairs, keys) if on_cpu else _counter_lanes_torch(pairs, keys, device)
    keep = lanes >= drop_threshold(p) - (1 << (LANE_BITS - 1))
    return (keep if 2 * pairs == n else keep[:, :n]).reshape(shape)


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
