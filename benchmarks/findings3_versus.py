"""Genes of one validation file against a gene of another, paired by seed (study 3's D1,
docs/findings.md: the top programs against the gated softmax on the suite).

    python benchmarks/findings3_versus.py PROGRAMS.json --reference-file GATE.json --reference GENE
        [--margin 0.02] --out versus.json

``validate`` compares every gene with the vanilla gene only. Two validations on the same seeds,
settings and data (here ``validate --from-run RUN --top 3 --suite S`` and ``validate --from-run RUN
--genes GATE --suite S``, both on the same seed block) hold every per-seed value needed to compare
the genes of the first with the reference gene of the second. Each comparison is paired by seed with
the tool's rule (``stats.versus_reference``: the exact sign-flip test below 12 pairs, TOST at the
margin, Holm over the genes of the first file), on the raw scale for accuracy (suite accuracy), on
the log scale otherwise (its changes then relative: the file says ``log``). The two files must name the same seeds and the same vanilla values (the
same baseline trainings); anything else is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evo_attention.util import stats


def by_seed(gene: dict) -> dict:
    return {s: v for s, v in zip(gene["seeds"], gene["values"]) if v is not None}


def versus(first: dict, second: dict, reference: str, margin: float) -> dict:
    if first["baseline"]["seeds"] != second["baseline"]["seeds"] or \
            first["baseline"]["values"] != second["baseline"]["values"]:
        raise SystemExit("the two files do not share their baseline trainings (seeds and values differ): "
                         "they are not paired")
    # the reference by its key, or by its key with recipe parts (GENE|lr=R: a gene at its selected rate)
    ref = next((g for g in second["genes"] if g["gene"] == reference), None) or \
        next((g for g in second["genes"] if g["gene"].startswith(reference + "|lr=")), None)
    if ref is None:
        raise SystemExit(f"{reference} is not a gene of the reference file")
    ref_values = by_seed(ref)
    genes = [g for g in first["genes"] if g["gene"] != ref["gene"]]
    seeds = sorted(set(ref_values).intersection(*(by_seed(g) for g in genes)))
    lower = bool(first.get("lower_is_better", True))
    log = lower and first.get("metric") not in ("val_loss",)
    rows = stats.versus_reference({g["gene"]: [by_seed(g)[s] for s in seeds] for g in genes},
                                  [ref_values[s] for s in seeds], margin=margin, log=log, lower_is_better=lower)
    # the metric as the files name it ("val_perplexity" names the metric whatever split was scored)
    return {"reference": reference, "metric": first.get("metric"), "metric_label": first.get("metric_label"),
            "eval_split": first.get("eval_split"), "log": log, "margin": margin, "seeds": seeds,
            "reference_values": [ref_values[s] for s in seeds],
            "genes": {g["gene"]: {"values": [by_seed(g)[s] for s in seeds], **rows[g["gene"]]} for g in genes}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--reference-file", required=True)
    p.add_argument("--reference", required=True, help="the gene of the reference file to compare against")
    p.add_argument("--margin", type=float, default=0.02)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = versus(json.loads(Path(args.file).read_text()), json.loads(Path(args.reference_file).read_text()),
                 args.reference, args.margin)
    out["files"] = [args.file, args.reference_file]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    for gene, row in out["genes"].items():
        print(f"{gene}: {row.get('verdict_text', row.get('verdict'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
