"""Signal over noise: does a task separate attention mechanisms more than seeds separate a mechanism from itself?

For a list of diverse genes, each trained with the same seeds on every point of a suite (and on a
language-modelling setting), per point:

- between-gene spread: the sample sd of the genes' means over seeds;
- within-gene spread: the pooled sd over seeds of one gene (sqrt of the mean per-gene variance);
- ratio = between / within, and the one-way ANOVA F test of "all genes equal" (scipy.stats.f_oneway).

A ratio well above 1 means a search on that point ranks mechanisms, not seeds; near or below 1, a
search there mostly selects luck. The suite's aggregate (each gene-seed's mean accuracy over the
points) is scored the same way. Every training is one Trial through the library's Runner and a run
store in ``--out`` (a repeat or a resumed run trains nothing); the result is one JSON file.

    python benchmarks/signal_noise.py --suite mad-cpu --seeds 3 --out runs/signal-noise \
        --json docs/results/signal-noise/signal_noise.json
    python benchmarks/signal_noise.py --lm benchmarks/wikitext_small.yaml --lm-steps 400 \
        --data-dir ../shared/data/wikitext-2 --seeds 3 --out runs/signal-noise-lm \
        --json docs/results/signal-noise/signal_noise_lm.json

Accuracy (higher is better) is the suite's metric; the language-modelling setting uses the
validation loss (log perplexity) over the whole validation split.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

GENES = {  # name -> gene key: the softmax baseline and six diverse mechanisms
    "softmax": "dot|softmax|none|fixed|bias|0.10",
    "linear": "dot|linear|none|fixed|bias|0.10",
    "performer": "dot|favor|none|fixed|bias|0.10",
    "window-8": "dot|softmax|none|fixed|bias|0.10|win=8",
    "sparsemax": "dot|sparsemax|none|fixed|bias|0.10",
    "output-gate": "dot|softmax|output_gate|fixed|bias|0.10",
    "highway": "dot|softmax|highway|fixed|bias|0.10",
}


def spread(values: dict[str, list[float]]) -> dict:
    """Between-gene over within-gene spread of per-seed values {gene: [value per seed]}."""
    from scipy import stats

    groups = {g: [v for v in vs if v is not None and math.isfinite(v)] for g, vs in values.items()}
    groups = {g: vs for g, vs in groups.items() if len(vs) >= 2}
    means = {g: statistics.fmean(vs) for g, vs in groups.items()}
    between = statistics.stdev(means.values()) if len(means) >= 2 else float("nan")
    within = math.sqrt(statistics.fmean(statistics.variance(vs) for vs in groups.values())) if groups else float("nan")
    test = stats.f_oneway(*groups.values()) if len(groups) >= 2 else None
    return {
        "genes": len(groups),
        "means": means,
        "between_sd": between,
        "within_sd": within,
        # no spread at all (every training the same value, e.g. a saturated task): no ratio
        "ratio": between / within if within > 0 else (None if between == 0 else float("inf")),
        "anova_f": None if test is None else float(test.statistic),
        "anova_p": None if test is None else float(test.pvalue),
    }


def train_all(config, data, genes: dict, seeds: list[int], out: Path, workers: int, label: str) -> dict:
    """{gene name: {seed: record}}: every (gene, seed) trained once through the runner and the store in ``out``."""
    from evo_attention.search.executors import EvalTask, make_executor
    from evo_attention.search.runner import Runner
    from evo_attention.studies.common import study_store
    from evo_attention.train.spec import Trial

    tasks = {}
    for name, gene in genes.items():
        for seed in seeds:
            trial = Trial.from_config(gene, config, seed=seed, data=data)
            tasks[EvalTask(trial, role="signal-noise", label=f"{label} {name} seed {seed}")] = (name, seed)
    out.mkdir(parents=True, exist_ok=True)
    # one model per trainer: every training of this measurement runs as the earlier points ran
    with study_store(out, config, "signal-noise") as store, \
            make_executor("local", workers=workers, batch_models="off") as pool:
        runner = Runner(pool, store=store, data={config.task: data})
        records = runner.evaluate(list(tasks))
    result: dict = {name: {} for name in genes}
    for task, record in records.items():
        name, seed = tasks[task]
        result[name][seed] = record
    return result


def value(record, metric: str):
    if record.status != "ok":
        return None
    return getattr(record, metric)


def measure_suite(args) -> dict:
    from evo_attention.data import data_from_config
    from evo_attention.data.suites import load_suite
    from evo_attention.train.presets import build_config
    from evo_attention.train.suite import point_config

    suite = load_suite(args.suite)
    base = build_config(args.preset, None, {"seed": args.seed, "eval_steps": None})
    seeds = [args.seed + i for i in range(1, args.seeds + 1)]
    points, per_seed_points = {}, {}
    for point in suite.points:
        config = point_config(base, point)  # the trainings compare/validate/search --suite make
        data = data_from_config(config)
        started = time.perf_counter()
        records = train_all(config, data, GENES, seeds, Path(args.out) / point.label, args.workers, point.label)
        acc = {g: [value(records[g][s], "accuracy") for s in seeds] for g in GENES}
        loss = {g: [value(records[g][s], "val_loss") for s in seeds] for g in GENES}
        points[point.label] = {"data": point.data, "steps": config.train_steps,
                               "chance_accuracy": data.describe().get("chance_accuracy"),
                               "accuracy": {g: dict(zip(map(str, seeds), v)) for g, v in acc.items()},
                               "accuracy_spread": spread(acc), "loss_spread": spread(loss),
                               "wall_s": round(time.perf_counter() - started, 1)}
        per_seed_points[point.label] = acc
        print(f"{point.label}: ratio {points[point.label]['accuracy_spread']['ratio']:.2f} "
              f"({points[point.label]['wall_s']} s)", flush=True)
    aggregate = {}
    for g in GENES:  # a failed point counts as accuracy 0 in the gene-seed's mean
        aggregate[g] = [statistics.fmean((per_seed_points[p][g][i] or 0.0) for p in per_seed_points)
                        for i in range(len(seeds))]
    return {"suite": suite.name, "preset": args.preset, "seeds": seeds, "genes": GENES, "points": points,
            "aggregate": {"accuracy": {g: dict(zip(map(str, seeds), v)) for g, v in aggregate.items()},
                          "accuracy_spread": spread(aggregate)}}


def measure_lm(args) -> dict:
    from evo_attention.data import data_from_config
    from evo_attention.train.presets import build_config

    overrides = {"seed": args.seed, "eval_steps": None, "train_steps": args.lm_steps}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    config = build_config(args.preset, args.lm, overrides)
    data = data_from_config(config)
    seeds = [args.seed + i for i in range(1, args.seeds + 1)]
    started = time.perf_counter()
    records = train_all(config, data, GENES, seeds, Path(args.out), args.workers, config.data)
    loss = {g: [value(records[g][s], "val_loss") for s in seeds] for g in GENES}
    return {"lm_config": args.lm, "data": config.data, "steps": config.train_steps, "seeds": seeds, "genes": GENES,
            "val_loss": {g: dict(zip(map(str, seeds), v)) for g, v in loss.items()},
            "val_loss_spread": spread(loss), "wall_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", help="a suite name or YAML file (accuracy per point)")
    parser.add_argument("--lm", help="a language-modelling config YAML (validation loss)")
    parser.add_argument("--lm-steps", type=int, default=400)
    parser.add_argument("--data-dir")
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", required=True, help="directory of the run store(s)")
    parser.add_argument("--json", required=True, help="the result file")
    args = parser.parse_args()
    if bool(args.suite) == bool(args.lm):
        parser.error("give one of --suite or --lm")
    from evo_attention.train.environment import machine, versions

    result = measure_suite(args) if args.suite else measure_lm(args)
    result["machine"], result["versions"] = machine(), versions()
    result["command"] = "python benchmarks/signal_noise.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "json")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
