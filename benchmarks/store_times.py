"""Machine time of a run from its store: per role (search, baseline, validate, ...) how many
trainings, when the first and the last were stored, the summed time of their trainings, and the
gaps (no training stored for longer than ``--gap`` seconds: a run stopped and resumed, or trainings
that took that long).

    python benchmarks/store_times.py RUN_DIR [--gap 600] [--trainings] --out times.json

``--trainings`` adds one row per training in the order stored: its role, generation, gene, when it
was stored, its times, milliseconds per training step (its training time over its steps), device,
precision, how its steps ran on CUDA (``cuda_graph``), status and validation loss.

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


def training_rows(records: list) -> list[dict]:
    """One row per training (``--trainings``), in the order they were stored."""
    rows = []
    for r in sorted(records, key=lambda r: _at(r.created_at)):
        steps = r.trained_steps or 0
        rows.append({"role": r.role, "generation": r.generation, "gene": r.gene,
                     "stored": _at(r.created_at).isoformat(timespec="seconds"), "time_s": r.time_s,
                     "train_time_s": r.train_time_s, "trained_steps": steps,
                     "ms_per_step": 1e3 * r.train_time_s / steps if steps and r.train_time_s else None,
                     "device": r.device, "precision": r.precision, "cuda_graph": r.extra.get("cuda_graph"),
                     "status": str(r.status), "val_loss": r.val_loss})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--gap", type=float, default=600.0, help="report stretches longer than this (seconds) in "
                                                                 "which no training was stored")
    parser.add_argument("--trainings", action="store_true", help="also one row per training")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    records = RunStore.open(args.run_dir, readonly=True).evaluations()
    result = {"run": args.run_dir, "gap_s": args.gap, "roles": store_times(records, args.gap)}
    if args.trainings:
        result["trainings"] = training_rows(records)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for role, r in result["roles"].items():
        print(f"{role}: {r['trainings']} trainings, {r['first_stored']} .. {r['last_stored']}, "
              f"{len(r['gaps'])} gap(s), summed {r['summed_time_s'] / 3600:.2f} h")
    return result


if __name__ == "__main__":
    main()
