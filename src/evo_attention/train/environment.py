"""Where a training runs: device, precision and compile choice, autocast, seeding, versions, peak memory."""

from __future__ import annotations

import platform
import random
import resource
import sys
from contextlib import nullcontext

import numpy as np
import torch

from evo_attention.util.errors import UserError
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
    torch.manual_seed(seed)  # also seeds every CUDA device
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


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


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto' -> bf16 where the device runs it fast (CPU with bf16 support, Ampere+ CUDA), else fp32."""
    if precision != "auto":
        if precision == "fp16" and device.type == "cpu":
            raise UserError("precision fp16 is not supported on CPU: use bf16 or fp32")
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    return "fp32"


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
    """Whether a ``steps``-step training of ``genes`` (one per layer) on ``device`` compiles its model.

    'off': never; 'on': always (on CPU it needs a C++ compiler); 'auto': where it was measured to
    pay (``COMPILE_PAYS``), for budgets of at least ``COMPILE_MIN_STEPS``, when it can run here."""
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
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def autocast(device: torch.device, precision: str):
    """The mixed-precision context of ``precision`` on ``device`` (a no-op for fp32)."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=matmul_dtype(precision))


def versions() -> dict:
    out = {"evo_attention": __version__, "torch": torch.__version__, "python": platform.python_version()}
    try:
        import entmax

        out["entmax"] = getattr(entmax, "__version__", "unknown")
    except ImportError:  # pragma: no cover - a declared dependency
        pass
    return out


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:  # Linux: writing 5 resets the process's peak resident set size (VmHWM)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously): call before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def process_memory_mb(field: str) -> float | None:
    """A memory line of Linux's /proc/self/status in MB (``VmRSS``: resident now, ``VmHWM``: its
    peak); None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = process_memory_mb("VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    # CUDA says "out of memory"; the CPU allocator "can't allocate memory" (DefaultCPUAllocator)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
