"""Writing files so that a reader never sees half of one, and creating output directories."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from evo_attention.util.errors import UserError


@contextmanager
def atomic_target(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` in one step."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        if path.is_dir():
            raise in_the_way(path, "a directory", "a file")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class InTheWay(UserError):
    """An output's place holds something else: no command goes on past it as if the output were written."""


def in_the_way(path: Path, what: str, wanted: str) -> InTheWay:
    """The one-line refusal of an output whose place ``path`` holds ``what`` instead of ``wanted``."""
    return InTheWay(f"{path} is {what}, where {wanted} goes: move it away (nothing was written there)")


def make_dir(path: str | os.PathLike) -> Path:
    """Create the directory ``path`` and its parents; UserError naming the file in the way if one is."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next(p for p in (path, *path.parents) if p.exists() and not p.is_dir())
        raise in_the_way(blocker, "a file", "a directory") from None
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically."""
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8", newline="\n")
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (parent directories are created)."""
    path = Path(path)
    make_dir(path.parent)
    with atomic_target(path) as tmp:
        tmp.write_bytes(data)
    return path


def write_directory(path: str | os.PathLike, files: dict[str, bytes]) -> Path:
    """Make ``path`` a directory holding exactly ``files`` (name -> bytes), replacing what was there.

    The files are written into a sibling temporary directory that is then renamed into place, so a
    reader sees the old directory, no directory, or the complete new one; never half of it.
    """
    path = Path(path)
    make_dir(path.parent)
    if path.exists() and not path.is_dir():
        raise in_the_way(path, "a file", "a directory")
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


# -- the one rule for what an output may replace ------------------------------------------------
# Names that mark a path as something no output replaces: a run's store and its lock (a locked
# directory holds the lock file), a saved model's weights. Their homes are search/store.py
# (DB_NAME), search/lock.py (LOCK_NAME) and interop/pretrained.py (WEIGHTS); tests/test_reliability.py
# checks that these names agree with them.
PROTECTED = {"run.db": "a run store", "run.lock": "a run directory", "model.safetensors": "a saved model"}
RUN_OWN = ("models", "checkpoints")  # a run's own subdirectories (its kept models, its generation snapshots)
# output kinds that recognise their own directories (registered in interop/ and, for a baseline, in cli/common,
# which every command imports): an output of one kind never goes into another's directory, where its files would mix
OUTPUT_KINDS: dict[str, Callable[[Path], bool]] = {}


def register_output_kind(kind: str, recognizer: Callable[[Path], bool]) -> None:
    """Make ``check_output`` refuse to write any other kind into a directory ``recognizer`` claims."""
    OUTPUT_KINDS[kind] = recognizer


SQLITE_HEADER = b"SQLite format 3\x00"


def protected_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` holds that no output may replace, in words (naming the file that says so), or None."""
    path = Path(path)
    try:
        if path.is_dir():
            for name, what in PROTECTED.items():
                if (path / name).exists():
                    return f"{what} ({path / name})"
            return None
        if path.name in PROTECTED or path.name.startswith(("run.db-", "run.db.")):
            return PROTECTED.get(path.name, "a run store")
        with open(path, "rb") as handle:
            if handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER:
                return "a SQLite database (a run store?)"
    except OSError:
        return None
    return None


def held_output(path: str | os.PathLike) -> str | None:
    """What another command wrote in the directory ``path`` (a run's own subdirectory, an output kind, a
    saved model), in words, or None: said where a command finds no input of its own there."""
    path = Path(path)
    if path.name in RUN_OWN and (path.parent / "run.db").is_file():
        return f"the {path.name} of the run in {path.parent}"
    weights = path / "model.safetensors"
    return next((name for name, claims in OUTPUT_KINDS.items() if claims(path)), None) or (
        f"{PROTECTED[weights.name]} ({weights})" if weights.is_file() else None)


def check_output(path, setting: str = "out", *, kind: str, directory: bool = True,
                 own: Callable[[Path], bool] | None = None, sources: dict | None = None, writes=()) -> Path:
    """``path`` as a Path, if a command may write its output ``kind`` there; else a UserError
    naming ``setting`` and what is there. The rule every command's output path follows:

    - never empty (it would mean the current directory), never under a file;
    - never one of the command's ``sources`` ({name of the input: its path}), what it reads;
    - an existing path of the wrong sort (a file for a directory ``kind`` or the reverse) is refused;
    - an existing file output is replaced only if ``own(path)`` says it is of its own kind (without
      ``own``: never); an existing directory that holds a run store, a run's lock or a saved model
      is refused unless ``own(path)`` says it is of its own kind, and so is one that holds any of
      ``writes`` (the names the output writes into its directory), which it would replace.
    """
    if path is None or not str(os.fspath(path)).strip():
        raise UserError(f"{setting} is empty: give the path of a {'directory' if directory else 'file'}",
                        setting=setting)
    out = Path(path)
    for name, source in (sources or {}).items():
        if source is not None and _same(out, Path(source)):
            raise UserError(f"{setting} {out} is the {name} this command reads: writing {kind} there would "
                            f"destroy it; choose another {setting}", setting=setting)
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{parent} is a file, not a directory: {setting} {out} cannot be created under it",
                                setting=setting)
            break
    if not out.exists():
        return out
    if directory and not out.is_dir():
        raise UserError(f"{out} is not a directory: give the path of a directory as {setting}", setting=setting)
    if not directory and out.is_dir():
        raise UserError(f"{out} is a directory: give the path of the file to write ({kind}) as {setting}", setting=setting)
    if own is not None and own(out):
        return out
    if out.is_dir() and out.name in RUN_OWN and (out.parent / "run.db").is_file():
        raise UserError(f"{setting} {out} is the {out.name} directory of the run in {out.parent}: the run writes it; "
                        f"choose another {setting}", setting=setting)
    other = next((name for name, claims in OUTPUT_KINDS.items() if name != kind and claims(out)), None)
    if other is not None:
        raise UserError(f"{setting} {out} holds {other}, not {kind}: their files would mix; choose another {setting} "
                        "(or remove it)", setting=setting)
    what = protected_kind(out)
    if what is not None:
        raise UserError(f"{setting} {out} holds {what}, not {kind}: writing there would destroy it; "
                        f"choose another {setting}", setting=setting)
    if not directory:
        raise UserError(f"{setting} {out} exists and is not {kind} this tool wrote: it is never replaced; "
                        f"remove it or choose another {setting}", setting=setting)
    theirs = [name for name in writes if (out / name).exists()]
    if theirs:
        raise UserError(f"{setting} {out} holds {', '.join(theirs)}, which writing {kind} there would replace: "
                        f"choose another {setting} (an empty directory)", setting=setting)
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
