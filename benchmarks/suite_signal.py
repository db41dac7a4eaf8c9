"""Suite signal: does every point of a suite leave room for a mechanism to show, at the suite's budget?

For a suite (default mad-cpu), trains the baseline gene (and any other genes given) on every point
with N seeds (default 3) at the point's steps (the suite's budget), with the quick preset's model
(64 dims, 2 layers, 4 heads), and writes one JSON file with, per point:

- the chance accuracy (a uniform guess among the symbols that can be answers) and, where the task
  defines it, the no-recall accuracy (a uniform guess among the example's own values);
- per gene: the accuracy of every seed, their mean and sd;
- the baseline's flags: ``saturated`` (mean >= the ceiling, 0.98), ``at_chance`` (mean <= chance),
  ``in_band`` (chance < mean < ceiling: issue 42's rule for a suite's points), ``no_lookup`` (mean
  at most max(0.02, 2 sd) above the no-recall level, or below it: the model answers with the
  example's likeliest value, it has not learned the lookup; None where the task has no such level)
  and ``informative`` (in band and not ``no_lookup``);
- ``signal_over_noise``: the baseline's headroom in units of its seed sd,
  min(mean - floor, ceiling - mean) / sd, with floor = the larger of chance and the no-recall level:
  how many seed-sds a gene could move above or below the baseline before it hits a level that says
  nothing. Below about 2 a point cannot tell a better or worse mechanism from a seed; None with one
  seed (no sd) or when the seeds agree exactly;
- with two or more genes, the between-gene over within-gene spread (``signal_noise.spread``).

Every training is one Trial through the library's Runner and a run store in ``--out`` (a repeat
trains nothing, an interrupted run resumes), the same trainings ``compare --suite`` makes.

    python benchmarks/suite_signal.py --suite mad-cpu --seeds 3 --out runs/suite-signal \\
        --json docs/results/suite-signal/mad-cpu.json
    python benchmarks/suite_signal.py --seeds 1 --steps 100 --out runs/suite-signal-100 --json /tmp/s.json
    python benchmarks/suite_signal.py --smoke --out /tmp/smoke --json /tmp/smoke.json   # seconds; numbers mean nothing

``--steps`` replaces every point's steps (a look below the suite's budget; the JSON says so).
``--smoke``: a 16-dim 1-layer model, 2 steps per point, 1 seed, 1 worker: checks the script runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from signal_noise import spread, train_all, value  # noqa: E402  (the same trainings and spread)

CEILING = 0.98  # a baseline at or above this has no room left above it
SMOKE = {"d_model": 16, "n_heads": 2, "n_layers": 1, "eval_batch_size": 500}
SMOKE_STEPS = 2


def flags(mean: float | None, sd: float | None, chance: float, no_recall: float | None) -> dict:
    """The baseline's flags and its signal over noise at one point (see the module docstring)."""
    if mean is None:
        return {"in_band": False, "saturated": None, "at_chance": None, "no_lookup": None, "informative": False,
                "headroom": None, "signal_over_noise": None}
    floor = max(chance, no_recall or 0.0)
    headroom = min(mean - floor, CEILING - mean)
    in_band = chance < mean < CEILING
    no_lookup = None if no_recall is None else mean <= no_recall + max(0.02, 2 * (sd or 0.0))
    return {"in_band": in_band, "saturated": mean >= CEILING, "at_chance": mean <= chance, "no_lookup": no_lookup,
            "informative": in_band and not no_lookup, "headroom": headroom,
            "signal_over_noise": headroom / sd if sd else None}


def summary(values: list) -> dict:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return {"mean": statistics.fmean(finite) if finite else None,
            "sd": statistics.stdev(finite) if len(finite) >= 2 else None,
            "failed": len(values) - len(finite)}


def measure(args) -> dict:
    from evo_attention.data import data_from_config
    from evo_attention.data.suites import load_suite
    from evo_attention.studies.compare import named_dropout, resolve_configs
    from evo_attention.train.presets import build_config
    from evo_attention.train.suite import point_config

    suite = load_suite(args.suite)
    overrides = {"seed": args.seed, "eval_steps": None, **(SMOKE if args.smoke else {})}
    base = build_config(args.preset, None, overrides)
    # names resolve as compare --suite resolves them: on a generated task without attention dropout
    dropout = named_dropout(point_config(base, suite.points[0]))
    genes = {name: gene.key for name, gene in resolve_configs(args.genes, base.d_model, base.n_heads, base.max_seq_len,
                                                              attention_dropout=dropout)}
    baseline = next(iter(genes))
    seeds = [args.seed + i for i in range(1, args.seeds + 1)]
    steps = SMOKE_STEPS if args.smoke else args.steps
    points = {}
    for point in suite.points:
        config = point_config(base, point)  # the trainings compare/validate/search --suite make
        if steps is not None:
            config = config.replace(train_steps=steps)
        data = data_from_config(config)
        described = data.describe()
        chance, no_recall = described["chance_accuracy"], described.get("no_recall_accuracy")
        started = time.perf_counter()
        workers = args.workers if args.workers > 1 else None  # one: in this process
        records = train_all(config, data, genes, seeds, Path(args.out) / point.label, workers, point.label)
        accuracy = {g: [value(records[g][s], "accuracy") for s in seeds] for g in genes}
        per_gene = {g: {"gene": genes[g], "accuracy": dict(zip(map(str, seeds), accuracy[g])), **summary(accuracy[g])}
                    for g in genes}
        base_row = per_gene[baseline]
        entry = {"data": point.data, "steps": config.train_steps, "suite_steps": point.steps,
                 "chance_accuracy": chance, "no_recall_accuracy": no_recall, "genes": per_gene,
                 "baseline": {"name": baseline, "mean": base_row["mean"], "sd": base_row["sd"],
                              **flags(base_row["mean"], base_row["sd"], chance, no_recall)},
                 "wall_s": round(time.perf_counter() - started, 1)}
        if len(genes) >= 2:
            entry["spread"] = spread(accuracy)
        points[point.label] = entry
        b = entry["baseline"]
        mean = "-" if b["mean"] is None else f"{b['mean']:.3f}"
        snr = "-" if b["signal_over_noise"] is None else f"{b['signal_over_noise']:.1f}"
        where = ("saturated" if b["saturated"] else "at chance" if b["at_chance"]
                 else "no lookup (at the no-recall level)" if b["no_lookup"] else "informative" if b["informative"]
                 else "-")
        print(f"{point.label}: {baseline} {mean} (chance {chance:.3f}"
              + (f", no-recall {no_recall:.3f}" if no_recall is not None else "")
              + f"): {where}, signal/noise {snr} ({entry['wall_s']} s)", flush=True)
    bands = [p["baseline"]["in_band"] for p in points.values()]
    informative = [p["baseline"]["informative"] for p in points.values()]
    return {"suite": suite.name, "preset": args.preset, "smoke": args.smoke, "seeds": seeds, "genes": genes,
            "baseline": baseline, "ceiling": CEILING, "steps": "the suite's" if steps is None else steps,
            "model": {"d_model": base.d_model, "n_layers": base.n_layers, "n_heads": base.n_heads,
                      "batch_size": base.batch_size, "learning_rate": base.learning_rate},
            "points": points, "every_point_in_band": all(bands), "points_in_band": sum(bands),
            "points_informative": sum(informative)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="mad-cpu", help="a suite name or YAML file (default mad-cpu)")
    parser.add_argument("--genes", default="baseline",
                        help="compare's names or gene strings, comma-separated; the first is the baseline the flags "
                             "are about (default baseline: the vanilla gene)")
    parser.add_argument("--preset", default="quick", help="the model and training settings (default quick)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42, help="seeds are seed+1 .. seed+N")
    parser.add_argument("--steps", type=int, help="replace every point's steps (default: the suite's budget)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 steps per point, 1 seed: seconds")
    parser.add_argument("--out", required=True, help="directory of the run stores (one per point)")
    parser.add_argument("--json", required=True, help="the result file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.workers = 1, 1
    if args.seeds < 1 or (args.steps is not None and args.steps < 1):
        parser.error("--seeds and --steps must be positive integers")
    from evo_attention.train.environment import machine, versions

    result = measure(args)
    result["machine"], result["versions"] = machine(), versions()
    result["command"] = "python benchmarks/suite_signal.py " + " ".join(
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in vars(args).items()
        if v is not None and v is not False and k != "json")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {args.json}: {result['points_in_band']} of {len(result['points'])} points strictly between chance "
          f"and {CEILING}, {result['points_informative']} of them above the no-recall level too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
