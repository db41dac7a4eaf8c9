"""Trainings per hour: K same-shape trials trained as one batch (train/batched.py) against today's
default (one trainer per trial, ``precision auto``), measured side by side.

    python benchmarks/bench_batched.py --data-dir ../shared/data/wikitext-2 [--ks 1 2 4 8]
        [--configs quick wikitext_small seed] [--steps 30] [--rounds 3] [--gene dot|softmax|none|fixed]

Configs: ``quick`` (the preset: recall task, 64 dims, 32 tokens, 400 steps), ``wikitext_small``
(benchmarks/wikitext_small.yaml on top of the quick preset: WikiText-2, vocabulary 5000, 64 tokens)
and ``seed`` (the original experiment: 128 dims, 128 tokens, vocabulary 10000, 5000 steps).

Arms, per config:

- ``alone, bf16 rule``: one ``run_training`` per trial, ``auto`` as it resolved before the probe
  (bf16 wherever the CPU has native bf16): today's default;
- ``alone, auto``: the same with ``auto`` measured per shape (``environment.choose_precision``);
- ``batch K``: ``run_batched`` of K trials (seeds 0..K-1), ``auto`` measured.

Each arm trains ``--steps`` steps per trial and evaluates as the config says; it is timed as a whole
(wall clock, building and evaluation included) and its training part apart, and extrapolated to the
config's budget: ``K trials cost fixed + budget * (training time / steps)``, trainings per hour =
``3600 * K / cost``. The arms run in interleaved rounds (the order rotates each round), so drifting
load hits every arm alike; the median over rounds is printed. Run it on an otherwise idle machine:
two processes on a 2-core CPU slow each other down by large factors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from evo_attention.data import data_from_config
from evo_attention.train import environment
from evo_attention.train.batched import run_batched
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


def run_arm(arm: str, k: int, trials: list, data, steps: int) -> dict:
    """One measurement of an arm: wall seconds of the whole, and of its training part."""
    start = time.perf_counter()
    if arm == "batch":
        results = run_batched(trials[:k], data)
        train_s = sum(r.record.train_time_s for r in results)  # each member's share: their sum is the batch's
    else:
        results = [run_training(t, data) for t in trials[:k]]
        train_s = sum(r.record.train_time_s for r in results)
    wall = time.perf_counter() - start
    bad = [r.record for r in results if r.record.status != "ok"]
    if bad:
        print(f"  warning: {arm} K={k}: {bad[0].status} ({bad[0].error})", file=sys.stderr)
    fallback = {r.record.extra.get("batch_fallback") for r in results} - {None}
    return {"wall_s": wall, "train_s": train_s, "steps": steps, "precision": results[0].record.precision,
            "reason": results[0].record.extra.get("precision_reason"), "fallback": sorted(fallback)}


def per_hour(measure: dict, k: int, budget: int) -> float:
    fixed = max(measure["wall_s"] - measure["train_s"], 0.0)
    cost = fixed + budget * measure["train_s"] / measure["steps"]
    return 3600.0 * k / cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="WikiText-2 directory (wikitext_small and seed configs)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8], help="models per batch")
    parser.add_argument("--steps", type=int, default=30, help="trained steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--alone", type=int, default=2, help="trials per measurement of the alone arms")
    parser.add_argument("--gene", default="dot|softmax|none|fixed")
    parser.add_argument("--eval-steps", type=int, help="cap evaluation batches (default: the config's)")
    parser.add_argument("--tiny", action="store_true",
                        help="a smoke run: 2 steps, 1 round, K 1 and 2, tiny evaluations (numbers mean nothing)")
    parser.add_argument("--json", help="also write every measurement here")
    args = parser.parse_args()
    if args.tiny:
        args.steps, args.rounds, args.ks, args.eval_steps = 2, 1, [1, 2], 1
    legacy = "bf16" if environment.cpu_has_fast_bf16() else "fp32"  # auto before the probe, on this CPU
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, cpu bf16 native: "
          f"{environment.cpu_has_fast_bf16()}; gene {args.gene}; {args.steps} steps x {args.rounds} rounds")
    rows, raw = [], {}
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
        # measure auto's precision for this shape now (once per machine), not inside a timed arm
        spec = config.model.with_data(data.vocab_size, data.seq_len)
        environment.choose_precision("auto", environment.resolve_device(config.device), spec, seq_len=data.seq_len,
                                     batch_size=config.batch_size)
        kmax = max(max(args.ks), args.alone)
        trials = {precision: [Trial.from_config(args.gene, config.replace(seed=s, precision=precision), data=data)
                              for s in range(kmax)] for precision in (legacy, "auto")}
        arms = [("alone", legacy, args.alone), ("alone", "auto", args.alone)] + [("batch", "auto", k) for k in args.ks]
        measured: dict = {arm: [] for arm in arms}
        for r in range(args.rounds):
            order = arms[r % len(arms):] + arms[:r % len(arms)]
            for arm in order:
                kind, precision, k = arm
                measured[arm].append(run_arm(kind, k, trials[precision], data, args.steps))
        baseline = None
        for arm in arms:
            kind, precision, k = arm
            runs = measured[arm]
            hourly = statistics.median(per_hour(m, k, budget) for m in runs)
            ms_step = statistics.median(1000 * m["train_s"] / m["steps"] for m in runs)
            label = ({legacy: "alone, today (auto = the bf16 rule)", "auto": "alone, auto (measured)"}[precision]
                     if kind == "alone" else f"batch K={k}, auto")
            if baseline is None:
                baseline = hourly
            rows.append((name, label, runs[0]["precision"], ms_step, hourly, hourly / baseline,
                         "; ".join(runs[0]["fallback"])))
            raw[f"{name}/{label}"] = runs
        print(f"  {name}: auto -> {measured[arms[-1]][0]['precision']} ({measured[arms[-1]][0]['reason']}); "
              f"budget {budget} steps", flush=True)
    print()
    print("| config | arm | precision | ms / step (all K) | trainings / hour | vs today |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for name, label, precision, ms, hourly, ratio, note in rows:
        note = f" {note}" if note else ""
        print(f"| {name} | {label} | {precision} | {ms:.1f} | {hourly:.1f} | {ratio:.2f}x |{note}")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
