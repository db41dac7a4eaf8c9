"""Time the real training step, and what a search at this setting will cost here.

``bench_gene`` builds the same ``Trainer`` a search uses (with ``models`` K > 1, the trainer of
K same-gene trials that ``batch_models`` K gives), runs a few warm-up steps
(the first one also counts FLOPs with PyTorch's flop counter), times ``steps`` more, times one
evaluation, and extrapolates to one evaluation at the configured budget and to trainings per hour
(the CLI multiplies an evaluation by a search's planned evaluations, which the search layer knows).
``step_time`` measures the step alone (what ``transfer --dry-run`` extrapolates a ladder from).
``decode_speed`` times generation with the key/value cache (``nn.decoding``), what a user of a kept
model waits for.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from evo_attention.data.base import TaskData
from evo_attention.genes import AttentionGene
from evo_attention.nn.fold import Unfoldable
from evo_attention.train.config import Config
from evo_attention.train.environment import (matmul_dtype, peak_memory_mb, process_memory_mb, release_free_memory,
                                             reset_peak_memory, resolve_device, synchronize)
from evo_attention.train.batching import models_per_batch
from evo_attention.train.probe_cache import expired, probe_path, read_probe, warn_damaged, write_probe_once
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import Trainer, timed_training
from evo_attention.util import threads
from evo_attention.util.errors import UserError


PROBE_SIZE = 2048  # the square matrix product that measures a machine's matmul limit
PROBE_VERSION = 2


def _peak_entry(entry: dict) -> bool:
    return isinstance(entry.get("flops_per_s"), (int, float)) and entry["flops_per_s"] > 0


def matmul_peak(device: str | torch.device = "cpu", precision: str = "fp32", *, repeats: int = 5,
                use_cache: bool = True) -> float:
    """FLOP/s of a 2048^3 matrix product at ``precision`` on ``device`` (best of ``repeats``), kept per
    machine, dtype and cores (``probe_cache``); ``use_cache=False`` measures again and replaces it."""
    device = torch.device(device)
    dtype = matmul_dtype(precision)
    shape = {"dtype": str(dtype), "size": PROBE_SIZE,
             **({"gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {})}
    path = probe_path(shape, device, kind="matmul-peak", version=PROBE_VERSION)
    found = read_probe(path, _peak_entry) if use_cache else None
    if found is not None and not expired(found):
        return float(found["flops_per_s"])
    if use_cache and found is None and path.exists():
        warn_damaged(path)
    use_cache = use_cache and not path.exists()  # an expired or damaged answer is replaced like a refused one
    a = torch.randn(PROBE_SIZE, PROBE_SIZE, device=device).to(dtype)
    b = torch.randn(PROBE_SIZE, PROBE_SIZE, device=device).to(dtype)
    a @ b  # warm-up (kernels, caches)
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    flops = 2 * PROBE_SIZE ** 3 / best
    if not use_cache:
        path.unlink(missing_ok=True)
    write_probe_once(path, {"flops_per_s": flops, "device": str(device), "dtype": str(dtype),
                            "threads": torch.get_num_threads()}, _peak_entry)
    return flops


def profile_step(gene: AttentionGene | str, config: Config, data: TaskData, *, warmup: int = 3, rows: int = 15,
                 device: str | None = None) -> str:
    """The top operators of one training step (torch.profiler, by self time), as a text table."""
    from torch.profiler import ProfilerActivity, profile

    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    # compiled or not as a whole training (see _timed); eager steps on CUDA: a replayed CUDA graph
    # would show as one launch, not as the operators whose time it spends
    trainer = Trainer.from_config(gene, config.replace(train_steps=max(config.train_steps, warmup + 1),
                                                       log_every=warmup + 1, cuda_graph="off"), data, device=device)
    trainer.train(until_step=warmup)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        trainer.train(until_step=warmup + 1)
        synchronize(trainer.device)
    key = "self_cuda_time_total" if trainer.device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def decode_speed(model, prompt_len: int, new_tokens: int) -> float:
    """Tokens/s of greedy generation with the key/value cache, batch 1: ``new_tokens`` after a
    ``prompt_len``-token prompt (the prompt's prefill counts in the time, as a user waits for it)."""
    from evo_attention.nn.decoding import generate

    device = next(model.parameters()).device
    prompt = torch.randint(0, model.spec.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0))
    generate(model, prompt.tolist(), 2, temperature=0.0)  # warm-up
    synchronize(device)
    start = time.perf_counter()
    generate(model, prompt.tolist(), new_tokens, temperature=0.0)
    synchronize(device)
    return new_tokens / (time.perf_counter() - start)


def _timed(gene, config: Config, data: TaskData, *, steps: int, warmup: int, models: int = 1, device=None,
           before_timing=None) -> tuple[Trainer, float]:
    """A Trainer of ``models`` trials of ``gene`` (seeds ``config.seed`` on) after ``warmup`` untimed and
    ``steps`` timed steps, and the seconds per timed step; ``before_timing(trainer)`` runs between them.
    It decides compiling and the schedule as for the configured budget; one log interval: one host sync."""
    cfg = config.replace(train_steps=max(config.train_steps, warmup + steps), log_every=warmup + steps)
    trainer = Trainer([Trial.from_config(gene, cfg, seed=cfg.seed + i, data=data) for i in range(models)], data,
                      device=device)
    trainer.train(until_step=warmup)
    synchronize(trainer.device)
    if before_timing is not None:
        before_timing(trainer)
    return trainer, timed_training(trainer, warmup + steps) / steps


def step_time(gene: AttentionGene | str, config: Config, data: TaskData, *, steps: int = 3, warmup: int = 2,
              device: str | None = None) -> dict:
    """One training step of ``gene`` under ``config`` here: the median of ``steps`` steps timed one by
    one after ``warmup`` untimed ones, as a whole training would run them. ``{"seconds_per_step",
    "flops_per_step", "device", "precision", "compiled", "threads"}``."""
    config = config.replace(train_steps=max(config.train_steps, warmup + steps))
    trainer, first = _timed(gene, config, data, steps=1, warmup=warmup, device=device)
    times = [first] + [timed_training(trainer, trainer.step + 1) for _ in range(steps - 1)]
    seconds = statistics.median(times)
    return {"seconds_per_step": seconds, "flops_per_step": trainer.flops_per_step, "device": str(trainer.device),
            "precision": trainer.precision, "compiled": trainer.compiled, "threads": torch.get_num_threads()}


def bench_gene(gene: AttentionGene | str, config: Config, data: TaskData, *, steps: int = 20, warmup: int = 3,
               device: str | None = None, time_eval: bool = True, time_decode: bool = True, models: int = 1) -> dict:
    """Time the training step of ``gene`` under ``config`` and extrapolate to its budget; ``models`` K > 1
    times one trainer of K same-gene models folded into one batch (its step and FLOPs all K models', its
    estimates per evaluation). Beside other busy processes, with the threads they leave free
    (``util.threads.sharing``; ``threads_shared`` says so)."""
    with threads.sharing(resolve_device(device if device is not None else config.device).type) as shared:
        gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
        if isinstance(models, bool) or not isinstance(models, int) or models < 1:
            raise UserError(f"models must be a whole number >= 1, got {models!r}", setting="models")
        budget = config.train_steps
        try:
            trainer, seconds_per_step = _timed(gene, config, data, models=models, steps=steps, warmup=warmup,
                                               device=device)
        except Unfoldable as exc:
            raise UserError(f"{gene.key} does not fold into one batch: {exc}; time it with models 1",
                            setting="models") from None
        single = trainer.members[0]
        eval_s = None
        if time_eval:  # each model evaluates alone, batched or not
            start = time.perf_counter()
            single.evaluate("valid")
            synchronize(trainer.device)
            eval_s = time.perf_counter() - start
        decode = None
        if time_decode:  # a quarter of the window as the prompt, then new tokens until it is full
            prompt_len = max(1, single.spec.max_seq_len // 4)
            decode = decode_speed(single.model, prompt_len, max(1, single.spec.max_seq_len - prompt_len))
        tokens = models * config.batch_size * data.seq_len
        flops = None if trainer.flops_per_step is None else models * trainer.flops_per_step  # all K models'
        achieved = flops / seconds_per_step if flops else None
        peak = matmul_peak(trainer.device, trainer.precision)
        if achieved and achieved > peak:  # impossible: the kept limit was measured while the cores were busy
            peak = matmul_peak(trainer.device, trainer.precision, use_cache=False)
        mfu = achieved / peak if achieved and achieved <= peak else None
        one_eval = budget * seconds_per_step / models + (eval_s or 0.0)  # one evaluation's share of its batch
        auto_models, auto_reason = models_per_batch("auto", Trial.from_config(gene, config, data=data), data,
                                                    device=trainer.device)
        result = {
            "gene": gene.key,
            "block": config.block,
            "device": str(trainer.device),
            "precision": trainer.precision,
            "compiled": trainer.compiled,
            "threads": torch.get_num_threads(),
            "thread_waits": threads.state(),  # how OpenMP's threads wait, what the load watch saw (util/threads.py)
            "models": models,  # models trained by one trainer (batched when more than one)
            "batch_size": config.batch_size,
            "seq_len": data.seq_len,
            "params": single.model.num_parameters(),  # of one model
            "steps_timed": steps,
            "ms_per_step": seconds_per_step * 1e3,  # one step of all the models
            "tokens_per_s": tokens / seconds_per_step,
            "flops_per_step": flops,
            "achieved_flops_per_s": achieved,
            "peak_flops_per_s": peak,  # a 2048^3 matrix product at the step's precision, on this machine
            # the fraction of that limit the step reaches; None where even a fresh probe of the limit is
            # below what the step achieved (the probe cannot be trusted here)
            "mfu": mfu,
            "eval_time_s": eval_s,
            "decode_tokens_per_s": decode,  # greedy generation, batch 1, key/value cache (decode_speed)
            "train_steps": budget,
            "est_evaluation_s": one_eval,
            "trainings_per_hour": 3600.0 / one_eval if one_eval > 0 else None,
            "auto_models": auto_models,  # the K batch_models auto takes for this shape on this machine
            "auto_models_reason": auto_reason,
            "diverged": trainer.diverged if models == 1 else any(m.diverged for m in trainer.members),
        }
    if shared:
        result["threads_shared"] = shared
    return result


# The long-context comparison: the four families at the seed's width, dropout 0 so that every one
# runs its fastest exact path in training (attention dropout needs explicit weights).
LONG_CONTEXT_GENES = {
    "softmax": "dot|softmax|none|fixed|bias|0.00",
    "linear": "dot|linear|none|fixed|bias|0.00",
    "favor": "dot|favor|none|fixed|bias|0.00",
    "window": "dot|softmax|none|fixed|bias|0.00|win=128",
}
LONG_CONTEXT_LENGTHS = (128, 256, 512, 1024, 2048)


def bench_lengths(genes: dict, config: Config, data_for, lengths=LONG_CONTEXT_LENGTHS, *,
                  tokens_per_step: int = 4096, steps: int = 5, warmup: int = 2, device: str | None = None,
                  progress=None) -> list[dict]:
    """ms per training step and memory against the sequence length T (``data_for(T)``: the data), per
    named gene. Every step holds ``tokens_per_step`` tokens, so what grows with T is attention's own
    cost. Memory: on CUDA the peak allocated; on CPU the peak resident set during the timed steps and
    (``step_memory_mb``) its rise over the resident set before them: what a step holds at its peak."""
    rows = []
    for t in lengths:
        batch = max(1, tokens_per_step // t)
        cfg = config.replace(max_seq_len=t, batch_size=batch)
        data = data_for(t)
        if data.seq_len != t:
            raise UserError(f"the data {data.name} gives sequences of {data.seq_len} tokens, not {t}: time long "
                            "contexts on a corpus (wikitext2, text, hf:...)", setting="seq_lens")
        for name, gene in genes.items():
            gc.collect()
            if progress:
                progress(name, t)
            before = {}

            def mark_memory(trainer):
                gc.collect()
                release_free_memory()
                before["mb"] = process_memory_mb("VmRSS") if trainer.device.type == "cpu" else 0.0
                reset_peak_memory(trainer.device)

            trainer, seconds = _timed(gene, cfg, data, steps=steps, warmup=warmup, device=device,
                                      before_timing=mark_memory)
            peak = peak_memory_mb(trainer.device)
            rows.append({"name": name, "gene": AttentionGene.parse(gene).key, "seq_len": t, "batch_size": batch,
                         "ms_per_step": seconds * 1e3, "tokens_per_s": batch * t / seconds,
                         "peak_memory_mb": peak, "step_memory_mb": None if before["mb"] is None else peak - before["mb"],
                         "device": str(trainer.device), "precision": trainer.precision,
                         "threads": torch.get_num_threads(), "steps_timed": steps})
            del trainer
    return rows
