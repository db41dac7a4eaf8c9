"""The counter dropout stream (a training's ``dropout_stream: counter``): keep masks with the lanes,
drop probability and scale of ``nn.dropout`` but no generator. Lane i of a mask is a pure function
of (seed, step, call, i), computed where the activations are, so a GPU draws nothing on the CPU
and copies nothing, and every device gives the same bits:

- ``counter_key(seed, step, call)`` (plain Python integers: SplitMix64's finaliser, chained over the
  three) gives an odd multiplier ``a < 2^31`` and an offset ``b < 2^32``; ``call`` is the dropout
  call's number within the step (the order of the sites in a forward pass is fixed, so it names the
  layer and the site);
- element i of the mask takes lane ``i % 2`` (bits 0-15, then 16-31) of ``h(j)``, ``j = i // 2``,
  where ``h(j) = lowbias32((a * j + b) mod 2^32)``: the 32-bit multiply-xorshift finaliser of
  Wellons's hash-prospector (shifts 16, 15, 16; multipliers 0x7feb352d, 0x846ca68b); two lanes per
  hash;
- a lane is read as a signed 16-bit number, as the generator's lanes are, and kept when it is at
  least ``threshold - 2^15`` (``nn.dropout.drop_threshold``): the same q and scale;
- K models folded into one batch (rows model-major) each hash their own rows with their own key,
  with i counted within the model's rows: model k's mask is the mask it gets alone.

Off the CPU the hash runs as int64 tensor ops on the device, exact with no overflow: values stay
in [0, 2^32) between steps; ``a * j + b < 2^31 * 2^31 + 2^32 < 2^63`` (a mask part holds fewer than
2^32 elements); a 32-bit multiplier c >= 2^31 is applied as ``c - 2^32`` (|c - 2^32| < 2^31), so every
product stays below 2^63 in magnitude and is congruent to ``x * c`` mod 2^32, which ``& (2^32 - 1)``
gives. On the CPU the same function runs as numpy uint32 arithmetic (wrapping modulo 2^32 by
definition), in cache-sized blocks; the tests hold both forms to a plain-Python reference. The
trainer hands ``counter_keep_mask`` to ``nn.dropout.mask_source``; this module is not shipped in an
export (``nn.dropout``, which is, imports only torch).
"""

from __future__ import annotations

import math
import sys
from typing import Sequence

import numpy as np
import torch

from evo_attention.nn.dropout import LANE_BITS, drop_threshold

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


def keys_tensor(keys: Sequence[tuple[int, int]], device, out: torch.Tensor | None = None) -> torch.Tensor:
    """``keys`` (``counter_key`` pairs) as an int64 tensor [K, 2] on ``device`` (or copied into
    ``out`` there). To a GPU from pinned memory, so the copy does not wait for the device; PyTorch
    keeps the host block until the copy is done."""
    ab = torch.tensor(keys, dtype=torch.int64)
    if torch.device(device).type == "cuda":
        ab = ab.pin_memory()
    return ab.to(device, non_blocking=True) if out is None else out.copy_(ab, non_blocking=True)


def _counter_lanes_torch(pairs: int, keys: Sequence[tuple[int, int]] | torch.Tensor, device) -> torch.Tensor:
    """The lanes [K, 2 * pairs] (int16) of ``h(j)``, j < pairs, per key: int64 tensor ops on ``device``.
    ``keys`` may be an int64 tensor [K, 2] on the device already (a CUDA graph reads them there)."""
    x = torch.arange(pairs, dtype=torch.int64, device=device)
    if not isinstance(keys, torch.Tensor) and len(keys) == 1:
        (a, b), = keys
        x = x.mul_(a).add_(b).unsqueeze(0)
    else:
        ab = keys if isinstance(keys, torch.Tensor) else keys_tensor(keys, x.device)
        x = torch.addcmul(ab[:, 1:], x, ab[:, :1])  # [K, pairs]: a_k * j + b_k, exact in int64
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


def counter_keep_mask(shape: torch.Size | tuple, p: float, keys: Sequence[tuple[int, int]] | torch.Tensor,
                      device: torch.device | str | None = None) -> torch.Tensor:
    """A bool tensor of ``shape`` on ``device``, True (keep) with probability 1 - q: the counter
    stream (module docstring). Its rows (dimension 0) split model-major into ``len(keys)`` equal
    parts; part k is hashed with ``keys[k]`` (``counter_key``; or row k of an int64 tensor [K, 2]
    of them on ``device``) and counts its elements from 0. On the CPU the hashes are numpy uint32
    arithmetic, elsewhere int64 tensor ops on the device: the same function, the same bits."""
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
    if on_cpu and isinstance(keys, torch.Tensor):
        keys = [tuple(k) for k in keys.tolist()]
    lanes = _counter_lanes_numpy(pairs, keys) if on_cpu else _counter_lanes_torch(pairs, keys, device)
    keep = lanes >= drop_threshold(p) - (1 << (LANE_BITS - 1))
    return (keep if 2 * pairs == n else keep[:, :n]).reshape(shape)
