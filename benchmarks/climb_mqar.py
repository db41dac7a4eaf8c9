"""Does a search started from the vanilla gene find token mixing where the task needs it?

MQAR at 8 pairs in 64 tokens (vocabulary 64), the quick preset's model (64 dims, 2 layers, no short
convolution), 1,000 steps: the vanilla gene solves it on 0 of 10 seeds and ``dconv=3`` on 10 of 10
(``docs/results/mqar-dconv/mqar-dconv.json``). For each search seed, a hill climb over programs
(``--strategy climb``, started from the vanilla gene: generation 0 is it and its one-edit
neighbours) with ``--population`` x ``--generations`` trainings (default 5 x 6 = 30); then the
search's winner is trained on 2 fresh seeds, and the search *solves* the task when the winner's
accuracy is >= 0.9 on both. The result keeps, per search seed, the winner, its search and fresh
accuracies and the training at which a program first reached 0.9 in the search; and the count of
solving searches with its exact (Clopper-Pearson) interval. With ``--elite-seeds K`` the climb races
(``search.racing``): a child that would replace the incumbent is first measured on K seeds, and
``trainings`` counts those re-measurements too.

    python benchmarks/climb_mqar.py --out runs/climb-mqar --json docs/results/climb-mqar/climb-mqar.json
    python benchmarks/climb_mqar.py --population 4 --generations 6 --elite-seeds 2 --out runs/climb-mqar-race \
        --json docs/results/climb-mqar/climb-mqar-race.json
    python benchmarks/climb_mqar.py --population 15 --generations 2 --out runs/climb-mqar-wide \
        --json docs/results/climb-mqar/climb-mqar-wide.json      # a wide first generation
    python benchmarks/climb_mqar.py --smoke --out /tmp/climb --json /tmp/climb.json   # seconds: it runs

Each search is one ``evo-attention search`` run in ``--out/seed-N`` (a repeat resumes or reuses it).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

TASK = "mqar:seq_len=64,vocab=64,pairs=8"
FRESH_SEEDS = (1001, 1002)
THRESHOLD = 0.9


def search(out: Path, seed: int, args) -> None:
    command = ["evo-attention", "search", "--preset", "quick", "--data", TASK, "--seq-len", "64",
               "--vocab-size", "64", "--steps", str(args.steps), "--strategy", "climb", "--start-from", "vanilla",
               "--population", str(args.population), "--generations", str(args.generations),
               "--config", str(args.space), "--no-baseline", "--seed", str(seed), "--workers", str(args.workers),
               "--keep-models", "0", "--no-check", "--quiet", "--out", str(out)]
    if args.elite_seeds > 1:
        command += ["--elite-seeds", str(args.elite_seeds)]
    if args.smoke:
        command += ["--d-model", "16", "--heads", "2", "--layers", "1", "--eval-batch-size", "500"]
    if (out / "run.db").exists():
        command.append("--resume")
    subprocess.run(command, check=True)


def fresh(gene: str, args) -> list[float]:
    from evo_attention.data import data_from_config
    from evo_attention.train.presets import build_config
    from evo_attention.train.spec import Trial
    from evo_attention.train.trainer import run_training

    overrides = {"data": TASK, "max_seq_len": 64, "vocab_size": 64, "train_steps": args.steps}
    if args.smoke:
        overrides.update(d_model=16, n_heads=2, n_layers=1, eval_batch_size=500)
    config = build_config("quick", overrides=overrides)
    data = data_from_config(config)
    return [run_training(Trial.from_config(gene, config.replace(seed=s), data=data), data).record.accuracy
            for s in FRESH_SEEDS]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="search seeds 1..N (default 5)")
    parser.add_argument("--population", type=int, default=5)
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--elite-seeds", type=int, default=1,
                        help="race a would-be incumbent on K seeds first (search --elite-seeds; default 1: no racing)")
    parser.add_argument("--space", default=str(Path(__file__).with_name("climb_space.yaml")),
                        help="a config file with the program search space")
    parser.add_argument("--smoke", action="store_true", help="a 16-dim model, 5 steps, 1 seed, 2 x 2: it runs")
    parser.add_argument("--out", required=True, help="directory of the search runs")
    parser.add_argument("--json", required=True, help="the result file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.steps, args.population, args.generations, args.workers = 1, 5, 2, 2, 1
    from evo_attention.train.environment import machine, versions
    from evo_attention.util import stats

    rows = {}
    for seed in range(1, args.seeds + 1):
        out = Path(args.out) / f"seed-{seed}"
        started = time.perf_counter()
        search(out, seed, args)
        winner = json.loads((out / "final_results.json").read_text())["best_gene"]["key"]
        with open(out / "evaluations.csv", newline="") as handle:  # in training order
            rows_read = list(csv.DictReader(handle))
        trained = [row for row in rows_read if row["role"] == "search"]
        raced = [row for row in rows_read if row["role"] == "race"]
        accuracy_of = {row["gene"]: float(row["accuracy"]) for row in trained if row["accuracy"]}
        first = next((i + 1 for i, row in enumerate(r for r in rows_read if r["role"] in ("search", "race"))
                      if row["role"] == "search" and row["accuracy"] and float(row["accuracy"]) >= THRESHOLD), None)
        accuracy = fresh(winner, args)
        rows[str(seed)] = {"winner": winner, "search_accuracy": accuracy_of.get(winner),
                           "fresh_accuracy": dict(zip(map(str, FRESH_SEEDS), accuracy)),
                           "solved": all(a is not None and a >= THRESHOLD for a in accuracy),
                           "first_training_at_threshold": first, "trainings": len(trained) + len(raced),
                           "racing_trainings": len(raced),
                           "wall_s": round(time.perf_counter() - started, 1)}
        print(f"search seed {seed}: winner {winner}, search accuracy {rows[str(seed)]['search_accuracy']}, fresh "
              f"{accuracy}: {'solved' if rows[str(seed)]['solved'] else 'not solved'}", flush=True)
    solved = sum(r["solved"] for r in rows.values())
    result = {"kind": "climb-mqar", "task": TASK, "steps": args.steps, "threshold": THRESHOLD,
              "fresh_seeds": list(FRESH_SEEDS), "population": args.population, "generations": args.generations,
              "elite_seeds": args.elite_seeds,
              "space": Path(args.space).read_text(), "smoke": args.smoke, "searches": rows, "solved": solved,
              "solve_rate": stats.solve_rate(solved, len(rows)), "machine": machine(), "versions": versions(),
              "command": "python benchmarks/climb_mqar.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{solved} of {len(rows)} searches found a program that solves {TASK} on both fresh seeds; wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
