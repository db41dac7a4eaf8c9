"""The search strategies at an equal budget: ga, random, tpe and nsga2 on the quick preset.

    python benchmarks/bench_strategies.py [--seeds 1 2 3] [--retrain-seeds 5] [--workers 2] [--out table.md]

Every strategy asks the same number of genes (``population`` in generation 0, then ``population -
elite`` per generation; duplicates are answered from the run store, so a strategy may train fewer),
and every search of one seed starts from the same generation 0 (the strategies share it for a
seed). For each strategy and each search seed:

1. a single-objective search (perplexity): its best perplexity as found (biased low: the minimum
   of many single trainings), then the winner retrained on ``--retrain-seeds`` fresh seeds
   (1001, 1002, ...; the same seeds for every winner, never a search seed) for an unbiased mean;
2. a two-objective search (``--objectives``, default perplexity,params): the hypervolume of its
   finished evaluations, measured for every run in one common box (``search.pareto.bounds`` of all
   the runs' evaluations together) so that the numbers compare across strategies and seeds.

Over the search seeds each number gets its mean and t interval (``util.stats.describe``). The
markdown table goes to ``--out`` (and to stdout); ``--json`` keeps every measurement.
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from evo_attention import Evolution
from evo_attention.data import data_from_config
from evo_attention.search import pareto
from evo_attention.search.executors import make_executor
from evo_attention.studies.common import run_seeds
from evo_attention.train.presets import build_config
from evo_attention.train.record import objective_values
from evo_attention.util import stats
from evo_attention.util.format import markdown_table

STRATEGIES = ("ga", "random", "tpe", "nsga2")


def search(config, data, out: Path, workers: int | None) -> dict:
    """Run one search; its best (lowest perplexity) and every search evaluation's objectives."""
    start = time.perf_counter()
    with Evolution(config, data=data, out_dir=out, executor=make_executor("local", workers=workers),
                   overwrite=True, report=False) as evo:
        evo.run()
        records = evo.store.evaluations(role="search")
        best = evo.best
    return {"best_gene": best.gene.key, "best_perplexity": best.perplexity, "trainings": len(records),
            "points": [objective_values(r, config.objectives) for r in records],
            "seconds": time.perf_counter() - start}


def interval(values, digits: int = 3) -> str:
    d = stats.describe(values)
    if d["mean"] is None:
        return "-"
    if d["ci_low"] is None:
        return f"{d['mean']:.{digits}f}"
    return f"{d['mean']:.{digits}f} [{d['ci_low']:.{digits}f}, {d['ci_high']:.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="search seeds (at least 3)")
    parser.add_argument("--retrain-seeds", type=int, default=5, help="fresh seeds each winner is retrained on")
    parser.add_argument("--steps", type=int, default=400, help="steps per model (the preset's 400)")
    parser.add_argument("--population", type=int, default=8, help="the preset's 8")
    parser.add_argument("--generations", type=int, default=4, help="the preset's 4")
    parser.add_argument("--elite", type=int, default=2, help="the preset's 2")
    parser.add_argument("--objectives", default="perplexity,params", help="of the two-objective searches")
    parser.add_argument("--config", help="YAML config file applied on top of the quick preset")
    parser.add_argument("--workers", type=int, help="worker processes per search (default: in process)")
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--json", help="also write every measurement here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-strategies-"))
    base = {"train_steps": args.steps, "population_size": args.population, "n_generations": args.generations,
            "elite_size": args.elite, "baseline": False}
    runs: dict[str, list[dict]] = {name: [] for name in args.strategies}
    retrain_seeds = list(range(1001, 1001 + args.retrain_seeds))
    try:
        data = data_from_config(build_config("quick", args.config, overrides=base))
        for seed in args.seeds:
            for name in args.strategies:
                single = build_config("quick", args.config, overrides={**base, "seed": seed, "strategy": name})
                two = single.replace(objectives=args.objectives.split(","))
                a = search(single, data, root / f"{name}-{seed}", args.workers)
                b = search(two, data, root / f"{name}-{seed}-mo", args.workers)
                runs[name].append({"seed": seed, "single": a, "two": b})
                print(f"seed {seed} {name}: best {a['best_perplexity']:.4f} {a['best_gene']} ({a['trainings']} "
                      f"trainings, {a['seconds']:.0f} s); two-objective run {b['trainings']} trainings "
                      f"({b['seconds']:.0f} s)", flush=True)
        winners = list(dict.fromkeys(r["single"]["best_gene"] for rows in runs.values() for r in rows))
        if retrain_seeds:
            config = build_config("quick", args.config, overrides=base)
            with make_executor("local", workers=args.workers) as executor:
                records = run_seeds(winners, config, data, retrain_seeds, role="validate", executor=executor)
            for rows in runs.values():
                for r in rows:
                    values = [records[r["single"]["best_gene"], s].metric() for s in retrain_seeds]
                    r["retrained"] = {"seeds": retrain_seeds, "values": values, **stats.describe(values)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    box = pareto.bounds([p for rows in runs.values() for r in rows for p in r["two"]["points"]])
    for rows in runs.values():
        for r in rows:
            r["two"]["hypervolume"] = pareto.hypervolume_share(r["two"]["points"], *box) if box else None
    headers = ["Strategy", "Trainings per search", "Best found (search seed)",
               f"Winner retrained on {len(retrain_seeds)} fresh seeds", f"Hypervolume ({args.objectives})"]
    table = []
    for name, rows in runs.items():
        table.append([name, interval([r["single"]["trainings"] for r in rows], 1),
                      interval([r["single"]["best_perplexity"] for r in rows]),
                      interval([r["retrained"]["mean"] for r in rows if r.get("retrained")]),
                      interval([r["two"]["hypervolume"] for r in rows])])
    text = markdown_table(headers, table, "lrrrr")
    note = (f"\nQuick preset, {args.steps} steps per model, population {args.population} x {args.generations} "
            f"generations (elite {args.elite}), search seeds {', '.join(map(str, args.seeds))}; perplexity: mean "
            "over the search seeds [95% t interval]; hypervolume: share of one common box (ideal to reference "
            "point over every run's evaluations).\n")
    print(text + note)
    if args.out:
        Path(args.out).write_text(text + note)
    if args.json:
        for rows in runs.values():
            for r in rows:
                r["two"].pop("points")
        Path(args.json).write_text(json.dumps({"runs": runs, "box": box}, indent=2, default=str))


if __name__ == "__main__":
    main()
