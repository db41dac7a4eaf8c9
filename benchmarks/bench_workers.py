"""Evaluations per hour of a search with 1 vs N worker processes, measured in the same run.

    python benchmarks/bench_workers.py [--workers 2] [--generations 4] [--steps 400] [--rounds 1]

Runs the quick preset's search (recall task, 64 dims, GA 8 x 4 + baseline) twice per round, from
scratch, into temporary run directories: once with ``--workers 1`` using all the cores' threads
for its one worker, once with ``--workers N`` splitting the same cores between the N workers, so
both use the same CPU; and, as a second reference, ``--workers 1`` with one thread (on a machine
shared with other work, two threads per evaluation can be much slower than one: threads that
wait for each other at every operation while the OS runs someone else). Wall time includes
starting the workers, as a user's search does. Prints evaluations per hour of each, the ratios,
and whether the searches found the same best (on a CPU the number of threads per evaluation can
change results in the last digits). Rounds rotate the order so that drifting machine load hits
all alike; the median ratios are reported.
"""

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from evo_attention import Evolution
from evo_attention.search.executors import ProcessExecutor, available_cores
from evo_attention.train.presets import build_config


def run_search(config, workers: int, threads: int, out: Path) -> dict:
    executor = ProcessExecutor(workers, threads=threads)
    start = time.perf_counter()
    with Evolution(config, out_dir=out, executor=executor, overwrite=True, report=False) as evo:
        evo.run()
        trained = len(evo.store.evaluations())
        best = (evo.best.gene.key, evo.best.perplexity)
    elapsed = time.perf_counter() - start
    return {"workers": workers, "threads_per_worker": threads, "evaluations": trained, "seconds": elapsed,
            "evaluations_per_hour": trained * 3600 / elapsed, "best": best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--generations", type=int, help="override the preset's 4 generations")
    parser.add_argument("--steps", type=int, help="override the preset's 400 steps per model")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args()
    overrides = {k: v for k, v in (("n_generations", args.generations), ("train_steps", args.steps)) if v}
    config = build_config("quick", overrides=overrides)
    cores = available_cores()
    print(f"quick preset: {config.population_size} x {config.n_generations} generations, {config.train_steps} steps; "
          f"{cores} cores: workers 1 x {cores} threads vs workers {args.workers} x {max(1, cores // args.workers)} "
          "threads")
    root = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    setups = [("one", 1, cores), ("many", args.workers, max(1, cores // args.workers)), ("one_thread", 1, 1)]
    rounds = []
    try:
        for r in range(args.rounds):
            order = setups[r % 3:] + setups[: r % 3]
            results = {}
            for name, w, t in order:
                results[name] = res = run_search(config, w, t, root / name)
                print(f"  round {r + 1}: workers {w} x {t} threads: {res['evaluations']} evaluations in "
                      f"{res['seconds']:.0f} s = {res['evaluations_per_hour']:.0f} evaluations/hour; best "
                      f"{res['best'][0]} {res['best'][1]:.4f}", flush=True)
            ratio = results["many"]["evaluations_per_hour"] / results["one"]["evaluations_per_hour"]
            ratio1 = results["many"]["evaluations_per_hour"] / results["one_thread"]["evaluations_per_hour"]
            rounds.append({**results, "ratio": ratio, "ratio_one_thread": ratio1})
            print(f"  round {r + 1}: workers {args.workers} vs workers 1 x {cores} threads: {ratio:.2f}x; vs workers 1 "
                  f"x 1 thread: {ratio1:.2f}x; same best: {len({res['best'] for res in results.values()}) == 1}",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    median = statistics.median(r["ratio"] for r in rounds)
    median1 = statistics.median(r["ratio_one_thread"] for r in rounds)
    print(f"evaluations per hour, workers {args.workers} vs workers 1 x {cores} threads: {median:.2f}x; vs workers 1 "
          f"x 1 thread: {median1:.2f}x (medians of {len(rounds)} round(s))")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "median_ratio": median,
                                               "median_ratio_one_thread": median1}, indent=2))


if __name__ == "__main__":
    main()
