"""Train one gene on one dataset and measure it: the fitness function of the search.

``train_and_evaluate(gene, config, data)`` returns a result *record* (a JSON-able dict) and never
raises for a bad gene: a NaN/inf loss ends training early with status ``diverged``, running out of
memory gives ``oom``, any other exception ``error`` with its message. Only bad *input* (an unknown
device, say) and KeyboardInterrupt propagate.

The measurement:

- AdamW, gradient clipping, a fixed step budget, constant lr (the original's) or linear warmup +
  cosine decay; deterministic for a seed (model init, dropout and batch order all derive from it).
- Evaluation is exact: the token-weighted mean NLL over every scored target of the split (the
  datasets never score padding), perplexity = exp of it, plus next-token accuracy; the record says
  how many tokens were scored (``eval_tokens``), so a capped evaluation is visible as such.
- The record also carries the learning curve, parameter count, FLOPs per training step (PyTorch's
  flop counter on the first step), wall time, tokens/s, peak memory, device and versions.

``Trainer`` is the stateful object behind it: it can train to a step, evaluate, and continue,
which is what multi-fidelity schedules need.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import platform
import resource
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

from .config import Config
from .data.base import TaskData
from .errors import UserError
from .genes import AttentionGene
from .losses import linear_cross_entropy, linear_nll_stats
from .model import TinyTransformer

STATUSES = ("ok", "diverged", "oom", "error")
# Settings that change what a training run computes; together with gene, seed, steps and the data
# fingerprint they identify an evaluation (the run store's cache key).
CONTEXT_FIELDS = ("d_model", "n_heads", "n_layers", "max_seq_len", "dropout", "d_ff", "batch_size",
                  "eval_batch_size", "learning_rate", "weight_decay", "grad_clip", "eval_steps",
                  "warmup_steps", "lr_schedule", "precision", "eval_stride")

ProgressFn = Callable[[int, int, float], None]  # (step, total_steps, recent mean loss)


# ---------------------------------------------------------------------------------------------
# Environment: device, precision, versions
# ---------------------------------------------------------------------------------------------

def resolve_device(name: str | torch.device | None) -> torch.device:
    """'auto' (or None) -> cuda, then mps, then cpu; anything else must be usable here."""
    if name is None or str(name) == "auto":
        from .utils import get_device

        return get_device()
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but CUDA is not available here: use --device cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"device {name!r} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device {name!r} requested but MPS is not available here: use --device cpu or auto")
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
        return "bf16" if _cpu_has_fast_bf16() else "fp32"
    return "fp32"


def _cpu_has_fast_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()) and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return False


def autocast_context(device: torch.device, precision: str):
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def versions() -> dict:
    from . import __version__

    out = {"evo_attention": __version__, "torch": torch.__version__, "python": platform.python_version()}
    try:
        import entmax

        out["entmax"] = getattr(entmax, "__version__", "unknown")
    except ImportError:  # pragma: no cover - a declared dependency
        pass
    return out


def training_context(config: Config, eval_split: str = "valid") -> str:
    """Short hash of the settings (other than gene, seed, steps, data) that shape a result."""
    settings = {name: getattr(config, name) for name in CONTEXT_FIELDS}
    settings["eval_split"] = eval_split
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------

def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:  # Linux: writing 5 resets the process's peak resident set size (VmHWM)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------

class Trainer:
    """Trains one TinyTransformer with one gene; ``train()`` may be called again to continue."""

    def __init__(self, gene: AttentionGene | str, config: Config, data: TaskData, *, seed: int | None = None,
                 device: str | torch.device | None = None):
        self.gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
        self.data = data
        self.seed = config.seed if seed is None else int(seed)
        self.device = resolve_device(device if device is not None else config.device)
        self.precision = resolve_precision(config.precision, self.device)
        # the model's vocabulary and window come from the data
        self.config = config.replace(vocab_size=data.vocab_size, max_seq_len=max(config.max_seq_len, data.seq_len))
        if self.device.type == "cpu":
            torch.set_flush_denormal(True)  # subnormal floats make CPU kernels up to 10x slower
        torch.manual_seed(self.seed)
        self.model = TinyTransformer(self.config, self.gene).to(self.device)
        self.optimizer = torch.optim.AdamW(self._param_groups(), lr=config.learning_rate, betas=(0.9, 0.95),
                                           **({"fused": True} if self.device.type == "cuda" else {}))
        self.generator = torch.Generator().manual_seed(self.seed)
        self.batches = data.train_batches(config.batch_size, self.generator)
        self.step = 0
        self.curve: list = []  # [step, mean train loss over the last log interval]
        self.train_time = 0.0
        self.tokens_seen = 0
        self.flops_per_step: int | None = None
        self.diverged = False

    def _param_groups(self):
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            (decay if p.dim() >= 2 and "emb" not in name else no_decay).append(p)
        return [{"params": decay, "weight_decay": self.config.weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    def lr_at(self, step: int) -> float:
        c = self.config
        if c.lr_schedule == "constant":
            return c.learning_rate
        if step < c.warmup_steps:
            return c.learning_rate * (step + 1) / c.warmup_steps
        progress = (step - c.warmup_steps) / max(1, c.train_steps - c.warmup_steps)
        return c.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    @property
    def matmul_dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision, torch.float32)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        with autocast_context(self.device, self.precision):
            hidden, _ = self.model.hidden_states(x)
        # the output projection and the loss, fused and chunked (see losses.py)
        loss = linear_cross_entropy(hidden, self.model.head.weight, y, dtype=self.matmul_dtype)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return loss.detach()

    def _count_flops(self, x, y) -> torch.Tensor:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            loss = self._step(x, y)
        self.flops_per_step = int(counter.get_total_flops())
        return loss

    def train(self, until_step: int | None = None, progress: ProgressFn | None = None) -> str:
        """Train up to ``until_step`` (default: the budget). Returns 'ok' or 'diverged'."""
        until = self.config.train_steps if until_step is None else min(until_step, self.config.train_steps)
        self.model.train()
        every = self.config.log_every
        window_sum = torch.zeros((), device=self.device)
        window_n = 0
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        start = time.perf_counter()
        while self.step < until and not self.diverged:
            x, y = next(self.batches)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            loss = self._count_flops(x, y) if self.flops_per_step is None else self._step(x, y)
            self.step += 1
            self.tokens_seen += x.numel()
            window_sum += loss
            window_n += 1
            finite &= torch.isfinite(loss)
            if self.step % every == 0 or self.step == until:
                mean = (window_sum / window_n).item()  # the one host sync, once per log interval
                if not bool(finite) or not math.isfinite(mean):
                    self.diverged = True
                else:
                    self.curve.append([self.step, mean])
                if progress is not None:
                    progress(self.step, self.config.train_steps, mean)
                window_sum.zero_()
                window_n = 0
        self.train_time += time.perf_counter() - start
        return "diverged" if self.diverged else "ok"

    @torch.no_grad()
    def evaluate(self, split: str = "valid") -> dict:
        """Exact token-weighted NLL, perplexity and accuracy over the split (eval_steps caps batches)."""
        self.model.eval()
        nll = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.long, device=self.device)
        tokens = torch.zeros((), dtype=torch.long, device=self.device)
        for x, y in self.data.eval_batches(split, self.config.eval_batch_size, self.config.eval_steps):
            x, y = x.to(self.device), y.to(self.device)
            with autocast_context(self.device, self.precision):
                hidden, _ = self.model.hidden_states(x)
            batch_nll, batch_correct, batch_tokens = linear_nll_stats(hidden, self.model.head.weight, y,
                                                                      dtype=self.matmul_dtype)
            nll += batch_nll
            correct += batch_correct
            tokens += batch_tokens
        self.model.train()
        n = int(tokens)
        if n == 0:
            raise UserError(f"the {split} split has no scored tokens: check the dataset settings")
        mean = float(nll) / n
        total = n if self.config.eval_steps is None else self.data.scored_tokens(split)
        return {
            "val_loss": mean,
            "val_perplexity": math.exp(mean) if mean < 700 else float("inf"),
            "accuracy": int(correct) / n,
            "eval_tokens": n,
            "eval_split": split,
            "eval_tokens_total": total,  # scored targets in the whole split
            "eval_complete": n == total,
        }

    def recent_train_loss(self) -> float:
        return self.curve[-1][1] if self.curve else float("nan")

    # -- checkpoints (multi-fidelity schedules continue a training from one) ---------------------
    def state_dict(self) -> dict:
        """Everything needed to continue this training exactly: weights, optimizer, step, curve,
        counters and the global RNG state (dropout). The batch stream is not saved: it is a
        function of the seed, so ``load_state_dict`` replays it and skips ``step`` batches."""
        return {
            "gene": self.gene.key, "seed": self.seed, "train_steps": self.config.train_steps, "step": self.step,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "curve": [list(point) for point in self.curve], "train_time": self.train_time,
            "tokens_seen": self.tokens_seen, "flops_per_step": self.flops_per_step, "diverged": self.diverged,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (made by ``state_dict`` of a Trainer of the same gene, seed and
        budget); training on gives exactly what an uninterrupted training gives."""
        for name, mine in (("gene", self.gene.key), ("seed", self.seed), ("train_steps", self.config.train_steps)):
            if state.get(name) != mine:
                raise ValueError(f"checkpoint has {name} {state.get(name)!r}, this trainer {mine!r}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.curve = [list(point) for point in state["curve"]]
        self.train_time = float(state["train_time"])
        self.tokens_seen = int(state["tokens_seen"])
        self.flops_per_step = state["flops_per_step"]
        self.diverged = bool(state["diverged"])
        self.generator = torch.Generator().manual_seed(self.seed)
        self.batches = self.data.train_batches(self.config.batch_size, self.generator)
        for _ in range(self.step):  # one batch per step
            next(self.batches)
        torch.set_rng_state(state["rng"].cpu())
        if state.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"].cpu(), self.device)


def state_to_bytes(state: dict) -> bytes:
    """A trainer state (``Trainer.state_dict``) as bytes, to store or send to another process."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def state_from_bytes(blob: bytes, device) -> dict:
    return torch.load(io.BytesIO(blob), map_location=device, weights_only=True)


def failed_metrics() -> dict:
    return {"val_loss": float("nan"), "val_perplexity": float("inf"), "accuracy": float("nan"), "eval_tokens": 0}


def train_and_evaluate(gene: AttentionGene | str, config: Config, data: TaskData, *, seed: int | None = None,
                       steps: int | None = None, eval_split: str = "valid", device: str | None = None,
                       progress: ProgressFn | None = None, keep_trainer: bool = False,
                       until_step: int | None = None, state: bytes | None = None,
                       save_state: bool = False) -> dict:
    """Train ``gene`` for ``steps`` (default config.train_steps) and evaluate it: a result record.

    Never raises for a failing gene (see the module docstring). With ``keep_trainer`` the record
    holds the Trainer under ``"_trainer"`` (not JSON) so the caller can save or inspect the model.

    Partial trainings (multi-fidelity): ``until_step`` stops at that step of the ``steps``-step
    training (the learning-rate schedule still spans all ``steps``); ``state`` (bytes from an
    earlier ``save_state``) continues a training exactly where it stopped, and the record then
    says ``resumed_from``; ``save_state`` puts the trainer state after training, taken before the
    evaluation, under ``"_state"`` (bytes, or None if the training failed).
    """
    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    if steps is not None:
        config = config.replace(train_steps=int(steps))
    seed = config.seed if seed is None else int(seed)
    dev = resolve_device(device if device is not None else config.device)  # bad input: raise
    record = {
        "gene": gene.key,
        "seed": seed,
        "steps": config.train_steps,
        "data": data.name,
        "data_fingerprint": data.fingerprint,
        "context": training_context(config, eval_split),
        "device": str(dev),
        "versions": versions(),
        "settings": {name: getattr(config, name) for name in CONTEXT_FIELDS},
    }
    _reset_peak_memory(dev)
    start = time.perf_counter()
    trainer, blob = None, None
    try:
        trainer = Trainer(gene, config, data, seed=seed, device=dev)
        record["precision"] = trainer.precision
        record["params"] = trainer.model.num_parameters()
        if state is not None:
            trainer.load_state_dict(state_from_bytes(state, dev))
            record["resumed_from"] = trainer.step
        status = trainer.train(until_step=until_step, progress=progress)
        if save_state and status == "ok":
            blob = state_to_bytes(trainer.state_dict())
        metrics = failed_metrics() if status == "diverged" else trainer.evaluate(eval_split)
        record.update(status=status, error=None, **metrics)
    except KeyboardInterrupt:
        raise
    except UserError:
        raise
    except Exception as exc:  # a failing gene must never crash the search
        status = "oom" if _is_oom(exc) else "error"
        record.update(status=status, error=f"{type(exc).__name__}: {exc}".splitlines()[0][:500], **failed_metrics())
        blob = None
    finally:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    elapsed = time.perf_counter() - start
    train_time = trainer.train_time if trainer else 0.0
    tokens = trainer.tokens_seen if trainer else 0
    record.update(
        train_loss=trainer.recent_train_loss() if trainer else float("nan"),
        trained_steps=trainer.step if trainer else 0,
        curve=trainer.curve if trainer else [],
        flops_per_step=trainer.flops_per_step if trainer else None,
        time_s=elapsed,
        train_time_s=train_time,
        tokens_per_s=tokens / train_time if train_time > 0 else None,
        peak_memory_mb=_peak_memory_mb(dev),
    )
    record.setdefault("params", None)
    record.setdefault("precision", None)
    if state is not None:
        record.setdefault("resumed_from", 0)
    if keep_trainer:
        record["_trainer"] = trainer
    if save_state:
        record["_state"] = blob
    return record
