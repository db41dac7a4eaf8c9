"""Cost against context length over interleaved rounds: one summary of ``evo-attention bench
--seq-lens`` runs (study 2's Q5, docs/findings.md).

    python benchmarks/cost_rounds.py runs/findings2/q5/round-*/long_context.json --out cost.json

Each round's file holds every gene's ms per step and step memory at each context length, timed in
that round's order. Per gene and length the summary keeps the median and range over rounds of the
ms per step, the median step memory, and the ratio to softmax *within each round* (both timed in
the same round, so drifting load cancels), with its range over the rounds. The registered rule
calls a gene faster or slower than softmax only where that range excludes 1 (every round agrees);
otherwise "not distinguishable".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REFERENCE = "softmax"


def summarise(rounds: list[dict], reference: str = REFERENCE) -> dict:
    """The summary of ``rounds`` (each a parsed ``long_context.json``)."""
    if not rounds:
        raise SystemExit("no round files given: pass the long_context.json of every round")
    cells: dict[tuple[str, int], list[dict]] = {}
    for payload in rounds:
        for row in payload["rows"]:
            cells.setdefault((row["name"], int(row["seq_len"])), []).append(row)
    lengths = sorted({t for _, t in cells})
    names = list(dict.fromkeys(name for name, _ in cells))
    if reference not in names:
        raise SystemExit(f"the rounds have no {reference!r} gene to compare with: genes {', '.join(names)}")
    genes = []
    for name in names:
        for t in lengths:
            rows = cells.get((name, t), [])
            ref = cells.get((reference, t), [])
            if len(rows) != len(rounds) or len(ref) != len(rounds):
                raise SystemExit(f"{name} at T={t} is missing from some rounds: every round must time every gene")
            ms = [r["ms_per_step"] for r in rows]
            ratios = [r["ms_per_step"] / s["ms_per_step"] for r, s in zip(rows, ref)]
            memory = [r.get("step_memory_mb") for r in rows if r.get("step_memory_mb") is not None]
            if name == reference:
                call = "reference"
            elif min(ratios) > 1:
                call = "slower"
            elif max(ratios) < 1:
                call = "faster"
            else:
                call = "not distinguishable"
            genes.append({"name": name, "gene": rows[0]["gene"], "seq_len": t, "batch_size": rows[0]["batch_size"],
                          "precision": rows[0].get("precision"), "ms_median": statistics.median(ms),
                          "ms_min": min(ms), "ms_max": max(ms), "ratio_median": statistics.median(ratios),
                          "ratio_min": min(ratios), "ratio_max": max(ratios),
                          "step_memory_mb_median": statistics.median(memory) if memory else None,
                          "call": call, "ms_per_round": ms})
    return {"rounds": len(rounds), "reference": reference, "lengths": lengths, "rows": genes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="each round's long_context.json")
    parser.add_argument("--out", required=True, help="the summary JSON to write")
    args = parser.parse_args(argv)
    rounds = []
    for name in args.files:
        try:
            rounds.append(json.loads(Path(name).read_text()))
        except (OSError, ValueError) as exc:
            print(f"cost_rounds: cannot read {name}: {exc}", file=sys.stderr)
            return 1
    summary = summarise(rounds)
    summary["files"] = args.files
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out}: {len(summary['rows'])} gene x length cells over {summary['rounds']} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
