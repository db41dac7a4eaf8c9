"""Train one gene on one dataset and measure it: the fitness function of the search.

``train_and_evaluate(gene, config, data)`` returns an ``EvaluationRecord`` and never raises for a
bad gene: a NaN/inf loss ends training early with status ``diverged``, running out of memory gives
``oom``, any other exception ``error`` with its message. Only bad *input* (an unknown device, say)
and KeyboardInterrupt propagate. ``run_training`` does the same and also hands back the Trainer
(the model, to save or inspect) and, when asked, its state after training: they travel beside the
record, never inside it.

The measurement:

- AdamW, gradient clipping, a fixed step budget, constant lr (the original's) or linear warmup +
  cosine decay; deterministic for a seed (model init, dropout and batch order all derive from it).
- Evaluation is exact: the token-weighted mean NLL over every scored target of the split (the
  datasets never score padding), perplexity = exp of it, plus next-token accuracy; the record says
  how many tokens were scored (``eval_tokens``), so a capped evaluation is visible as such.
- The record also carries the learning curve, parameter count, FLOPs per training step (PyTorch's
  flop counter on the first step), wall time, tokens/s, peak memory, device and versions.
- Inference latency (``latency_ms``): after a successful evaluation, the first evaluation batch is
  run through the model in eval mode without gradients ``LATENCY_WARMUP`` times untimed, then
  ``LATENCY_REPEATS`` times timed (the device synchronised around each pass); the record keeps the
  median, the interquartile range (``latency_ms_iqr``) and torch's CPU thread count
  (``latency_threads``). The same procedure for every gene; still a wall-clock time, so it moves
  with the machine's load.

``Trainer`` is the stateful object behind it: it can train to a step, evaluate, and continue,
which is what multi-fidelity schedules need.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from evo_attention.data.base import TaskData
from evo_attention.genes import AttentionGene, layers_of
from evo_attention.nn.losses import linear_cross_entropy, linear_nll_stats
from evo_attention.nn.model import TinyTransformer
from evo_attention.train.config import Config
from evo_attention.train.environment import (autocast, is_oom, matmul_dtype, peak_memory_mb, reset_peak_memory,
                                             resolve_compile, resolve_device, resolve_precision, synchronize,
                                             versions)
from evo_attention.train.record import EvaluationRecord, Status
from evo_attention.util.errors import UserError

# nats above the uniform-guess loss ln(vocab) at which a finite loss still counts as diverged
ABSURD_MARGIN = 5.0
# inference latency: untimed forward passes first (allocator, kernel selection, caches), then timed ones
LATENCY_WARMUP = 2
LATENCY_REPEATS = 7
# Settings that change what a training run computes; together with gene, seed, steps and the data
# fingerprint they identify an evaluation (the run store's cache key).
FAVOR_FEATURES_DEFAULT = 64
SETTINGS_FIELDS = ("d_model", "n_heads", "n_layers", "max_seq_len", "dropout", "d_ff", "batch_size",
                   "eval_batch_size", "learning_rate", "weight_decay", "grad_clip", "eval_steps",
                   "warmup_steps", "lr_schedule", "precision", "eval_stride")


def result_settings(config: Config, gene: AttentionGene | None = None) -> dict:
    """The settings (other than gene, seed, steps, data) that shape a result, as a record keeps them.

    ``block`` joins them only when it is not the default gpt2, and ``favor_features`` only when it
    differs from its default or the gene uses it: the records and cache keys of runs made before
    these fields existed stay valid, and a llama result never shares a key with a gpt2 one."""
    settings = {name: getattr(config, name) for name in SETTINGS_FIELDS}
    if config.block != "gpt2":
        settings["block"] = config.block
    uses_favor = gene is not None and any(g.normalization == "favor" for g in layers_of(gene))
    if config.favor_features != FAVOR_FEATURES_DEFAULT or uses_favor:
        settings["favor_features"] = config.favor_features
    return settings


def settings_hash(config: Config, eval_split: str = "valid") -> str:
    """Short hash of ``result_settings`` and the split: the ``context`` part of a record's cache key."""
    settings = result_settings(config)
    settings["eval_split"] = eval_split
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


ProgressFn = Callable[[int, int, float], None]  # (step, total_steps, recent mean loss)


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------

def _sdpa_formulas() -> dict:
    """FLOP formulas for the fused attention kernels, priced as the explicit path computes.

    PyTorch's counter has no formula for the CPU kernel, so a gene on the fused path (no attention
    dropout, no window) would be priced as if attention were free, below the same gene on the
    explicit path; and it prices the CUDA kernels' backward with the scores recomputed. Here every
    kernel counts the two score/value products forward and their four gradient products backward,
    as the explicit path does, so the FLOP objective measures the gene and not the kernel that ran
    it (recomputation is the kernel's choice).
    """
    from torch.utils.flop_counter import sdpa_flop_count

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:  # arguments as shapes
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return 2 * sdpa_flop_count(query, key, value)  # each forward product has two gradients

    kernels = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
               "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    formulas = {}
    for name in kernels:  # each takes (query, key, value, ...) and its backward (grad_out, query, key, value, ...)
        if hasattr(torch.ops.aten, name) and hasattr(torch.ops.aten, f"{name}_backward"):
            formulas[getattr(torch.ops.aten, name)] = forward
            formulas[getattr(torch.ops.aten, f"{name}_backward")] = backward
    return formulas


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
        self.compiled = resolve_compile(config.compile, self.device, self.model.genes, self.config.train_steps)
        # the training forward; the FLOP count and evaluation stay eager (a frame first run under
        # the flop counter's dispatch mode would never be compiled, and eval shapes would recompile)
        self._forward = self.model.hidden_states
        if self.compiled:
            # a clean Dynamo cache per compiled model: a search trains many models in one process, and
            # Dynamo gives up compiling a function (silently running it eager) after a few recompiles
            torch._dynamo.reset()
            self._forward = torch.compile(self.model.hidden_states)
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
        self.divergence: str | None = None  # why the training diverged

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
        return matmul_dtype(self.precision)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        with autocast(self.device, self.precision):
            hidden, _ = self._forward(x)
        # the output projection and the loss, fused and chunked (see losses.py)
        loss = linear_cross_entropy(hidden, self.model.head.weight, y, dtype=self.matmul_dtype)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return loss.detach()

    def _count_flops(self, x, y) -> torch.Tensor:
        from torch.utils.flop_counter import FlopCounterMode

        compiled, self._forward = self._forward, self.model.hidden_states  # counted eager (see __init__)
        try:
            with FlopCounterMode(display=False, custom_mapping=_sdpa_formulas()) as counter:
                loss = self._step(x, y)
        finally:
            self._forward = compiled
        self.flops_per_step = int(counter.get_total_flops())
        return loss

    @property
    def absurd_loss(self) -> float:
        """A loss this far above a uniform guess over the vocabulary means the training diverged."""
        return math.log(self.config.vocab_size) + ABSURD_MARGIN

    def _weights_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.model.parameters())

    def train(self, until_step: int | None = None, progress: ProgressFn | None = None) -> str:
        """Train up to ``until_step`` (default: the budget). Returns 'ok' or 'diverged' (the reason is
        ``divergence``): a non-finite loss or weights, or a mean loss above ``absurd_loss``."""
        until = self.config.train_steps if until_step is None else min(until_step, self.config.train_steps)
        self.model.train()
        every = self.config.log_every
        window_sum = torch.zeros((), device=self.device)
        window_n = 0
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        start = time.perf_counter()
        try:
            while self.step < until and not self.diverged:
                x, y = next(self.batches)
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                try:
                    loss = self._count_flops(x, y) if self.flops_per_step is None else self._step(x, y)
                except Exception as exc:  # NaN weights make e.g. sparsemax's sort fail: that is divergence
                    if self._weights_finite():
                        raise
                    self._diverge(f"non-finite weights at step {self.step + 1} "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
                    break
                self.step += 1
                self.tokens_seen += x.numel()
                window_sum += loss
                window_n += 1
                finite &= torch.isfinite(loss)
                if self.step % every == 0 or self.step == until:
                    mean = (window_sum / window_n).item()  # the one host sync, once per log interval
                    if not bool(finite) or not math.isfinite(mean):
                        self._diverge(f"non-finite training loss in steps {self.step - window_n + 1}..{self.step}")
                    elif mean > self.absurd_loss:
                        self._diverge(f"training loss {mean:.4g} at step {self.step} is far above a uniform guess "
                                      f"(ln {self.config.vocab_size} = {math.log(self.config.vocab_size):.2f})")
                    else:
                        self.curve.append([self.step, mean])
                    if progress is not None:
                        progress(self.step, self.config.train_steps, mean)
                    window_sum.zero_()
                    window_n = 0
        finally:
            self.train_time += time.perf_counter() - start
        return "diverged" if self.diverged else "ok"

    def _diverge(self, reason: str) -> None:
        self.diverged = True
        self.divergence = reason

    @torch.no_grad()
    def evaluate(self, split: str = "valid") -> dict:
        """Exact token-weighted NLL, perplexity and accuracy over the split (eval_steps caps batches)."""
        self.model.eval()
        nll = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.long, device=self.device)
        tokens = torch.zeros((), dtype=torch.long, device=self.device)
        for x, y in self.data.eval_batches(split, self.config.eval_batch_size, self.config.eval_steps):
            x, y = x.to(self.device), y.to(self.device)
            with autocast(self.device, self.precision):
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
        text = self.data.scored_text(split, self.config.eval_batch_size, self.config.eval_steps)
        bits = float(nll) / math.log(2)
        per_text = {} if not text else {
            "eval_bytes": text["bytes"], "eval_chars": text["chars"],
            "bits_per_byte": bits / text["bytes"] if text["bytes"] else None,
            "bits_per_char": bits / text["chars"] if text["chars"] else None}
        return {
            **per_text,
            "val_loss": mean,
            "val_perplexity": math.exp(mean) if mean < 700 else float("inf"),
            "accuracy": int(correct) / n,
            "eval_tokens": n,
            "eval_split": split,
            "eval_tokens_total": total,  # scored targets in the whole split
            "eval_complete": n == total,
        }

    @torch.no_grad()
    def measure_latency(self, split: str = "valid", warmup: int = LATENCY_WARMUP,
                        repeats: int = LATENCY_REPEATS) -> dict:
        """Wall time of an eval-mode forward pass (logits included) over the first evaluation batch
        of ``split``: ``{"latency_ms" (median), "latency_ms_iqr", "latency_threads"}``."""
        x, _ = next(iter(self.data.eval_batches(split, self.config.eval_batch_size, 1)))
        x = x.to(self.device)
        self.model.eval()
        times = []
        try:
            for i in range(warmup + repeats):
                synchronize(self.device)
                start = time.perf_counter()
                with autocast(self.device, self.precision):
                    self.model(x)
                synchronize(self.device)
                if i >= warmup:
                    times.append(1000.0 * (time.perf_counter() - start))
        finally:
            self.model.train()
        q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else (times[0],) * 3
        return {"latency_ms": statistics.median(times), "latency_ms_iqr": q3 - q1,
                "latency_threads": torch.get_num_threads()}

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


@dataclass
class TrainingResult:
    """What ``run_training`` gives: the record, and beside it the Trainer (None if it could not be
    built) and the trainer state after training (bytes, when asked and the training succeeded)."""

    record: EvaluationRecord
    trainer: "Trainer | None" = None
    state: bytes | None = None


def run_training(gene: AttentionGene | str, config: Config, data: TaskData, *, seed: int | None = None,
                 steps: int | None = None, eval_split: str = "valid", device: str | None = None,
                 progress: ProgressFn | None = None, until_step: int | None = None, state: bytes | None = None,
                 keep_state: bool = False) -> TrainingResult:
    """Train ``gene`` for ``steps`` (default config.train_steps) and evaluate it.

    Never raises for a failing gene (see the module docstring). Partial trainings (multi-fidelity):
    ``until_step`` stops at that step of the ``steps``-step training (the learning-rate schedule
    still spans all ``steps``); ``state`` (bytes from an earlier ``keep_state``) continues a
    training exactly where it stopped, and the record then says ``resumed_from``; ``keep_state``
    returns the trainer state after training, taken before the evaluation.
    """
    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    if steps is not None:
        config = config.replace(train_steps=int(steps))
    seed = config.seed if seed is None else int(seed)
    dev = resolve_device(device if device is not None else config.device)  # bad input: raise
    record = EvaluationRecord(
        gene=gene.key, seed=seed, steps=config.train_steps, data=data.name, data_fingerprint=data.fingerprint,
        context=settings_hash(config, eval_split), eval_split=eval_split, device=str(dev), versions=versions(),
        settings=result_settings(config, gene),
        resumed_from=0 if state is not None else None)
    reset_peak_memory(dev)
    start = time.perf_counter()
    trainer, blob = None, None
    try:
        trainer = Trainer(gene, config, data, seed=seed, device=dev)
        record.precision = trainer.precision
        record.compiled = trainer.compiled
        record.params = trainer.model.num_parameters()
        if state is not None:
            trainer.load_state_dict(state_from_bytes(state, dev))
            record.resumed_from = trainer.step
        status = Status(trainer.train(until_step=until_step, progress=progress))
        if keep_state and status == Status.OK:
            blob = state_to_bytes(trainer.state_dict())
        record.status = status
        if status == Status.OK:
            for name, value in trainer.evaluate(eval_split).items():
                setattr(record, name, value)
            if record.val_loss > trainer.absurd_loss:
                record.status = Status.DIVERGED
                trainer.divergence = (f"validation loss {record.val_loss:.4g} is far above a uniform guess "
                                      f"(ln {trainer.config.vocab_size} = {math.log(trainer.config.vocab_size):.2f})")
            else:
                for name, value in trainer.measure_latency(eval_split).items():
                    setattr(record, name, value)
        if record.status == Status.DIVERGED:
            record.error = trainer.divergence
    except KeyboardInterrupt:
        raise
    except UserError:
        raise
    except Exception as exc:  # a failing gene must never crash the search
        record.status = Status.OOM if is_oom(exc) else Status.ERROR
        record.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        blob = None
    finally:
        if dev.type == "cuda":
            gc.collect()  # cyclic garbage may hold tensors: drop it before giving cached blocks back
            torch.cuda.empty_cache()
    if trainer is not None:
        record.train_loss = trainer.recent_train_loss()
        record.trained_steps = trainer.step
        record.curve = trainer.curve
        record.flops_per_step = trainer.flops_per_step
        record.train_time_s = trainer.train_time
        record.tokens_per_s = trainer.tokens_seen / trainer.train_time if trainer.train_time > 0 else None
    else:
        record.train_time_s = 0.0
    record.time_s = time.perf_counter() - start
    record.peak_memory_mb = peak_memory_mb(dev)
    return TrainingResult(record, trainer, blob)


def train_and_evaluate(gene: AttentionGene | str, config: Config, data: TaskData, *, seed: int | None = None,
                       steps: int | None = None, eval_split: str = "valid", device: str | None = None,
                       progress: ProgressFn | None = None) -> EvaluationRecord:
    """Train ``gene`` for ``steps`` (default config.train_steps), evaluate it, return its record."""
    return run_training(gene, config, data, seed=seed, steps=steps, eval_split=eval_split, device=device,
                        progress=progress).record
