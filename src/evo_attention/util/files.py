"""Writing files so that a reader never sees half of one, and creating output directories."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from evo_attention.util.errors import UserError


@contextmanager
def atomic_target(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` in one step."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically."""
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8", newline="\n")
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (parent directories are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_target(path) as tmp:
        tmp.write_bytes(data)
    return path


def write_directory(path: str | os.PathLike, files: dict[str, bytes]) -> Path:
    """Make ``path`` a directory holding exactly ``files`` (name -> bytes), replacing what was there.

    The files are written into a sibling temporary directory that is then renamed into place, so a
    reader sees the old directory, no directory, or the complete new one; never half of it.
    """
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def check_directory_path(path, setting: str = "out") -> Path:
    """``path`` as a Path; UserError naming ``setting`` if it is empty (which would mean the current
    directory) or names something that exists and is not a directory."""
    if path is None or not str(os.fspath(path)).strip():
        raise UserError(f"{setting} is empty: give the path of a directory", setting=setting)
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is not a directory: give the path of a directory as {setting}", setting=setting)
    return out


def output_dir(path: str | os.PathLike, setting: str = "out") -> Path:
    """Create the directory ``path`` (and its parents); UserError naming ``setting`` if it cannot be."""
    out = check_directory_path(path, setting)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output directory {out}: {exc.strerror}; pick a writable {setting}") from None
    return out
