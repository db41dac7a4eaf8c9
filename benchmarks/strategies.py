"""Search strategies compared over several search seeds (study 2's Q4, docs/findings.md).

    python benchmarks/strategies.py runs/findings2/q4 --out strategies.json [--reference random]
        [--margin 0.01]

Reads ``DIR/STRATEGY-SEED/validation.json`` (``evo-attention validate --from-run`` of each search,
``--top 1``; ``validation_suite.json`` for a search on a suite, its value the suite accuracy, higher
is better): the winner of each search re-measured on fresh seeds. A strategy's value for a search
seed is its winner's mean over those seeds. Each strategy is compared with the reference strategy
paired by search seed, on the log scale (``stats.versus_reference``: paired t-test, TOST at the
margin, Holm over the comparisons), and gets the tool's verdict word. Writes every search's winner,
its search value, its validated values and the comparisons to ``--out``.

The searches of different search seeds are independent units only when their validations share no
seed (``validate --from-run DIR --seed-block run``: each search's seeds from a block of its own);
``validation_seeds`` in the output records every search's seeds and any seed that served two search
seeds, and a shared seed is warned about. Searches of the same search seed share their seeds: the
pairing of the strategies.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from evo_attention.util import stats

NAME = re.compile(r"^(?P<strategy>[a-z0-9_]+)-(?P<seed>\d+)$")


def collect(root: Path) -> dict[str, dict[int, dict]]:
    """strategy -> search seed -> that search's validated winner."""
    found: dict[str, dict[int, dict]] = {}
    for path in sorted([*root.glob("*/validation.json"), *root.glob("*/validation_suite.json")]):
        match = NAME.match(path.parent.name)
        if not match:
            continue
        payload = json.loads(path.read_text())
        genes = payload.get("genes") or []
        if not genes:
            raise SystemExit(f"{path}: no validated gene (was it validated with --top 1?)")
        winner = genes[0]
        if int(match["seed"]) in found.get(match["strategy"], {}):
            raise SystemExit(f"{path.parent}: a validation and a suite validation of one search: keep one")
        found.setdefault(match["strategy"], {})[int(match["seed"])] = {
            "gene": winner["gene"], "search_value": winner.get("search_value"), "seeds": winner.get("seeds"),
            "values": winner.get("values"), "mean": winner.get("mean"),
            "baseline_mean": (payload.get("baseline") or {}).get("mean"), "verdict_vs_baseline": winner.get("verdict"),
            "metric": payload.get("metric"), "file": str(path)}
    return found


def compare(found: dict[str, dict[int, dict]], reference: str, margin: float) -> dict:
    if reference not in found:
        raise SystemExit(f"no searches of the reference strategy {reference!r}: found {', '.join(sorted(found)) or 'none'}")
    seeds = sorted(set.intersection(*(set(v) for v in found.values())))
    if len(seeds) < 2:
        raise SystemExit(f"every strategy needs the same search seeds, at least 2: common seeds {seeds}")
    means = {s: [found[s][seed]["mean"] for seed in seeds] for s in found}
    metric = next(iter(found[reference].values()))["metric"]
    lower = not str(metric).endswith("accuracy")
    others = {s: means[s] for s in found if s != reference}
    rows = stats.versus_reference(others, means[reference], margin=margin, log=lower, lower_is_better=lower)
    return {"reference": reference, "search_seeds": seeds, "metric": metric, "margin": margin,
            "means": means, "comparisons": rows, "validation_seeds": seed_use(found),
            "searches": {s: {str(seed): found[s][seed] for seed in sorted(found[s])} for s in found}}


def seed_use(found: dict[str, dict[int, dict]]) -> dict:
    """Which validation seeds served which search seeds: ``{"by_search_seed": search seed -> its
    validation seeds, "shared": validation seed -> the search seeds it served (only those that
    served more than one), "disjoint": no shared seed}``."""
    by_search: dict[int, set] = {}
    for searches in found.values():
        for search_seed, row in searches.items():
            by_search.setdefault(search_seed, set()).update(row.get("seeds") or [])
    served: dict[int, list] = {}
    for search_seed, seeds in sorted(by_search.items()):
        for seed in seeds:
            served.setdefault(seed, []).append(search_seed)
    shared = {str(seed): units for seed, units in sorted(served.items()) if len(units) > 1}
    return {"by_search_seed": {str(k): sorted(v) for k, v in sorted(by_search.items())}, "shared": shared,
            "disjoint": not shared}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="the folder holding STRATEGY-SEED run folders")
    parser.add_argument("--out", required=True)
    parser.add_argument("--reference", default="random")
    parser.add_argument("--margin", type=float, default=0.01, help="equivalence margin, relative (default 0.01)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"strategies: {root} is not a folder of searches", file=sys.stderr)
        return 1
    result = compare(collect(root), args.reference, args.margin)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    shared = result["validation_seeds"]["shared"]
    if shared:
        print(f"warning: {len(shared)} validation seed(s) served several search seeds (e.g. seed "
              f"{next(iter(shared))}: search seeds {next(iter(shared.values()))}); the searches are not independent "
              "units: validate each with --seed-block run", file=sys.stderr)
    for name, row in result["comparisons"].items():
        if row.get("relative") is not None:  # a log scale: the relative change
            change = (f"{100 * row['relative']:+.2f}% [{100 * row['relative_ci_low']:+.2f}, "
                      f"{100 * row['relative_ci_high']:+.2f}]")
        else:  # accuracy: the difference in its units
            change = f"{row['difference']:+.4f} [{row['diff_ci_low']:+.4f}, {row['diff_ci_high']:+.4f}]"
        print(f"{name} vs {args.reference}: {change}, Holm p {row['p_holm']:.3g}: {row['verdict_label']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
