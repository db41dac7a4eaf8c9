"""How PyTorch's CPU threads wait: long spins on idle cores, short ones while others want them.

GNU OpenMP (libgomp, in PyTorch's Linux CPU wheels) spins its threads for a while before they
sleep between parallel regions: fast alone, but beside a busy process a spinning thread burns its
partner's time slice (a step slowed 35-120x on 2 cores: ``benchmarks/bench_busy.py``), and a short
fixed spin costs 1.2x idle (docs/results/busy/). So the wait follows the load (``watch``): a daemon
thread samples every ``INTERVAL`` seconds the CPU time *other* processes took (``/proc/stat``'s busy
time minus this process's own) and ``Hysteresis`` decides short or long waits. The lever is
libgomp's documented rule for oversubscription (``GOMP_SPINCOUNT``): with more OpenMP threads than
CPUs, every wait spins only 100 iterations; ``Throttle`` makes one more team while the machine is busy.

A CPU training that *starts* while other processes use the cores also takes only the threads they
leave free, at least one (``shared_threads``; ``train.trainer`` applies it for the whole training,
and the record's ``threads`` says how many, of how many, and the load that chose them); its results
then differ from an idle run's by the rounding of another split of the sums, and
``EVO_ATTENTION_SHARE_CORES=off`` keeps torch's count (the tests run so). The waits change no result
(``tests/test_threads.py``). Nothing is watched when the user set any of ``USER_VARIABLES``, with
``EVO_ATTENTION_THREADS=off``, with one torch thread, or where libgomp is not the loaded runtime.
Without ``/proc/stat``, ``configure`` sets a fixed short spin (``FALLBACK``) before torch loads its
OpenMP runtime, which reads it once.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from evo_attention.util.errors import UserError

OFF = "EVO_ATTENTION_THREADS"  # =off: leave OpenMP's defaults
SHARE = "EVO_ATTENTION_SHARE_CORES"  # =off: the load never changes a training's thread count
USER_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
# Without a watch: spin about a microsecond, then sleep (docs/results/busy/cpu-rounds7.json, 2-core
# AMD EPYC, quick preset: beside a 2-thread job 37 ms a step against OpenMP's defaults' 69 ms with
# tails to 286 ms, but idle 1.24x the defaults' 17.4 ms).
FALLBACK = {"GOMP_SPINCOUNT": "1000"}
PROC_STAT = "/proc/stat"
INTERVAL = 0.5  # seconds between samples of the other processes' load
FIRST_SAMPLE = 0.2  # seconds of the first sample, taken when the watch starts
BUSY_CORES = 0.5  # others use half a core or more: short waits
IDLE_CORES = 0.25  # ... below a quarter of a core ...
IDLE_SAMPLES = 2  # ... this many samples in a row: long waits again

_state = "not configured"
_mode = "off"  # watch | fixed | off | refused (a bad OFF or SHARE, raised by ``watch``: importing must not fail)


def turned_off(environ, name: str) -> bool:
    """Whether the environment variable ``name`` says off (off, 0, false, no) rather than on (unset, on, 1,
    true, yes); any other value is a UserError."""
    value = str(environ.get(name, "")).strip().lower()
    if value not in ("", "on", "1", "true", "yes", "off", "0", "false", "no"):
        raise UserError(f"{name}={environ[name]!r} is not a setting: use on or off")
    return value in ("off", "0", "false", "no")


@contextmanager
def environment_defaults(settings: dict):
    """``settings`` in ``os.environ`` within, each where the user set none (theirs is kept), and gone
    again after: for a library that reads its settings from the environment at each call."""
    added = [name for name in settings if name not in os.environ]
    os.environ.update({name: settings[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def configure(environ=None) -> str:
    """Choose how this process's OpenMP threads wait (before torch loads, when ``environ`` is
    ``os.environ``): ``watch`` where it can work, else ``FALLBACK``; nothing when the user chose
    (``USER_VARIABLES``, ``EVO_ATTENTION_THREADS=off``). Returns what was done (kept for ``state``)."""
    global _state, _mode
    environ = os.environ if environ is None else environ
    try:
        turned_off(environ, SHARE)  # read as each training starts (``shared_threads``), checked with OFF
        off = turned_off(environ, OFF)
    except UserError as exc:
        _state, _mode = str(exc), "refused"
        return _state
    if off:
        _state, _mode = f"OpenMP's defaults ({OFF}=off)", "off"
    elif any(name in environ for name in USER_VARIABLES):
        _state = "the user's settings (" + ", ".join(f"{n}={environ[n]}" for n in USER_VARIABLES if n in environ) + ")"
        _mode = "off"
    elif sys.platform.startswith("linux") and os.path.exists(PROC_STAT):
        _state, _mode = "OpenMP's defaults, short waits while other processes use the cores", "watch"
    elif "torch" in sys.modules and environ is os.environ:
        _state, _mode = "OpenMP's defaults (torch was imported before evo_attention)", "off"
    else:
        environ.update(FALLBACK)
        _state, _mode = ", ".join(f"{k}={v}" for k, v in FALLBACK.items()), "fixed"
    return _state


def state() -> str:
    """How this process's OpenMP threads wait (what ``configure`` did, and what the watch saw)."""
    watch = _watch
    if watch is None or not watch.alive:
        return _state
    return f"{_state} ({watch.summary()})"


def others_cores(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Cores' worth of CPU time other processes took between two ``sample``s."""
    wall = after[0] - before[0]
    if wall <= 0:
        return 0.0
    return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / wall)


def sample() -> tuple[float, float, float]:
    """(monotonic time, CPU-seconds all processes were busy, CPU-seconds this process used)."""
    with open(PROC_STAT) as f:
        fields = f.readline().split()[1:]
    ticks = [int(v) for v in fields[:8]] + [0] * (8 - len(fields[:8]))
    user, nice, system, _idle, _iowait, irq, softirq, _steal = ticks  # steal: not a process of this machine
    own = os.times()
    return (time.monotonic(), (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), own.user + own.system)


class Hysteresis:
    """Busy from ``BUSY_CORES`` on; idle again after ``IDLE_SAMPLES`` samples below ``IDLE_CORES``."""

    def __init__(self):
        self.busy = False
        self._quiet = 0

    def update(self, others: float) -> bool:
        if others >= BUSY_CORES:
            self.busy, self._quiet = True, 0
        elif self.busy:
            self._quiet = self._quiet + 1 if others < IDLE_CORES else 0
            if self._quiet >= IDLE_SAMPLES:
                self.busy, self._quiet = False, 0
        return self.busy


class Throttle:
    """libgomp's short waits while ``on``: ``engage`` starts a helper thread that ran one parallel
    region and so holds one extra OpenMP team (asleep, using no CPU) in libgomp's books; ``release``
    ends it, libgomp frees its team and waits spin long again."""

    def __init__(self):
        self._release = threading.Event()
        self._helper: threading.Thread | None = None

    @property
    def on(self) -> bool:
        return self._helper is not None

    def engage(self) -> None:
        if self._helper is not None:
            return
        self._release.clear()
        ready = threading.Event()
        self._helper = threading.Thread(target=self._hold, args=(ready,), name="evo-attention-throttle", daemon=True)
        self._helper.start()
        ready.wait(5.0)

    def release(self) -> None:
        if self._helper is None:
            return
        self._release.set()
        self._helper.join(5.0)
        self._helper = None

    def _hold(self, ready: threading.Event) -> None:
        import torch

        torch.zeros(1 << 20).add_(1.0)  # one parallel region: this thread's own team, kept while it lives
        ready.set()
        self._release.wait()


class Watch:
    """The daemon thread that follows the other processes' load (``Hysteresis``) with ``Throttle``;
    ``sampler``: where the load is read (``sample``)."""

    def __init__(self, sampler: Callable[[], tuple[float, float, float]] | None = None):
        self.sampler = sample if sampler is None else sampler
        self.throttle = Throttle()
        self.hysteresis = Hysteresis()
        self.switches = 0
        self.last_others = 0.0
        # the first decision before the training starts: it should not begin beside a spinner
        before = self.sampler()
        time.sleep(FIRST_SAMPLE)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._decide(before),),
                                        name="evo-attention-load-watch", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def summary(self) -> str:
        now = "short" if self.throttle.on else "long"
        return f"now {now} waits, others used {self.last_others:.2f} cores, {self.switches} switches"

    def _decide(self, before: tuple[float, float, float]) -> tuple[float, float, float]:
        """Short or long waits from the load since ``before``; returns the new sample."""
        import torch

        after = self.sampler()
        self.last_others = others_cores(before, after)
        wanted = self.hysteresis.update(self.last_others) and torch.get_num_threads() > 1
        if wanted != self.throttle.on:
            (self.throttle.engage if wanted else self.throttle.release)()
            self.switches += 1
        return after

    def stop(self) -> None:
        """End the watch; waits spin long again."""
        self._stop.set()
        self._thread.join(5.0)

    def _run(self, before: tuple[float, float, float]) -> None:
        try:
            while not self._stop.wait(INTERVAL):
                before = self._decide(before)
        except OSError:  # /proc/stat unreadable: leave the waits as they were before the watch
            pass
        self.throttle.release()


_watch: Watch | None = None
_watch_lock = threading.Lock()


@functools.cache  # a loaded library stays loaded: read the process's maps once, not per trainer
def libgomp_loaded() -> bool:
    """Whether this process's OpenMP runtime is GNU's (the throttle is libgomp's rule)."""
    try:
        with open("/proc/self/maps") as f:
            return "libgomp" in f.read()
    except OSError:
        return False


def watch() -> bool:
    """Start following the load (once per process) where ``configure`` chose it, torch trains with
    more than one thread and libgomp is the runtime; returns whether a watch runs (a bad OFF or SHARE, which
    ``configure`` found: a UserError)."""
    global _watch
    if _mode == "refused":
        raise UserError(_state)
    if _mode != "watch":
        return False
    with _watch_lock:
        if _watch is None or not _watch.alive:
            import torch

            if torch.get_num_threads() <= 1 or not libgomp_loaded():
                return False
            _watch = Watch()
    return True


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def shared_threads() -> tuple[int, str] | None:
    """``(threads, why)`` for a CPU training starting now while other processes use the cores (the
    watch says busy): the cores they leave free, at least one, where that is fewer than torch's
    threads; None to keep torch's count (no watch, idle, or ``EVO_ATTENTION_SHARE_CORES=off``)."""
    watch = _watch
    if watch is None or not watch.alive or not watch.hysteresis.busy or turned_off(os.environ, SHARE):
        return None
    import torch

    have, total, others = torch.get_num_threads(), cores(), watch.last_others
    free = max(1, round(total - others))
    if free >= have:
        return None
    return free, f"{free} of {have} threads: other processes used {others:.1f} of {total} cores when it started"


@contextmanager
def using(count: int | None):
    """torch's CPU threads set to ``count`` within (None: unchanged), torch's count again after."""
    if count is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def sharing(device_type: str):
    """Within: on a CPU, the threads ``shared_threads`` gives (torch's count again after); yields
    why (None where nothing changed)."""
    shared = shared_threads() if device_type == "cpu" and watch() else None
    with using(shared[0] if shared else None):
        yield shared[1] if shared else None
