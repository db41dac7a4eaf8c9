"""Study 3's corrections of 2026-11-29, recomputed from its committed result files in docs/findings3.

    python benchmarks/study3_checks.py --json docs/findings3/corrections.json

(a) D4: the per-seed log change of the gate against its matched model, differenced between cells;
(b) D2: the spread of the GA-minus-random differences and the share of it the fresh seeds explain;
(c) the programs D2's twenty searches and D1's search scored, each search's best against its vanilla gene;
(d) D1: the interval of the third program against its matched model at 96x2 on WikiText-2.
Nothing is trained; each quantity in the JSON names its files and says what it is.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from evo_attention.studies.results import matched_pair
from evo_attention.util import stats

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "docs" / "findings3"
COMMAND = "python benchmarks/study3_checks.py --json docs/findings3/corrections.json"


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def rel(path: Path) -> str:  # a path as the docs give it
    return str(path.relative_to(REPO))


def var(values) -> float:  # the sample variance
    return stats.describe(values)["sd"] ** 2


def d4_steps() -> dict:
    cells = ("tpp2", "tpp6", "tpp12")
    paths = [STUDY / "d4" / cell / "validation_test.json" for cell in cells]
    per_seed = {}
    for cell, path in zip(cells, paths):
        result = read(path)
        gate = result["genes"][0]
        pair = matched_pair(result, gate["gene"], rel(path))
        assert pair["seeds"] == gate["seeds"], path
        r = stats.paired(pair["values"], pair["matched_values"], log=True, bootstrap_resamples=0)
        assert abs(r["difference"] - gate["difference"]) < 1e-12
        per_seed[cell] = dict(zip(pair["seeds"], r["differences"]))
    steps = {}
    for a, b in (("tpp2", "tpp6"), ("tpp6", "tpp12"), ("tpp2", "tpp12")):
        change = [per_seed[b][seed] - per_seed[a][seed] for seed in per_seed[a]]
        test = stats.sign_flip(change)
        steps[f"{a} -> {b}"] = {"mean_change": float(np.mean(change)), "seeds_up": sum(c > 0 for c in change),
                                "n": test["n"], "p_exact": test["p_value"], "per_seed": change}
    return {"description": "per seed, log(gate test perplexity) - log(its matched model's), differenced "
                           "between cells (b minus a); p: exact two-sided sign-flip (stats.sign_flip)",
            "files": [rel(p) for p in paths],
            "cell_mean_log_change": {cell: float(np.mean(list(d.values()))) for cell, d in per_seed.items()},
            "steps": steps}


def d2_spread() -> dict:
    path = STUDY / "d2" / "strategies.json"
    result = read(path)
    searches = result["searches"]
    pairs = [(searches["ga"][str(s)], searches["random"][str(s)]) for s in result["search_seeds"]]
    assert all(g["seeds"] == r["seeds"] for g, r in pairs)
    spread = stats.describe([g["mean"] - r["mean"] for g, r in pairs])
    variance = spread["sd"] ** 2
    noise = float(np.mean([var(g["values"]) / len(g["values"]) + var(r["values"]) / len(r["values"])
                           for g, r in pairs]))
    noise_paired = float(np.mean([var(np.subtract(g["values"], r["values"])) / len(g["values"]) for g, r in pairs]))
    ga, rnd = [g["mean"] for g, _ in pairs], [r["mean"] for _, r in pairs]  # the winners' fresh-seed means
    return {"description": "sd and variance of the 10 GA-minus-random differences of the winners' fresh-seed means; "
                           "noise: mean over pairs of var(ga values)/3 + var(random values)/3 (paired: var of the "
                           "per-seed differences / 3), and its share of that variance; the winners' means",
            "files": [rel(path)], "n_pairs": spread["n"], "sd_diff": spread["sd"],
            "sd_diff_in_file": result["comparisons"]["ga"]["sd_diff"], "variance": variance,
            "noise_variance": noise, "noise_share": noise / variance,
            "noise_variance_paired": noise_paired, "noise_share_paired": noise_paired / variance,
            "winner_means": {"all": [min(ga + rnd), max(ga + rnd)], "ga": [min(ga), max(ga)],
                             "random": [min(rnd), max(rnd)]}}


def d2_search(run: Path) -> tuple[dict, set]:
    """One D2 search: its programs (role search in evaluations.csv, one row per suite point), its best
    program's suite accuracy (the mean over the points) and the vanilla gene's, both on the search seed."""
    final = read(run / "final_results.json")
    points = len(final["suite"]["points"])
    accuracy: dict[str, list[float]] = {}
    with open(run / "evaluations.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["role"] == "search":  # a failed point scores 0 (train.suite.FAILED_ACCURACY)
                accuracy.setdefault(row["gene"], []).append(float(row["accuracy"]) if row["status"] == "ok" else 0.0)
    assert all(len(v) == points for v in accuracy.values()), run
    best = max(float(np.mean(v)) for v in accuracy.values())
    assert abs(best - final["top_5"][0]["suite_accuracy"]) < 1e-9, run
    return {"programs": len(accuracy), "answered_by_equivalent": final["counts"].get("equivalent", 0) // points,
            "best": best, "vanilla": final["baseline"]["suite_accuracy"]}, set(accuracy)


def programs() -> dict:
    rows, genes = {}, set()
    for run in sorted((STUDY / "d2").glob("*-*"), key=lambda p: (p.name.split("-")[0], int(p.name.split("-")[1]))):
        rows[f"d2 {run.name}"], found = d2_search(run)
        genes |= found
    final = read(STUDY / "d1-search" / "final_results.json")
    points = len(final["suite"]["points"])
    rows["d1"] = {"programs": final["counts"]["by_role"]["search"] // points,
                  "answered_by_equivalent": final["counts"].get("equivalent", 0) // points,
                  "best": final["top_5"][0]["suite_accuracy"], "vanilla": final["baseline"]["suite_accuracy"]}
    for row in rows.values():
        row["trained"] = row["programs"] - row["answered_by_equivalent"]
        row["gap"] = row["vanilla"] - row["best"]
    d2 = [row for name, row in rows.items() if name.startswith("d2")]
    closest = min((name for name in rows if name.startswith("d2")), key=lambda name: rows[name]["gap"])
    return {"description": "programs scored per search (distinct role-search genes, 7 suite points each; D1 from "
                           "counts.by_role.search / 7), those answered by an equivalent program's training "
                           "(counts.equivalent / 7) and trained; best program and the vanilla gene on the search seed",
            "files": ["docs/findings3/d2/*/evaluations.csv", "docs/findings3/d2/*/final_results.json",
                      rel(STUDY / "d1-search" / "final_results.json")],
            "d2_programs": sum(r["programs"] for r in d2), "d2_distinct": len(genes),
            "d2_answered_by_equivalent": sum(r["answered_by_equivalent"] for r in d2),
            "d2_trained": sum(r["trained"] for r in d2), "d1_programs": rows["d1"]["programs"],
            "d1_answered_by_equivalent": rows["d1"]["answered_by_equivalent"], "d1_trained": rows["d1"]["trained"],
            "any_at_or_above_vanilla": any(r["best"] >= r["vanilla"] for r in rows.values()),
            "closest_d2": {"search": closest, **rows[closest]}, "searches": rows}


def d1_interval() -> dict:
    path = STUDY / "d1-wikitext" / "96x2" / "validation_test.json"
    result = read(path)
    gene = result["genes"][2]  # D1's third program
    pair = matched_pair(result, gene["gene"], rel(path))
    assert pair["seeds"] == gene["seeds"], path
    r = stats.paired(pair["values"], pair["matched_values"], log=True)
    assert abs(r["diff_ci_low"] - gene["diff_ci_low"]) < 1e-12 and gene["boot_ci_low"] is None
    return {"description": "D1's third program against its matched model, test perplexity at 96x2 on WikiText-2: "
                           "the t interval of stats.paired (no bootstrap interval below BOOTSTRAP_MIN pairs)",
            "files": [rel(path)], "gene": gene["gene"], "n_pairs": r["n"], "bootstrap_min": stats.BOOTSTRAP_MIN,
            "boot_ci": [r["boot_ci_low"], r["boot_ci_high"]], "relative": r["relative"],
            "relative_t_ci": [r["relative_ci_low"], r["relative_ci_high"]], "p_exact": r["p_exact"],
            "p_holm_in_file": gene["p_holm"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, type=Path, help="the JSON file to write")
    args = parser.parse_args()
    out = {"command": COMMAND, "d4_steps": d4_steps(), "d2_spread": d2_spread(), "programs": programs(),
           "d1_interval": d1_interval()}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
