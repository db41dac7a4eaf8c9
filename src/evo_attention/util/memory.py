"""The machine's available memory, and the one-line refusal of work estimated not to fit in it.

``available_memory()`` is what a new allocation could still take here; a limit on this process
(``ulimit -v``, ``-d``) lowers it, since beyond that an allocation fails however much the machine has
free. ``check_memory`` compares an estimate made before anything is built with it, so a task or
model that cannot fit is refused in one line naming the setting and what to do, never a raw
allocator error or the OOM killer minutes later. An unknown amount refuses nothing: the allocation
itself then fails, and the caller names it (``refuse_failed_allocation``).
"""

from __future__ import annotations

import contextlib
import os

from evo_attention.util.errors import UserError

# each resource limit of a process's memory, with the /proc/self/status field it is measured against
PROCESS_LIMITS = (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData"))


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation in this process: the machine's available
    memory, lowered to what a process limit leaves; None if neither is known."""
    return min((n for n in (machine_memory(), limit_headroom()) if n is not None), default=None)


def limit_headroom() -> int | None:
    """Bytes the tightest of this process's memory limits (``PROCESS_LIMITS``) leaves above what the
    process already uses; None when no limit is set (or this platform has none)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    used, left = process_status(), []
    for name, field in PROCESS_LIMITS:
        soft = resource.getrlimit(getattr(resource, name))[0] if hasattr(resource, name) else resource.RLIM_INFINITY
        if soft != resource.RLIM_INFINITY and soft >= 0:  # a limit is set
            left.append(max(0, soft - used.get(field, 0)))  # unknown use: the whole limit, an upper bound
    return min(left, default=None)


def process_status() -> dict[str, int]:
    """This process's sizes from /proc/self/status in bytes (``VmSize``, ``VmData``, ...); empty where
    the file cannot be read."""
    sizes = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    sizes[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return sizes


def machine_memory() -> int | None:
    """Bytes of memory available to a new allocation on this machine: psutil's ``available`` where
    psutil is installed, else Linux's ``MemAvailable`` (/proc/meminfo), else the free physical pages
    (``os.sysconf``); None when none of them answers."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def gigabytes(n: float) -> str:
    return f"{n / 2**30:,.1f} GB"


def check_memory(needed: float, what: str, fix: str, setting=None, *, available: float | None | str = "machine",
                 where: str = "this machine") -> None:
    """UserError when ``needed`` bytes (an estimate) exceed the memory available: ``what`` needs about
    N GB and ``where`` has M GB available: ``fix``. ``available``: bytes (another device's free
    memory); by default this process's (``available_memory``; ``where`` then says when a process
    limit is what binds). Nothing when the amount is unknown."""
    if available == "machine":
        available, limit = available_memory(), limit_headroom()
        if limit is not None and available == limit and where == "this machine":
            where = "this process (under its memory limit, ulimit)"
    if available is not None and needed > available:
        raise UserError(f"{what} needs about {gigabytes(needed)} of memory and {where} has {gigabytes(available)} "
                        f"available: {fix}", setting=setting)


@contextlib.contextmanager
def refuse_failed_allocation(what: str, fix: str, setting=None):
    """Turns an allocation that fails inside the block (``MemoryError``, PyTorch's "can't allocate")
    into the one-line UserError ``what`` could not be built: ``fix``; for work whose estimate passed
    but whose memory still ran out (an estimate is approximate; an unknown amount refuses nothing)."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if not isinstance(exc, MemoryError) and "allocate" not in str(exc):
            raise
        raise UserError(f"{what} could not be built (the allocation failed): {fix}", setting=setting) from None
