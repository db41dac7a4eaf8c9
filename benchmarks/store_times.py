"""Machine time of a run from its store (``evo_attention.studies.results.run_times``, which
``evo-attention study run`` writes as ``times.json`` beside every store of a stage): per role how
many trainings, when the first and the last were stored, the gaps longer than ``--gap`` seconds in
which none was, their summed time; ``--trainings`` adds one row per training.

    python benchmarks/store_times.py RUN_DIR [--gap 600] [--trainings] --out times.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evo_attention.studies.results import run_times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--gap", type=float, default=600.0, help="report stretches longer than this (seconds) in "
                                                                 "which no training was stored")
    parser.add_argument("--trainings", action="store_true", help="also one row per training")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run_times(args.run_dir, args.gap, args.trainings)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for role, r in result["roles"].items():
        print(f"{role}: {r['trainings']} trainings, {r['first_stored']} .. {r['last_stored']}, "
              f"{len(r['gaps'])} gap(s), summed {r['summed_time_s'] / 3600:.2f} h")
    return result


if __name__ == "__main__":
    main()
