"""Hugging Face ``datasets`` as a corpus: ``hf:NAME[:CONFIG]`` from the hub, ``hf:/path`` (or any
existing path) for a dataset saved with ``save_to_disk``.

Splits are mapped by name: ``train``; ``validation``, ``valid`` or ``dev``; ``test``. Each row's text
field (``text_field``, default ``text``) becomes one line of the split's text, which is then
tokenized like any corpus (``corpus.corpus_from_texts``, with the token cache). ``datasets`` is an
optional extra (``pip install -e ".[hf]"``).
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import getproxies

from evo_attention.util.errors import UserError

SPLIT_NAMES = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}
PREFIX = "hf:"


def is_hf(name: str) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def _library():
    try:
        import datasets
    except ImportError:
        raise UserError('data hf:... needs Hugging Face datasets: pip install -e ".[hf]"', setting="data") from None
    return datasets


def hub_unreachable(datasets, cached: str) -> str | None:
    """Why the Hugging Face hub is not reachable within 3 s; None when it is, in offline mode, when the
    dataset's folder ``cached`` is in the datasets cache, or behind a proxy (which a direct connect would
    not pass). Without this check an offline machine waits ~40 s while the hub client logs its retries,
    then fails all the same."""
    config = getattr(datasets, "config", None)
    cache = getattr(config, "HF_DATASETS_CACHE", None)
    if getattr(config, "HF_HUB_OFFLINE", False) or (cache and Path(cache, cached).is_dir()) or getproxies():
        return None
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=3).close()
    except OSError as exc:
        return f"the Hugging Face hub {url.hostname}:{port} cannot be reached: {exc}"
    return None


def read_hf(spec: str, text_field: str = "text") -> tuple[str, dict]:
    """(source, {split: (text, sha256 of its UTF-8 bytes, where)}) of the dataset ``spec`` (``hf:...``)."""
    datasets = _library()
    target = spec[len(PREFIX):].strip()
    if not target:
        raise UserError("data hf: names no dataset: write hf:NAME, hf:NAME:CONFIG or hf:/path/to/saved", setting="data")
    try:
        if target.startswith(("/", ".", "~")) or Path(target).expanduser().exists():
            path = Path(target).expanduser()
            if not path.exists():
                raise UserError(f"no saved dataset at {path}: give the directory written by save_to_disk",
                                setting="data")
            loaded = datasets.load_from_disk(str(path))
        else:
            name, _, config = target.partition(":")
            if reason := hub_unreachable(datasets, "___".join(name.split("/"))):
                raise UserError(f"cannot load {spec} with Hugging Face datasets ({reason})", setting="data")
            loaded = datasets.load_dataset(name, config or None)
    except UserError:
        raise
    except Exception as exc:  # no network, unknown name, not a saved dataset: never substitute other data
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        raise UserError(f"cannot load {spec} with Hugging Face datasets ({type(exc).__name__}: {reason})",
                        setting="data") from None
    if not hasattr(loaded, "keys"):
        raise UserError(f"{spec} is a single split, not a dataset with train/validation/test splits: save a "
                        "DatasetDict", setting="data")
    available = list(loaded.keys())
    texts = {}
    for split, names in SPLIT_NAMES.items():
        found = next((n for n in names if n in loaded), None)
        if found is None:
            raise UserError(f"{spec} has no {split} split (looked for {', '.join(names)}; it has "
                            f"{', '.join(available) or 'none'}): add it to the dataset", setting="data")
        columns = loaded[found].column_names
        if text_field not in columns:
            raise UserError(f"{spec} split {found} has no text field {text_field!r} (its columns are "
                            f"{', '.join(columns)}): choose one with text_field", setting="text_field")
        rows = loaded[found][text_field]
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, str)), None)
        if bad is not None:
            raise UserError(f"{spec} split {found} row {bad}: {text_field} is {rows[bad]!r}, not text: choose a text "
                            "column with text_field, or drop the rows without text", setting="text_field")
        text = "".join(row if row.endswith("\n") else f"{row}\n" for row in rows)  # one line per row
        texts[split] = (text, hashlib.sha256(text.encode("utf-8")).hexdigest(), f"{spec} {found}")
    return spec, texts
