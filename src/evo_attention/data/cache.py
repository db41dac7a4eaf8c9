"""On-disk cache of tokenized corpora.

A tokenized corpus (one token stream per split plus its tokenizer) is one file,
``<cache dir>/tokens-<key>.pt``, the key being the sha256 of everything the result depends on
(``cache_key``). Streams are stored as int32 and handed back as int64. Files are written to a
temporary name and moved into place with ``os.replace``, so concurrent workers never see a
half-written file. Each entry holds the sha256 of its key, tokenizer, streams and byte counts
(``_checksum``): torch's zip reader checks no CRC, so a damaged byte would load as other data; an
entry that does not match (or holds no checksum: an older one) is rebuilt, not trusted. A cache
that cannot be written only costs time: it warns and carries on.
The directory is the ``cache_dir`` argument, else ``$EVO_ATTENTION_CACHE_DIR``, else
``~/.cache/evo-attention``.
"""

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import torch

from evo_attention.data.base import SPLITS, fingerprint_of

ENV_CACHE_DIR = "EVO_ATTENTION_CACHE_DIR"
FORMAT_VERSION = 1


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory the cache lives in (it is created on first write)."""
    chosen = cache_dir or os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "evo-attention"
    return Path(chosen).expanduser()


def cache_key(file_hashes: dict[str, str], vocab_size: int | None, recipe_version: int,
              tokenizer: str | None = None) -> str:
    """Hex sha256 naming one tokenization result; also the corpus fingerprint. The word recipe
    (``tokenizer`` None) has the key it always had."""
    identity = {"files": file_hashes, "vocab_size": vocab_size, "recipe": recipe_version, "cache_format": FORMAT_VERSION}
    if tokenizer is not None:
        identity["tokenizer"] = tokenizer
    return fingerprint_of(identity)


def _path(directory: Path, key: str) -> Path:
    return directory / f"tokens-{key}.pt"


def load(directory: Path, key: str) -> tuple[dict[str, torch.Tensor], str, dict] | None:
    """(streams as int64, tokenizer or vocab JSON, split -> (bytes, chars) per token) for ``key``,
    or None on a miss, an unreadable entry or one written before byte counts were kept."""
    path = _path(directory, key)
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload.get("key") != key:
            raise ValueError("key mismatch")
        if "checksum" not in payload:
            return None  # an entry of an older version: tokenized again (same ids) and rewritten
        if payload["checksum"] != _checksum(payload):
            raise ValueError("checksum mismatch")
        streams = {split: payload["streams"][split].long() for split in SPLITS}
        return streams, payload["vocab"], {split: tuple(payload["sizes"][split]) for split in SPLITS}
    except Exception as e:  # a damaged entry is rebuilt, not trusted
        warnings.warn(f"ignoring unreadable cache file {path} ({type(e).__name__}); rebuilding it")
        return None


def save(directory: Path, key: str, streams: dict[str, torch.Tensor], vocab_json: str, sizes: dict) -> Path | None:
    """Atomically write one entry; returns its path, or None (with a warning) if it cannot."""
    payload = {"key": key, "vocab": vocab_json,
               "streams": {split: t.to(torch.int32) for split, t in streams.items()},
               "sizes": {split: (b.to(torch.int32), c.to(torch.int32)) for split, (b, c) in sizes.items()}}
    payload["checksum"] = _checksum(payload)
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".tokens-{key[:12]}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache may be shared
        os.replace(tmp, _path(directory, key))
        return _path(directory, key)
    except OSError as e:
        warnings.warn(f"could not write the tokenization cache in {directory} ({e.strerror or e}); "
                      f"set {ENV_CACHE_DIR} to a writable directory to speed up later runs")
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        return None


def _checksum(payload: dict) -> str:
    """sha256 of an entry's key, tokenizer, split lengths, streams and byte counts (all three splits,
    each a stream and its bytes and characters per token, as the int32 they are stored as)."""
    streams, sizes = payload["streams"], payload["sizes"]
    header = [payload["key"], payload["vocab"], sorted(streams), sorted(sizes), [len(streams[s]) for s in SPLITS]]
    digest = hashlib.sha256(json.dumps(header).encode())
    for split in SPLITS:
        for t in (streams[split], *sizes[split]):
            digest.update(t.to(torch.int32).contiguous().numpy().tobytes())
    return digest.hexdigest()
