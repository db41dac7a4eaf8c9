"""Train trials and measure them: the fitness function of the search. One engine for one or many.

``run_training(trial, data)`` trains one trial and returns its ``EvaluationRecord`` (inside a
``TrainingResult``, beside the trained ``Member`` and, when asked, its state after training);
``run_batched(trials, data)`` trains K same-shape trials as one. Neither raises for a bad gene: a
NaN/inf loss ends a training early with status ``diverged``, running out of memory gives ``oom``,
any other exception ``error`` with its message. Only bad *input* (an unknown device, trials that
cannot share a batch) and KeyboardInterrupt propagate.

``Trainer(trials, data)`` is the engine behind both: K >= 1 ``Member``s stepped by one loop. With
K = 1 the member's own model trains (compiled where ``compile`` says) with PyTorch's AdamW, on CUDA
as a captured and replayed CUDA graph (``train.graph``: the same kernels, so the same numbers). With
K > 1 the models are folded into one (``nn.fold``, model-major; attentions that differ: ``Split``),
the fused loss gives one mean per model, and ``optim.StackedAdamW`` steps each with its own rate,
decay and clipping; a member's parameters stay views of its slice. A model that diverges leaves the
batch and the others go on; where attentions differ, each member's FLOPs are counted on its own model.

Same trial, same result, alone or in a batch:

- Every member is built as a training of its trial alone builds it (``torch.manual_seed(seed)``,
  then the model), draws its batches from its own seeded generator, and its dropout masks from its
  own stream (``nn.dropout.mask_source``): with ``dropout_stream: cpu`` its own generator, which
  starts at the global RNG state right after its model was built; with ``counter`` the hash of its
  seed, its step and the call's number within the step (``nn.dropout_counter``, on the training's
  device), its rows counted from 0.
- The folded parts, the loss and the optimizer repeat the single model's operations (``nn.fold``,
  ``nn.losses``, ``train.optim``): the vanilla gene (gpt2 and llama, fp32 and bf16) is bitwise the
  same batched with its own seeds and alone on a CPU at one thread, and every gene of the tests'
  covering list stays within ``SAME_RESULT_RTOL`` after 8 steps. What differs is floating-point
  reassociation (batched products at more than one thread; the weight gradients of thin products),
  which training amplifies like any rounding: on the 2-core AMD EPYC, one thread, 300 steps, 10 genes,
  K = 3, up to 3.5e-2 (fp32) and 1.2e-2 (bf16) relative in the final val_loss or a curve point, where
  the same fp32 trial alone at one thread and at two differs by up to 2.8e-2; more for genes that
  amplify rounding (docs/speed.md).

The measurement (the one record rule, alone or batched):

- AdamW, gradient clipping, a fixed step budget, the recipe's learning-rate schedule
  (``schedules``); deterministic for a seed. The recipe is ``Trial.recipe``: the configured one,
  with the genome's own rate, warm-up and weight decay where its key sets them.
- Evaluation is exact: the token-weighted mean NLL over every scored target of the split (padding
  is never scored), perplexity = exp of it, plus next-token accuracy and ``eval_tokens`` scored.
- ``params`` and ``flops_per_step`` are per model (PyTorch's flop counter on the first step, divided
  by K: every counted product is linear in the batch); ``train_time_s`` is the model's share of the
  training's wall time (each step's time divided by the models that took it), so ``tokens_per_s``
  is its share of the throughput; ``time_s`` its share of building and training plus its own
  evaluation; a batched record also says ``batched: K`` and ``batch_time_s``. ``peak_memory_mb`` is
  the process peak while the trials trained (a batch's: larger than one training's).
- Inference latency (``latency_ms``): after a successful evaluation, the first evaluation batch is
  run through the model alone in eval mode ``LATENCY_WARMUP`` times untimed, then
  ``LATENCY_REPEATS`` times timed; the record keeps the median, the interquartile range and
  torch's CPU thread count (a wall-clock time: it moves with the machine's load).

A genome whose parts do not all fold (``batch_problem`` says why: a component with weights and no
folded form) trains one trial at a time, and so do the trials of a batch that fails as a whole (out
of memory, say): a record never depends on the batch it was planned in (it says ``batch_fallback``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import io
import math
import re
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from evo_attention.data.base import TaskData
from evo_attention.genes import AttentionGene, LayerGenes, layers_of, mechanism_of
from evo_attention.nn import components
from evo_attention.nn.attention import EvolvedAttention
from evo_attention.nn.dropout import keep_mask, mask_source
from evo_attention.nn.dropout_counter import counter_key, counter_keep_mask
from evo_attention.train.probe_cache import used_probes
from evo_attention.nn.fold import Rows, Split, Unfoldable, fold_models, fold_problem
from evo_attention.nn.losses import linear_cross_entropy, linear_nll_stats
from evo_attention.nn.model import TinyTransformer
from evo_attention.train.config import MAX_SEED, Config
from evo_attention.train.environment import (PROBE_ROUNDS, PROBE_SLOW_STEP_S, PROBE_STEPS, autocast,
                                             available_memory_mb, choose_precision, is_oom, matmul_dtype,
                                             peak_memory_mb, reset_peak_memory, resolve_compile, resolve_device,
                                             synchronize, versions)
from evo_attention.train import graph
from evo_attention.train.optim import SingleAdamW, StackedAdamW, adamw_state
from evo_attention.train.record import EvaluationRecord, Status
from evo_attention.train.schedules import scheduled_rate
from evo_attention.train.spec import Trial
from evo_attention.util import threads
from evo_attention.util.errors import UserError, check_argument
from evo_attention.util.memory import check_memory

# nats above the uniform-guess loss ln(vocab) at which a finite loss still counts as diverged
ABSURD_MARGIN = 5.0
# inference latency: untimed forward passes first (allocator, kernel selection, caches), then timed ones
LATENCY_WARMUP = 2
LATENCY_REPEATS = 7

# TrainSpec fields the trials of one batch may differ in: they change no shape
VARYING_TRAIN_FIELDS = ("learning_rate", "weight_decay", "warmup_steps", "lr_schedule", "lr_decay_fraction",
                        "grad_clip")
# the tests' bound on a batched trial against the same trial alone (relative, final val_loss and every
# curve point of a short training; module docstring); genes whose parts all fold exactly are bitwise equal
SAME_RESULT_RTOL = {"fp32": 5e-3, "bf16": 5e-3}

ProgressFn = Callable[[int, int, float], None]  # (step, total_steps, recent mean loss)


def sdpa_flop_formulas() -> dict:
    """FLOP formulas for the fused attention kernels, priced as the explicit path computes: the two
    score/value products forward and their four gradients backward, so the FLOP objective measures the
    gene, not the kernel (PyTorch has no formula for the CPU kernel, and prices CUDA's recomputation)."""
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


# -- Which trials train as one ----------------------------------------------------------------------

def shape_difference(trials: Sequence[Trial]) -> tuple[str, str] | None:
    """``(field, message)`` for the first field in which a trial differs from the first one where the
    trials of a batch must agree, or None when they can train as one batch."""
    first = trials[0]
    for i, trial in enumerate(trials[1:], 1):
        for name in ("genome", "steps", "budget", "eval_split"):
            mine, theirs = getattr(first, name), getattr(trial, name)
            if name == "genome":  # the attentions may differ (nn.fold splits them): the model around them may not
                mine, theirs = _model_frame(mine), _model_frame(theirs)
            if mine != theirs:
                return name, f"trial {i} has {name} {theirs!r} where trial 0 has {mine!r}"
        for group in ("model", "task", "train"):
            a, b = getattr(first, group), getattr(trial, group)
            for name in (f.name for f in dataclasses.fields(a) if f.compare):
                if group == "train" and name in VARYING_TRAIN_FIELDS:
                    continue
                mine, theirs = getattr(a, name), getattr(b, name)
                if mine != theirs:
                    return name, f"trial {i} has {group}.{name} {theirs!r} where trial 0 has {mine!r}"
    return None


def _model_frame(genome) -> str:
    """What a genome decides outside its attentions: whether the model has a learned position table."""
    learned = layers_of(mechanism_of(genome))[0].uses_absolute_positions
    return "a learned position table" if learned else "no learned position table"


def check_batchable(trials: Sequence[Trial]) -> None:
    """UserError naming the field in which the trials differ where one batch needs them equal."""
    difference = shape_difference(trials)
    if difference is not None:
        name, message = difference
        config_fields = {f.name for f in dataclasses.fields(Config)}
        raise UserError(f"these trials cannot train as one batch: {message} (a batch shares everything but the "
                        f"seed and {', '.join(VARYING_TRAIN_FIELDS)})",
                        setting=name if name in config_fields else None)


def batch_problem(trial: Trial) -> str | None:
    """Why the genome of ``trial`` cannot be folded into a batch (its trials then train one by one),
    naming the component, or None."""
    gene = mechanism_of(trial.gene)
    # the registered factories are part of the answer's key: a name unregistered and registered
    # again (another plugin's component) is another component
    factories = tuple(components.factory(field, getattr(layer, field)) for layer in layers_of(gene)
                      for field in EvolvedAttention.COMPONENTS.values())
    return _fold_problem(gene.key, trial.model, factories)


@functools.lru_cache(maxsize=256)
def _fold_problem(genome: str, model, factories: tuple) -> str | None:
    # folding depends on the parts of the model, not on its vocabulary or window: a small stand-in,
    # built without touching the global random state
    with torch.random.fork_rng(devices=[]):
        built = TinyTransformer(model.with_data(2, 1), genome)
    exc = fold_problem(built)
    if exc is None:
        return None
    parts = exc.part.split(".")
    if len(parts) >= 4 and parts[0] == "blocks" and parts[2] == "attn" and parts[3] in EvolvedAttention.COMPONENTS:
        field = EvolvedAttention.COMPONENTS[parts[3]]
        name = getattr(built.genes[int(parts[1])], field)
        return f"{field} {name!r} cannot be folded into a batch: {exc}"
    return f"cannot be folded into a batch: {exc}"


# -- One trial's training ---------------------------------------------------------------------------

@torch.no_grad()
def evaluation_sums(model, data: TaskData, split: str, batch_size: int, cap: int | None, *, device: torch.device,
                    precision: str, models: int = 1, rows: Rows | None = None):
    """(summed NLL as float64, correct next-token predictions, scored tokens), each [models], over the
    first ``cap`` evaluation batches of ``split``: of one model, or of ``models`` folded ones (``rows``),
    each scoring the same batch with its own head (the sums it gets alone). UserError: no scored token."""
    nll = torch.zeros(models, dtype=torch.float64, device=device)
    correct = torch.zeros(models, dtype=torch.long, device=device)
    tokens = torch.zeros(models, dtype=torch.long, device=device)
    heads = [model.head.weight] if models == 1 else model.head.weight  # [vocab, d]; folded [K, vocab, d]
    model.eval()
    for x, y in data.eval_batches(split, batch_size, cap):
        x, y = x.to(device), y.to(device)
        if rows is not None:
            rows.batch = x.shape[0]
        with autocast(device, precision):
            hidden, _ = model.hidden_states(x if models == 1 else x.repeat(models, *([1] * (x.dim() - 1))))
        for i, h in enumerate(hidden.split(x.shape[0])):  # [B, T, d] per model
            batch_nll, batch_correct, batch_tokens = linear_nll_stats(h, heads[i], y, dtype=matmul_dtype(precision))
            nll[i] += batch_nll
            correct[i] += batch_correct
            tokens[i] += batch_tokens
    model.train()
    if int(tokens.min()) == 0:  # every model sees the same batches
        raise UserError(f"the {split} split has no scored tokens: check the dataset settings")
    return nll, correct, tokens


class Member:
    """One trial of a ``Trainer`` (its model's weights are views of the batch's stacked weights while
    it trains folded); its evaluation and, trained alone or kept with its moments, its checkpoint."""

    def __init__(self, trial: Trial, data: TaskData, *, device: torch.device, spec, precision: str,
                 precision_reason: str):
        self.trial, self.gene, self.data, self.seed = trial, trial.gene, data, trial.seed
        self.recipe = trial.recipe  # the configured recipe with the genome's own parts (lr=, wu=, wd=)
        self.train_steps = trial.schedule_steps  # the learning-rate schedule spans the budget
        self.device, self.spec = device, spec
        self.precision, self.precision_reason = precision, precision_reason
        self.settings = trial.config_dict(spec)  # what a saved model keeps (train.saving.save_model)
        torch.manual_seed(self.seed)
        self.model = TinyTransformer(spec, self.gene).to(device)
        # dropout: the global stream right after the model was built, drawn by this member alone
        self.dropout_generator = torch.Generator()
        self.dropout_generator.set_state(torch.get_rng_state())
        self.generator = torch.Generator().manual_seed(self.seed)
        self.batches = data.train_batches(self.recipe.batch_size, self.generator)
        self.optimizer: torch.optim.Optimizer | None = None  # PyTorch's AdamW state, for state_dict
        self.compiled = False
        self.cuda_graph: str | None = None  # on CUDA: how its steps ran (train.graph)
        self.step = 0
        self.curve: list = []  # [step, mean train loss over the last log interval]
        self.val_curve: list = []  # [step, validation loss on VAL_BATCHES batches] at VAL_POINTS of the budget
        self.train_time = 0.0
        self.tokens_seen = 0
        self.flops_per_step: int | None = None
        self.diverged = False
        self.divergence: str | None = None  # why the training diverged

    def lr_at(self, step: int) -> float:
        return scheduled_rate(self.recipe, step, self.train_steps)

    @property
    def absurd_loss(self) -> float:  # a loss this far above a uniform guess means the training diverged
        return math.log(self.spec.vocab_size) + ABSURD_MARGIN

    def far_above_guess(self, what: str) -> str:
        return f"{what} is far above a uniform guess (ln {self.spec.vocab_size} = {math.log(self.spec.vocab_size):.2f})"

    def close_interval(self, mean: float, finite: bool, first: int, step: int) -> None:
        """Judge the log interval of steps ``first``..``step`` from its mean training loss: a
        non-finite loss or one far above a uniform guess is divergence, else a point of the curve."""
        if not finite or not math.isfinite(mean):
            self.diverge(f"non-finite training loss in steps {first}..{step}")
        elif mean > self.absurd_loss:
            self.diverge(self.far_above_guess(f"training loss {mean:.4g} at step {step}"))
        else:
            self.curve.append([step, mean])

    def diverge(self, reason: str) -> None:
        self.diverged = True
        self.divergence = reason

    def detach_weights(self) -> None:  # weights of its own (they were views of a batch's stacked weights)
        for p in self.model.parameters():
            p.data = p.data.clone()

    @torch.no_grad()
    def validation_point(self) -> None:
        """The loss on the first VAL_BATCHES valid batches at this step (draws nothing from any stream)."""
        self.add_validation_point(self.evaluate("valid", max_batches=VAL_BATCHES)["val_loss"])

    def add_validation_point(self, loss: float) -> None:
        if math.isfinite(loss):
            self.val_curve.append([self.step, loss])

    def eval_cap(self, max_batches: int | None = None) -> int | None:  # eval_steps, or max_batches if smaller
        return self.recipe.eval_steps if max_batches is None else min(max_batches, self.recipe.eval_steps or max_batches)

    def evaluate(self, split: str = "valid", max_batches: int | None = None) -> dict:
        """Exact token-weighted NLL, perplexity and accuracy over the split (batches capped: ``eval_cap``)."""
        sums = evaluation_sums(self.model, self.data, split, self.recipe.eval_batch_size, self.eval_cap(max_batches),
                               device=self.device, precision=self.precision)
        nll, correct, n = float(sums[0][0]), int(sums[1][0]), int(sums[2][0])
        mean = nll / n
        total = n if self.recipe.eval_steps is None else self.data.scored_tokens(split)
        text = self.data.scored_text(split, self.recipe.eval_batch_size, self.recipe.eval_steps)
        bits = nll / math.log(2)
        per_text = {} if not text else {
            "eval_bytes": text["bytes"], "eval_chars": text["chars"],
            "bits_per_byte": bits / text["bytes"] if text["bytes"] else None,
            "bits_per_char": bits / text["chars"] if text["chars"] else None}
        return {
            **per_text,
            "val_loss": mean,
            "val_perplexity": math.exp(mean) if mean < 700 else float("inf"),
            "accuracy": correct / n,
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

    # -- checkpoints (multi-fidelity schedules continue a training from one) ---------------------
    def state_dict(self) -> dict:
        """Everything needed to continue this training exactly, alone; not the batch stream, a function
        of the seed, which ``load_state_dict`` replays, skipping ``step`` batches."""
        if self.optimizer is None:
            raise RuntimeError("this member trained in a batch that did not keep its optimizer moments "
                               "(Trainer.train(keep_moments=True))")
        return {
            "gene": self.gene.key, "seed": self.seed, "train_steps": self.train_steps, "step": self.step,
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "curve": [list(point) for point in self.curve], "train_time": self.train_time,
            "val_curve": [list(point) for point in self.val_curve],
            "tokens_seen": self.tokens_seen, "flops_per_step": self.flops_per_step, "diverged": self.diverged,
            "rng": self.dropout_generator.get_state(), "cuda_rng": None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly from ``state`` (``state_dict`` of a member of the same gene, seed and budget)."""
        for name, mine in (("gene", self.gene.key), ("seed", self.seed), ("train_steps", self.train_steps)):
            if state.get(name) != mine:
                raise ValueError(f"checkpoint has {name} {state.get(name)!r}, this trainer {mine!r}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.curve = [list(point) for point in state["curve"]]
        self.val_curve = [list(point) for point in state.get("val_curve", [])]
        self.train_time = float(state["train_time"])
        self.tokens_seen = int(state["tokens_seen"])
        self.flops_per_step = state["flops_per_step"]
        self.diverged = bool(state["diverged"])
        self.generator = torch.Generator().manual_seed(self.seed)
        self.batches = self.data.train_batches(self.recipe.batch_size, self.generator)
        for _ in range(self.step):  # one batch per step
            next(self.batches)
        self.dropout_generator.set_state(state["rng"].cpu())


# -- The engine -------------------------------------------------------------------------------------

# bytes per parameter of a training: the fp32 weight, its gradient and AdamW's two moments
TRAINING_BYTES_PER_PARAMETER = 16
# float32 values per token a training holds at least for its backward pass: per layer LAYER_FLOATS (per d_model, per
# d_ff), outside the layers OUTSIDE_FLOATS d_model; an evaluation (one layer at a time) EVALUATION_FLOATS. A lower
# bound (first fp32 CPU steps grew the peak RSS by per layer 11 d_model + 2 d_ff, outside 6.3-33 d_model, evaluation
# 6.7 d_model at d_ff 4 d_model), attention scores not counted: a training that still runs out is recorded oom.
LAYER_FLOATS, OUTSIDE_FLOATS, EVALUATION_FLOATS = (10, 2), 6, (3, 1)


@functools.lru_cache(maxsize=256)
def _parameters(genome: str, spec) -> int:
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # no memory, no random draws
        return TinyTransformer(spec, genome).num_parameters()


def check_training_memory(spec, genome, models: int, device: torch.device, vocab_from: str | None = None, *,
                          batch_size: int = 0, eval_batch_size: int = 0, seq_len: int = 0) -> None:
    """UserError, before any model is built, when the weights, gradients and moments of ``models``
    models of ``genome`` at ``spec`` and the activations of their batches (``batch_size``,
    ``eval_batch_size`` windows of ``seq_len`` tokens, else ``spec.max_seq_len``; 0: none) would not
    fit in ``device``'s available memory. ``vocab_from``: the data name whose knob set the vocabulary."""
    params = _parameters(mechanism_of(genome).key, spec)
    t, d, ff = seq_len or spec.max_seq_len, spec.d_model, spec.ffn_dim
    train = batch_size * t * (spec.n_layers * (LAYER_FLOATS[0] * d + LAYER_FLOATS[1] * ff) + OUTSIDE_FLOATS * d)
    evaluation = eval_batch_size * t * (EVALUATION_FLOATS[0] * d + EVALUATION_FLOATS[1] * ff)
    activations = 4 * models * max(train, evaluation)
    needed = TRAINING_BYTES_PER_PARAMETER * params * models + activations
    embedding = spec.vocab_size * spec.d_model
    if activations > needed / 2:
        batch, windows = ("batch_size", batch_size) if train >= evaluation else ("eval_batch_size", eval_batch_size)
        fix, setting = f"lower {batch} or max_seq_len (the activations of {windows:,} windows of {t} tokens)", (
            batch, "max_seq_len")
    elif 2 * embedding > params:
        knob = "vocab_size" if vocab_from is None else f"the vocab knob of data {vocab_from}"
        fix, setting = f"lower {knob} (the vocabulary sets the embedding) or d_model", (
            "vocab_size" if vocab_from is None else "data", "d_model")
    else:
        fix, setting = "lower d_model or n_layers", ("d_model", "n_layers")
    what = f"training {'a model' if models == 1 else f'{models} models'} of {params:,} parameters"
    available = available_memory_mb(device)
    check_memory(needed, what, fix, setting=setting, available=None if available is None else available * 2**20,
                 where="this machine" if device.type == "cpu" else str(device))


class Trainer:
    """Trains K >= 1 trials as one (see the module docstring); ``train()`` may be called again to
    continue. A trainer of one trial reads as its member: ``trainer.model``, ``.curve``,
    ``.evaluate()``, ``.state_dict()`` are that trial's."""

    graph_class = graph.StepGraph  # how a step is captured and replayed on CUDA (train.graph)

    def __init__(self, trials: Trial | Sequence[Trial], data: TaskData, *, device: str | torch.device | None = None):
        trials = [trials] if isinstance(trials, Trial) else list(trials)
        if len(trials) > 1:
            check_batchable(trials)
        first = trials[0]
        self.trials, self.data = trials, data
        self.device = resolve_device(device if device is not None else first.train.device)
        if self.device.type == "cpu":
            threads.watch()  # OpenMP's waits follow the other processes' load (util/threads.py)
        self.spec = first.model.with_data(data.vocab_size, data.seq_len)
        knobs = str(first.task.data).partition(":")[2]
        vocab_from = first.task.data if re.search(r"(^|[:,])vocab=", knobs) else None  # the data set the vocabulary
        largest = max({mechanism_of(t.gene).key for t in trials}, key=lambda key: _parameters(key, self.spec))
        windows = first.train.eval_batch_size  # an evaluation batch holds at most its split's windows
        with contextlib.suppress(NotImplementedError):  # a streamed split's size is unknown
            windows = min(windows, max(map(data.num_eval_items, {"valid", first.eval_split})))
        check_training_memory(self.spec, largest, len(trials), self.device, vocab_from,  # before any model is built
                              batch_size=first.train.batch_size, eval_batch_size=windows, seq_len=data.seq_len)
        # auto: measured per model shape on this machine (environment.choose_precision); the record says why
        self.precision, self.precision_reason = choose_precision(
            first.train.precision, self.device, self.spec, seq_len=data.seq_len, batch_size=first.train.batch_size,
            dropout_stream=first.train.dropout_stream, timer=lambda: precision_step_times(first, data, self.device))
        if self.device.type == "cpu":
            torch.set_flush_denormal(True)  # subnormal floats make CPU kernels up to 10x slower
        if len(trials) > 1:
            problem = next(filter(None, map(batch_problem, trials)), None)
            if problem:
                raise Unfoldable(problem)
        self.members = [Member(t, data, device=self.device, spec=self.spec, precision=self.precision,
                               precision_reason=self.precision_reason) for t in trials]
        self.active = list(self.members)
        self.step = 0
        self.flops_per_step: int | None = None
        # ``stepper`` (``train.optim``): PyTorch's AdamW for one model (also ``trainer.optimizer``), stacked for K
        self.graph: graph.StepGraph | None = None
        self.graph_problem: str | None = None
        if len(trials) == 1:
            member = self.members[0]
            self.rows, self.fold = None, None
            self.model = member.model
            member.compiled = resolve_compile(first.train.compile, self.device, self.model.genes, member.train_steps)
            self.graph_problem = graph.graph_problem(first.train.cuda_graph, self.device, 1, member.compiled)
            # a rate tensor is for CUDA's fused AdamW only (the tests' CPU stand-in graph keeps the float)
            self.stepper = SingleAdamW(self.model, member.recipe.learning_rate, member.recipe.weight_decay,
                                       self.device, graphable=self.graph_problem is None and self.device.type == "cuda")
            member.optimizer = self.stepper.torch
            if self.graph_problem is None:
                self.graph = self.graph_class(self.device, self._graph_body, self.stepper.zero_grad)
        else:
            self.rows = Rows()
            self.fold = fold_models([m.model for m in self.members], self.rows)
            self.model = self.fold.model
            self.stepper = StackedAdamW(self.fold.stacked, self.fold.owners)
            self.graph_problem = graph.graph_problem(first.train.cuda_graph, self.device, len(trials), False)
        self.compiled = self.members[0].compiled
        self.dropout_stream = first.train.dropout_stream
        self._dropout_calls = [0]  # each model's dropout calls so far in the current step (the counter's ``call``)
        self._graph_keys = False  # in _graph_body: masks read their keys from the graph's input
        # a compiled forward runs the counter's mask eagerly: traced, its step and call (Python
        # integers) would be guards that recompile the graph every step
        self._mask_fn = torch.compiler.disable(self._masks) if self.compiled else self._masks
        self.model.train()
        # the training forward; the FLOP count and evaluation stay eager (a frame first run under
        # the flop counter's dispatch mode would never be compiled, and eval shapes would recompile)
        self._forward = self.model.hidden_states
        if self.compiled:
            # a clean Dynamo cache per compiled model: a search trains many models in one process, and
            # Dynamo gives up compiling a function (silently running it eager) after a few recompiles
            torch._dynamo.reset()
            self._forward = torch.compile(self.model.hidden_states)

    def __getattr__(self, name: str):
        members = self.__dict__.get("members")
        if members is not None and len(members) == 1 and not name.startswith("__"):
            return getattr(members[0], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @classmethod
    def from_config(cls, gene, config, data: TaskData, *, seed: int | None = None,
                    device: str | torch.device | None = None) -> "Trainer":
        """The trainer of ``gene`` under ``config`` (its seed unless given) on ``data``."""
        return cls(Trial.from_config(gene, config, seed=seed, data=data), data, device=device)

    @property
    def size(self) -> int:
        return len(self.members)

    # -- one step ----------------------------------------------------------------------------
    def _masks(self, shape: tuple, p: float) -> torch.Tensor:
        """The dropout keep mask of the rows computing (every active model's, or inside a folded
        ``Split`` its group's): model k's rows from model k's stream, its k-th call its own."""
        running = range(len(self.active)) if self.rows is None or self.rows.members is None else self.rows.members
        calls = [self._dropout_calls[i] for i in running]
        for i in running:
            self._dropout_calls[i] += 1
        if self.dropout_stream == "counter":
            if self._graph_keys:  # in the captured step: its keys are an input of the graph
                return counter_keep_mask(shape, p, self.graph.keys[calls[0]:calls[0] + 1], device=self.device)
            return counter_keep_mask(shape, p, [counter_key(self.active[i].seed, self.active[i].step, call)
                                                for i, call in zip(running, calls)], device=self.device)
        gens = [self.active[i].dropout_generator for i in running]
        if len(gens) == 1:
            return keep_mask(shape, p, generator=gens[0])
        if shape[0] % len(gens):
            raise RuntimeError(f"a dropout site of {shape[0]} rows does not split over {len(gens)} models")
        part = (shape[0] // len(gens), *shape[1:])
        return torch.cat([keep_mask(part, p, generator=g) for g in gens])

    def _losses(self, x: torch.Tensor, y: torch.Tensor, cache: bool = True) -> torch.Tensor:
        """The forward pass and loss of every active model: their losses [K] (with their graph)."""
        if self.rows is not None:
            self.rows.batch = x.shape[0] // len(self.active)
        self._dropout_calls = [0] * len(self.active)
        with mask_source(self._mask_fn), autocast(self.device, self.precision, cache):
            hidden, _ = self._forward(x)
        weight = self.model.head.weight  # tied to the token table (stacked [K, vocab, d] when folded)
        return linear_cross_entropy(hidden, weight, y, dtype=matmul_dtype(self.precision))

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimisation step of every active model; their losses [K]."""
        losses = self._losses(x, y)
        self.stepper.zero_grad()
        losses.sum().backward()
        self.stepper.step([m.lr_at(self.step) for m in self.active], [m.recipe.weight_decay for m in self.active],
                            [m.recipe.grad_clip for m in self.active])
        return losses.detach().reshape(len(self.active))

    def _graph_body(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step ``StepGraph`` captures (one model): ``_step`` with the rate read from the
        optimizer's tensor and the gradients written, not zeroed (the capture starts with none)."""
        self._graph_keys = True
        try:
            losses = self._losses(x, y, cache=False)
        finally:
            self._graph_keys = False
        losses.sum().backward()
        self.stepper.update(self.active[0].recipe.grad_clip)
        return losses.detach().reshape(1)

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step by the fastest path that gives the same numbers: the FLOP count first, then eager
        steps, on CUDA a captured graph from ``graph.CAPTURE_AFTER`` steps on (``train.graph``)."""
        if self.flops_per_step is None:
            return self.count_flops(x, y)
        g = self.graph
        if g is None or not self.active:
            return self._step(x, y)
        m = self.active[0]
        if g.graph is not None and (x.shape, y.shape) != (g.x.shape, g.y.shape):  # a loader's odd batch
            self.graph = None  # eager from here on; the graph and its buffers are freed
            self.graph_problem = f"a batch of another shape ({tuple(x.shape)}) at step {self.step + 1}"
            return self._step(x, y)
        if g.graph is not None:
            self.stepper.set_rate(m.lr_at(self.step))
            return g.replay(x, y, [counter_key(m.seed, m.step, c) for c in range(g.calls)])
        losses = g.warm(lambda: self._step(x, y))
        if self.step + 1 < graph.CAPTURE_AFTER:
            return losses
        if self.dropout_stream == "cpu" and self._dropout_calls[0]:
            self.graph, self.graph_problem = None, "dropout masks drawn on the CPU (dropout_stream cpu)"
            return losses
        if not g.capture(x, y, self._dropout_calls[0], self.step + 1):  # eager from here on: the same numbers
            self.graph, self.graph_problem = None, g.describe()
        return losses

    def graph_state(self) -> str | None:
        """How the steps ran on CUDA (None elsewhere): a captured graph, or eager and why."""
        if self.device.type != "cuda":
            return None
        if self.graph is None:
            return f"eager: {self.graph_problem}"
        if self.graph.graph is None:
            return f"eager: the training ended before step {graph.CAPTURE_AFTER}, where its step is captured"
        return self.graph.describe()

    def count_flops(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step on ``x``, ``y`` under PyTorch's flop counter (eager); sets every active
        member's ``flops_per_step`` (the batch's count divided by its models) and returns the losses."""
        compiled, self._forward = self._forward, self.model.hidden_states  # counted eager (see __init__)
        try:
            with FlopCounterMode(display=False, custom_mapping=sdpa_flop_formulas()) as counter:
                loss = self._step(x, y)
        finally:
            self._forward = compiled
        self.flops_per_step = int(round(counter.get_total_flops() / len(self.active)))
        split = self.fold is not None and any(isinstance(part, Split) for part in self.model.modules())
        counts: dict[str, int] = {}  # a batch of different attentions: each model's own count, once per mechanism
        for m in self.active:
            key = mechanism_of(m.gene).key
            if split and key not in counts:
                counts[key] = self._flops_alone(m, x[:x.shape[0] // len(self.active)], y[:y.shape[0] // len(self.active)])
            m.flops_per_step = counts.get(key, self.flops_per_step)
        return loss

    def _flops_alone(self, member: Member, x: torch.Tensor, y: torch.Tensor) -> int:
        """The FLOPs of one training step of ``member``'s model alone on rows like ``x``, ``y``: its
        forward and backward pass (the optimizer's arithmetic is not counted), with masks that keep
        everything, drawn from no stream."""
        model = member.model
        try:
            with FlopCounterMode(display=False, custom_mapping=sdpa_flop_formulas()) as counter, \
                    mask_source(lambda shape, p: torch.ones(shape, dtype=torch.bool)), \
                    autocast(self.device, self.precision, True):
                hidden, _ = model.hidden_states(x)
                linear_cross_entropy(hidden, model.head.weight, y, dtype=matmul_dtype(self.precision)).sum().backward()
        finally:
            for p in model.parameters():
                p.grad = None
        return counter.get_total_flops()

    @torch.no_grad()
    def _validation_points(self) -> None:
        """Every active member's point of its validation curve (``Member.validation_point``). Folded,
        one forward pass of all K models per batch (each model's rows the same batch), each model's
        rows scored with its own head: the sums each would make alone, in one pass instead of K."""
        if self.fold is None:
            self.members[0].validation_point()
            return
        first = self.active[0]
        nll, _, tokens = evaluation_sums(self.model, self.data, "valid", first.recipe.eval_batch_size,
                                         first.eval_cap(VAL_BATCHES), device=self.device, precision=self.precision,
                                         models=len(self.active), rows=self.rows)
        for m, loss in zip(self.active, (nll / tokens).tolist()):
            m.add_validation_point(loss)

    def _drop(self, keep: list[int]) -> None:
        """Only the models at ``keep`` (indices into ``active``) train on."""
        for i, m in enumerate(self.active):
            if i not in keep and self.fold is not None:
                m.detach_weights()
        self.active = [self.active[i] for i in keep]
        if self.fold is None or not self.active:
            return
        self.stepper.keep_models(self.fold.keep(list(keep)))
        self.fold.bind([m.model for m in self.active])

    # -- training ------------------------------------------------------------------------------
    def train(self, until_step: int | None = None,
              progress: ProgressFn | Sequence[ProgressFn | None] | None = None) -> str:
        """Train every model to its budget (or ``until_step``), or until it diverges: a non-finite
        loss or weights, or a mean loss above its ``absurd_loss`` (the member's ``divergence`` says
        which). ``progress``: a ``ProgressFn`` (one trial) or one per member, called after each log
        interval. May be called again to continue. Returns 'ok' or 'diverged' (of the first member)."""
        steps = self.members[0].train_steps
        until = steps if until_step is None else min(until_step, steps)
        fns = [progress] if callable(progress) else list(progress or [])
        report = {id(m): fn for m, fn in zip(self.members, fns) if fn is not None}
        every = log_interval(self.members[0].recipe.log_every, steps)
        checks = validation_steps(steps)
        self.model.train()
        n = len(self.active)
        window_sum = torch.zeros(n, device=self.device)
        window_n = 0
        finite = torch.ones(n, dtype=torch.bool, device=self.device)
        pending = None
        while self.step < until and self.active:
            start = time.perf_counter()
            if pending is None:
                pairs = [next(m.batches) for m in self.active]
                xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
            else:
                (xs, ys), pending = pending, None
            x = (xs[0] if len(xs) == 1 else torch.cat(xs)).to(self.device, non_blocking=True)
            y = (ys[0] if len(ys) == 1 else torch.cat(ys)).to(self.device, non_blocking=True)
            streams = [m.dropout_generator.get_state() for m in self.active]
            try:
                loss = self._train_step(x, y)
            except Exception as exc:  # NaN weights make e.g. a plugin's sort fail: that is divergence
                bad = [i for i, m in enumerate(self.active)
                       if not all(bool(torch.isfinite(p).all()) for p in m.model.parameters())]
                if not bad:
                    raise
                text = str(exc).splitlines()[0][:200] if str(exc) else ""
                for i in bad:
                    self.active[i].diverge(f"non-finite weights at step {self.step + 1} "
                                           f"({type(exc).__name__}: {text})")
                keep = [i for i in range(len(self.active)) if i not in bad]
                for i in keep:  # the step again for the others, with their batches and dropout masks
                    self.active[i].dropout_generator.set_state(streams[i])
                pending = ([xs[i] for i in keep], [ys[i] for i in keep])
                window_sum, finite = window_sum[keep], finite[keep]
                self._drop(keep)
                continue
            self.step += 1
            window_sum += loss
            window_n += 1
            finite &= torch.isfinite(loss)
            closing = self.step % every == 0 or self.step == until
            means = (window_sum / window_n).tolist() if closing else None  # the one host sync per interval
            elapsed = time.perf_counter() - start
            for i, m in enumerate(self.active):
                m.step += 1
                m.tokens_seen += xs[i].numel()
                m.train_time += elapsed / len(self.active)
            if self.step in checks:
                self._validation_points()
            if not closing:
                continue
            finites = finite.tolist()
            for i, m in enumerate(self.active):  # each model by the single training's rule
                m.close_interval(means[i], bool(finites[i]), self.step - window_n + 1, self.step)
                if id(m) in report:
                    report[id(m)](self.step, m.train_steps, means[i])
            window_sum.zero_()
            window_n = 0
            keep = [i for i, m in enumerate(self.active) if not m.diverged]
            if len(keep) < len(self.active):
                window_sum, finite = window_sum[keep], finite[keep]
                self._drop(keep)
        return "diverged" if self.members[0].diverged else "ok"

    def release(self, keep_moments: bool = False) -> None:
        """End a folded training: each member gets weights of its own and, with ``keep_moments``, its
        optimizer state (for ``state_dict``: to continue it alone). A one-trial trainer has nothing to release."""
        if self.fold is None:
            return
        for k, m in enumerate(self.active):
            if keep_moments:
                slots = {name: self.fold.slice_of(k, name) for name, _ in m.model.named_parameters()}
                m.optimizer = adamw_state(m.model, m.recipe.learning_rate, m.recipe.weight_decay, self.device,
                                          self.stepper.steps, self.stepper.moments(slots))
                for group in m.optimizer.param_groups if m.step else ():  # the rate of its last step
                    group["lr"] = m.lr_at(m.step - 1)
            m.detach_weights()
        self.active, self.fold = [], None

    def load_state_dict(self, state: dict) -> None:
        """Continue the one trial of this trainer from ``state`` (``Member.state_dict``)."""
        if len(self.members) != 1:
            raise ValueError("only a trainer of one trial continues from a checkpoint")
        self.members[0].load_state_dict(state)
        self.step = self.members[0].step


def step_seconds(trials: Sequence[Trial], data: TaskData, *, device: torch.device, warmup: int = 1, steps: int = 2,
                 repeats: int = 1) -> tuple[Trainer, float]:
    """``(trainer, seconds per step)`` of ``trials`` trained by one ``Trainer`` after ``warmup`` untimed
    steps: the fastest of ``repeats`` timings of ``steps`` steps, none holding a validation point (a
    shorter budget becomes ``timing_budget`` of them)."""
    budget = timing_budget(warmup + repeats * steps)
    trials = [t if t.schedule_steps >= budget else t.replace(steps=budget, budget=None) for t in trials]
    trainer = Trainer(trials, data, device=device)
    trainer.train(until_step=warmup)
    best = min((timed_training(trainer, warmup + r * steps) / steps for r in range(1, repeats + 1)), default=math.inf)
    return trainer, best


def timed_training(trainer: Trainer, until_step: int) -> float:
    """The seconds of ``trainer.train(until_step=...)``, from and to an idle device."""
    synchronize(trainer.device)
    start = time.perf_counter()
    trainer.train(until_step=until_step)
    synchronize(trainer.device)
    return time.perf_counter() - start


def probe_trial(trial: Trial, steps: int, log_every: int) -> Trial:
    """What a probe of ``trial``'s shape trains: its vanilla gene, eager, at a constant rate for
    ``steps`` steps (a whole training of them), logged every ``log_every``."""
    return trial.replace(genome=AttentionGene.vanilla().key, steps=steps, budget=None,
                         train=trial.train.replace(compile="off", log_every=log_every, lr_schedule="constant"))


def precision_step_times(trial: Trial, data: TaskData, device: torch.device, *, rounds: int = PROBE_ROUNDS,
                         steps: int = PROBE_STEPS) -> dict:
    """Seconds per training step of ``trial``'s shape (``probe_trial``) in fp32 and in bf16, timed in
    interleaved rounds, the fastest round of each kept (other work only slows a round down), and
    ``spread``: the largest ratio of a precision's slowest round to its fastest. Torch's RNG is kept."""
    warm_steps = 1
    total = warm_steps + rounds * steps
    base = probe_trial(trial, timing_budget(total), total)
    with torch.random.fork_rng(devices=[]):
        trainers = {p: Trainer(base.replace(train=base.train.replace(precision=p)), data, device=device)
                    for p in ("fp32", "bf16")}
        times: dict[str, list[float]] = {p: [] for p in trainers}

        def timed(precision: str, n: int) -> float:
            return timed_training(trainers[precision], trainers[precision].step + n) / n

        warm = max(timed("fp32", warm_steps), timed("bf16", warm_steps))  # allocations, kernel choice
        if warm > PROBE_SLOW_STEP_S:
            rounds, steps = min(rounds, 2), 1
        for r in range(rounds):
            for precision in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
                times[precision].append(timed(precision, steps))
    return {**{precision: min(values) for precision, values in times.items()},
            "spread": max(max(values) / min(values) for values in times.values())}


def state_to_bytes(state: dict) -> bytes:
    """A trainer state (``Member.state_dict``) as bytes, to store or send to another process."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def state_from_bytes(blob: bytes, device) -> dict:
    return torch.load(io.BytesIO(blob), map_location=device, weights_only=True)


@dataclass
class TrainingResult:
    """The record, the trained ``Member`` (None if it could not be built) and its state (when asked)."""

    record: EvaluationRecord
    trainer: Member | None = None
    state: bytes | None = None


# -- The entry points and the one record rule -------------------------------------------------------

def _new_record(trial: Trial, data: TaskData, device: torch.device, resumed: bool) -> EvaluationRecord:
    return EvaluationRecord(
        gene=trial.genome, seed=trial.seed, steps=trial.steps, data=data.name, data_fingerprint=data.fingerprint,
        context=trial.context, eval_split=trial.eval_split, device=str(device), versions=versions(),
        settings=trial.record_settings(), budget=trial.budget,
        resumed_from=0 if (resumed or trial.budget is not None) else None)


def _failed(record: EvaluationRecord, exc: BaseException) -> None:
    """A failing gene never crashes a search: its record says how it failed."""
    if isinstance(exc, SystemExit):  # a component (a plugin's) that calls sys.exit fails its gene, not the search
        record.status = Status.ERROR
        record.error = f"SystemExit: the gene's code called sys.exit({exc.code!r})"
    else:
        record.status = Status.OOM if is_oom(exc) else Status.ERROR
        record.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]


MIN_CURVE_POINTS = 3  # a training's curve has at least this many points (fewer steps: one per step)
VAL_POINTS = (0.25, 0.5, 0.75)  # where in the budget the validation curve gets a point (and at the end)
VAL_BATCHES = 2  # evaluation batches per validation point (the end's evaluation is the whole one)


def log_interval(log_every: int, steps: int) -> int:
    """``log_every``, shortened where ``steps`` would give fewer than MIN_CURVE_POINTS curve points."""
    return max(1, min(log_every, steps // MIN_CURVE_POINTS))


def validation_steps(steps: int) -> set[int]:
    """The steps before the end at which each member measures a point of its validation curve."""
    return {s for s in (round(steps * f) for f in VAL_POINTS) if 0 < s < steps}


def timing_budget(steps: int) -> int:
    """A budget whose first ``steps`` steps hold no validation point (the first is at a quarter of it: s + 1)."""
    return 4 * steps + 4


def _finish(record: EvaluationRecord, member: Member, trial: Trial, *, keep_state: bool, size: int, shared_s: float,
            device: torch.device, failure: BaseException | None = None) -> TrainingResult:
    """The record of ``member`` after its training (its share of ``shared_s``) or its ``failure``."""
    start = time.perf_counter()
    record.precision = member.precision
    record.extra["precision_reason"] = member.precision_reason
    if used_probes():  # the measured answers that decided it, for its run to pin (train.probe_cache)
        record.extra["probes"] = used_probes()
    record.compiled = member.compiled
    if member.cuda_graph is not None:
        record.extra["cuda_graph"] = member.cuda_graph
    record.params = member.model.num_parameters()
    blob = None
    if failure is not None:
        _failed(record, failure)
    else:
        try:
            status = Status.DIVERGED if member.diverged else Status.OK
            if keep_state and status == Status.OK:
                blob = state_to_bytes(member.state_dict())
            evaluate_into(record, member, status, trial.eval_split)
        except (KeyboardInterrupt, UserError):
            raise
        except (Exception, SystemExit) as exc:
            _failed(record, exc)
            blob = None
    record.train_loss = member.curve[-1][1] if member.curve else float("nan")
    record.trained_steps = member.step
    record.curve = member.curve
    record.val_curve = member.val_curve + ([[member.step, record.val_loss]] if record.ok else [])
    record.flops_per_step = member.flops_per_step
    record.train_time_s = member.train_time
    record.tokens_per_s = member.tokens_seen / member.train_time if member.train_time > 0 else None
    record.time_s = shared_s / size + (time.perf_counter() - start)
    record.peak_memory_mb = peak_memory_mb(device)
    if size > 1:
        record.extra.update(batched=size, batch_time_s=shared_s)
    return TrainingResult(record, member, blob)


def _release_memory(device: torch.device) -> None:
    if device.type == "cuda":
        gc.collect()  # cyclic garbage may hold tensors: drop it before giving cached blocks back
        torch.cuda.empty_cache()


def run_training(trial: Trial, data: TaskData, *, device: str | None = None, progress: ProgressFn | None = None,
                 state: bytes | None = None, keep_state: bool = False) -> TrainingResult:
    """Train ``trial`` on ``data`` (its task's dataset) and evaluate it; never raises for a failing gene.

    A partial training (``trial.budget`` set) stops at ``trial.steps`` of a ``budget``-step schedule.
    ``state`` (bytes of an earlier ``keep_state``: the trainer state after training, before the
    evaluation) continues exactly where it stopped (the record says ``resumed_from``); one that cannot
    be loaded is set aside with a warning and the training starts from scratch (the same result).
    """
    trial = trial if trial.task.fingerprint is not None else trial.with_data(data)
    dev = resolve_device(device if device is not None else trial.train.device)  # bad input: raise
    return _train([trial], data, dev, [progress], keep_state, state)[0]


def run_batched(trials: Sequence[Trial], data: TaskData, *, device: str | None = None, keep_state: bool = False,
                progress: Sequence[ProgressFn | None] | None = None) -> list[TrainingResult]:
    """Train ``trials`` (``check_batchable``: UserError naming the field where they cannot) as one batch
    on ``data``: one ``TrainingResult`` per trial, in order, as ``run_training`` gives it (``keep_state``
    too). Never raises for a failing gene: a diverged model is recorded so while the others train on.
    Trials whose genome cannot be folded, and those of a batch that fails as a whole, train alone
    (their records say ``batch_fallback``). ``progress``: one ``ProgressFn`` (or None) per trial.
    """
    trials = [t if t.task.fingerprint is not None else t.with_data(data) for t in trials]
    if not trials:
        return []
    check_batchable(trials)
    progress = list(progress) if progress is not None else [None] * len(trials)
    if len(progress) != len(trials):
        raise ValueError(f"progress has {len(progress)} entries for {len(trials)} trials")
    dev = resolve_device(device if device is not None else trials[0].train.device)
    try:
        return _train(trials, data, dev, progress, keep_state)
    except Unfoldable as exc:
        note = f"not batched: {exc}"
    except Exception as exc:  # the batch as a whole failed (out of memory, say): the trials alone
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        note = f"the batch of {len(trials)} failed ({type(exc).__name__}: {text}); trained alone"
    results = [run_training(trial, data, device=dev, keep_state=keep_state, progress=report)
               for trial, report in zip(trials, progress)]
    for result in results:
        result.record.extra["batch_fallback"] = note
    return results


def _train(trials: list[Trial], data: TaskData, device: torch.device, progress: list, keep_state: bool,
           state: bytes | None = None) -> list[TrainingResult]:
    """The trainings of ``trials`` by one ``Trainer`` and their records (a batch that fails as a whole
    raises). On a CPU other processes keep busy, with the threads they leave free (records: ``threads``)."""
    with threads.sharing(device.type) as shared:
        results = _train_together(trials, data, device, progress, keep_state, state)
    for result in results if shared else ():
        result.record.extra["threads"] = shared
    return results


def _train_together(trials: list[Trial], data: TaskData, device: torch.device, progress: list, keep_state: bool,
                    state: bytes | None) -> list[TrainingResult]:
    records = [_new_record(t, data, device, resumed=state is not None) for t in trials]
    reset_peak_memory(device)
    start = time.perf_counter()
    trainer, failure = None, None
    try:
        trainer = Trainer(trials, data, device=device)
        if state is not None:
            try:
                trainer.load_state_dict(state_from_bytes(state, device))
                records[0].resumed_from = trainer.step
            except Exception as exc:  # the tool's own file failed, not the gene: start afresh, as without one
                warnings.warn(f"the trainer state given for {trials[0].genome} (seed {trials[0].seed}) cannot be "
                              f"used ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}): "
                              "training it from scratch instead, which gives the same result")
                trainer = Trainer(trials, data, device=device)
        trainer.train(until_step=trials[0].steps, progress=progress)
        trainer.release(keep_moments=keep_state)
    except (KeyboardInterrupt, UserError):
        raise
    except (Exception, SystemExit) as exc:
        if len(trials) > 1:
            raise
        failure = exc
    if trainer is None:  # one trial whose trainer could not even be built
        _failed(records[0], failure)
        records[0].train_time_s = 0.0
        records[0].time_s = time.perf_counter() - start
        records[0].peak_memory_mb = peak_memory_mb(device)
        _release_memory(device)
        return [TrainingResult(records[0], None, None)]
    shared, members, size = time.perf_counter() - start, trainer.members, trainer.size
    for m in members:
        m.cuda_graph = trainer.graph_state()
    del trainer  # the members hold their own weights
    results = [_finish(r, m, t, keep_state=keep_state, size=size, shared_s=shared, device=device, failure=failure)
               for r, m, t in zip(records, members, trials)]
    _release_memory(device)
    return results


def evaluate_into(record: EvaluationRecord, member: Member, status: Status, eval_split: str) -> None:
    """Finish ``record`` of a training that ended with ``status``: on success the evaluation over
    ``eval_split`` (an absurd loss is divergence) and the latency; a divergence's reason as its error."""
    record.status = status
    if status == Status.OK:
        for name, value in member.evaluate(eval_split).items():
            setattr(record, name, value)
        if math.isnan(record.val_loss):  # a NaN compares False with any bound
            record.status = Status.DIVERGED
            member.divergence = "non-finite validation loss"
        elif record.val_loss > member.absurd_loss:
            record.status = Status.DIVERGED
            member.divergence = member.far_above_guess(f"validation loss {record.val_loss:.4g}")
        else:
            for name, value in member.measure_latency(eval_split).items():
                setattr(record, name, value)
    if record.status == Status.DIVERGED:
        record.error = member.divergence


def train_and_evaluate(gene, config, data: TaskData, *, seed: int | None = None, steps: int | None = None,
                       eval_split: str = "valid", device: str | None = None,
                       progress: ProgressFn | None = None) -> EvaluationRecord:
    """Train ``gene`` with ``config`` (its seed and train_steps unless given) on ``data``, evaluate
    it, return its record: the trial ``Trial.from_config`` makes of these, trained."""
    check_argument("gene", gene, (AttentionGene, LayerGenes, str), "an AttentionGene or a gene key")
    check_argument("config", config, Config, "a Config")
    check_argument("data", data, TaskData, "a TaskData (evo_attention.data.load_data(name, ...) or "
                   "data_from_config(config))")
    for name, value in (("seed", seed), ("steps", steps)):
        if value is not None:
            check_argument(name, value, int, "a whole number")
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise UserError(f"seed must be a whole number in 0..2^63-1 (as the config's seed), not {seed}", setting="seed")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a function (step, total, loss) or None, not {progress!r}")
    if eval_split not in ("valid", "test"):
        raise ValueError(f"eval_split must be 'valid' or 'test', not {eval_split!r}")
    config = config.replace()  # validated again: a field may have been set after construction
    trial = Trial.from_config(gene, config, seed=seed, steps=steps, eval_split=eval_split, data=data)
    return run_training(trial, data, device=device, progress=progress).record
