"""Ownership of a run directory: one writer at a time, held by an OS file lock (docs/reliability.md).

A writer takes an exclusive ``flock`` for the life of its process on the run directory itself and on
``RUN_DIR/run.lock`` (for writers of earlier versions, and alone where a directory cannot be locked),
which carries its pid, host and start time; a second writer is refused naming the holder. The OS
drops the lock when the process ends in any way, so no stale lock is left. Deleting ``run.lock``
frees nothing (the directory stays locked): the writer puts it back (``RunLock.refresh``), and until
then ``holder`` names it from the kernel's lock table. Readers never take the lock. Locks are per
open file, so two writers in one process exclude each other too; a file system without ``flock`` is
refused rather than run unprotected.
"""

from __future__ import annotations

import json
import os
import socket
import time
from contextlib import ExitStack, suppress
from pathlib import Path

from evo_attention.util.errors import UserError
from evo_attention.util.files import check_directory_path
from evo_attention.util.format import utc_now

LOCK_NAME = "run.lock"
RETRY_S = 1.0  # a reader probing the lock holds it for microseconds: retry that long before refusing

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None


def _describe(info: dict | None) -> str:
    if not info or info.get("pid") is None:
        return "another process"
    since = f" (since {info['started_at']})" if info.get("started_at") else ""
    return f"process {info.get('pid')} on {info.get('host')}{since}"


def _read_info(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None


class RunLock:
    """The writer's lock of one run directory (a context manager; ``release`` is idempotent)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._dir_fd: int | None = None
        self._fd: int | None = None
        self._info: dict | None = None

    def acquire(self) -> "RunLock":
        if fcntl is None:  # pragma: no cover
            return self
        check_directory_path(self.run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(self.run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError as exc:
            raise UserError(f"cannot take the lock of {self.run_dir}: {exc.strerror}; pick a writable out",
                            setting="out") from None
        with ExitStack() as undo:  # a failure closes what was opened
            undo.callback(os.close, dir_fd)
            if not _lock(dir_fd, self.path, self.run_dir, directory=True):
                undo.close()  # no locks on directories here (some network file systems): the file's alone
                dir_fd = None
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise UserError(f"cannot take the lock {self.path}: {exc.strerror}; pick a writable out",
                                setting="out") from None
            undo.callback(os.close, fd)
            _lock(fd, self.path, self.run_dir)  # a holder of an earlier version locks the file only
            undo.pop_all()
        self._info = {**_this_process(), "started_at": utc_now()}
        self._write(fd)
        self._dir_fd, self._fd = dir_fd, fd
        return self

    def _write(self, fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self._info).encode(), 0)

    def refresh(self) -> None:
        """Put ``run.lock`` back if it was deleted or replaced while this writer holds the run (the
        directory lock never lapsed; this restores the holder's name for readers)."""
        if self._fd is None:
            return
        with suppress(OSError):  # gone: put back below
            if os.path.samestat(os.fstat(self._fd), os.stat(self.path)):
                return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return  # best effort: the directory lock still protects the run
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self._write(fd)
        old, self._fd = self._fd, fd
        os.close(old)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with suppress(OSError):
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    os.ftruncate(fd, 0)  # no holder any more (the lock file itself stays)
            os.close(fd)  # closing releases the flock
        if self._dir_fd is not None:
            fd, self._dir_fd = self._dir_fd, None
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _lock(fd: int, path: Path, run_dir: Path, directory: bool = False) -> bool:
    """Take an exclusive flock on ``fd`` (retrying ``RETRY_S`` seconds: readers probe it briefly).
    A file system that cannot lock a ``directory`` gives False; for a file it is refused."""
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            raise in_use(run_dir, _read_info(path) or _kernel_holder(run_dir)) from None
        except OSError as exc:
            if directory:
                return False
            raise UserError(f"cannot lock {path} ({exc.strerror}): this file system does not support "
                            "file locks; put the run directory on a local disk", setting="out") from None


def _this_process() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def is_this_process(info: dict | None) -> bool:
    """Whether ``info`` (from ``holder``) names the process asking."""
    return bool(info) and {k: info.get(k) for k in ("pid", "host")} == _this_process()


def in_use(run_dir: str | os.PathLike, info: dict | None) -> UserError:
    """The error for a run directory that another process writes."""
    return UserError(f"{run_dir} is in use by {_describe(info)}, which is writing this run: wait for it to finish "
                     "(or stop it), or choose another out", setting="out")


def check_free(run_dir: str | os.PathLike) -> None:
    """UserError naming the holder if a live process writes ``run_dir`` (a check before slower work)."""
    info = holder(run_dir)
    if info is not None:
        raise in_use(run_dir, info)


def holder(run_dir: str | os.PathLike) -> dict | None:
    """The live writer of ``run_dir`` (``{"pid", "host", "started_at"}``), or None when no process
    holds its lock (on the directory, or on ``run.lock`` for a writer of an earlier version). Never
    blocks and never takes the lock for longer than a probe."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    if fcntl is None or not run_dir.is_dir():
        return None
    for target in (run_dir, path):
        try:
            fd = os.open(target, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_info(path) or _kernel_holder(run_dir) or {"pid": None, "host": None, "started_at": None}
            except OSError:
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return None


def _kernel_holder(run_dir: Path) -> dict | None:
    """The process holding a flock on ``run_dir``, from the kernel's lock table (Linux): the name of
    a writer whose ``run.lock`` was deleted."""
    with suppress(OSError, ValueError):
        st = os.stat(run_dir)
        wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            for line in table:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == wanted and parts[4].isdigit():
                    return {"pid": int(parts[4]), "host": socket.gethostname(), "started_at": None}
    return None
