"""What one attention layer computes for each classic gene (and the covering genes and programs of
``conftest``), pinned: ``tests/fixtures/classic_reference.npz`` holds these outputs as the engine of
0.5 (commit 8769ca9, before every gene became a program) computed them; ``test_engine.py`` holds
today's engine to them within 1e-6.

Per gene: the eval-mode output, the gradient of a fixed functional with respect to the input and,
per parameter, the gradient's inner product with a fixed tensor, the rows ``decode`` gives (one
chunk then one position at a time), a training-mode output with attention dropout from a seeded
generator, and a hash of the state-dict keys (checkpoints of classic genes keep their names).
Weights are set by name from a generator seeded by the name, so the comparison does not depend on
the order in which a version builds its parts.

Regenerate (only when a change of the function is intended): ``python3 tests/classic_reference.py``.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
import zlib
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "fixtures" / "classic_reference.npz"


def classic_keys() -> list:
    from evo_attention.genes import AXIS_DEFAULTS, CATEGORICAL_FIELDS, FIELD, AttentionGene, violation

    options = [AttentionGene.SIMILARITY_FUNCS, AttentionGene.NORMALIZATIONS, AttentionGene.GATING,
               AttentionGene.TEMPERATURE_MODES]
    fields = [FIELD[name] for name in CATEGORICAL_FIELDS]
    keys = []
    for i, combo in enumerate(itertools.product(*(o[:len(f.builtins)] for o, f in zip(options, fields)))):
        values = dict(zip(CATEGORICAL_FIELDS, combo))
        if violation({**AXIS_DEFAULTS, **values, "program": None}) is None:
            gene = AttentionGene(gene_dict={**values, "use_bias": bool(i % 2), "attention_dropout": 0.1})
            keys.append(gene.key)
    return keys


def covering_keys() -> list:
    sys.path.insert(0, str(HERE))
    from conftest import covering_gene_keys
    return covering_gene_keys()


def _named_values(name: str, shape, scale: float = 0.3) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(tuple(shape), generator=g) * scale


def _set_weights(attn: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in attn.named_parameters():
            p.add_(_named_values(name, p.shape))
        for name, b in attn.named_buffers():
            if name.endswith(("features", "key_shift")):  # random features: drawn at construction
                b.copy_(_named_values(name, b.shape, 1.0))


def compute(key: str, classic: bool) -> dict:
    """The pinned quantities of one gene (see the module docstring)."""
    from evo_attention.nn.attention import EvolvedAttention

    d, h, t = (8, 2, 6) if classic else (16, 4, 7)
    torch.manual_seed(0)
    attn = EvolvedAttention(d, h, key, max_seq_len=16)
    _set_weights(attn)
    x = _named_values("x", (1, t, d), 1.0).requires_grad_(True)
    r = _named_values("r", (1, t, d), 1.0)
    attn.eval()
    out = attn(x)
    (out * r).sum().backward()
    grads = [float((p.grad * _named_values("g" + n, p.shape, 1.0)).sum()) if p.grad is not None else 0.0
             for n, p in sorted(attn.named_parameters())]
    with torch.no_grad():
        cache = attn.new_cache()
        rows = [attn.decode(x[:, :4], cache)] + [attn.decode(x[:, i:i + 1], cache) for i in range(4, t)]
        attn.train()
        torch.manual_seed(1)
        train_out = attn(x)
    names = ",".join(sorted(attn.state_dict()))
    return {"out": out.detach().numpy(), "x_grad": x.grad.numpy(), "param_grads": np.array(grads, dtype=np.float64),
            "decode": torch.cat(rows, dim=1).numpy(), "train_out": train_out.numpy(),
            "state_keys": np.array(hashlib.sha256(names.encode()).hexdigest())}


def all_keys() -> list:
    return [(k, True) for k in classic_keys()] + [(k, False) for k in covering_keys()]


QUANTITIES = ("out", "x_grad", "param_grads", "decode", "train_out")


def main() -> None:
    """One flat array and its offsets per quantity (few archive members keep the file small)."""
    keys, states, values = [], [], {q: [] for q in QUANTITIES}
    for key, classic in all_keys():
        found = compute(key, classic)
        keys.append(key)
        states.append(str(found["state_keys"]))
        for q in QUANTITIES:
            values[q].append(np.asarray(found[q], dtype=np.float32).ravel())
    arrays = {"keys": np.array(keys), "state_keys": np.array(states)}
    for q, parts in values.items():
        arrays[q] = np.concatenate(parts)
        arrays[q + "_offsets"] = np.cumsum([0] + [len(v) for v in parts])
    FIXTURE.parent.mkdir(exist_ok=True)
    np.savez_compressed(FIXTURE, **arrays)
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes, {len(keys)} genes)")


def load() -> dict:
    """{key: {quantity: flat float32 array, "state_keys": hash}} from the fixture."""
    data = np.load(FIXTURE)
    out = {}
    for i, key in enumerate(data["keys"]):
        row = {"state_keys": str(data["state_keys"][i])}
        for q in QUANTITIES:
            lo, hi = data[q + "_offsets"][i:i + 2]
            row[q] = data[q][lo:hi]
        out[str(key)] = row
    return out


if __name__ == "__main__":
    main()
