"""Save a trained model with its training Config; load it back (the format: ``interop/pretrained.py``).

    save_model(model, "out/model", vocab=data.vocab, settings=trial.config_dict(model.spec))
    model = load_model("out/model")   # built from its ModelSpec; model.config: the training Config

``config.json`` holds the per-layer gene keys, the Config (the ``settings`` given, the others at
their defaults; without settings, the model's ``ModelSpec``), the checksum of every other file and
whatever ``extra`` the caller adds (a search's kept models add their evaluation), so a discovered
mechanism is usable after the run without the search code that found it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from evo_attention.interop import pretrained
from evo_attention.nn.model import TinyTransformer
from evo_attention.train.config import Config
from evo_attention.util.errors import UserError


def saved_settings(settings: Config | Mapping[str, Any] | None) -> dict | None:
    """The whole Config's dict of ``settings`` (a Config or some of its keys: ``Trial.config_dict``)."""
    if settings is None:
        return None
    return (settings if isinstance(settings, Config) else Config.from_dict(settings, source="settings")).to_dict()


def model_files(model: TinyTransformer, *, vocab=None, tokenizer=None, settings=None,
                extra: dict | None = None) -> dict[str, bytes]:
    """The files of ``model``'s directory as bytes (see ``interop.pretrained.model_files``); it stores the
    data's ``tokenizer``, else its ``vocab`` (word-level)."""
    return pretrained.model_files(model, tokenizer=vocab if tokenizer is None else tokenizer,
                                  settings=saved_settings(settings), extra=extra)


def save_model(model: TinyTransformer, directory: str | Path, *, vocab=None, tokenizer=None, settings=None,
               extra: dict | None = None) -> Path:
    return pretrained.save_pretrained(model, directory, tokenizer=vocab if tokenizer is None else tokenizer,
                                      settings=saved_settings(settings), extra=extra)


def load_config(directory: str | Path, *, verify: bool = True) -> Config:
    """The training Config a model directory was saved with (the settings it lacks at their defaults)."""
    values = pretrained.read_config(directory, verify=verify)["config"]
    try:
        return Config.from_dict(values, source=f"a saved model's {pretrained.CONFIG}")
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{Path(directory) / pretrained.CONFIG} does not describe a model this version can build "
                        f"({str(exc).splitlines()[0][:200]}): save the model again") from None


def load_model(directory: str | Path, device: str = "cpu") -> TinyTransformer:
    """The model saved in ``directory`` (UserError naming a missing or altered file), built from its
    ``ModelSpec``; its ``config`` is the training Config it was saved with (``load_config``)."""
    model = pretrained.from_pretrained(directory, device=device)
    model.config = load_config(directory, verify=False)
    return model


def load_tokenizer(directory: str | Path):
    """The tokenizer saved with a model (a word tokenizer over its vocabulary), or None."""
    return pretrained.load_tokenizer(directory)


def saved_info(directory: str | Path) -> dict:
    """config.json of a saved model (checked), e.g. its ``genes``, ``config`` and ``result``."""
    return pretrained.read_config(directory)


def saved_plugins(directory: str | Path) -> list[str]:
    """The plugins of the training a model directory was saved from (its Config's ``plugins``): load
    them (``util.plugins.load_plugins``) before the model, whose genes may name their ops and components."""
    plugins = pretrained.read_config(directory, verify=False)["config"].get("plugins") or []
    return [p for p in plugins if isinstance(p, str)] if isinstance(plugins, list) else []
