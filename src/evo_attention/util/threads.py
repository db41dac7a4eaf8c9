"""How PyTorch's CPU threads wait: chosen before torch loads its OpenMP runtime.

PyTorch's CPU wheels use GNU OpenMP, whose threads spin for a while before they sleep between
parallel regions. Alone on the cores that is fast; beside any other busy process a spinning thread
burns the time slice its partner needs, and a training step slowed 35-120x on a 2-core machine
(``benchmarks/bench_busy.py``). OpenMP reads its wait settings once, when the library loads (at
``import torch``), so ``configure`` sets them in the environment first: importing
``evo_attention`` calls it, and worker processes inherit the environment.

The choice (``SETTINGS``) changes how threads wait, never how many there are or how sums are
split, so results are bitwise those of OpenMP's defaults. Nothing is changed when the user set any
of the variables, when torch was imported before (too late: reported by ``state``), or with
``EVO_ATTENTION_THREADS=off``. The measurement behind the choice is docs/results/busy/.
"""

from __future__ import annotations

import os
import sys

OFF = "EVO_ATTENTION_THREADS"  # =off: leave OpenMP's defaults
USER_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
# Spin about a microsecond, then sleep. Measured (docs/results/busy/, 2-core AMD EPYC, quick preset):
# beside a 2-thread job 37 ms per step (OpenMP's defaults: 69 ms, tails to 286 ms; larger spin
# counts 10k-100k: tails to 117-337 ms), but idle 1.24x the defaults' 17.4 ms (a known cost).
SETTINGS = {"GOMP_SPINCOUNT": "1000"}

_state = "not configured"


def configure(environ=None) -> str:
    """Set ``SETTINGS`` in ``environ`` (default ``os.environ``) unless the user chose otherwise or
    torch is loaded already; returns what was done (also kept for ``state``)."""
    global _state
    environ = os.environ if environ is None else environ
    if str(environ.get(OFF, "")).strip().lower() in ("off", "0", "false", "no"):
        _state = f"OpenMP's defaults ({OFF}=off)"
    elif any(name in environ for name in USER_VARIABLES):
        _state = "the user's settings (" + ", ".join(f"{n}={environ[n]}" for n in USER_VARIABLES if n in environ) + ")"
    elif "torch" in sys.modules and environ is os.environ:
        _state = "OpenMP's defaults (torch was imported before evo_attention)"
    else:
        environ.update(SETTINGS)
        _state = ", ".join(f"{k}={v}" for k, v in SETTINGS.items())
    return _state


def state() -> str:
    """How this process's OpenMP threads wait (what ``configure`` did)."""
    return _state
