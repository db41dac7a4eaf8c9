"""Trainings per hour of one search generation of different genes: folded into batches of K (the
engine folds models whose attentions differ: ``nn.fold.Split``) against one trainer per trial.

    python benchmarks/bench_generation.py [--population 8] [--ks 1 2 4 8] [--steps 30] [--rounds 3]
        [--out bench_generation.json]
    python benchmarks/bench_generation.py --tiny   # a smoke run (numbers mean nothing)

The generation is what a climb from the vanilla gene trains first: the vanilla gene's program and
``--population - 1`` distinct one-edit neighbours of it (``programs.edit``, seeded), at the quick
preset (``--config quick``), CPU-sized WikiText-2 (``wikitext_small``, with ``--data-dir``) or the
seed config (``seed``, with ``--data-dir``; ``benchmarks/gpu_checks.sh`` runs it on a lent GPU).
Arms: ``K=1``, every trial alone; ``K>1``, the generation in ceil(n / K) folded batches of different
genes; and, for scale, ``same K``: K trials of the vanilla gene folded (what folding gave before).
Each measurement trains ``--steps`` steps per trial and evaluates as the config says, timed as a
whole and its training part apart, extrapolated to the config's budget as ``bench_batched.py`` does;
the arms run in interleaved rounds (the order rotates each round) and the median is reported, with
the K ``batch_models auto`` takes for the shape. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from bench_batched import make_config, per_hour
from evo_attention import programs
from evo_attention.data import data_from_config
from evo_attention.genes import AttentionGene, SearchSpace, canonical_program, in_program_form, program_grammar
from evo_attention.train import environment
from evo_attention.train.batching import models_per_batch
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_batched, run_training


def generation(population: int, seed: int = 0) -> list[str]:
    """The vanilla gene's program and ``population - 1`` distinct one-edit neighbours of it."""
    space = SearchSpace(program={"max_nodes": 12})
    vanilla = AttentionGene.parse(in_program_form("dot|softmax|none|fixed", space))
    rng, grammar = random.Random(seed), program_grammar()
    keys = [vanilla.key]
    for _ in range(1000 * population):
        if len(keys) == population:
            break
        _, edited = programs.edit(canonical_program(vanilla.program), rng, space.program_space, grammar)
        key = vanilla.replace(program=str(edited)).key
        if key not in keys:
            keys.append(key)
    return keys


def measure(trials: list, k: int, data, steps: int) -> dict:
    """Wall seconds of training ``trials`` in batches of ``k`` (1: one trainer each), and their training part."""
    start = time.perf_counter()
    results = []
    for i in range(0, len(trials), k):
        group = trials[i:i + k]
        results += run_batched(group, data) if len(group) > 1 else [run_training(group[0], data)]
    wall = time.perf_counter() - start
    fallback = sorted({r.record.extra.get("batch_fallback") for r in results} - {None})
    return {"trials": len(results), "wall_s": wall, "train_s": sum(r.record.train_time_s for r in results),
            "steps": steps, "statuses": sorted({r.record.status for r in results}), "fallback": fallback,
            "precision": results[0].record.precision}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="quick", choices=["quick", "wikitext_small", "seed"])
    parser.add_argument("--data-dir", help="WikiText-2 directory (wikitext_small, seed)")
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default="bench_generation.json")
    args = parser.parse_args()
    overrides = {"train_steps": args.steps, "log_every": args.steps}
    if args.tiny:
        args.steps, args.rounds, args.ks, args.population = 2, 1, [1, 2], 3
        overrides = {"train_steps": 2, "log_every": 2, "eval_steps": 1,
                     "recall": {"num_pairs": 4, "train_examples": 2000, "eval_examples": 50}}
    config = make_config(args.config, args.data_dir, overrides)
    budget = make_config(args.config, args.data_dir, {}).train_steps
    data = data_from_config(config)
    genes = generation(args.population)
    trials = [Trial.from_config(g, config.replace(seed=i), data=data) for i, g in enumerate(genes)]
    same = [Trial.from_config(genes[0], config.replace(seed=i), data=data) for i in range(max(args.ks))]
    auto_k, auto_reason = models_per_batch("auto", trials[0], data)
    arms = [("different", k) for k in sorted(set(args.ks) | {1})] + [("same", k) for k in args.ks if k > 1]
    measured = {arm: [] for arm in arms}
    for r in range(args.rounds):
        for kind, k in arms[r % len(arms):] + arms[:r % len(arms)]:
            measured[(kind, k)].append(measure(trials if kind == "different" else same[:k], k, data, args.steps))
    alone = statistics.median(per_hour(m, budget) for m in measured[("different", 1)])
    rows = []
    for kind, k in arms:
        runs = measured[(kind, k)]
        hourly = statistics.median(per_hour(m, budget) for m in runs)
        rows.append({"genes": kind, "k": k, "trainings_per_hour": hourly, "vs_alone": hourly / alone,
                     "ms_per_step_per_model": statistics.median(1000 * m["train_s"] / m["steps"] / m["trials"]
                                                                for m in runs),
                     "fallback": runs[0]["fallback"], "statuses": runs[0]["statuses"], "runs": runs})
    machine = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": environment.cpu_name(),
               "cpu_bf16_native": environment.cpu_has_fast_bf16(), "python": platform.python_version()}
    result = {"machine": machine, "settings": vars(args), "config": args.config, "budget": budget, "genes": genes,
              "auto": {"models": auto_k, "reason": auto_reason}, "precision": rows[0]["runs"][0]["precision"],
              "arms": rows}
    print(f"{machine['cpu']}, {machine['threads']} threads; {args.config}, {len(genes)} genes, {args.steps} steps x "
          f"{args.rounds} rounds; batch_models auto -> {auto_k} ({auto_reason})")
    print("| genes | K | ms / step per model | trainings / hour | vs alone |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        note = f" ({'; '.join(row['fallback'])})" if row["fallback"] else ""
        print(f"| {row['genes']} | {row['k']} | {row['ms_per_step_per_model']:.1f} | {row['trainings_per_hour']:.0f} | "
              f"{row['vs_alone']:.2f}x{note} |")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
