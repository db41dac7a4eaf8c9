"""Paired verdicts of each gene against a reference gene at one point of a difficulty curve (study 2's
Q3, docs/findings.md, amendment 2).

    python benchmarks/curve_verdicts.py runs/findings2/q3/curve.json --at 16 --out verdicts.json
        [--reference GENE] [--margin 0.02]

Reads a ``curve.json`` (``evo-attention curve``): every gene trained at every value of the knob on
the same seeds. At the value ``--at``, each gene's per-seed accuracies are compared with the
reference gene's (default: the curve's first gene) paired by seed on the raw scale
(``stats.versus_reference``: the tool's paired test and its equivalence test at the margin in
accuracy units, Holm over the genes compared). A seed where either training failed is left out of
that pair (the file says how many). Writes the per-seed values, the device each seed trained on (a
curve can read trainings made on another machine from its store), the comparisons and the tool's
verdict words to ``--out``, marked with the rule that made them (``analysis``: under a later rule,
benchmarks/doc_tables.py recomputes them from the per-seed values).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evo_attention.util import stats


def point_of(gene: dict, value) -> dict:
    for point in gene["points"]:
        if str(point["value"]) == str(value):
            return point
    raise SystemExit(f"gene {gene['gene']} has no point at {value!r}: its values are "
                     f"{', '.join(str(p['value']) for p in gene['points'])}")


def verdicts(curve: dict, at, reference: str | None, margin: float) -> dict:
    genes = curve["genes"]
    if len(genes) < 2:
        raise SystemExit("the curve has fewer than 2 genes: nothing to compare")
    names = [g["gene"] for g in genes]
    reference = reference or names[0]
    if reference not in names:
        raise SystemExit(f"reference {reference!r} is not a gene of the curve: {', '.join(names)}")
    ref = point_of(genes[names.index(reference)], at)
    values, devices = {}, {}
    for gene in genes:
        point = point_of(gene, at)
        if point["seeds"] != ref["seeds"]:
            raise SystemExit(f"gene {gene['gene']} has seeds {point['seeds']}, the reference {ref['seeds']}: "
                             "a paired comparison needs the same seeds")
        values[gene["gene"]] = point["accuracy"]
        devices[gene["gene"]] = point.get("devices")  # a curve written before it recorded them: None
    others = {name: v for name, v in values.items() if name != reference}
    rows = stats.versus_reference(others, values[reference], margin=margin, log=False, lower_is_better=False)
    return {"source": curve.get("task"), "analysis": stats.ANALYSIS, "knob": curve.get("knob"), "at": at,
            "metric": curve.get("metric"), "reference": reference, "margin": margin, "seeds": ref["seeds"],
            "steps": curve.get("steps"), "test": stats.paired_test_name(False), "values": values, "devices": devices,
            "comparisons": rows, "machine": curve.get("machine"), "versions": curve.get("versions")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curve", type=Path, help="a curve.json written by evo-attention curve")
    parser.add_argument("--at", required=True, help="the knob's value to compare at, e.g. 16")
    parser.add_argument("--reference", default=None, help="the reference gene (default: the curve's first)")
    parser.add_argument("--margin", type=float, default=0.02, help="equivalence margin in accuracy (default 0.02)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.curve.is_file():
        raise SystemExit(f"{args.curve}: no such file (run evo-attention curve first)")
    if not args.margin > 0:
        raise SystemExit(f"--margin must be above 0, got {args.margin}")
    result = verdicts(json.loads(args.curve.read_text()), args.at, args.reference, args.margin)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in result["comparisons"].items():
        if row["diff_ci_low"] is None:
            print(f"{name}: {row['verdict_label']} ({row['n_pairs']} pairs)")
            continue
        print(f"{name}: {row['verdict_label']} ({row['difference']:+.4f} [{row['diff_ci_low']:+.4f}, "
              f"{row['diff_ci_high']:+.4f}], Holm p {row['p_holm']:.3g}, {row['n_pairs']} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
