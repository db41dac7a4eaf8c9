"""Does a climb from the vanilla gene on the language fitness end no worse than where it started?

The language fitness preset (``--preset fitness-lm``: Shakespeare bytes, 64x2 with a width-3 short
convolution, 828 steps; its check sees the output gate in one evaluation with probability 0.99).
For each search seed a hill climb over programs (``--strategy climb``, started from the vanilla
gene) with ``--population`` x ``--generations`` candidates, racing a would-be incumbent on
``--elite-seeds`` seeds; the search ends with its fresh-seed check (its report's "Fitness
reliability" line). Then ``validate --from-run --top 1`` trains the winner and the vanilla gene on
``--validate-seeds`` fresh seeds (seed + 1 ...; the check's seeds are the first two of them, so
they are reused) and gives the paired verdict (exact sign-flip test on the validation loss). A
search *holds* when that verdict is not "worse" (the winner may be the vanilla gene itself: then
it holds trivially, and the row says so; its program form, which the climb starts from, counts as it).

    python benchmarks/climb_lm.py --data-dir ../shared/data/shakespeare --out runs/climb-lm \\
        --json docs/results/climb-lm/climb-lm.json
    python benchmarks/climb_lm.py --smoke --data-dir ../shared/data/shakespeare --out /tmp/cl --json /tmp/cl.json

Each search is one ``evo-attention search`` run in ``--out/seed-N`` (a repeat resumes or reuses it).

How a candidate gets its learning rate, the two ways measured side by side (each in its own ``--out``):
``--rate-grid R1,R2,R3`` (each candidate at its best rate on a tuning seed, ``search --rate-grid``) or
``--rate-axis default,R1,R2`` (the rate a gene part the climb edits, starting at the preset's); neither: the preset's rate. The
result keeps every search's trainings by role (what the way cost).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SMOKE = ["--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "6", "--eval-batch-size", "64"]


def run(command: list[str]) -> None:
    subprocess.run(["evo-attention", *command], check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="the Shakespeare corpus (../shared/data/shakespeare)")
    parser.add_argument("--seeds", type=int, default=10, help="search seeds 1..N (default 10)")
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--elite-seeds", type=int, default=2)
    parser.add_argument("--validate-seeds", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--space", default=str(Path(__file__).with_name("climb_lm_space.yaml")))
    rates = parser.add_mutually_exclusive_group()  # how a candidate gets its learning rate (default: the preset's)
    rates.add_argument("--rate-grid", metavar="R1,R2,...", help="each candidate at its best of these rates on a "
                                                                "tuning seed (search --rate-grid)")
    rates.add_argument("--rate-axis", metavar="default,R1,...", help="the rate as a gene part the climb edits "
                                                                     "(search_space lr: [...]; 'default', the "
                                                                     "preset's rate, is where the climb starts)")
    parser.add_argument("--smoke", action="store_true", help="a 16-dim model, 6 steps, 1 seed, 2 x 2: it runs")
    parser.add_argument("--out", required=True, help="directory of the search runs")
    parser.add_argument("--json", required=True, help="the result file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.population, args.generations = 1, 2, 2
    import yaml

    from evo_attention.genes import SearchSpace, in_program_form
    from evo_attention.train.environment import machine, versions

    space_file, arm = Path(args.space), []
    if args.rate_axis:  # the space with the rate as an axis, beside the runs
        space = yaml.safe_load(space_file.read_text())
        space["search_space"]["lr"] = [r if r == "default" else float(r) for r in args.rate_axis.split(",")]
        space_file = Path(args.out) / "space.yaml"
        space_file.parent.mkdir(parents=True, exist_ok=True)
        space_file.write_text(yaml.safe_dump(space))
    if args.rate_grid:
        arm = ["--rate-grid", args.rate_grid]
    rows = {}
    for seed in range(1, args.seeds + 1):
        out = Path(args.out) / f"seed-{seed}"
        started = time.perf_counter()
        search = ["search", "--preset", "fitness-lm", "--data-dir", args.data_dir, "--strategy", "climb",
                  "--start-from", "vanilla", "--population", str(args.population), "--generations",
                  str(args.generations), "--elite-seeds", str(args.elite_seeds), "--config",
                  str(space_file), *arm, "--seed", str(seed), "--workers", str(args.workers), "--keep-models", "0", "--quiet",
                  "--out", str(out), *(SMOKE if args.smoke else [])]
        timed = not (out / "fresh_check.json").exists()  # a finished search is read back, not timed
        if timed:
            run(search + (["--resume"] if (out / "run.db").exists() else []))
        final = json.loads((out / "final_results.json").read_text())
        winner, vanilla = final["best_gene"]["key"], final["baseline"]["gene"]
        check = json.loads((out / "fresh_check.json").read_text())
        start = in_program_form(vanilla, SearchSpace.from_dict(yaml.safe_load(space_file.read_text())["search_space"]))
        row = {"winner": winner, "is_vanilla": winner in (vanilla, start), "fresh_check": check["line"],
               "search_s": round(time.perf_counter() - started, 1) if timed else None}
        if not row["is_vanilla"]:
            run(["validate", "--from-run", str(out), "--top", "1", "--seeds", str(args.validate_seeds),
                 "--workers", str(args.workers), "--quiet", *(SMOKE if args.smoke else [])])
            validation = json.loads((out / "validation.json").read_text())
            found = next(g for g in validation["genes"] if g["gene"] == winner)
            row.update(verdict=found["verdict"], relative=found["relative"], p_holm=found["p_holm"],
                       test=found["test"], seeds=args.validate_seeds,
                       params_ratio=found["cost"]["params"] / validation["baseline"]["cost"]["params"])
        row["holds"] = row["is_vanilla"] or row["verdict"] != "worse"
        row["wall_s"] = round(time.perf_counter() - started, 1) if timed else None
        rows[str(seed)] = row
        print(f"search seed {seed}: winner {winner}: {row.get('verdict', 'the vanilla gene itself')}", flush=True)
    held = sum(r["holds"] for r in rows.values())
    result = {"kind": "climb-lm", "preset": "fitness-lm", "population": args.population,
              "generations": args.generations, "elite_seeds": args.elite_seeds,
              "validate_seeds": args.validate_seeds, "space": space_file.read_text(), "smoke": args.smoke,
              "rates": {"grid": args.rate_grid, "axis": args.rate_axis},
              "trainings": {seed: _trainings(Path(args.out) / f"seed-{seed}") for seed in rows},
              "searches": rows, "held": held, "of": len(rows), "machine": machine(), "versions": versions(),
              "command": "python benchmarks/climb_lm.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{held} of {len(rows)} climbs ended no worse than the vanilla gene on fresh seeds; wrote {args.json}")
    return 0


def _trainings(run: Path) -> dict:
    """A search's trainings by role, from its store (what each way of choosing the rate cost)."""
    import sqlite3

    with sqlite3.connect(f"{(run / 'run.db').resolve().as_uri()}?mode=ro", uri=True) as db:
        return dict(db.execute("SELECT role, count(*) FROM evaluations GROUP BY role").fetchall())


if __name__ == "__main__":
    sys.exit(main())
