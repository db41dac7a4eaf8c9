"""Time the real training step, and what a search at this setting will cost here.

``bench_gene`` builds the same ``Trainer`` a search uses, runs a few warm-up steps (the first one
also counts FLOPs with PyTorch's flop counter), times ``steps`` more, times one evaluation, and
extrapolates to one evaluation at the configured budget (the CLI multiplies that by a search's
planned evaluations, which the search layer knows).
"""

from __future__ import annotations

import time

import torch

from evo_attention.train.config import Config
from evo_attention.data.base import TaskData
from evo_attention.genes import AttentionGene
from evo_attention.train.trainer import Trainer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_gene(gene: AttentionGene | str, config: Config, data: TaskData, *, steps: int = 20, warmup: int = 3,
               device: str | None = None, time_eval: bool = True) -> dict:
    gene = AttentionGene.parse(gene) if isinstance(gene, str) else gene
    budget = config.train_steps
    trainer = Trainer(gene, config.replace(train_steps=warmup + steps, log_every=warmup + steps), data,
                      device=device)
    trainer.train(until_step=warmup)
    _sync(trainer.device)
    start = time.perf_counter()
    trainer.train(until_step=warmup + steps)
    _sync(trainer.device)
    seconds_per_step = (time.perf_counter() - start) / steps
    eval_s = None
    if time_eval:
        start = time.perf_counter()
        trainer.evaluate("valid")
        _sync(trainer.device)
        eval_s = time.perf_counter() - start
    tokens = config.batch_size * data.seq_len
    flops = trainer.flops_per_step
    one_eval = budget * seconds_per_step + (eval_s or 0.0)
    return {
        "gene": gene.key,
        "device": str(trainer.device),
        "precision": trainer.precision,
        "threads": torch.get_num_threads(),
        "batch_size": config.batch_size,
        "seq_len": data.seq_len,
        "params": trainer.model.num_parameters(),
        "steps_timed": steps,
        "ms_per_step": seconds_per_step * 1e3,
        "tokens_per_s": tokens / seconds_per_step,
        "flops_per_step": flops,
        "achieved_flops_per_s": flops / seconds_per_step if flops else None,
        "eval_time_s": eval_s,
        "train_steps": budget,
        "est_evaluation_s": one_eval,
        "diverged": trainer.diverged,
    }
