"""The cache of measured answers per machine: probes of a model shape (precision, models per batch).

A probe times the real training engine once per machine and shape and keeps its answer in
``EVO_ATTENTION_CACHE_DIR`` (``data.cache.resolve_cache_dir``), so every later training of that shape
on the machine resolves the same way. One file per probe kind, version, device type, CPU model,
thread count, torch version and shape (``probe_path``); the file is created once and never replaced
(``write_probe_once``), so two processes probing at once both use the first answer written.
``forget_probes`` removes the kept answers (``evo-attention bench --reprobe``), so the next
training of each shape measures again.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from evo_attention.data.base import fingerprint_of
from evo_attention.data.cache import resolve_cache_dir


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_shape(spec, seq_len: int, batch_size: int) -> dict:
    """What a probe of a shape depends on: the model's sizes, the tokens of a step, the batch."""
    return {"d_model": spec.d_model, "n_heads": spec.n_heads, "n_layers": spec.n_layers, "ffn_dim": spec.ffn_dim,
            "block": getattr(spec, "block", "gpt2"), "dropout": spec.dropout, "vocab_size": spec.vocab_size,
            "max_seq_len": spec.max_seq_len, "seq_len": int(seq_len), "batch_size": int(batch_size)}


def probe_path(shape: dict, device: torch.device, *, kind: str, version: int) -> Path:
    """The cache file of a probe of ``kind`` (its file name's prefix) for ``shape`` on this machine."""
    key = fingerprint_of({"v": version, "device": device.type, "cpu": cpu_name(),
                          "threads": torch.get_num_threads(), "torch": torch.__version__, "shape": shape})
    return resolve_cache_dir() / f"{kind}-{key[:16]}.json"


def read_probe(path: Path, valid: Callable[[dict], bool]) -> dict | None:
    """The entry a probe's cache file holds, or None where it is missing, unreadable or not ``valid``."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and valid(entry) else None


def write_probe_once(path: Path, entry: dict, valid: Callable[[dict], bool]) -> dict:
    """Create ``path`` holding ``entry`` unless it exists; the entry the file holds afterwards."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entry, sort_keys=True) + "\n")
        os.link(tmp, path)  # atomic, and fails where another process was first
    except FileExistsError:
        pass
    except OSError:
        return entry  # no cache here: this process keeps its own answer
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass
    return read_probe(path, valid) or entry


PROBE_KINDS = ("precision", "batch-models", "matmul-peak")


def forget_probe(path: Path) -> None:
    """Remove one kept answer (nothing if there is none)."""
    path.unlink(missing_ok=True)


def forget_probes(kinds=PROBE_KINDS) -> list[Path]:
    """Remove every kept answer of ``kinds`` from the cache directory; the files removed."""
    root = resolve_cache_dir()
    found = [p for kind in kinds for p in sorted(root.glob(f"{kind}-*.json"))] if root.is_dir() else []
    for path in found:
        forget_probe(path)
    return found
