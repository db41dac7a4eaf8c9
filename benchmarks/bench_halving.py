"""Training steps and final best of --fidelity halving vs full fidelity, over several seeds.

    python benchmarks/bench_halving.py [--seeds 1 2 3] [--workers 2] [--eta 3] [--rungs 3] [--config FILE]

For each seed runs the quick preset's search (recall task, GA 8 x 4 + baseline, 400 steps; or the
preset with a YAML config file on top, such as ``benchmarks/wikitext_small.yaml``) twice: at full
fidelity and with successive halving. Prints, per seed, the training steps each spent and
the best perplexity each found (always a model trained on the full budget), then:

- the step ratio: full-fidelity steps / halving steps (summed over the seeds);
- the noise of the full-fidelity result: the mean and standard deviation of its best over the
  seeds (how much the best moves with nothing but the seed changed);
- the mean difference halving - full of the best, in perplexity and in units of that standard
  deviation ("within the noise" means well under 1);
- with ``--validate-seeds N`` (default 5): both winners of each seed retrained on N fresh seeds
  (1001 ... 1000 + N, never a search seed; the same seeds for every winner). A search's best
  perplexity is the minimum of many single trainings, so it is biased low, and more so the more
  full-budget trainings the search ran (full fidelity runs several times as many as halving).
  The retrained means compare the genes found without that bias: per seed the difference halving -
  full with its Welch interval, and over the seeds the mean difference in units of the
  retraining noise (the pooled standard deviation of one training's perplexity).

The runs may use worker processes (--workers): steps and results do not depend on the executor.
"""

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from evo_attention.util import stats
from evo_attention.studies.common import run_seeds
from evo_attention.data import data_from_config
from evo_attention import Evolution
from evo_attention.search.executors import make_executor
from evo_attention.search.fidelity import RUNG_ROLE
from evo_attention.train.presets import build_config


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


def retrain(genes, config, seeds, workers: int | None) -> dict:
    """Validation perplexity of each gene (key) over ``seeds``: {key: [values]}."""
    with make_executor("local", workers=workers) as executor:
        records = run_seeds(genes, config, data_from_config(config), seeds, role="validate", executor=executor)
    return {key: [records[key, s]["val_perplexity"] for s in seeds] for key in dict.fromkeys(genes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--workers", type=int, help="worker processes per search (default: in process)")
    parser.add_argument("--eta", type=int, default=3)
    parser.add_argument("--rungs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400, help="steps per model (the preset's 400)")
    parser.add_argument("--generations", type=int, default=4, help="generations (the preset's 4)")
    parser.add_argument("--config", help="YAML config file applied on top of the quick preset")
    parser.add_argument("--data-dir", help="directory of the corpus (for a config that names wikitext2 or text)")
    parser.add_argument("--validate-seeds", type=int, default=5,
                        help="retrain both winners of each seed on this many fresh seeds (0: skip)")
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-halving-"))
    rows = []
    try:
        for seed in args.seeds:
            overrides = {"seed": seed, "train_steps": args.steps, "n_generations": args.generations}
            if args.data_dir:
                overrides["data_dir"] = args.data_dir
            full = build_config("quick", args.config, overrides=overrides)
            halving = full.replace(fidelity="halving", halving_eta=args.eta, halving_rungs=args.rungs)
            a = run(full, root / f"full-{seed}", args.workers)
            b = run(halving, root / f"halving-{seed}", args.workers)
            row = {"seed": seed, "full": a, "halving": b}
            corr = ", ".join(f"{c['steps']} steps: {c['spearman'] if c['spearman'] is None else round(c['spearman'], 2)}"
                             f" (n={c['n']})" for c in b["fidelity"]["rank_correlation"])
            print(f"seed {seed}: full {a['steps']} steps, best {a['best_perplexity']:.4f} {a['best_gene']} "
                  f"({a['seconds']:.0f} s) | halving {b['steps']} steps, best {b['best_perplexity']:.4f} "
                  f"{b['best_gene']} ({b['seconds']:.0f} s); rank correlation {corr}", flush=True)
            if args.validate_seeds:
                seeds = list(range(1001, 1001 + args.validate_seeds))
                values = retrain([a["best_gene"], b["best_gene"]], full, seeds, args.workers)
                row["retrained"] = {"seeds": seeds, "full": values[a["best_gene"]],
                                    "halving": values[b["best_gene"]]}
                w = stats.welch(row["retrained"]["halving"], row["retrained"]["full"])
                row["retrained"]["welch"] = w
                print(f"seed {seed} retrained on seeds {seeds[0]}-{seeds[-1]}: full's best "
                      f"{_mean_sd(row['retrained']['full'])}, halving's best {_mean_sd(row['retrained']['halving'])}, "
                      f"difference {w['difference']:+.4f} (95% CI {_ci(w)})", flush=True)
            rows.append(row)
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
    summary = {"rows": rows, "step_ratio": full_steps / halving_steps, "full_best_std": spread, "diffs": diffs}
    retrained = [r["retrained"] for r in rows if "retrained" in r]
    if retrained:
        described = [{k: stats.describe(r[k]) for k in ("full", "halving")} for r in retrained]
        rdiffs = [d["halving"]["mean"] - d["full"]["mean"] for d in described]
        noise = math.sqrt(statistics.mean(d[k]["sd"] ** 2 for d in described for k in d if d[k]["sd"] is not None))
        print(f"retrained winners: halving - full, mean over seeds {statistics.mean(rdiffs):+.4f} perplexity "
              f"({statistics.mean(rdiffs) / noise:+.2f} x the noise of one training, pooled sd {noise:.4f}); "
              "per seed " + ", ".join(f"{d:+.4f}" for d in rdiffs))
        summary.update(retrained_diffs=rdiffs, retrain_sd=noise)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str))


def _mean_sd(values) -> str:
    d = stats.describe(values)
    return f"{d['mean']:.4f} +- {d['sd']:.4f} (n={d['n']})" if d["sd"] is not None else f"{d['mean']} (n={d['n']})"


def _ci(w) -> str:
    if w["diff_ci_low"] is None:
        return "n/a"
    return f"{w['diff_ci_low']:+.4f} to {w['diff_ci_high']:+.4f}"


if __name__ == "__main__":
    main()
