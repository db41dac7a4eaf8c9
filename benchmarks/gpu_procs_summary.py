"""The summary of ``gpu_checks.sh``'s ``procs`` part: N processes, each a ``bench_gpu.py`` run of one
seed-config model (K = 1) on one device at once, as a search's N workers share it.

    python benchmarks/gpu_procs_summary.py DIR --processes N --out gpu-procs.json

DIR holds the processes' result files (``p*.json``). Writes each process's milliseconds per step,
its measuring window (start and last write, UTC, to the second: the sum below is a throughput only
where the windows overlap), the sum of their steps per second, and what that rate makes of the seed
study (``search --preset seed``: 94 trainings of 5000 steps), training steps only: building the
models, evaluation and the search's own work come on top.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SEED_STUDY_STEPS = 94 * 5000


def summarize(runs: list[dict], processes: int) -> dict:
    rows = [(run, row) for run in runs for row in run["rows"] if row["status"] == "ok"]
    rate = sum(1.0 / row["seconds_per_step"] for _, row in rows)  # steps per second, all processes together
    return {
        "benchmark": "gpu_checks procs", "device": runs[0]["device"] if runs else None, "processes": processes,
        "ok": len(rows), "settings": runs[0]["settings"] if runs else None,
        "ms_per_step": [row["ms_per_step"] for _, row in rows],
        "windows": [[run["started"], run["updated"]] for run, _ in rows],
        "steps_per_s_total": rate,
        "seed_study_training_minutes": SEED_STUDY_STEPS / rate / 60 if rate else None,
        "notes": "each process times its own steps after its warm-up; steps_per_s_total sums them (a throughput "
                 "where the windows overlap); seed_study_training_minutes: 94 trainings of 5000 steps at that "
                 "rate, training steps only",
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    runs = [json.loads(f.read_text()) for f in sorted(args.dir.glob("p*.json"))]
    result = summarize(runs, args.processes)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    minutes = result["seed_study_training_minutes"]
    print(f"{result['ok']} of {args.processes} processes: {result['steps_per_s_total']:.1f} steps/s together; the "
          f"seed study's training steps at that rate: {'?' if minutes is None else f'{minutes:.1f}'} min")
    return result


if __name__ == "__main__":
    main()
