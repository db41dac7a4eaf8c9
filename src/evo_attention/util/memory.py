"""The machine's available memory, and the one-line refusal of work estimated not to fit in it.

``available_memory()`` is what a new allocation could still take here: psutil's ``available`` where
psutil is installed, else Linux's ``MemAvailable`` (/proc/meminfo), else the free physical pages
(``os.sysconf``); None when none of them answers. ``check_memory`` compares an estimate made before
anything is built with it, so a task or model that cannot fit is refused in one line naming the
setting and what to do, never a raw allocator error or the OOM killer minutes later. An unknown
amount refuses nothing: the allocation itself then fails, and the caller names it.
"""

from __future__ import annotations

import os

from evo_attention.util.errors import UserError


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation on this machine, None if unknown."""
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
    memory); by default this machine's. Nothing when the amount is unknown."""
    if available == "machine":
        available = available_memory()
    if available is not None and needed > available:
        raise UserError(f"{what} needs about {gigabytes(needed)} of memory and {where} has {gigabytes(available)} "
                        f"available: {fix}", setting=setting)
