"""The CPU cost of the two dropout streams: today's mask (``dropout_stream: cpu``, drawn from a seeded
CPU generator, four 16-bit lanes per 64-bit draw) against the counter mask (``counter``: a hash of
seed, step, call and element: numpy uint32 arithmetic on the CPU), in interleaved rounds.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_dropout.py --out docs/results/dropout/cpu.json

What it times, each arm in every round (the arms' order alternating between rounds), the median over
``--rounds`` (at least 5) reported:

- one keep mask (``nn.dropout.keep_mask`` from a generator, as the trainer draws it for one model;
  ``nn.dropout_counter.counter_keep_mask`` with a fresh key per call, as the trainer computes it),
  p = 0.1, at the shapes of the presets' dropout sites: the attention-dropout mask [B*H, T, T] of the quick
  preset (B 32, H 4, T 32: the recall task's windows) and of the seed config (B 32, H 4, T 128),
  and the seed config's model-dropout mask [B, T, d] (d 128); ``--calls`` masks per timing,
  milliseconds per mask;
- one training step of the quick preset (the vanilla gene, whose attention dropout is 0.10, fp32,
  eager) with each stream: two trainers built alike, ``--steps`` steps per timing after one untimed.

The result is one JSON file (``--out``): ``machine`` (CPU, cores, torch, threads, OMP_NUM_THREADS,
python, evo_attention), ``settings``, ``masks`` (per shape: each arm's milliseconds per mask per
round and median, and ``ratio_counter_vs_cpu``), ``step`` (the same for the training step). A short
table is printed. Timings move with the machine's load: run it on an otherwise idle machine.
``--smoke`` runs tiny shapes, 1 round, in a second or two (the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from evo_attention.data import data_from_config
from evo_attention.nn.dropout import keep_mask
from evo_attention.nn.dropout_counter import counter_key, counter_keep_mask
from evo_attention.train.environment import cpu_name
from evo_attention.train.presets import build_config
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import Trainer, timing_budget
from evo_attention.util.version import __version__

P = 0.1
ARMS = ("cpu", "counter")
VANILLA = "dot|softmax|none|fixed"  # attention dropout 0.10
SMOKE_SHAPES = {"smoke [8, 8, 8]": (8, 8, 8)}


def site_shapes() -> dict[str, tuple]:
    """The dropout-mask shapes of the quick preset's and the seed config's sites."""
    quick, seed = build_config("quick"), build_config("seed")
    t_quick = data_from_config(quick).seq_len  # the recall task's windows
    return {
        f"quick attention [B*H, T, T] = [{quick.batch_size}*{quick.n_heads}, {t_quick}, {t_quick}]":
            (quick.batch_size * quick.n_heads, t_quick, t_quick),
        f"seed attention [B*H, T, T] = [{seed.batch_size}*{seed.n_heads}, {seed.max_seq_len}, {seed.max_seq_len}]":
            (seed.batch_size * seed.n_heads, seed.max_seq_len, seed.max_seq_len),
        f"seed model [B, T, d] = [{seed.batch_size}, {seed.max_seq_len}, {seed.d_model}]":
            (seed.batch_size, seed.max_seq_len, seed.d_model),
    }


def mask_timer(arm: str, shape: tuple, calls: int):
    """A function timing ``calls`` masks of ``arm`` at ``shape``: milliseconds per mask."""
    generator = torch.Generator().manual_seed(0)
    counter = iter(range(10**12))

    def one() -> torch.Tensor:
        if arm == "cpu":
            return keep_mask(shape, P, generator=generator)
        step = next(counter)
        return counter_keep_mask(shape, P, [counter_key(0, step // 8, step % 8)])

    one()  # allocations

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            one()
        return 1e3 * (time.perf_counter() - start) / calls

    return timed


def step_timer(arm: str, steps: int, rounds: int, smoke: bool):
    """A function timing ``steps`` quick-preset training steps with the ``arm`` stream: ms per step."""
    overrides = {"compile": "off", "precision": "fp32", "dropout_stream": arm}
    if smoke:
        overrides.update(d_model=16, n_heads=2, n_layers=1,
                         recall={"num_pairs": 4, "train_examples": 500, "eval_examples": 20})
    config = build_config("quick", overrides=overrides)
    data = data_from_config(config)
    total = 1 + steps * rounds
    config = config.replace(train_steps=timing_budget(total), log_every=total)  # no validation point timed
    trainer = Trainer(Trial.from_config(VANILLA, config, data=data), data)
    trainer.train(until_step=1)  # untimed: allocations

    def timed() -> float:
        start = time.perf_counter()
        trainer.train(until_step=trainer.step + steps)
        return 1e3 * (time.perf_counter() - start) / steps

    return timed


def interleaved(timers: dict, rounds: int) -> dict:
    """``rounds`` rounds of every timer (order alternating per round): per arm its times and median."""
    times = {arm: [] for arm in timers}
    arms = list(timers)
    for r in range(rounds):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            times[arm].append(timers[arm]())
    out = {arm: {"ms_rounds": t, "ms_median": statistics.median(t)} for arm, t in times.items()}
    out["ratio_counter_vs_cpu"] = out["counter"]["ms_median"] / out["cpu"]["ms_median"]
    return out


def machine() -> dict:
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "machine": platform.machine(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "python": platform.python_version(), "evo_attention": __version__}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds, median reported (at least 5)")
    parser.add_argument("--calls", type=int, default=20, help="masks per timing (default 20)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per timing (default 10)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and model, 1 round: a test of the script")
    parser.add_argument("--out", default="dropout.json", help="the JSON result file (default dropout.json)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.calls, args.steps = 1, 2, 1
    elif args.rounds < 5:
        parser.error("--rounds must be at least 5 (the median of 5 interleaved rounds or more)")
    if args.calls < 1 or args.steps < 1:
        parser.error("--calls and --steps must be >= 1")
    started = time.perf_counter()
    result = {"benchmark": "bench_dropout", "command": " ".join([sys.executable, "benchmarks/bench_dropout.py",
                                                                  *(sys.argv[1:] if argv is None else argv)]),
              "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
              "settings": {"p": P, "rounds": args.rounds, "calls": args.calls, "steps": args.steps,
                           "smoke": args.smoke, "gene": VANILLA, "step_config": "quick preset, fp32, compile off"},
              "masks": {}, "step": None}
    shapes = SMOKE_SHAPES if args.smoke else site_shapes()
    for name, shape in shapes.items():
        result["masks"][name] = {"shape": list(shape), **interleaved(
            {arm: mask_timer(arm, shape, args.calls) for arm in ARMS}, args.rounds)}
    result["step"] = interleaved({arm: step_timer(arm, args.steps, args.rounds, args.smoke) for arm in ARMS},
                                 args.rounds)
    result["elapsed_s"] = round(time.perf_counter() - started, 2)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("| what | cpu ms | counter ms | counter / cpu |\n| --- | ---: | ---: | ---: |")
    for name, row in [*result["masks"].items(), ("quick preset training step", result["step"])]:
        print(f"| {name} | {row['cpu']['ms_median']:.3f} | {row['counter']['ms_median']:.3f} | "
              f"{row['ratio_counter_vs_cpu']:.2f}x |")
    print(f"wrote {out} ({result['elapsed_s']:.1f} s)")
    return result


if __name__ == "__main__":
    main()
