"""How many trials train as one batch: the ``batch_models`` setting, measured per machine and shape.

Which trials can share a batch, and how one trains, is the engine's (``train.trainer``); this module
answers how many. K folded models share every kernel launch, which pays where a step is many small
operations, not where a few large matrix products already fill the machine. So ``auto`` is measured
per machine and shape, like ``precision auto``, and kept in the same cache (``probe_cache``,
``batch-models-*.json``): a short probe times steps of the shape's vanilla gene with K = 1, 2, 4, 8
through the engine, and ``auto`` takes the K of the most trainings per hour (K / seconds per step) if
it beats K = 1 by at least BATCH_PROBE_GAIN, else 1. Memory bounds K: one model's peak memory
(measured with K = 1, kept in the file) times K must stay within MEMORY_FRACTION of the memory
available when K is chosen, shared by the trainings that run at once. Per shape, not per genome.
``evo-attention bench --reprobe`` measures again; EVO_ATTENTION_BATCH_MODELS decides what ``auto``
means (off, K, or auto to measure).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

from evo_attention.data.base import TaskData
from evo_attention.train.config import batch_models_value
from evo_attention.train.environment import (available_memory_mb, choose_precision, is_oom, memory_in_use_mb,
                                             peak_memory_mb, reset_peak_memory, resolve_device, steady_probe)
from evo_attention.train.probe_cache import pinned_probes, probe_answer, probe_path, probe_shape
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import precision_step_times, probe_trial, step_seconds
from evo_attention.util.errors import UserError

BATCH_PROBE_VERSION = 2  # raised when the measurement changes: cached answers of another version are measured again
BATCH_PROBE_KS = (1, 2, 4, 8)  # a CPU: small models fill its cores at a few models per step
# a GPU: a small model uses a sliver of the device; on an H100 64 quick-preset models per step gave 9.3x
# the trainings per hour of one (docs/results/gpu/gpu-h100.json), so the probe goes on while memory lasts
CUDA_BATCH_PROBE_KS = (1, 4, 16, 64, 256)
BATCH_PROBE_GAIN = 0.10  # a batch must give 10% more trainings per hour than one model alone
BATCH_PROBE_REPEATS = 2  # timed repeats per K, the fastest kept (other work only slows a repeat down)
BATCH_PROBE_STEPS = 2  # timed steps per repeat, after one untimed step
BATCH_PROBE_SLOW_STEP_S = 0.5  # building one model and its untimed step slower than this: 1 repeat of 1 step
MEMORY_FRACTION = 0.5
ENV_BATCH_MODELS = "EVO_ATTENTION_BATCH_MODELS"
_BATCH_PROBES: dict[str, dict] = {}  # cache file -> its entry, per process


def models_per_batch(setting: str | int, trial: Trial, data: TaskData, *, device: str | torch.device | None = None,
                     share: int = 1) -> tuple[int, str]:
    """How many trials of ``trial``'s shape (on ``data``) train as one batch, and why: ``off`` 1, K K,
    ``auto`` what ``EVO_ATTENTION_BATCH_MODELS`` says (off or K), else the K measured here
    (``probed_batch_times``; ``share``: the trainings sharing the memory). A failing probe gives 1."""
    setting = batch_models_value(setting)
    if setting != "auto":
        return (1, "batch_models off") if setting == "off" else (setting, f"batch_models {setting}")
    forced = os.environ.get(ENV_BATCH_MODELS, "").strip()
    if forced and forced.lower() != "auto":
        value = batch_models_value(forced, ENV_BATCH_MODELS)
        return (1 if value == "off" else value), f"auto: {ENV_BATCH_MODELS}={forced}"
    dev = resolve_device(device if device is not None else trial.train.device)
    try:
        entry, name = probed_batch_times(trial, data, dev, share=share)
    except (KeyboardInterrupt, UserError):
        raise
    except Exception as exc:  # the trainings themselves will say what is wrong with the shape
        return 1, f"auto: the probe failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
    return choose_models(entry, available_memory_mb(dev), share, source=name)


def choose_models(entry: dict, available_mb: float | None, share: int = 1, *, source: str = "") -> tuple[int, str]:
    """The K of a probe's ``entry`` (``{"seconds": {K: s per step of K models}, "step_memory_mb"}``):
    the most trainings per hour within the memory bound, if at least BATCH_PROBE_GAIN above K = 1."""
    seconds = {int(k): float(v) for k, v in entry["seconds"].items()}
    memory = entry.get("step_memory_mb")
    cap = MEMORY_FRACTION * available_mb / max(1, share) if available_mb is not None and memory else None
    rates = {k: k / s for k, s in seconds.items() if k == 1 or cap is None or memory * k <= cap}
    best = max(rates, key=lambda k: (rates[k], -k))
    gain = rates[best] / rates[1]
    measured = ", ".join(f"K={k} {1000 * s:.1f} ms" for k, s in sorted(seconds.items()))
    where = f"; {source}" if source else ""
    if best == 1 or gain < 1.0 + BATCH_PROBE_GAIN:
        return 1, (f"auto: no batch pays here (best K={best}, {gain:.2f}x the trainings per hour; per step "
                   f"{measured}{where})")
    return best, f"auto: K={best} gives {gain:.2f}x the trainings per hour (per step {measured}{where})"


def _batch_entry(entry: dict) -> bool:
    seconds = entry.get("seconds")
    return (isinstance(seconds, dict) and "1" in seconds
            and all(k.isdigit() and isinstance(v, (int, float)) and v > 0 for k, v in seconds.items())
            and (entry.get("step_memory_mb") is None or isinstance(entry.get("step_memory_mb"), (int, float))))


def probe_ks(device: torch.device) -> tuple:
    """The models per step the probe times on ``device`` (it stops at the first K beyond memory)."""
    return CUDA_BATCH_PROBE_KS if torch.device(device).type == "cuda" else BATCH_PROBE_KS


def _batch_shape(trial: Trial, data: TaskData, device: torch.device) -> dict:
    spec = trial.model.with_data(data.vocab_size, data.seq_len)
    stream = trial.train.dropout_stream
    precision = choose_precision(trial.train.precision, device, spec, seq_len=data.seq_len,
                                 batch_size=trial.train.batch_size, dropout_stream=stream,
                                 timer=lambda: precision_step_times(trial, data, device))[0]
    shape = {**probe_shape(spec, data.seq_len, trial.train.batch_size, stream), "precision": precision}
    if device.type == "cuda":
        shape["gpu"] = torch.cuda.get_device_name(device)
    return shape


def probed_batch_times(trial: Trial, data: TaskData, device: torch.device, *, share: int = 1) -> tuple[dict, str]:
    """The probe's entry for ``trial``'s shape here and its cache file's name (``probe_cache.probe_answer``)."""
    path = probe_path(_batch_shape(trial, data, device), device, kind="batch-models", version=BATCH_PROBE_VERSION)
    key = str(path)
    if path.name in pinned_probes() or key not in _BATCH_PROBES:  # a run's pinned answer first

        def measure() -> dict:
            available = available_memory_mb(device)
            budget = MEMORY_FRACTION * available / max(1, share) if available is not None else None
            measured = probe_batch_times(trial, data, device, ks=probe_ks(device), memory_budget_mb=budget)
            return {"seconds": {str(k): v for k, v in measured["seconds"].items()},
                    "step_memory_mb": measured["step_memory_mb"], "spread": measured.get("spread", 1.0),
                    "gain": BATCH_PROBE_GAIN, "threads": torch.get_num_threads(), "torch": torch.__version__}

        # kept only where its two timings of one model agree (else it serves this process and its run only);
        # an answer decides its K (here without the memory bound, which is the machine's, not the file's)
        _BATCH_PROBES[key] = probe_answer(path, _batch_entry, measure, keep=steady_probe,
                                          decides=lambda entry: choose_models(entry, None)[0])[0]
    return _BATCH_PROBES[key], path.name


def probe_batch_times(trial: Trial, data: TaskData, device: torch.device, *, ks: Sequence[int] = BATCH_PROBE_KS,
                      repeats: int = BATCH_PROBE_REPEATS, steps: int = BATCH_PROBE_STEPS,
                      memory_budget_mb: float | None = None) -> dict:
    """Seconds per step of K models of ``trial``'s shape (its vanilla gene, seeds 0..K-1, eager) for each
    K of ``ks``, and one model's peak memory in MB (None: not measurable). A K beyond
    ``memory_budget_mb`` or out of memory ends the probe. Torch's global RNG is left as it was."""
    slow = None
    seconds: dict[int, float] = {}
    memory = None
    devices = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for k in sorted(ks):
            if k > 1 and memory is not None and memory_budget_mb is not None and memory * k > memory_budget_mb:
                break
            n_repeats, n_steps = (1, 1) if slow else (repeats, steps)
            total = 1 + n_repeats * n_steps
            trials = [probe_trial(trial, total, total).replace(seed=i) for i in range(k)]
            before = memory_in_use_mb(device)
            reset_peak_memory(device)
            try:
                start = time.perf_counter()
                trainer, per_step = step_seconds(trials, data, device=device, warmup=1, steps=n_steps,
                                                 repeats=n_repeats)
            except Exception as exc:
                if k > 1 and is_oom(exc):
                    break
                raise
            if trainer.step != total:
                raise RuntimeError(f"the probe's training of {k} model(s) stopped at step {trainer.step} of {total}")
            if k == 1:
                if before is not None:
                    memory = max(0.0, peak_memory_mb(device) - before)
                slow = (time.perf_counter() - start) - n_repeats * n_steps * per_step > BATCH_PROBE_SLOW_STEP_S
            seconds[k] = per_step
            del trainer
        spread = 1.0
        if not slow and len(seconds) > 1:  # one model timed again last: the rounds agree on an idle machine
            base = probe_trial(trial, 1 + repeats * steps, 1 + repeats * steps)
            _, again = step_seconds([base], data, device=device, warmup=1, steps=steps, repeats=repeats)
            spread = max(again, seconds[1]) / min(again, seconds[1])
    return {"seconds": seconds, "step_memory_mb": memory, "spread": spread}

