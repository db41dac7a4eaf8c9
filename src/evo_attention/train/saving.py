"""Save a trained model with its training Config; load it back (the format: ``nn/pretrained.py``).

    save_model(model, "out/model", vocab=data.vocab)   # -> config.json, model.safetensors, tokenizer.json
    model = load_model("out/model")                    # a TinyTransformer whose .config is a Config

``config.json`` holds the per-layer gene keys, the Config, the checksum of every other file and
whatever ``extra`` the caller adds (a search's kept models add their evaluation), so a discovered
mechanism is usable after the run without the search code that found it.
"""

from __future__ import annotations

from pathlib import Path

from evo_attention.nn import pretrained
from evo_attention.nn.model import TinyTransformer
from evo_attention.train.config import Config


def _tokenizer(vocab=None, tokenizer=None):
    """What a model directory stores: the data's tokenizer, else its vocabulary (word-level)."""
    return tokenizer if tokenizer is not None else vocab


def model_files(model: TinyTransformer, *, vocab=None, tokenizer=None, extra: dict | None = None) -> dict[str, bytes]:
    """The files of ``model``'s directory as bytes (see ``nn.pretrained.model_files``)."""
    return pretrained.model_files(model, tokenizer=_tokenizer(vocab, tokenizer), extra=extra)


def save_model(model: TinyTransformer, directory: str | Path, *, vocab=None, tokenizer=None,
               extra: dict | None = None) -> Path:
    return model.save_pretrained(directory, tokenizer=_tokenizer(vocab, tokenizer), extra=extra)


def config_from_saved(values: dict) -> Config:
    """The training Config of a saved model's stored settings."""
    return Config.from_dict(values, source=f"a saved model's {pretrained.CONFIG}")


def load_model(directory: str | Path, device: str = "cpu") -> TinyTransformer:
    """The model saved in ``directory`` with its Config (UserError naming a missing or altered file)."""
    return TinyTransformer.from_pretrained(directory, device=device, settings=config_from_saved)


def load_tokenizer(directory: str | Path):
    """The tokenizer saved with a model (a word tokenizer over its vocabulary), or None."""
    return pretrained.load_tokenizer(directory)


def load_vocab(directory: str | Path):
    """The word vocabulary saved with a model, or None (character, byte and BPE models have none)."""
    return getattr(load_tokenizer(directory), "vocab", None)


def saved_info(directory: str | Path) -> dict:
    """config.json of a saved model (checked), e.g. its ``genes``, ``config`` and ``result``."""
    return pretrained.read_config(directory)
