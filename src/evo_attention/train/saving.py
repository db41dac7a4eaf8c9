"""Save a trained model as safetensors with its gene(s) and config beside it; load it back.

    save_model(model, "out/model")          # -> out/model/model.safetensors + model.json
    model = load_model("out/model")         # a TinyTransformer, ready to use

``model.json`` holds the per-layer gene keys, the Config and (when given) the vocabulary or, for a
character, byte or BPE model, the tokenizer, so a discovered mechanism is usable after the run
without the search code that found it.
"""

from __future__ import annotations

import json
from pathlib import Path

from evo_attention.train.config import Config
from evo_attention.util.errors import UserError
from evo_attention.genes import AttentionGene
from evo_attention.nn.model import TinyTransformer

WEIGHTS = "model.safetensors"
META = "model.json"


def save_model(model: TinyTransformer, directory: str | Path, *, vocab=None, tokenizer=None,
               extra: dict | None = None) -> Path:
    from safetensors.torch import save_model as _save

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": "evo-attention-model/1",
        "genes": [g.key for g in model.genes],
        "config": model.config.to_dict(),
        "vocab": None if vocab is None else json.loads(vocab.to_json()),
        **({} if tokenizer is None or vocab is not None else {"tokenizer": json.loads(tokenizer.to_json())}),
        **(extra or {}),
    }
    _save(model, str(directory / WEIGHTS))
    (directory / META).write_text(json.dumps(meta, indent=2))
    return directory


def load_model(directory: str | Path, device: str = "cpu") -> TinyTransformer:
    from safetensors.torch import load_model as _load

    directory = Path(directory)
    if not (directory / WEIGHTS).is_file() or not (directory / META).is_file():
        raise UserError(f"no saved model in {directory}: expected {WEIGHTS} and {META} (save one with save_model)",
                        setting="save_model")
    try:
        meta = json.loads((directory / META).read_text())
        config = Config.from_dict(meta["config"], source=str(directory / META))
        genes = [AttentionGene.parse(k) for k in meta["genes"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read {directory / META} ({type(exc).__name__}: {str(exc)[:200]}): save the model "
                        "again or restore the directory") from None
    model = TinyTransformer(config, genes)
    try:
        _load(model, str(directory / WEIGHTS), device=device)
    except Exception as exc:  # safetensors' own errors, a size mismatch (RuntimeError), a truncated file (OSError)
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UserError(f"{directory / WEIGHTS} is damaged or does not match {META} ({reason}): save the model again "
                        "or restore the directory") from None
    return model.to(device).eval()


def load_vocab(directory: str | Path):
    """The vocabulary saved with a model, or None."""
    from evo_attention.data.vocab import Vocab

    meta = json.loads((Path(directory) / META).read_text())
    return None if meta.get("vocab") is None else Vocab.from_json(meta["vocab"])


def load_tokenizer(directory: str | Path):
    """The tokenizer saved with a model (a word tokenizer over its vocabulary), or None."""
    from evo_attention.data.tokenizers import WordTokenizer, tokenizer_from_json

    meta = json.loads((Path(directory) / META).read_text())
    if meta.get("tokenizer") is not None:
        return tokenizer_from_json(meta["tokenizer"])
    vocab = load_vocab(directory)
    return None if vocab is None else WordTokenizer(vocab)
