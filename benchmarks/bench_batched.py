"""Trainings per hour: K same-shape trials trained as one batch (the engine of train/trainer.py with K > 1, what
``--batch-models K`` runs), in the precision ``auto`` measures per shape, against the reference: one
trainer per trial in the precision of version 0.3's rule (bf16 wherever the CPU has it, unmeasured),
measured side by side in interleaved rounds.

    python benchmarks/bench_batched.py --data-dir ../shared/data/wikitext-2 [--ks 1 2 4 8]
        [--configs quick wikitext_small seed] [--precisions auto fp32] [--steps 30] [--rounds 3]
        [--out bench_batched.json]
    python benchmarks/bench_batched.py --data-dir ../shared/data/wikitext-2 --tiny   # a smoke run

Configs: ``quick`` (the preset: recall task, 64 dims, 32 tokens, 400 steps), ``wikitext_small``
(benchmarks/wikitext_small.yaml on top of the quick preset: WikiText-2, vocabulary 5000, 64 tokens)
and ``seed`` (the original experiment: 128 dims, 128 tokens, vocabulary 10000, 5000 steps).

Arms, per config:

- the reference: one ``run_training`` per trial (``--alone`` trials per measurement) in the
  precision ``auto`` gives without its probe (``EVO_ATTENTION_PRECISION_PROBE=off``: bf16 on a
  CPU with native bf16), the default before precision was measured per shape and trials batched;
- ``K=1``: one trainer per trial, ``--precision auto`` (measured per shape: the default);
- ``K=2, 4, 8``: one ``run_batched`` of K trials (seeds 0..K-1, rates alternating between the
  config's and half of it, as a seed-and-rate study would give them);
- with ``--precisions auto fp32 bf16``, every K again at each named precision.

Each measurement trains ``--steps`` steps per trial and evaluates as the config says; it is timed as
a whole (wall clock, building and evaluation included) and its training part apart, and
extrapolated to the config's budget: ``n trials cost fixed + budget * (training time / steps)``,
trainings per hour = ``3600 * n / cost``. The arms run in interleaved rounds (the order rotates each
round), so drifting load hits every arm alike; the median over rounds is reported. Before the
rounds, each config's ``batch_models auto`` is resolved (``batched.models_per_batch``: its probe
runs once per machine and shape, or its cached answer is read), and the table marks the K it takes.
Writes every measurement and the summary to ``--out`` (JSON) and prints a markdown table. Run it on
an otherwise idle machine: two processes on a 2-core CPU slow each other down by large factors.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from evo_attention.data import data_from_config
from evo_attention.train import environment
from evo_attention.train.batching import models_per_batch
from evo_attention.train.trainer import run_batched
from evo_attention.train.presets import build_config
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_training

HERE = Path(__file__).resolve().parent
CONFIGS = ("quick", "wikitext_small", "seed")


def make_config(name: str, data_dir: str | None, overrides: dict):
    if name == "quick":
        return build_config("quick", overrides=overrides)
    if name == "wikitext_small":
        return build_config("quick", HERE / "wikitext_small.yaml", overrides={"data_dir": data_dir, **overrides})
    if name == "seed":
        return build_config("seed", overrides={"data_dir": data_dir, **overrides})
    raise SystemExit(f"unknown config {name!r}: choose from {', '.join(CONFIGS)}")


def run_arm(k: int, trials: list, data, steps: int, alone: int) -> dict:
    """One measurement of an arm: wall seconds of the whole, and of its training part."""
    start = time.perf_counter()
    if k > 1:
        results = run_batched(trials[:k], data)
    else:
        results = [run_training(t, data) for t in trials[:alone]]
    wall = time.perf_counter() - start
    train_s = sum(r.record.train_time_s for r in results)  # batched: each member's share, summing to the batch's
    bad = [r.record for r in results if r.record.status != "ok"]
    if bad:
        print(f"  warning: K={k}: {bad[0].status} ({bad[0].error})", file=sys.stderr)
    fallback = {r.record.extra.get("batch_fallback") for r in results} - {None}
    return {"trials": len(results), "wall_s": wall, "train_s": train_s, "steps": steps,
            "precision": results[0].record.precision, "reason": results[0].record.extra.get("precision_reason"),
            "fallback": sorted(fallback)}


def per_hour(measure: dict, budget: int) -> float:
    fixed = max(measure["wall_s"] - measure["train_s"], 0.0)
    cost = fixed + budget * measure["train_s"] / measure["steps"]
    return 3600.0 * measure["trials"] / cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="WikiText-2 directory (wikitext_small and seed configs)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8], help="models per batch (1: today's default)")
    parser.add_argument("--steps", type=int, default=30, help="trained steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--alone", type=int, default=2, help="trials per measurement of the K=1 arm")
    parser.add_argument("--precisions", nargs="+", default=["auto"], choices=["auto", "fp32", "bf16"],
                        help="precisions to measure every K at (today's default, the reference, is auto at K=1)")
    parser.add_argument("--gene", default="dot|softmax|none|fixed")
    parser.add_argument("--eval-steps", type=int, help="cap evaluation batches (default: the config's)")
    parser.add_argument("--tiny", action="store_true",
                        help="a smoke run: 2 steps, 1 round, K 1 and 2, tiny evaluations (numbers mean nothing)")
    parser.add_argument("--out", default="bench_batched.json", help="the JSON result file (default bench_batched.json)")
    args = parser.parse_args()
    if args.tiny:
        args.steps, args.rounds, args.ks, args.eval_steps = 2, 1, [1, 2], 1
    ks = sorted(set(args.ks) | {1})  # K=1 is the reference every arm is compared with
    machine = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": environment.cpu_name(),
               "cpu_bf16_native": environment.cpu_has_fast_bf16(), "python": platform.python_version()}
    print(f"torch {machine['torch']}, {machine['threads']} threads, {machine['cpu']} (bf16 native: "
          f"{machine['cpu_bf16_native']}); gene {args.gene}; {args.steps} steps x {args.rounds} rounds")
    result = {"machine": machine, "settings": {k: v for k, v in vars(args).items() if k != "out"}, "configs": {}}
    rows = []
    for name in args.configs:
        if name != "quick" and not args.data_dir:
            print(f"skipping {name}: give --data-dir", file=sys.stderr)
            continue
        overrides = {"train_steps": args.steps, "log_every": args.steps}
        if args.eval_steps is not None:
            overrides["eval_steps"] = args.eval_steps
        if args.tiny and name == "quick":
            overrides["recall"] = {"num_pairs": 4, "train_examples": 2000, "eval_examples": 50}
        config = make_config(name, args.data_dir, overrides)
        budget = make_config(name, args.data_dir, {}).train_steps
        data = data_from_config(config)
        # resolve auto's precision and batch size for this shape now (once per machine), not inside a timed arm
        precisions = ["auto"] + [p for p in args.precisions if p != "auto"]
        trials_at = {p: [Trial.from_config(args.gene, config.replace(seed=s, precision=p,
                                                                     learning_rate=config.learning_rate / (1 + s % 2)),
                                           data=data) for s in range(max(max(ks), args.alone))]
                     for p in precisions}
        auto_k, auto_reason = models_per_batch("auto", trials_at["auto"][0], data)
        # the unmeasured rule: what auto gives where no model shape is known
        before, before_reason = environment.choose_precision("auto", torch.device("cpu"))
        trials_at["before"] = [t.replace(train=t.train.replace(precision=before)) for t in trials_at["auto"]]
        arms_order = [("before", 1)] + [(p, k) for p in precisions for k in ks]
        measured: dict[tuple, list] = {arm: [] for arm in arms_order}
        for r in range(args.rounds):
            order = arms_order[r % len(arms_order):] + arms_order[:r % len(arms_order)]
            for p, k in order:
                measured[(p, k)].append(run_arm(k, trials_at[p], data, args.steps, args.alone))
        today = statistics.median(per_hour(m, budget) for m in measured[("before", 1)])
        arms = []
        for p, k in arms_order:
            runs = measured[(p, k)]
            hourly = statistics.median(per_hour(m, budget) for m in runs)
            ms_step = statistics.median(1000 * m["train_s"] / m["steps"] / (1 if k > 1 else m["trials"]) for m in runs)
            label = (f"K=1 (one trainer per trial)" if k == 1 else f"K={k} (one batched trainer)") + f", --precision {p}"
            if p == "before":
                label = "reference: K=1, --precision auto unmeasured (bf16 wherever native)"
            arms.append({"k": k, "precision_setting": p, "label": label, "precision": runs[0]["precision"],
                         "ms_per_step": ms_step, "trainings_per_hour": hourly, "vs_today": hourly / today,
                         "fallback": runs[0]["fallback"], "runs": runs})
            note = "; ".join(runs[0]["fallback"])
            rows.append((name, label, runs[0]["precision"], ms_step, hourly, hourly / today,
                         "<- auto" if (p, k) == ("auto", auto_k) else "", note))
        result["configs"][name] = {"budget": budget, "auto": {"models": auto_k, "reason": auto_reason},
                                   "reference": {"precision": before, "reason": before_reason},
                                   "precision_reason": measured[("auto", 1)][0]["reason"], "arms": arms}
        print(f"  {name}: precision {measured[('auto', 1)][0]['precision']} ({measured[('auto', 1)][0]['reason']}); "
              f"budget {budget} steps; batch_models auto -> {auto_k} ({auto_reason})", flush=True)
    print()
    print("| config | arm | precision | ms / step (all its models) | trainings / hour | vs reference | auto |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for name, label, precision, ms, hourly, ratio, auto, note in rows:
        note = f" {note}" if note else ""
        print(f"| {name} | {label} | {precision} | {ms:.1f} | {hourly:.1f} | {ratio:.2f}x | {auto} |{note}")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
