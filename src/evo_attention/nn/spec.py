"""ModelSpec: the shape of one model, as a frozen value (nanoGPT's ``GPTConfig``).

A ``TinyTransformer`` is built from one (``Config.model``, a saved model's ``config.json``, a
``train.spec.Trial``'s). Each field is declared once, here, with its default, its part in a trial's
key and its flag (``setting``); the flat ``Config`` takes them from here. Derived sizes are computed
here and nowhere else (``ffn_dim``). ``vocab_size`` is None until the data is known (``with_data``).

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

BLOCKS = ("gpt2", "llama")
LLAMA_FFN_MULTIPLE = 8  # the SwiGLU width is rounded up to a multiple of this
FAVOR_FEATURES_DEFAULT = 64
SHORT_CONV_WIDTHS = range(2, 9)  # the widths of a causal convolution of the attention input (short_conv)


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


def setting(default: Any = None, *, flag: str | None = None, help: Any = None, parse: str | None = None,
            choices: Any = None, metavar: str | None = None, group: str | None = None, after: str | None = None,
            factory: Callable | None = None, key: bool = True, omit_default: bool = False, compare: bool = True):
    """A field of a spec or of ``train.config.Config`` (which takes the specs' fields, ``group`` the
    spec's), declared once: its default, its part in a trial's key (``identity``) and how the front
    door reads it. ``cli.common`` makes the flag ``--flag`` with ``help``, ``choices`` (either may be
    a function: a table that grows), ``metavar`` and the parser ``parse`` (``int``, ``float``,
    ``str``, ``list``, or ``count_or_all`` and ``vocab``: 0 and 'all'/'full' stand for None).
    ``after``: the field the Config lists this one after (the key order of stored configs)."""
    metadata = {**identity(key=key, omit_default=omit_default), "group": group, "flag": flag, "help": help,
                "parse": parse, "choices": choices, "metavar": metavar, "after": after}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata, compare=compare)
    return field(default=default, metadata=metadata, compare=compare)


def whole_floats(spec) -> None:
    """A spec's ``__post_init__``: a float field given a whole number (an int, not a bool) holds it as the
    float, so 1 and 1.0, equal settings, give one trial key (its hash is of the JSON, which writes 1 and 1.0)."""
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.type in (float, "float") and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(spec, f.name, float(value))


@dataclass(frozen=True)
class ModelSpec:
    # key=False: known through the data fingerprint
    vocab_size: int | None = setting(10000, flag="vocab-size", parse="vocab", key=False,
                                     help="vocabulary size, or 'full' for every training word")
    d_model: int = setting(128, flag="d-model", parse="int")
    n_heads: int = setting(4, flag="heads", parse="int")
    n_layers: int = setting(2, flag="layers", parse="int")
    max_seq_len: int = setting(128, flag="seq-len", parse="int", help="tokens per window (max_seq_len)")
    dropout: float = setting(0.1, flag="dropout", parse="float")
    d_ff: int | None = setting(None, flag="ffn", parse="int",
                               help="feed-forward width (default 4 x d_model; about 8/3 x d_model with --block llama)")
    block: str = setting("gpt2", flag="block", parse="str", choices=BLOCKS, omit_default=True,
                         help="the block around the attention: gpt2 (LayerNorm + GELU, the default) or llama "
                              "(RMSNorm + SwiGLU, no feed-forward biases)")
    favor_features: int = setting(FAVOR_FEATURES_DEFAULT, flag="favor-features", parse="int", omit_default=True,
                                  help="random features per head of normalization favor (default 64)")
    short_conv: int = setting(0, flag="short-conv", parse="int", omit_default=True,
                              help="width W (2-8) of a depthwise causal convolution along time over the channels "
                                   "of each attention's input, before its projections (Zoology's short "
                                   "convolution); 0: none (the default)")
    __post_init__ = whole_floats

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
