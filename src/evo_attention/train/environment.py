"""Where a training runs: device, precision and compile choice, autocast, seeding, versions, peak memory."""

from __future__ import annotations

import os
import platform
import random
import resource
import sys
from contextlib import nullcontext, suppress

import numpy as np
import torch

from evo_attention.train.probe_cache import cpu_name, pinned_probes, probe_answer, probe_path, probe_shape
from evo_attention.util.errors import UserError
from evo_attention.util import memory
from evo_attention.util.version import __version__


def get_device() -> torch.device:
    """The best available device: CUDA, then Apple MPS, then CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def set_seed(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and CUDA) random number generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy only takes 32-bit seeds
    torch.manual_seed(seed)  # also seeds every CUDA device (torch.cuda.manual_seed_all)


def resolve_device(name: str | torch.device | None) -> torch.device:
    """'auto' (or None) -> cuda, then mps, then cpu; anything else must be usable here."""
    if name is None or str(name) == "auto":
        return get_device()
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but CUDA is not available here: use device cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"device {name!r} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device {name!r} requested but MPS is not available here: use device cpu or auto")
    return device


# --- precision auto -------------------------------------------------------------------------------
# On a CPU with native bf16 neither precision is faster everywhere: bf16 pays where the step is large
# matrix products (the seed config) and costs where it is many small ones (the quick preset: 1.4x slower
# on the 2-core AMD EPYC). So ``auto`` there is measured per machine and model shape (``probed_precision``)
# and kept on disk (``probe_cache``): deterministic for a trial. Per shape, not per genome, so a ranking of
# genes never mixes precisions. ``evo-attention bench --reprobe`` measures again.
PROBE_VERSION = 2
PROBE_BF16_MARGIN = 0.05  # bf16 must save 5% of the fp32 step: a tie keeps full precision
PROBE_ROUNDS = 3  # interleaved rounds (fp32 first in even rounds, bf16 first in odd ones)
PROBE_STEPS = 2  # timed steps per precision and round, after one untimed step each
PROBE_SLOW_STEP_S = 1.0  # an untimed step slower than this: 2 rounds of 1 step
# rounds further apart (slowest / fastest of a precision) were disturbed: the answer serves this process only
PROBE_STABLE_SPREAD = 1.5
ENV_PRECISION_PROBE = "EVO_ATTENTION_PRECISION_PROBE"  # "off": auto takes bf16 wherever the CPU has it, unmeasured
_PRECISION_CHOICES: dict[str, tuple[str, str]] = {}  # cache file -> (precision, reason), per process


def choose_precision(precision: str, device: torch.device, spec=None, *, seq_len: int | None = None,
                     batch_size: int | None = None, timer=None, dropout_stream: str = "cpu") -> tuple[str, str]:
    """The precision a training runs in and why (a record keeps both).

    A set precision is taken as it is. ``auto``: bf16 on CUDA GPUs that support it; fp32 on a CPU
    without native bf16 and on other devices; on a CPU with native bf16, the measured choice for
    this shape (``probed_precision``; ``spec``: a ``ModelSpec`` with the data's vocabulary; ``timer()``:
    ``train.trainer.precision_step_times``), or bf16 unmeasured where no shape or timer is given or
    ``EVO_ATTENTION_PRECISION_PROBE=off`` says so. A trial's key holds "auto": one precision on one
    machine, maybe another elsewhere (the record says which ran).
    """
    if precision != "auto":
        return precision, f"set to {precision}"
    if device.type == "cuda":
        supported = torch.cuda.is_bf16_supported()
        return ("bf16", "auto: CUDA with bf16") if supported else ("fp32", "auto: CUDA without bf16")
    if device.type != "cpu":
        return "fp32", f"auto: fp32 on {device.type}"
    if not cpu_has_fast_bf16():
        return "fp32", "auto: this CPU has no native bf16"
    if spec is None or seq_len is None or batch_size is None or timer is None:
        return "bf16", "auto: native bf16 on this CPU (no model shape given to measure)"
    setting = os.environ.get(ENV_PRECISION_PROBE, "").strip().lower()
    if setting in ("0", "off", "no", "false"):
        return "bf16", f"auto: native bf16 on this CPU ({ENV_PRECISION_PROBE}={setting}: not measured)"
    if setting not in ("", "1", "on", "yes", "true"):
        raise UserError(f"{ENV_PRECISION_PROBE}={setting!r} is not a setting: use on or off")
    return probed_precision(spec, seq_len, batch_size, device, timer, dropout_stream)


def probed_precision(spec, seq_len: int, batch_size: int, device: torch.device, timer,
                     dropout_stream: str = "cpu") -> tuple[str, str]:
    """The measured precision of a shape on this machine: a run's pinned answer, the probe's cache file,
    or probed now (``timer()``: seconds per step in each precision and the ``spread`` of its rounds) and
    kept (``probe_cache.probe_answer``): bf16 where it was at least PROBE_BF16_MARGIN faster. Where the
    rounds disagreed by more than PROBE_STABLE_SPREAD (a busy machine) the answer is fp32, kept too (a
    machine's load never makes a command train in another precision later), and the reason says so."""
    shape = probe_shape(spec, seq_len, batch_size, dropout_stream)
    path = probe_path(shape, device, kind="precision", version=PROBE_VERSION)
    key = str(path)
    if key in _PRECISION_CHOICES and path.name not in pinned_probes():  # a run's pinned answer first
        return _PRECISION_CHOICES[key]

    def measure() -> dict:
        times = timer()
        # bf16 only where its gain was measured: rounds that disagree choose the exact fp32, in every process alike
        gain = steady_probe(times) and times["bf16"] < (1.0 - PROBE_BF16_MARGIN) * times["fp32"]
        return {"precision": "bf16" if gain else "fp32", "fp32_ms": 1000 * times["fp32"],
                "bf16_ms": 1000 * times["bf16"], "margin": PROBE_BF16_MARGIN, "threads": torch.get_num_threads(),
                "torch": torch.__version__, "shape": shape, "spread": times.get("spread", 1.0)}

    found, _ = probe_answer(path, _precision_entry, measure, decides=lambda entry: entry["precision"])
    precision = found["precision"]
    times = f"fp32 {found['fp32_ms']:.1f} ms vs bf16 {found['bf16_ms']:.1f} ms per step"
    reason = (f"auto: measured for this shape on this machine, {times} ({path.name})" if steady_probe(found) else
              f"auto: {precision}, the machine was too busy to measure bf16's gain ({times}, rounds disagreeing by "
              f"more than {PROBE_STABLE_SPREAD:g}x; kept in {path.name} until probes are measured again)")
    _PRECISION_CHOICES[key] = (precision, reason)
    return precision, reason


def steady_probe(entry: dict) -> bool:
    """Whether a probe's rounds agreed (``spread`` within PROBE_STABLE_SPREAD): only then did it measure."""
    return entry.get("spread", 1.0) <= PROBE_STABLE_SPREAD


def _precision_entry(entry: dict) -> bool:
    return (entry.get("precision") in ("fp32", "bf16")
            and all(isinstance(entry.get(k), (int, float)) for k in ("fp32_ms", "bf16_ms")))


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU runs bf16 matrix products natively (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.backends.mkldnn.is_available()) and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return False


# Genes whose training step torch.compile was measured to speed up, by device type: the additive
# similarity's blocks of tanh(a + c) . v fuse into one loop (benchmarks/bench_compile.py, 2-core
# AMD EPYC, bf16, seed config: 678 -> 504 ms/step, the ~70 s cold compile repaid after ~400 steps).
# Every other gene measured 0.96-0.97x there (its step is matrix products Inductor leaves alone,
# and the CPU dropout mask breaks the graph), and nothing has been measured on a GPU yet.
COMPILE_PAYS = {"cpu": lambda gene: gene.similarity == "additive"}
COMPILE_MIN_STEPS = 2000  # 'auto' compiles only budgets this long: shorter ones may not repay the compile


def cpp_compiler() -> str | None:
    """The C++ compiler torch.compile's CPU backend would use, or None if there is none."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # no compiler found, or an Inductor without this helper
        return None


def resolve_compile(setting: str, device: torch.device, genes, steps: int) -> bool:
    """Whether a ``steps``-step training of ``genes`` (one per layer) on ``device`` compiles its model:
    'off' never; 'on' always (a CPU needs a C++ compiler); 'auto' where ``COMPILE_PAYS`` and at least
    ``COMPILE_MIN_STEPS``, when it can run here."""
    if setting == "off":
        return False
    has_compiler = device.type != "cpu" or cpp_compiler() is not None
    if setting == "on":
        if not has_compiler:
            raise UserError("compile is on but torch.compile finds no C++ compiler for the CPU: install g++ "
                            "(or clang) or use compile auto/off", setting="compile")
        return True
    pays = COMPILE_PAYS.get(device.type)
    return (steps >= COMPILE_MIN_STEPS and has_compiler and pays is not None and any(pays(g) for g in genes))


def matmul_dtype(precision: str) -> torch.dtype:
    return {"bf16": torch.bfloat16}.get(precision, torch.float32)


def autocast(device: torch.device, precision: str, cache: bool = True):
    """The mixed-precision context of ``precision`` on ``device`` (a no-op for fp32). ``cache``:
    keep each weight's cast for the context's life (a CUDA graph's capture needs it off: the same
    casts, recomputed, so the same values)."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=matmul_dtype(precision), cache_enabled=cache)


def versions() -> dict:
    out = {"evo_attention": __version__, "torch": torch.__version__, "python": platform.python_version()}
    with suppress(ImportError):  # a declared dependency
        import entmax

        out["entmax"] = getattr(entmax, "__version__", "unknown")
    return out


def machine() -> dict:
    """The machine a measurement came from: CPU model, cores, native bf16, GPU if any, and
    ``torch_threads`` of the calling process (a worker's training has its own: ``latency_threads``)."""
    out = {"cpu": cpu_name(), "cores": os.cpu_count(), "native_bf16": cpu_has_fast_bf16(),
           "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        # the allocator's statistics exist only once CUDA is initialised in this process: a worker
        # process that has not touched the GPU yet would fail ("Invalid device argument")
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with suppress(OSError), open("/proc/self/clear_refs", "w") as f:  # Linux: 5 resets the peak RSS (VmHWM)
            f.write("5")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously): call before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def process_memory_mb(field: str) -> float | None:
    """A memory line of Linux's /proc/self/status in MB (``VmRSS``: resident now, ``VmHWM``: its
    peak); None where there is none."""
    with suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return None


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = process_memory_mb("VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc), so the resident set counts live memory."""
    import ctypes

    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def memory_in_use_mb(device: torch.device) -> float | None:
    """What this process holds now: on CUDA the allocated device memory, else the resident set
    (after handing freed heap pages back); the base a later ``peak_memory_mb`` is measured from."""
    if device.type == "cuda":
        torch.cuda.init()  # as in reset_peak_memory
        return torch.cuda.memory_allocated(device) / 2**20
    release_free_memory()
    return process_memory_mb("VmRSS")


def available_memory_mb(device: torch.device) -> float | None:
    """Memory a training could still take here: on CUDA the device's free memory; else the
    machine's available RAM (``util.memory.available_memory``); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / 2**20
    available = memory.available_memory()
    return None if available is None else available / 2**20


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    # CUDA says "out of memory"; the CPU allocator "can't allocate memory" (DefaultCPUAllocator)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
