"""Training steps and final best of --fidelity halving vs full fidelity, over several seeds.

    python benchmarks/bench_halving.py [--seeds 1 2 3] [--workers 2] [--eta 3] [--rungs 3]

For each seed runs the quick preset's search (recall task, GA 8 x 4 + baseline, 400 steps) twice:
at full fidelity and with successive halving. Prints, per seed, the training steps each spent and
the best perplexity each found (always a model trained on the full budget), then:

- the step ratio: full-fidelity steps / halving steps (summed over the seeds);
- the noise of the full-fidelity result: the mean and standard deviation of its best over the
  seeds (how much the best moves with nothing but the seed changed);
- the mean difference halving - full of the best, in perplexity and in units of that standard
  deviation ("within the noise" means well under 1).

The runs may use worker processes (--workers): steps and results do not depend on the executor.
"""

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from evo_attention.evolution import Evolution
from evo_attention.executors import make_executor
from evo_attention.fidelity import RUNG_ROLE
from evo_attention.presets import build_config


def run(config, out: Path, workers: int | None) -> dict:
    start = time.perf_counter()
    with Evolution(config, out_dir=out, executor=make_executor("local", workers=workers), overwrite=True,
                   report=False) as evo:
        evo.run()
        records = evo.store.evaluations()
        best = evo.best
        meta = evo.store.get_meta("fidelity")
    steps = sum(max(0, int(r.get("trained_steps") or 0) - int(r.get("resumed_from") or 0)) for r in records)
    return {"best_gene": best.gene.key, "best_perplexity": best.perplexity, "steps": steps,
            "full_budget_trainings": sum(1 for r in records if r["role"] != RUNG_ROLE),
            "rung_evaluations": sum(1 for r in records if r["role"] == RUNG_ROLE),
            "seconds": time.perf_counter() - start, "fidelity": meta}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--workers", type=int, help="worker processes per search (default: in process)")
    parser.add_argument("--eta", type=int, default=3)
    parser.add_argument("--rungs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400, help="steps per model (the preset's 400)")
    parser.add_argument("--generations", type=int, default=4, help="generations (the preset's 4)")
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-halving-"))
    rows = []
    try:
        for seed in args.seeds:
            full = build_config("quick", overrides={"seed": seed, "train_steps": args.steps,
                                                    "n_generations": args.generations})
            halving = full.replace(fidelity="halving", halving_eta=args.eta, halving_rungs=args.rungs)
            a = run(full, root / f"full-{seed}", args.workers)
            b = run(halving, root / f"halving-{seed}", args.workers)
            rows.append({"seed": seed, "full": a, "halving": b})
            corr = ", ".join(f"{c['steps']} steps: {c['spearman'] if c['spearman'] is None else round(c['spearman'], 2)}"
                             f" (n={c['n']})" for c in b["fidelity"]["rank_correlation"])
            print(f"seed {seed}: full {a['steps']} steps, best {a['best_perplexity']:.4f} {a['best_gene']} "
                  f"({a['seconds']:.0f} s) | halving {b['steps']} steps, best {b['best_perplexity']:.4f} "
                  f"{b['best_gene']} ({b['seconds']:.0f} s); rank correlation {corr}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    full_steps = sum(r["full"]["steps"] for r in rows)
    halving_steps = sum(r["halving"]["steps"] for r in rows)
    full_best = [r["full"]["best_perplexity"] for r in rows]
    diffs = [r["halving"]["best_perplexity"] - r["full"]["best_perplexity"] for r in rows]
    spread = statistics.stdev(full_best) if len(full_best) > 1 else float("nan")
    print(f"step ratio full / halving: {full_steps / halving_steps:.2f}x ({full_steps} vs {halving_steps} steps)")
    print(f"full-fidelity best over seeds: mean {statistics.mean(full_best):.4f}, std {spread:.4f}, "
          f"range {min(full_best):.4f}-{max(full_best):.4f}")
    print(f"halving best - full best: mean {statistics.mean(diffs):+.4f} perplexity "
          f"({statistics.mean(diffs) / spread:+.2f} std of the full-fidelity best); per seed "
          + ", ".join(f"{d:+.4f}" for d in diffs))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "step_ratio": full_steps / halving_steps,
                                               "full_best_std": spread, "diffs": diffs}, indent=2, default=str))


if __name__ == "__main__":
    main()
