"""Ownership of a run directory: one writer at a time, held by an OS file lock.

A search (new, ``resume`` or ``overwrite``) takes ``RUN_DIR/run.lock`` with ``flock`` for the life of
its process and writes its pid, host and start time into the file. A second writer is refused with
a one-line message naming the holder. The operating system releases the lock when the process
ends in any way (exit, crash, SIGKILL, power loss), so a lock left by a dead process is simply
taken by the next writer: there is no stale lock to clean up. Readers (``status``, ``report``)
never take the lock; ``holder(run_dir)`` tells them whether a live process writes the run.

Locks are per open file: two searches in one process exclude each other too. On a file system
without ``flock`` (some network mounts) the lock cannot be taken and the writer is refused with a
message that says so, rather than running unprotected.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path

from evo_attention.util.errors import UserError

LOCK_NAME = "run.lock"
RETRY_S = 1.0  # a reader probing the lock holds it for microseconds: retry that long before refusing

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None


def _describe(info: dict | None) -> str:
    if not info:
        return "another process"
    return f"process {info.get('pid')} on {info.get('host')} (since {info.get('started_at')})"


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
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        if fcntl is None:  # pragma: no cover
            return self
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(f"cannot take the lock {self.path}: {exc.strerror}; pick a writable out",
                            setting="out") from None
        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                os.close(fd)
                raise in_use(self.run_dir, _read_info(self.path)) from None
            except OSError as exc:
                os.close(fd)
                raise UserError(f"cannot lock {self.path} ({exc.strerror}): this file system does not support "
                                "file locks; put the run directory on a local disk", setting="out") from None
        info = {**_this_process(), "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)  # no holder any more (the lock file itself stays)
            except OSError:
                pass
            os.close(fd)  # closing releases the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _this_process() -> dict:
    """How a lock file names its holder: pid and host."""
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
    holds its lock. Never blocks and never takes the lock for longer than a probe."""
    path = Path(run_dir) / LOCK_NAME
    if fcntl is None or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_info(path) or {"pid": None, "host": None, "started_at": None}
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
