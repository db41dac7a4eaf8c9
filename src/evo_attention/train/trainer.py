"""Train one gene on one dataset and measure it: the fitness function of the search.

``train_and_evaluate(gene, config, data)`` returns an ``EvaluationRecord`` and never raises for a
bad gene: a NaN/inf loss ends training early with status ``diverged``, running out of memory gives
``oom``, any other exception ``error`` with its message. Only bad *input* (an unknown device, say)
and KeyboardInterrupt propagate. ``run_training`` does the same and also hands back the Trainer
(the model, to save or inspect) and, when asked, its state after training: they travel beside the
record, never inside it.

The measurement:

- AdamW, gradient clipping, a fixed step budget, constant lr (the original's), linear warmup +
  cosine decay, or wsd (linear warmup, stable, linear decay: ``scheduled_rate``); deterministic for
  a seed (model init, dropout and batch order all derive from it). The recipe is the trial's
  ``Trial.recipe``: the configured one, with the genome's own rate, warm-up and weight decay where
  its key sets them (``lr=``, ``wu=``, ``wd=``).
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
import io
import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from evo_attention.data.base import TaskData
from evo_attention.nn.losses import linear_cross_entropy, linear_nll_stats
from evo_attention.nn.model import TinyTransformer
from evo_attention.train.config import Config
from evo_attention.train.spec import Trial, steps_of
from evo_attention.train.environment import (autocast, is_oom, matmul_dtype, peak_memory_mb, reset_peak_memory,
                                             resolve_compile, resolve_device, choose_precision, synchronize,
                                             versions)
from evo_attention.train.record import EvaluationRecord, Status
from evo_attention.util.errors import UserError

# nats above the uniform-guess loss ln(vocab) at which a finite loss still counts as diverged
ABSURD_MARGIN = 5.0
# inference latency: untimed forward passes first (allocator, kernel selection, caches), then timed ones
LATENCY_WARMUP = 2
LATENCY_REPEATS = 7
def scheduled_rate(recipe, step: int, total_steps: int) -> float:
    """The learning rate of step ``step`` (0-based) of a ``total_steps``-step training (the steps
    the schedule spans: a partial training's budget). With peak rate ``lr``, ``W = warmup_steps``
    and ``T = total_steps``:

    - ``constant``: ``lr`` at every step (no warm-up);
    - ``cosine``: ``lr * (step + 1) / W`` for ``step < W``, then
      ``lr * 0.5 * (1 + cos(pi * min(1, (step - W) / max(1, T - W))))``: 0 at ``T``;
    - ``wsd`` (warm-up, stable, decay), with ``D = round(lr_decay_fraction * T)`` decay steps (halves
      up): the same warm-up, then ``lr`` while ``step < T - D``, then ``lr * max(0, T - step) / D``:
      ``lr`` at the decay's first step ``T - D``, ``lr / D`` at the last trained step, 0 at ``T``.
    """
    if recipe.lr_schedule == "constant":
        return recipe.learning_rate
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    if recipe.lr_schedule == "wsd":
        decay = steps_of(recipe.lr_decay_fraction, total_steps)
        if decay == 0 or step < total_steps - decay:
            return recipe.learning_rate
        return recipe.learning_rate * max(0, total_steps - step) / decay
    progress = (step - recipe.warmup_steps) / max(1, total_steps - recipe.warmup_steps)
    return recipe.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


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

    def __init__(self, trial: Trial, data: TaskData, *, device: str | torch.device | None = None):
        self.trial = trial
        self.gene = trial.gene
        self.data = data
        self.seed = trial.seed
        self.recipe = trial.recipe  # the configured recipe with the genome's own parts (lr=, wu=, wd=)
        self.train_steps = trial.schedule_steps  # the learning-rate schedule spans the budget
        self.device = resolve_device(device if device is not None else self.recipe.device)
        # the model's vocabulary and window come from the data
        self.spec = trial.model.with_data(data.vocab_size, data.seq_len)
        # auto: measured per model shape on this machine (environment.choose_precision); the record says why
        self.precision, self.precision_reason = choose_precision(self.recipe.precision, self.device, self.spec,
                                                                 seq_len=data.seq_len,
                                                                 batch_size=self.recipe.batch_size)
        self.config = Config.from_trial(trial, self.spec)  # what a saved model keeps
        if self.device.type == "cpu":
            torch.set_flush_denormal(True)  # subnormal floats make CPU kernels up to 10x slower
        torch.manual_seed(self.seed)
        self.model = TinyTransformer(self.config, self.gene).to(self.device)
        self.compiled = resolve_compile(self.recipe.compile, self.device, self.model.genes, self.train_steps)
        # the training forward; the FLOP count and evaluation stay eager (a frame first run under
        # the flop counter's dispatch mode would never be compiled, and eval shapes would recompile)
        self._forward = self.model.hidden_states
        if self.compiled:
            # a clean Dynamo cache per compiled model: a search trains many models in one process, and
            # Dynamo gives up compiling a function (silently running it eager) after a few recompiles
            torch._dynamo.reset()
            self._forward = torch.compile(self.model.hidden_states)
        self.optimizer = torch.optim.AdamW(self._param_groups(), lr=self.recipe.learning_rate, betas=(0.9, 0.95),
                                           **({"fused": True} if self.device.type == "cuda" else {}))
        self.generator = torch.Generator().manual_seed(self.seed)
        self.batches = data.train_batches(self.recipe.batch_size, self.generator)
        self.step = 0
        self.curve: list = []  # [step, mean train loss over the last log interval]
        self.train_time = 0.0
        self.tokens_seen = 0
        self.flops_per_step: int | None = None
        self.diverged = False
        self.divergence: str | None = None  # why the training diverged

    @classmethod
    def from_config(cls, gene, config, data: TaskData, *, seed: int | None = None,
                    device: str | torch.device | None = None) -> "Trainer":
        """The trainer of ``gene`` under ``config`` (its seed unless given) on ``data``."""
        return cls(Trial.from_config(gene, config, seed=seed, data=data), data, device=device)

    def _param_groups(self):
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            (decay if p.dim() >= 2 and "emb" not in name else no_decay).append(p)
        return [{"params": decay, "weight_decay": self.recipe.weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    def lr_at(self, step: int) -> float:
        return scheduled_rate(self.recipe, step, self.train_steps)

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
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.grad_clip)
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
        return math.log(self.spec.vocab_size) + ABSURD_MARGIN

    def _weights_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.model.parameters())

    def train(self, until_step: int | None = None, progress: ProgressFn | None = None) -> str:
        """Train up to ``until_step`` (default: the budget). Returns 'ok' or 'diverged' (the reason is
        ``divergence``): a non-finite loss or weights, or a mean loss above ``absurd_loss``."""
        until = self.train_steps if until_step is None else min(until_step, self.train_steps)
        self.model.train()
        every = self.recipe.log_every
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
                    self.close_interval(mean, bool(finite), self.step - window_n + 1, self.step)
                    if progress is not None:
                        progress(self.step, self.train_steps, mean)
                    window_sum.zero_()
                    window_n = 0
        finally:
            self.train_time += time.perf_counter() - start
        return "diverged" if self.diverged else "ok"

    def close_interval(self, mean: float, finite: bool, first: int, step: int) -> None:
        """Judge the log interval of steps ``first``..``step`` from its mean training loss: a
        non-finite loss or one far above a uniform guess is divergence, else a point of the curve."""
        if not finite or not math.isfinite(mean):
            self._diverge(f"non-finite training loss in steps {first}..{step}")
        elif mean > self.absurd_loss:
            self._diverge(f"training loss {mean:.4g} at step {step} is far above a uniform guess "
                          f"(ln {self.spec.vocab_size} = {math.log(self.spec.vocab_size):.2f})")
        else:
            self.curve.append([step, mean])

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
        for x, y in self.data.eval_batches(split, self.recipe.eval_batch_size, self.recipe.eval_steps):
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
        total = n if self.recipe.eval_steps is None else self.data.scored_tokens(split)
        text = self.data.scored_text(split, self.recipe.eval_batch_size, self.recipe.eval_steps)
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
        x, _ = next(iter(self.data.eval_batches(split, self.recipe.eval_batch_size, 1)))
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
            "gene": self.gene.key, "seed": self.seed, "train_steps": self.train_steps, "step": self.step,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "curve": [list(point) for point in self.curve], "train_time": self.train_time,
            "tokens_seen": self.tokens_seen, "flops_per_step": self.flops_per_step, "diverged": self.diverged,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (made by ``state_dict`` of a Trainer of the same gene, seed and
        budget); training on gives exactly what an uninterrupted training gives."""
        for name, mine in (("gene", self.gene.key), ("seed", self.seed), ("train_steps", self.train_steps)):
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
        self.batches = self.data.train_batches(self.recipe.batch_size, self.generator)
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


def run_training(trial: Trial, data: TaskData, *, device: str | None = None, progress: ProgressFn | None = None,
                 state: bytes | None = None, keep_state: bool = False) -> TrainingResult:
    """Train ``trial`` on ``data`` (the dataset of its task) and evaluate it.

    Never raises for a failing gene (see the module docstring). A partial training (``trial.budget``
    set, multi-fidelity) stops at ``trial.steps`` of a ``budget``-step training (the learning-rate
    schedule spans the budget); ``state`` (bytes from an earlier ``keep_state``) continues a
    training exactly where it stopped, and the record then says ``resumed_from``; a state that cannot
    be loaded is the tool's fault, never the gene's: it is set aside with a warning and the training
    starts from scratch (the same result). ``keep_state`` returns the trainer state after training,
    taken before the evaluation.
    """
    if trial.task.fingerprint is None:
        trial = trial.with_data(data)
    dev = resolve_device(device if device is not None else trial.train.device)  # bad input: raise
    partial = trial.budget is not None
    record = EvaluationRecord(
        gene=trial.genome, seed=trial.seed, steps=trial.steps, data=data.name, data_fingerprint=data.fingerprint,
        context=trial.context, eval_split=trial.eval_split, device=str(dev), versions=versions(),
        settings=trial.record_settings(), budget=trial.budget,
        resumed_from=0 if (state is not None or partial) else None)
    reset_peak_memory(dev)
    start = time.perf_counter()
    trainer, blob = None, None
    try:
        trainer = Trainer(trial, data, device=dev)
        if state is not None:
            try:
                trainer.load_state_dict(state_from_bytes(state, dev))
                record.resumed_from = trainer.step
            except Exception as exc:  # the tool's own file failed, not the gene: start afresh, as without one
                warnings.warn(f"the trainer state given for {trial.genome} (seed {trial.seed}) cannot be used "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}): "
                              "training it from scratch instead, which gives the same result")
                trainer = Trainer(trial, data, device=dev)
        record.precision = trainer.precision
        record.extra["precision_reason"] = trainer.precision_reason
        record.compiled = trainer.compiled
        record.params = trainer.model.num_parameters()
        status = Status(trainer.train(until_step=trial.steps, progress=progress))
        if keep_state and status == Status.OK:
            blob = state_to_bytes(trainer.state_dict())
        evaluate_into(record, trainer, status, trial.eval_split)
    except KeyboardInterrupt:
        raise
    except UserError:
        raise
    except Exception as exc:  # a failing gene must never crash the search
        record.status = Status.OOM if is_oom(exc) else Status.ERROR
        record.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        blob = None
    except SystemExit as exc:  # a component (a plugin's) that calls sys.exit fails its gene, not the search
        record.status = Status.ERROR
        record.error = f"SystemExit: the gene's code called sys.exit({exc.code!r})"
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


def evaluate_into(record: EvaluationRecord, trainer: "Trainer", status: Status, eval_split: str) -> None:
    """Finish ``record`` of a training that ended with ``status``: on success, the evaluation over
    ``eval_split`` (a loss far above a uniform guess turns it into divergence) and the latency; a
    divergence's reason as its error. The one rule for every trainer (alone or batched)."""
    record.status = status
    if status == Status.OK:
        for name, value in trainer.evaluate(eval_split).items():
            setattr(record, name, value)
        if record.val_loss > trainer.absurd_loss:
            record.status = Status.DIVERGED
            trainer.divergence = (f"validation loss {record.val_loss:.4g} is far above a uniform guess "
                                  f"(ln {trainer.spec.vocab_size} = {math.log(trainer.spec.vocab_size):.2f})")
        else:
            for name, value in trainer.measure_latency(eval_split).items():
                setattr(record, name, value)
    if record.status == Status.DIVERGED:
        record.error = trainer.divergence


def train_and_evaluate(gene, config, data: TaskData, *, seed: int | None = None, steps: int | None = None,
                       eval_split: str = "valid", device: str | None = None,
                       progress: ProgressFn | None = None) -> EvaluationRecord:
    """Train ``gene`` with ``config`` (its seed and train_steps unless given) on ``data``, evaluate
    it, return its record: the trial ``Trial.from_config`` makes of these, trained."""
    trial = Trial.from_config(gene, config, seed=seed, steps=steps, eval_split=eval_split, data=data)
    return run_training(trial, data, device=device, progress=progress).record
