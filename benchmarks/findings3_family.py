"""Study 3's D4 (docs/findings.md): the gate against its parameter-matched baseline in several
cells, Holm over the cells, and the trend of the paired change over tokens per parameter.

    python benchmarks/findings3_family.py --gene GENE --cell tpp2=runs/.../d4/tpp2/validation_test.json \
        --cell tpp6=... --cell tpp12=... --cell seed=... --trend tpp2=2,tpp6=6,tpp12=12 [--margin 0.01] --out family.json

Each cell's file is a ``validate --match-params`` result: the gene (found by its key, or by its key
with recipe parts such as ``GENE|lr=R``) and the matched vanilla model it was judged against, with
their per-seed values. The family is the gene against its matched model in every cell: each pair is
re-tested with the tool's rule (``stats.versus_reference`` on the log scale: the exact sign-flip test
below 12 pairs, TOST at the margin) with the other cells as the rest of its family, so every p is
Holm-corrected over all the cells. The trend: for each seed shared by the trend's cells, the least-
squares slope of the log difference (gene minus matched) on log2 of the cell's tokens per parameter;
the mean slope is tested against 0 by the exact sign-flip test (two-sided, its own family of one),
the one-sample t-test beside it. Negative: the gene's advantage grows with tokens per parameter.
``--trend-only`` writes the trend without the family: the trend is a family of its own and reads only
its cells' files, so it can be reported while a cell outside it (D4's seed config) has not run; the
cells' Holm words wait for every cell.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from evo_attention.util import stats


def pair_of(payload: dict, gene: str, where: str) -> dict:
    """``{"gene", "seeds", "values", "matched", "matched_values", "d_ff"}`` of ``gene`` in a validation."""
    row = next((g for g in payload["genes"] if g["gene"] == gene or g["gene"].startswith(gene + "|lr=")), None)
    if row is None:
        raise SystemExit(f"{where}: no gene {gene}")
    matched = next((m for m in payload.get("matched_baselines") or [] if row["gene"] in m.get("matched_to", [])), None)
    if matched is None:
        raise SystemExit(f"{where}: no parameter-matched baseline for {row['gene']} (was it run with --match-params?)")
    own, base = dict(zip(row["seeds"], row["values"])), dict(zip(matched["seeds"], matched["values"]))
    seeds = [s for s in row["seeds"] if own.get(s) is not None and base.get(s) is not None]
    return {"gene": row["gene"], "seeds": seeds, "values": [own[s] for s in seeds],
            "matched_values": [base[s] for s in seeds], "d_ff": matched.get("d_ff")}


def family(cells: dict[str, dict], margin: float) -> dict:
    out = {}
    for name, cell in cells.items():
        others = {other: {"values": c["values"], "reference": c["matched_values"]}
                  for other, c in cells.items() if other != name}
        row = stats.versus_reference({name: cell["values"]}, cell["matched_values"], margin=margin, log=True,
                                     lower_is_better=True, others=others)[name]
        out[name] = {**cell, **row}
    return out


def trend(cells: dict[str, dict], levels: dict[str, float]) -> dict:
    seeds = sorted(set.intersection(*(set(cells[c]["seeds"]) for c in levels)))
    x = np.log2([levels[c] for c in levels])
    slopes = []
    for seed in seeds:
        d = [math.log(dict(zip(cells[c]["seeds"], cells[c]["values"]))[seed])
             - math.log(dict(zip(cells[c]["seeds"], cells[c]["matched_values"]))[seed]) for c in levels]
        slopes.append(float(np.polyfit(x, d, 1)[0]))
    exact = stats.sign_flip(slopes)
    t = scipy_stats.ttest_1samp(slopes, 0.0) if len(slopes) > 1 else None
    p = exact["p_value"]
    mean = float(np.mean(slopes)) if slopes else None
    words = ("the gene's advantage grows with tokens per parameter" if p is not None and p < 0.05 and mean < 0 else
             "the gene's advantage shrinks with tokens per parameter" if p is not None and p < 0.05 and mean > 0 else
             "no trend shown")
    return {"cells": levels, "seeds": seeds, "slopes": slopes, "mean_slope": mean, "p_exact": p,
            "smallest_p": exact["smallest_p"], "p_t": None if t is None else float(t.pvalue), "words": words}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gene", required=True)
    p.add_argument("--cell", action="append", required=True, metavar="NAME=FILE")
    p.add_argument("--trend", metavar="NAME=TPP,...", help="the cells of the trend and their tokens per parameter")
    p.add_argument("--trend-only", action="store_true",
                   help="the trend alone (its own family of one), without the Holm family of the cells")
    p.add_argument("--margin", type=float, default=0.01)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cells = {}
    for item in args.cell:
        name, _, path = item.partition("=")
        cells[name] = pair_of(json.loads(Path(path).read_text()), args.gene, path)
    if args.trend_only and not args.trend:
        raise SystemExit("--trend-only needs --trend NAME=TPP,...")
    out = {"gene": args.gene, "margin": args.margin, "files": args.cell}
    if not args.trend_only:
        out["family"] = family(cells, args.margin)
    if args.trend:
        levels = {n: float(v) for n, v in (part.split("=") for part in args.trend.split(","))}
        missing = sorted(set(levels) - set(cells))
        if missing or len(levels) < 3:
            raise SystemExit(f"--trend needs at least 3 of the cells: {missing or list(levels)}")
        out["trend"] = trend(cells, levels)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    for name, row in out.get("family", {}).items():
        print(f"{name}: {row['verdict_text']}")
    if "trend" in out:
        print(f"trend: {out['trend']['words']} (mean slope {out['trend']['mean_slope']:+.4f}, exact p {out['trend']['p_exact']:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
