"""ModelSpec: the shape of one model, as a frozen value (nanoGPT's ``GPTConfig``).

Everything that builds a ``TinyTransformer`` reads these fields: the training ``Config`` produces a
ModelSpec (``Config.model``), a saved model directory stores one (``config.json``), and the trial
of a training carries one (``train.spec.Trial``). Derived sizes are computed here and nowhere
else: ``ffn_dim`` is ``d_ff`` when given, else the block's default width.

``vocab_size`` is None until the data is known (a word-level corpus with its full vocabulary): the
model is built with the data's size (``with_data``).

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

BLOCKS = ("gpt2", "llama")
LLAMA_FFN_MULTIPLE = 8  # the SwiGLU width is rounded up to a multiple of this
FAVOR_FEATURES_DEFAULT = 64


def llama_ffn_dim(d_model: int) -> int:
    """The SwiGLU hidden width of the llama block: 8/3 d_model rounded up to a multiple of 8
    (128 -> 344, 256 -> 688, 384 -> 1024)."""
    m = LLAMA_FFN_MULTIPLE
    return -(-8 * d_model // (3 * m)) * m


def identity(*, key: bool = True, omit_default: bool = False) -> dict:
    """Field metadata that says how a spec field joins a trial's cache key (``train.spec``).

    ``key=False``: the field never changes a result (where or how fast it runs) or reaches the key
    another way (the data fingerprint); ``omit_default=True``: the field joins the key only when it
    differs from its default, so keys made before the field existed stay valid."""
    return {"key": key, "omit_default": omit_default}


@dataclass(frozen=True)
class ModelSpec:
    vocab_size: int | None = field(default=10000, metadata=identity(key=False))  # known through the data fingerprint
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    max_seq_len: int = 128
    dropout: float = 0.1
    d_ff: int | None = None  # None: 4 * d_model (gpt2 block), about 8/3 * d_model (llama block)
    block: str = field(default="gpt2", metadata=identity(omit_default=True))  # gpt2 or llama
    favor_features: int = field(default=FAVOR_FEATURES_DEFAULT, metadata=identity(omit_default=True))

    @property
    def ffn_dim(self) -> int:
        """The feed-forward width: ``d_ff``, else the block's default."""
        if self.d_ff:
            return self.d_ff
        return llama_ffn_dim(self.d_model) if self.block == "llama" else 4 * self.d_model

    def with_data(self, vocab_size: int, seq_len: int) -> "ModelSpec":
        """The spec of the model built for data of ``vocab_size`` tokens and ``seq_len``-token windows."""
        return dataclasses.replace(self, vocab_size=int(vocab_size), max_seq_len=max(self.max_seq_len, int(seq_len)))

    def replace(self, **changes: Any) -> "ModelSpec":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ModelSpec":
        """The model fields of ``values`` (a saved model's settings, a full Config's dict); other keys
        are ignored, missing ones take their defaults."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})
