"""Does a candidate of a climb want another learning rate than the vanilla gene's?

    python benchmarks/rate_census.py --data-dir ../shared/data/shakespeare [--genes G1,G2,...]
        [--neighbours 7] [--factors 0.5,1,2] [--out rate_census.json]

Trains the vanilla gene, ``--neighbours`` distinct one-edit neighbours of its program (the first
generation of a climb from it, as ``bench_generation.py`` draws them) and any ``--genes`` (say the
climbs' winners) on the language fitness preset (``fitness-lm``) at the preset's rate times each of
``--factors``, on the tuning seed (``seed + train.config.TUNING_FROM``: no search or verdict seed),
and writes each gene's validation loss per rate, its best rate (``search.tuning.select_rate``, the
rule of ``--rate-grid``), and what the preset's rate costs it: its loss there minus its best. Then,
per candidate, whether its comparison with the vanilla gene has the same sign at the preset's rate
(what a search without a rate per candidate sees) and with each at its own best rate (what
``--rate-grid`` sees). One seed per cell: a census of where rates matter, not a verdict.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from bench_generation import generation
from evo_attention.data import data_from_config
from evo_attention.genes import split_genes
from evo_attention.search.tuning import select_rate
from evo_attention.train.config import TUNING_FROM
from evo_attention.train.presets import build_config
from evo_attention.train.spec import Trial
from evo_attention.train.trainer import run_training


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--genes", default="", help="more genes (comma-separated gene strings)")
    parser.add_argument("--neighbours", type=int, default=7)
    parser.add_argument("--factors", default="0.5,1,2")
    parser.add_argument("--seed", type=int, default=0, help="the run seed (its tuning seed is seed + 1001)")
    parser.add_argument("--steps", type=int, help="fewer steps (a smoke run)")
    parser.add_argument("--out", default="rate_census.json")
    args = parser.parse_args()
    overrides = {"data_dir": args.data_dir, **({"train_steps": args.steps} if args.steps else {})}
    config = build_config("fitness-lm", overrides=overrides)
    data = data_from_config(config)
    factors = [float(f) for f in args.factors.split(",")]
    rates = [config.learning_rate * f for f in factors]
    genes = generation(1 + args.neighbours) + [g for g in split_genes(args.genes) if g]
    seed = args.seed + TUNING_FROM
    rows = []
    for gene in genes:
        losses, statuses = {}, {}
        for rate in rates:
            record = run_training(Trial.from_config(gene, config.replace(seed=seed, learning_rate=rate), data=data),
                                  data).record
            losses[rate] = record.val_loss if record.status == "ok" else None
            statuses[rate] = record.status
            print(f"{gene} lr {rate:.3g}: {record.status} {record.val_loss:.4f}", flush=True)
        best = select_rate([{"lr": r, "mean": v, "n_failed": int(v is None)} for r, v in losses.items()])
        rows.append({"gene": gene, "losses": {f"{r:.6g}": v for r, v in losses.items()}, "statuses": statuses,
                     "best_rate": best, "preset_rate_cost": None if losses[config.learning_rate] is None or
                     losses[best] is None else losses[config.learning_rate] - losses[best]})
    vanilla = rows[0]
    for row in rows[1:]:
        at_preset = row["losses"][f"{config.learning_rate:.6g}"], vanilla["losses"][f"{config.learning_rate:.6g}"]
        at_best = row["losses"][f"{row['best_rate']:.6g}"], vanilla["losses"][f"{vanilla['best_rate']:.6g}"]
        row["beats_vanilla_at_preset_rate"] = None if None in at_preset else at_preset[0] < at_preset[1]
        row["beats_vanilla_at_best_rates"] = None if None in at_best else at_best[0] < at_best[1]
    result = {"preset": "fitness-lm", "data_dir": args.data_dir, "preset_rate": config.learning_rate, "rates": rates,
              "tuning_seed": seed, "steps": config.train_steps, "rows": rows,
              "other_best_rate": sum(r["best_rate"] != config.learning_rate for r in rows),
              "flips": sum(r.get("beats_vanilla_at_preset_rate") != r.get("beats_vanilla_at_best_rates")
                           for r in rows[1:]),
              "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                          "python": platform.python_version()},
              "command": " ".join(["python", *sys.argv])}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['other_best_rate']} of {len(rows)} genes best at another rate than the preset's; "
          f"{result['flips']} of {len(rows) - 1} candidates compare otherwise with the vanilla gene at their own "
          f"best rates; wrote {args.out}")


if __name__ == "__main__":
    main()
