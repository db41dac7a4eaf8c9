"""Search strategies compared over several search seeds (study 2's Q4, docs/findings.md): a call of
``evo_attention.studies.results`` (the ``strategies`` stage of ``evo-attention study``).

    python benchmarks/strategies.py runs/findings2/q4 --out strategies.json [--reference random]
        [--margin 0.01]

Reads ``DIR/STRATEGY-SEED/validation*.json`` (``validate --from-run --top 1`` of each search): each
strategy against the reference, paired by search seed (``results.compare_strategies``); warns where a
validation seed served two search seeds (validate each with ``--seed-block run``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evo_attention.studies.results import collect_strategies, compare_strategies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="the folder holding STRATEGY-SEED run folders")
    parser.add_argument("--out", required=True)
    parser.add_argument("--reference", default="random")
    parser.add_argument("--margin", type=float, default=0.01, help="equivalence margin, relative (default 0.01)")
    args = parser.parse_args(argv)
    if not Path(args.root).is_dir():
        print(f"strategies: {args.root} is not a folder of searches", file=sys.stderr)
        return 1
    result = compare_strategies(collect_strategies(Path(args.root)), args.reference, args.margin)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if result["validation_seeds"]["shared"]:
        print("warning: validation seeds served several search seeds; the searches are not independent units: "
              "validate each with --seed-block run", file=sys.stderr)
    for name, row in result["comparisons"].items():
        print(f"{name} vs {args.reference}: Holm p {row['p_holm']:.3g}: {row['verdict_label']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
