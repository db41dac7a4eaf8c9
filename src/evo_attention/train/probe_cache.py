"""The cache of measured answers per machine: probes of a model shape (precision, models per batch).

A probe times the real training engine once per machine and shape and keeps its answer in
``EVO_ATTENTION_CACHE_DIR``, so every later training of that shape there resolves the same way. One
file per probe kind, version, device type, CPU model, cores (not the threads a training took: a
machine's answer never follows its load), torch version and shape (``probe_path``).
``forget_probes`` removes the kept answers (``evo-attention bench --reprobe``).

An answer decides a result (a training's precision, the models per batch), so a run pins the answers
it used (``pin_probes``: the run store's meta, handed to every worker; ``used_probes``, which the
trainer adds to its records): a pinned answer is used whatever the file says now, and a file whose
answer decides otherwise is reported once, never used. Processes measure a missing or damaged answer
one at a time (a lock beside the file); a damaged file is replaced and reported once; an unwritable
cache directory is reported once (every process then measures for itself). A file written without
the lock is created once, never replaced (``write_probe_once``): the first answer written wins.

Answers expire ``MAX_AGE_DAYS`` after their ``measured_at`` (none: an older version's), so a machine
that changed is measured again without ``--reprobe``; a run's pinned answers never expire within it.
"""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from contextlib import contextmanager, suppress
from collections.abc import Callable
from pathlib import Path

import torch

from evo_attention.data.base import fingerprint_of
from evo_attention.data.cache import resolve_cache_dir
from evo_attention.util.threads import cores


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` says."""
    with suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def probe_shape(spec, seq_len: int, batch_size: int, dropout_stream: str = "cpu") -> dict:
    """What a probe of a shape depends on: the model's sizes, the tokens of a step, the batch, and
    the dropout stream whose masks its steps draw (named only when not the default ``cpu``, so the
    default's cache files keep their names)."""
    shape = {"d_model": spec.d_model, "n_heads": spec.n_heads, "n_layers": spec.n_layers, "ffn_dim": spec.ffn_dim,
             "block": getattr(spec, "block", "gpt2"), "dropout": spec.dropout, "vocab_size": spec.vocab_size,
             "max_seq_len": spec.max_seq_len, "seq_len": int(seq_len), "batch_size": int(batch_size)}
    if dropout_stream != "cpu":
        shape["dropout_stream"] = dropout_stream
    return shape


def probe_path(shape: dict, device: torch.device, *, kind: str, version: int) -> Path:
    """The cache file of a probe of ``kind`` (its file name's prefix) for ``shape`` on this machine."""
    fields = {"v": version, "device": device.type, "cpu": cpu_name(), "torch": torch.__version__, "shape": shape}
    name = f"{kind}-{fingerprint_of({**fields, 'cores': cores()})[:16]}.json"
    # the name a run pinned before probes were keyed on cores (on this thread count): such a run resumes on it
    _LEGACY[name] = f"{kind}-{fingerprint_of({**fields, 'threads': torch.get_num_threads()})[:16]}.json"
    return resolve_cache_dir() / name


_PINNED: dict[str, dict] = {}  # probe file name -> the answer the run in this process pinned
_USED: dict[str, dict] = {}  # probe file name -> the answer this process used
_LEGACY: dict[str, str] = {}  # probe file name -> its name keyed on the thread count (``probe_path``)
_WARNED: set[str] = set()


def pin_probes(entries: dict | None) -> None:
    """Make ``entries`` ({probe file name: answer}, a run's pinned answers) this process's answers."""
    _PINNED.clear()
    _PINNED.update(entries or {})


def pinned_probes() -> dict:
    return dict(_PINNED)


def used_probes() -> dict:  # the answers this process used, by probe file name
    return dict(_USED)


def warn_damaged(path: Path) -> None:
    """Say once that the kept answer in ``path`` cannot be read (it is measured again and replaced)."""
    warn_once(f"damaged:{path}", f"the probe answer in {path} is damaged: measured again and replaced")


def warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, stacklevel=3)


def read_probe(path: Path, valid: Callable[[dict], bool]) -> dict | None:
    """The entry a probe's cache file holds, or None where it is missing, unreadable or not ``valid``."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and valid(entry) else None


def probe_answer(path: Path, valid: Callable[[dict], bool], measure: Callable[[], dict],
                 keep: Callable[[dict], bool] = lambda entry: True,
                 decides: Callable[[dict], object] = lambda entry: entry) -> tuple[dict, bool]:
    """The answer of the probe kept in ``path`` and whether it is kept: the run's pinned answer, else
    the file's, else ``measure()``d now (one process at a time) and written if ``keep(entry)``.
    ``decides(entry)``: what of an entry decides a result (only a difference there is reported)."""
    pinned = _PINNED.get(path.name, _PINNED.get(_LEGACY.get(path.name, "")))
    if pinned is not None and valid(pinned):
        there = read_probe(path, valid)
        if there is not None and decides(there) != decides(pinned):
            warn_once(f"pinned:{path}", f"the probe answer in {path} differs from the one this run pinned at its "
                      "first use: the run keeps its own answer (its results stay comparable)")
        _USED[path.name] = pinned
        return pinned, True
    with _exclusive(path):
        found = read_probe(path, valid)
        if found is not None and expired(found):
            found = None  # measured again below, and replaced
        elif found is None and path.exists():
            warn_damaged(path)
        if found is None:
            entry = measure()
            if not keep(entry):  # this process's alone (and its run's, which pins it)
                _USED[path.name] = entry
                return entry, False
            found = _write(path, entry)
    _USED[path.name] = found
    return found, True


@contextmanager
def _exclusive(path: Path):
    """Hold an exclusive lock beside ``path`` (nothing where the directory cannot be written)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        _unwritable(path, exc)
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _unwritable(path: Path, exc: OSError) -> None:
    warn_once(f"unwritable:{path.parent}", f"cannot keep probe answers in {path.parent} ({exc.strerror or exc}): "
              "every process measures for itself; set EVO_ATTENTION_CACHE_DIR to a writable directory")


MAX_AGE_DAYS = 30


def expired(entry: dict, now: float | None = None) -> bool:
    """Whether a kept answer is older than ``MAX_AGE_DAYS`` (or carries no ``measured_at``)."""
    measured = entry.get("measured_at")
    if not isinstance(measured, (int, float)) or isinstance(measured, bool):
        return True
    return ((time.time() if now is None else now) - measured) > MAX_AGE_DAYS * 86400


def _stamped(entry: dict) -> dict:
    return {**entry, "measured_at": entry.get("measured_at", round(time.time()))}


@contextmanager
def _temporary(path: Path, entry: dict):
    """``entry`` written to a temporary file beside ``path``, removed afterwards whatever happened: a
    file that appears at ``path`` in one step (``os.replace`` or ``os.link``) is whole."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(entry, sort_keys=True) + "\n")
        yield tmp
    finally:
        with suppress(OSError):
            tmp.unlink()


def _write(path: Path, entry: dict) -> dict:
    """Write ``entry`` (stamped with ``measured_at``) to ``path`` in one step (the caller holds the
    lock); the entry written."""
    entry = _stamped(entry)
    try:
        with _temporary(path, entry) as tmp:
            os.replace(tmp, path)
    except OSError as exc:
        _unwritable(path, exc)
    return entry


def write_probe_once(path: Path, entry: dict, valid: Callable[[dict], bool]) -> dict:
    """Create ``path`` holding ``entry`` (stamped with ``measured_at``) unless it exists; the entry
    the file holds afterwards."""
    entry = _stamped(entry)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _temporary(path, entry) as tmp:
            os.link(tmp, path)  # atomic, and fails where another process was first
    except FileExistsError:
        pass
    except OSError:
        return entry  # no cache here: this process keeps its own answer
    return read_probe(path, valid) or entry


PROBE_KINDS = ("precision", "batch-models", "matmul-peak")


def forget_probes(kinds=PROBE_KINDS) -> list[Path]:
    """Remove every kept answer of ``kinds`` from the cache directory; the files removed."""
    root = resolve_cache_dir()
    found = [p for kind in kinds for p in sorted(root.glob(f"{kind}-*.json"))] if root.is_dir() else []
    for path in found:
        path.unlink(missing_ok=True)
    return found
