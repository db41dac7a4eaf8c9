"""Batched against alone, one thread against two: each trial's validation perplexity after a short training.

    EVO_ATTENTION_SHARE_CORES=off EVO_ATTENTION_PRECISION_PROBE=off PYTHONPATH=src \\
        python benchmarks/fold_rounding.py --float64

Each gene of ``--genes`` at each seed of ``--seeds`` (the quick preset, ``--steps`` steps, fp32, data
seed 7) is trained alone (``run_training``) and, all of them, as one batch (``run_batched``); the
``--control`` gene (vanilla) the same way, its seeds batched on their own. This for every thread count
of ``--threads`` (``torch.set_num_threads`` in this process: it takes effect for later work, so each
count's trainings are those of a process started with it). ``--float64`` repeats it all with a default
dtype of float64 and float64 products (outside the engine's settings: the trainer's ``matmul_dtype``
is replaced for the run). The result (``--out``): every perplexity, and the largest relative
difference of each comparison (batched against alone per thread count; alone, and batched, between
the first and the last thread count). These are perplexities, not timings: the machine's load does
not move them; the thread count and the CPU's kernels do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import torch

import evo_attention.train.presets as presets
import evo_attention.train.trainer as trainer
from evo_attention import Config
from evo_attention.data import data_from_config
from evo_attention.train.environment import cpu_name
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_batched, run_training
from evo_attention.util.errors import UserError
from evo_attention.util.version import __version__

GENES = "dot|relu_norm|none|fixed|bias|0.00,dot|relu_norm|none|adaptive|bias|0.00"
CONTROL = "dot|softmax|none|fixed|bias|0.10"  # the vanilla gene
OUT = "docs/results/fold-rounding/fold-rounding.json"


@contextmanager
def float64(on: bool):
    """Train in float64 (parameters and products) inside, when ``on``."""
    if not on:
        yield
        return
    dtype, matmul = torch.get_default_dtype(), trainer.matmul_dtype
    torch.set_default_dtype(torch.float64)
    trainer.matmul_dtype = lambda precision: torch.float64
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
        trainer.matmul_dtype = matmul


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def perplexities(results) -> list[float]:
    for r in results:  # a batch that fell back to trainings alone would compare alone with alone
        if "batch_fallback" in r.record.extra:
            raise RuntimeError(f"a batched trial trained alone: {r.record.extra['batch_fallback']}")
    return [r.record.val_perplexity for r in results]


def measure(groups: dict, data, threads: list[int]) -> dict:
    """Per thread count, per group: each trial's perplexity alone and batched."""
    out = {}
    for n in threads:
        torch.set_num_threads(n)
        row = out[str(n)] = {}
        for name, trials in groups.items():
            alone = [run_training(t, data).record.val_perplexity for t in trials]
            row[name] = {"trials": [f"{t.genome} seed {t.seed}" for t in trials], "alone": alone,
                         "batched": perplexities(run_batched(trials, data))}
            print(f"{n} thread(s) {name}: alone {[round(p, 6) for p in alone]} "
                  f"batched {[round(p, 6) for p in row[name]['batched']]}", flush=True)
    return out


def compare(values: dict, threads: list[int]) -> dict:
    """The largest relative difference of each comparison, per group (relative to alone; the first count)."""
    first, last = str(threads[0]), str(threads[-1])
    out = {}
    for name in values[first]:
        cmp = {f"batched_vs_alone_{n}_threads": max(map(rel, values[str(n)][name]["batched"],
                                                        values[str(n)][name]["alone"])) for n in threads}
        if first != last:
            for kind in ("alone", "batched"):
                cmp[f"{kind}_{last}_vs_{first}_threads"] = max(map(rel, values[last][name][kind],
                                                                   values[first][name][kind]))
        out[name] = cmp
    return out


def refuse(message: str):
    """Bad input: one line, exit 2."""
    print(f"fold_rounding.py: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUT, help=f"the JSON result file (default {OUT})")
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--genes", default=GENES, help="comma-separated genes, batched together (default the two "
                                                       "relu_norm genes)")
    parser.add_argument("--control", default=CONTROL, help="a gene batched on its own ('' for none; default vanilla)")
    parser.add_argument("--seeds", default="8,9", help="comma-separated training seeds (default 8,9)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--float64", action="store_true", help="also train everything in float64")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        threads = [int(n) for n in args.threads.split(",")]
    except ValueError:
        refuse("--seeds and --threads take comma-separated whole numbers")
    if args.steps < 1 or not seeds or min(threads) < 1:
        refuse("--steps and --threads must be >= 1")
    genes = [g for g in args.genes.split(",") if g]
    if not genes:
        refuse("--genes names no gene")
    config = Config(**{**presets.PRESETS["quick"], "train_steps": args.steps, "seed": 7, "precision": "fp32"})
    data = data_from_config(config)
    try:
        groups = {"genes": [Trial.from_config(g, config, seed=s, data=data) for g in genes for s in seeds]}
        if args.control:
            groups["control"] = [Trial.from_config(args.control, config, seed=s, data=data) for s in seeds]
    except UserError as exc:
        refuse(str(exc).splitlines()[0])
    result = {"benchmark": "fold_rounding",
              "command": " ".join(["python benchmarks/fold_rounding.py", *(sys.argv[1:] if argv is None else argv)]),
              "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "machine": platform.machine(),
                          "torch": torch.__version__, "python": platform.python_version(),
                          "evo_attention": __version__,
                          "share_cores": os.environ.get("EVO_ATTENTION_SHARE_CORES"),
                          "precision_probe": os.environ.get("EVO_ATTENTION_PRECISION_PROBE")},
              "settings": {"preset": "quick", "steps": args.steps, "data_seed": 7, "precision": "fp32",
                           "genes": genes, "control": args.control or None, "seeds": seeds, "threads": threads},
              "note": "relative differences are |x - y| / |y|, y the second named (alone; the first thread count)"}
    for dtype in ("float32", "float64") if args.float64 else ("float32",):
        with float64(dtype == "float64"):
            values = measure(groups, data, threads)
        result[dtype] = {"perplexity": values, "max_relative_difference": compare(values, threads)}
        print(dtype, json.dumps(result[dtype]["max_relative_difference"]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
