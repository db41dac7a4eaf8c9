"""Machine time of a run from its store: per role (search, baseline, validate, ...) how many
trainings, when the first and the last were stored, the summed time of their trainings, and the
gaps (no training stored for longer than ``--gap`` seconds: a run stopped and resumed, or trainings
that took that long).

    python benchmarks/store_times.py RUN_DIR [--gap 600] --out times.json

``created_at`` is when a training's record was stored (its end); ``time_s`` is what the record says
it took (building, training and evaluation; a folded training's share of its batch). With several
workers the summed time exceeds the wall time.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from evo_attention.search.store import RunStore


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def store_times(records: list, gap_s: float) -> dict:
    """``records``: a store's evaluation records (each with ``role``, ``created_at``, ``time_s``)."""
    by_role: dict[str, list] = {}
    for r in records:
        by_role.setdefault(r.role, []).append(r)
    out = {}
    for role, rs in by_role.items():
        times = sorted(_at(r.created_at) for r in rs)
        gaps = [{"from": a.isoformat(timespec="seconds"), "to": b.isoformat(timespec="seconds"),
                   "seconds": round((b - a).total_seconds())}
                  for a, b in zip(times, times[1:]) if (b - a).total_seconds() > gap_s]
        span = (times[-1] - times[0]).total_seconds()
        out[role] = {"trainings": len(rs), "first_stored": times[0].isoformat(timespec="seconds"),
                     "last_stored": times[-1].isoformat(timespec="seconds"), "span_s": round(span),
                     "gaps": gaps, "span_without_gaps_s": round(span - sum(g["seconds"] for g in gaps)),
                     "summed_time_s": round(sum(r.time_s or 0.0 for r in rs), 1)}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--gap", type=float, default=600.0, help="report stretches longer than this (seconds) in "
                                                                 "which no training was stored")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    store = RunStore.open(args.run_dir, readonly=True)
    result = {"run": args.run_dir, "gap_s": args.gap, "roles": store_times(store.evaluations(), args.gap)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for role, r in result["roles"].items():
        print(f"{role}: {r['trainings']} trainings, {r['first_stored']} .. {r['last_stored']}, "
              f"{len(r['gaps'])} gap(s), summed {r['summed_time_s'] / 3600:.2f} h")
    return result


if __name__ == "__main__":
    main()
