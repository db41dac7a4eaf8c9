"""Study 3's D3 (docs/findings.md): how often program searches from random starts find known
ingredients of attention, and at what budget.

    python benchmarks/rediscovery.py RUN_DIR [RUN_DIR ...] --out rediscovery.json [--reference random]
        [--describe RUN_DIR ...]

Reads each search's ``final_results.json`` (its strategy, its top 5, the best gene of every
generation) and ``evaluations.csv`` (every evaluation in order). The positional searches are the
compared ones (one budget, one row per strategy); a ``--describe`` search (another budget, such as
D1's) is reported on its own and enters no count or test, and may lack ``evaluations.csv`` (then
its evaluation budget and generation-0 draws are unknown: null). A program **holds** a feature when
one of the feature's ops appears in it (an op is a name followed by "("):

- the output gate: ``sgate`` or ``g.output_gate`` (gated attention, Qiu et al. 2025);
- the squared ReLU: ``sqrelu`` (Primer);
- a depthwise convolution: ``dconv2``, ``dconv3`` or ``dconv4`` (Primer's multi-DConv-head attention).

A search **finds** a feature when its winner (rank 1 of its top table) holds it; beside it, whether
any of its top 5 does. Its budget: the number of distinct genes evaluated, in order, until the first
that holds the feature, and the first generation whose running best (by the search's fitness) holds
it. The base rate: the share of generation-0 programs (random draws) that hold it. Per strategy the
counts with exact intervals (``stats.solve_rate``); each other strategy against ``--reference`` by
Fisher's exact test with Holm over the features (``stats.solve_rates_versus``), Barnard's beside it.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

from evo_attention.util import stats

FEATURES = {"output gate": {"sgate", "g.output_gate"}, "squared ReLU": {"sqrelu"},
            "depthwise convolution": {"dconv2", "dconv3", "dconv4"}}
OP = re.compile(r"([A-Za-z_][\w.]*)\(")
WORDS = {"solves more often": "rediscovered more often", "solves less often": "rediscovered less often",
         "undetermined": "no difference shown"}


def ops(gene: str) -> set[str]:
    program = gene.split("prog=", 1)[1].split("|", 1)[0] if "prog=" in gene else ""
    return set(OP.findall(program))


def holds(gene: str, feature: str) -> bool:
    return bool(ops(gene) & FEATURES[feature])


def search(run: Path, need_evaluations: bool = True) -> dict:
    if not (run / "final_results.json").is_file():
        raise SystemExit(f"rediscovery: {run / 'final_results.json'} is missing: pass the folder of a finished search")
    final = json.loads((run / "final_results.json").read_text())
    recorded = (run / "evaluations.csv").is_file()
    if not recorded and need_evaluations:
        raise SystemExit(f"rediscovery: {run / 'evaluations.csv'} is missing: a compared search needs every "
                         "evaluation (pass a search without it with --describe)")
    rows = []
    if recorded:
        with open(run / "evaluations.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("role") == "search"]
    order, generation0 = [], []
    for row in sorted(rows, key=lambda r: int(r["id"])):
        if row["gene"] not in order:
            order.append(row["gene"])
            if row.get("generation") == "0":
                generation0.append(row["gene"])
    top = [g["gene"] for g in final.get("top_5") or []]
    suite = final.get("suite") is not None or any("suite_accuracy" in g for g in final.get("top_5") or [])
    running, best = [], None
    for gen in final.get("history") or []:
        value = gen.get("best_suite_accuracy") if suite else gen.get("best_perplexity")
        if value is not None and (best is None or (value > best[0] if suite else value < best[0])):
            best = (value, gen.get("best_gene"))
        running.append(None if best is None else best[1])
    strategy = final.get("strategy")
    out = {"run": str(run), "strategy": strategy.get("name") if isinstance(strategy, dict) else strategy, "seed": (final.get("config") or {}).get("seed"),
           "winner": top[0] if top else None, "top_5": top, "evaluated": len(order) if recorded else None,
           "generation0": len(generation0) if recorded else None, "evaluations_recorded": recorded,
           "features": {}}
    for feature in FEATURES:
        first = next((i + 1 for i, g in enumerate(order) if holds(g, feature)), None)
        first_best = next((i for i, g in enumerate(running) if g and holds(g, feature)), None)
        out["features"][feature] = {
            "found": bool(top) and holds(top[0], feature), "in_top_5": any(holds(g, feature) for g in top),
            "first_evaluation": first, "first_generation_best": first_best,
            "generation0_holding": sum(holds(g, feature) for g in generation0) if recorded else None}
    return out


def summarise(searches: list[dict], reference: str) -> dict:
    by_strategy: dict[str, list] = {}
    for s in searches:
        by_strategy.setdefault(str(s["strategy"]), []).append(s)
    summary = {}
    for strategy, runs in by_strategy.items():
        rows = {}
        for feature in FEATURES:
            found = sum(r["features"][feature]["found"] for r in runs)
            firsts = [r["features"][feature]["first_evaluation"] for r in runs
                      if r["features"][feature]["first_evaluation"] is not None]
            drawn = sum(r["generation0"] for r in runs)
            rows[feature] = {**stats.solve_rate(found, len(runs)),
                             "in_top_5": sum(r["features"][feature]["in_top_5"] for r in runs),
                             "first_evaluation_median": statistics.median(firsts) if firsts else None,
                             "first_evaluation_range": [min(firsts), max(firsts)] if firsts else None,
                             "base_rate": (sum(r["features"][feature]["generation0_holding"] for r in runs) / drawn
                                           if drawn else None)}
        summary[strategy] = rows
    comparisons = {}
    if reference in summary:
        ref = {f: (summary[reference][f]["solved"], summary[reference][f]["n"]) for f in FEATURES}
        for strategy in summary:
            if strategy == reference:
                continue
            counts = {f: (summary[strategy][f]["solved"], summary[strategy][f]["n"]) for f in FEATURES}
            fisher = stats.solve_rates_versus(counts, ref, test="fisher")
            barnard = stats.solve_rates_versus(counts, ref, test="barnard")
            comparisons[strategy] = {f: {**fisher[f], "p_barnard_holm": barnard[f].get("p_holm"),
                                         "words": WORDS.get(fisher[f]["verdict"], fisher[f]["verdict"])}
                                     for f in FEATURES}
    return {"features": {f: sorted(o) for f, o in FEATURES.items()}, "reference": reference,
            "strategies": summary, "comparisons": comparisons}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--reference", default="random")
    p.add_argument("--out", required=True)
    p.add_argument("--describe", nargs="+", default=[], metavar="RUN_DIR",
                   help="searches reported on their own: in no count or test (another budget)")
    args = p.parse_args(argv)
    searches = [search(Path(r)) for r in args.runs]
    described = [search(Path(r), need_evaluations=False) for r in args.describe]
    out = {"searches": searches, **summarise(searches, args.reference), "described": described}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    for strategy, rows in out["strategies"].items():
        print(strategy + ": " + "; ".join(f"{f} {r['solved']}/{r['n']}" for f, r in rows.items()))
    for run in described:
        print(f"{run['run']} (described): winner holds " +
              (", ".join(f for f, r in run["features"].items() if r["found"]) or "none of the features"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
