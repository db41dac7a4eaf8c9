"""Verdicts computed from result files, training nothing: what a study's computed stages read from
earlier ones (versus, family and trend, strategies, rediscovery, reliability, a tuning stage's rate)
and a run store's machine time per role. Every test is ``util.stats``'s; a file that does not fit is
refused with one line (UserError).
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from datetime import datetime
from pathlib import Path

from evo_attention.genes import AttentionGene
from evo_attention.programs import TIME_OPS
from evo_attention.report.studies.common import lower_is_better
from evo_attention.util import stats
from evo_attention.util.errors import UserError


def _by_seed(gene: dict) -> dict:
    return {s: v for s, v in zip(gene["seeds"], gene["values"]) if v is not None}


def _find_gene(genes: list, gene: str):
    """The row of ``gene`` by its key, or by its key with recipe parts (``GENE|lr=R``)."""
    return (next((g for g in genes if g["gene"] == gene), None)
            or next((g for g in genes if g["gene"].startswith(gene + "|lr=")), None))


def _scale(payload: dict) -> dict:
    """How a result file's metric compares: its direction (lower is better unless the file says not) and
    its scale (log for a lower-is-better metric other than the loss; accuracy and the loss in units)."""
    lower = bool(payload.get("lower_is_better", True))
    return {"metric": payload.get("metric"), "lower_is_better": lower,
            "log": lower and payload.get("metric") not in ("val_loss",)}


def versus(first: dict, second: dict, reference: str, margin: float) -> dict:
    """Each gene of ``first`` against ``reference``, a gene of ``second``, paired by seed: the tool's
    rule (``stats.versus_reference``: the exact sign-flip test below 12 pairs, TOST at the margin,
    Holm over the genes of the first file), on the raw scale for accuracy, on the log scale otherwise."""
    if any(first["baseline"][k] != second["baseline"][k] for k in ("seeds", "values")):
        raise UserError("the two files do not share their baseline trainings (seeds and values differ): they are "
                        "not paired")
    ref = _find_gene(second["genes"], reference)
    if ref is None:
        raise UserError(f"{reference} is not a gene of the reference file")
    ref_values = _by_seed(ref)
    genes = [g for g in first["genes"] if g["gene"] != ref["gene"]]
    seeds = sorted(set(ref_values).intersection(*(_by_seed(g) for g in genes)))
    lower, log = (scale := _scale(first))["lower_is_better"], scale["log"]
    rows = stats.versus_reference({g["gene"]: [_by_seed(g)[s] for s in seeds] for g in genes},
                                  [ref_values[s] for s in seeds], margin=margin, log=log, lower_is_better=lower)
    # the metric as the files name it ("val_perplexity" names the metric whatever split was scored)
    return {"reference": reference, "metric": first.get("metric"), "metric_label": first.get("metric_label"),
            "eval_split": first.get("eval_split"), "log": log, "margin": margin, "seeds": seeds,
            "reference_values": [ref_values[s] for s in seeds],
            "genes": {g["gene"]: {"values": [_by_seed(g)[s] for s in seeds], **rows[g["gene"]]} for g in genes}}


def matched_pair(payload: dict, gene: str, where: str, against: str = "matched") -> dict:
    """``{"gene", "seeds", "values", "matched_values", "d_ff"}`` of ``gene`` in a validation and the
    model it is judged against: its parameter-matched model (``validate --match-params``) or the
    baseline (``against="baseline"``)."""
    row = _find_gene(payload["genes"], gene)
    if row is None:
        raise UserError(f"{where}: no gene {gene}")
    if against == "baseline":
        other = payload["baseline"]
    else:
        other = next((m for m in payload.get("matched_baselines") or [] if row["gene"] in m.get("matched_to", [])),
                     None)
        if other is None:
            raise UserError(f"{where}: no parameter-matched baseline for {row['gene']} (was it run with "
                            "--match-params?)")
    own, base = dict(zip(row["seeds"], row["values"])), dict(zip(other["seeds"], other["values"]))
    seeds = [s for s in row["seeds"] if own.get(s) is not None and base.get(s) is not None]
    return {"gene": row["gene"], "seeds": seeds, "values": [own[s] for s in seeds],
            "matched_values": [base[s] for s in seeds], "d_ff": other.get("d_ff"), **_scale(payload)}


def _cells_scale(cells: dict[str, dict]) -> dict:
    """The one metric, direction and scale of a family's cells (``matched_pair``'s)."""
    scales = {name: _scale(c) for name, c in cells.items()}
    if len({tuple(v.values()) for v in scales.values()}) > 1:
        raise UserError("the family's cells differ in metric or direction: "
                        + ", ".join(f"{n} {v['metric']} ({'lower' if v['lower_is_better'] else 'higher'} is better)"
                                    for n, v in scales.items()))
    return next(iter(scales.values()), _scale({}))


def family(cells: dict[str, dict], margin: float) -> dict:
    """Each cell's pair re-tested on its metric's scale (log or units, as ``versus``) with the other cells
    as the rest of its family: every p is Holm-corrected over all the cells."""
    scale, out = _cells_scale(cells), {}
    for name, cell in cells.items():
        others = {other: {"values": c["values"], "reference": c["matched_values"]}
                  for other, c in cells.items() if other != name}
        row = stats.versus_reference({name: cell["values"]}, cell["matched_values"], margin=margin, log=scale["log"],
                                     lower_is_better=scale["lower_is_better"], others=others)[name]
        out[name] = {**cell, **row}
    return out


ABOVE, BELOW = "above", "below"  # a rediscovery rate's side of its bar (else undetermined)
BASELINE_ITSELF = "the baseline itself"  # the verdict of a winner that is the baseline gene
TREND_WORDS = {"grows": "the gene's advantage grows with tokens per parameter",
               "shrinks": "the gene's advantage shrinks with tokens per parameter", "none": "no trend shown"}


def trend(cells: dict[str, dict], levels: dict[str, float], alpha: float = 0.05) -> dict:
    """Per seed shared by the cells, the least-squares slope of the difference (gene minus matched, of
    logs on a log-scale metric: ``family``'s scale) on log2 of the level; the mean slope against 0 by
    the exact sign-flip test (two-sided, a family of its own), the one-sample t-test beside it. The
    advantage grows where the slope points the better way (negative where lower is better)."""
    import numpy as np
    from scipy import stats as scipy_stats

    scale = _cells_scale({c: cells[c] for c in levels})
    f = math.log if scale["log"] else float
    seeds = sorted(set.intersection(*(set(cells[c]["seeds"]) for c in levels)))
    x = np.log2([levels[c] for c in levels])
    slopes = []
    for seed in seeds:
        d = [f(dict(zip(cells[c]["seeds"], cells[c]["values"]))[seed])
             - f(dict(zip(cells[c]["seeds"], cells[c]["matched_values"]))[seed]) for c in levels]
        slopes.append(float(np.polyfit(x, d, 1)[0]))
    exact = stats.sign_flip(slopes)
    t = scipy_stats.ttest_1samp(slopes, 0.0) if len(slopes) > 1 else None
    mean = float(np.mean(slopes)) if slopes else None
    out = {"cells": levels, "seeds": seeds, "slopes": slopes, "mean_slope": mean, "p_exact": exact["p_value"],
           "smallest_p": exact["smallest_p"], "p_t": None if t is None else float(t.pvalue), **scale}
    return {**out, "words": TREND_WORDS[trend_verdict(out, alpha)]}


def trend_verdict(t: dict, alpha: float = 0.05) -> str:
    """``grows``, ``shrinks`` or ``none``: the registered reading of a trend's mean slope and exact p (a
    trend without ``lower_is_better`` is of a lower-is-better metric)."""
    p, mean = t.get("p_exact"), t.get("mean_slope")
    if p is None or mean is None or p >= alpha or mean == 0:
        return "none"
    return "grows" if (mean < 0) == t.get("lower_is_better", True) else "shrinks"


_SEARCH = re.compile(r"^(?P<strategy>[a-z0-9_]+)-(?P<seed>\d+)$")


def collect_strategies(root: Path) -> dict[str, dict[int, dict]]:
    """strategy -> search seed -> that search's validated winner (``ROOT/STRATEGY-SEED/validation*.json``:
    ``validate --from-run --top 1`` of each search)."""
    found: dict[str, dict[int, dict]] = {}
    for path in sorted([*Path(root).glob("*/validation.json"), *Path(root).glob("*/validation_suite.json")]):
        match = _SEARCH.match(path.parent.name)
        if not match:
            continue
        payload = json.loads(path.read_text())
        genes = payload.get("genes") or []
        if not genes:
            raise UserError(f"{path}: no validated gene (was it validated with --top 1?)")
        winner = genes[0]
        if int(match["seed"]) in found.get(match["strategy"], {}):
            raise UserError(f"{path.parent}: a validation and a suite validation of one search: keep one")
        found.setdefault(match["strategy"], {})[int(match["seed"])] = {
            "gene": winner["gene"], "search_value": winner.get("search_value"), "seeds": winner.get("seeds"),
            "values": winner.get("values"), "mean": winner.get("mean"),
            "baseline_mean": (payload.get("baseline") or {}).get("mean"), "verdict_vs_baseline": winner.get("verdict"),
            "metric": payload.get("metric"), "file": str(path)}
    return found


def compare_strategies(found: dict[str, dict[int, dict]], reference: str, margin: float) -> dict:
    """Each strategy against ``reference``, paired by search seed (a strategy's value: its winner's
    mean over its fresh seeds), on the log scale for a loss, in units for accuracy."""
    if reference not in found:
        raise UserError(f"no searches of the reference strategy {reference!r}: found "
                        f"{', '.join(sorted(found)) or 'none'}")
    seeds = sorted(set.intersection(*(set(v) for v in found.values())))
    if len(seeds) < 2:
        raise UserError(f"every strategy needs the same search seeds, at least 2: common seeds {seeds}")
    means = {s: [found[s][seed]["mean"] for seed in seeds] for s in found}
    metric = next(iter(found[reference].values()))["metric"]
    lower = lower_is_better(metric)
    others = {s: means[s] for s in found if s != reference}
    rows = stats.versus_reference(others, means[reference], margin=margin, log=lower, lower_is_better=lower)
    return {"reference": reference, "analysis": stats.ANALYSIS, "search_seeds": seeds, "metric": metric,
            "margin": margin, "means": means, "comparisons": rows, "validation_seeds": seed_use(found),
            "searches": {s: {str(seed): found[s][seed] for seed in sorted(found[s])} for s in found}}


def seed_use(found: dict[str, dict[int, dict]]) -> dict:
    """Which validation seeds served which search seeds: ``{"by_search_seed", "shared" (the seeds
    that served more than one), "disjoint"}``: searches are independent units only when disjoint."""
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


# a program holds a feature when one of the feature's ops appears in it (an op: a name before "(")
FEATURES = {"output gate": {"sgate", "g.output_gate"}, "squared ReLU": {"sqrelu"},
            "depthwise convolution": {"dconv2", "dconv3", "dconv4"},
            "token mixing": set(TIME_OPS)}  # the ops of the program edit "time"
TESTED = ("output gate", "squared ReLU", "depthwise convolution")  # a rediscovery stage's default family
_OP = re.compile(r"([A-Za-z_][\w.]*)\(")
REDISCOVERY_WORDS = {stats.SOLVED_MORE: "rediscovered more often", stats.SOLVED_LESS: "rediscovered less often",
                     stats.UNDETERMINED: "no difference shown"}


def ops(gene: str) -> set[str]:
    program = gene.split("prog=", 1)[1].split("|", 1)[0] if "prog=" in gene else ""
    return set(_OP.findall(program))


def holds(gene: str, feature: str) -> bool:
    return bool(ops(gene) & FEATURES[feature])


def search_features(run: Path, need_evaluations: bool = True) -> dict:
    """One search's winner, top 5 and, per feature: found (its winner holds it), in its top 5, the
    evaluations until the first program holding it, the first generation whose running best holds
    it, and how many generation-0 programs hold it (from ``final_results.json`` and ``evaluations.csv``;
    without the latter its budget and generation 0 are unknown: None)."""
    run = Path(run)
    if not (run / "final_results.json").is_file():
        raise UserError(f"{run / 'final_results.json'} is missing: name the folder of a finished search")
    final = json.loads((run / "final_results.json").read_text())
    recorded = (run / "evaluations.csv").is_file()
    if not recorded and need_evaluations:
        raise UserError(f"{run / 'evaluations.csv'} is missing: a compared search needs every evaluation (describe "
                        "a search without it)")
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
    out = {"run": str(run), "strategy": strategy.get("name") if isinstance(strategy, dict) else strategy,
           "seed": (final.get("config") or {}).get("seed"), "winner": top[0] if top else None, "top_5": top,
           "evaluated": len(order) if recorded else None, "generation0": len(generation0) if recorded else None,
           "evaluations_recorded": recorded, "features": {}}
    out["validated"] = _validated(run, out["winner"])
    for feature in FEATURES:
        first = next((i + 1 for i, g in enumerate(order) if holds(g, feature)), None)
        first_best = next((i for i, g in enumerate(running) if g and holds(g, feature)), None)
        out["features"][feature] = {
            "found": bool(top) and holds(top[0], feature), "in_top_5": any(holds(g, feature) for g in top),
            "first_evaluation": first, "first_generation_best": first_best,
            "generation0_holding": sum(holds(g, feature) for g in generation0) if recorded else None}
    return out


def _validated(run: Path, winner: str | None) -> dict | None:
    """The winner's row of the validation beside its search (``validate --from-run``: ``validation.json``
    or ``validation_suite.json`` in the run's folder): its verdict (against its parameter-matched model
    where the validation matched parameters), relative change and fresh-seed values; None without one."""
    for name in ("validation.json", "validation_suite.json"):
        if (run / name).is_file() and winner is not None:
            payload = json.loads((run / name).read_text())
            row = next((g for g in payload.get("genes") or [] if g["gene"].split("|lr=")[0] == winner), None)
            if row is None and winner not in (AttentionGene.vanilla().key, (payload.get("baseline") or {}).get("gene")):
                raise UserError(f"{run / name} does not validate the search's winner {winner}: validate it with "
                                "--from-run and --top 1")
            row = row or {"verdict": BASELINE_ITSELF}  # the baseline gene: validate leaves it out
            return {"verdict": row.get("verdict"), "relative": row.get("relative"),
                    "difference": row.get("difference"), "values": row.get("values"),
                    "against": (row.get("versus") or {}).get("baseline", "baseline"), "metric": payload.get("metric"),
                    "file": name}
    return None


def _facts(search: dict, solve_at: float | None) -> dict[str, bool]:
    """What a rule may ask of one search: ``holds FEATURE``, ``validated better``, ``solves`` (every
    fresh-seed value of its validated winner at or above ``solve_at``)."""
    v = search.get("validated") or {}
    values = [x for x in v.get("values") or [] if x is not None]
    facts = {f"holds {f}": row["found"] for f, row in search["features"].items()}
    facts["validated better"] = v.get("verdict") == "better"
    facts["solves"] = solve_at is not None and bool(values) and min(values) >= solve_at
    return facts


def check_rule(rule, bar) -> None:
    """A rediscovery rule: a list of alternatives, each a list of facts (``_facts``), and its bar in (0, 1)."""
    known = {f"holds {f}" for f in FEATURES} | {"validated better", "solves"}
    if not (isinstance(rule, list) and rule and all(isinstance(a, list) and a for a in rule)):
        raise UserError("rediscovered_if is a list of alternatives, each a list of facts, e.g. "
                        "[[holds output gate], [validated better]]")
    for fact in (f for a in rule for f in a):
        if fact not in known:
            raise UserError(f"rediscovered_if: {fact!r} is not a fact: use one of {', '.join(sorted(known))}")
    if not isinstance(bar, (int, float)) or isinstance(bar, bool) or not 0 < bar < 1:
        raise UserError(f"bar {bar!r} is not a rate between 0 and 1: give the registered rate to beat, e.g. 0.5")


def rediscovered(searches: list[dict], rule: list, bar: float, solve_at: float | None = None) -> dict:
    """Per strategy: the searches for which one alternative of ``rule`` holds in full, the count with
    its exact interval and the verdict against ``bar``: ``above`` when the interval lies above it,
    ``below`` when it lies below, else ``undetermined``. Each search dict gains ``rediscovered`` (its
    row of the written file says whether it counts)."""
    check_rule(rule, bar)
    out = {}
    for s in searches:
        facts = _facts(s, solve_at)
        s["rediscovered"] = any(all(facts[f] for f in alt) for alt in rule)
        out.setdefault(str(s["strategy"]), []).append(s["rediscovered"])
    rates = {strategy: stats.solve_rate(sum(hits), len(hits)) for strategy, hits in out.items()}
    for r in rates.values():
        r["verdict"] = ABOVE if r["ci_low"] > bar else BELOW if r["ci_high"] < bar else stats.UNDETERMINED
    return {"rule": rule, "bar": bar, "solve_at": solve_at, "rates": rates}


def reliability(payloads: list[dict], confidence: float = 0.95) -> dict:
    """Per validation of a search's top genes (``validate --from-run --top K``): Spearman's rank
    correlation of the genes' search scores and their fresh-seed means (positive: the search ranked
    them as fresh seeds do); pooled as the mean over searches with its t interval (searches are the
    units). A search with fewer than 3 scored genes, or ties throughout, has no correlation."""
    from scipy.stats import spearmanr

    rows = []
    for p in payloads:
        pairs = [(g["search_value"], g["mean"]) for g in p.get("genes") or []
                 if g.get("search_value") is not None and g.get("mean") is not None]
        search, fresh = [a for a, _ in pairs], [b for _, b in pairs]
        varied = len(pairs) >= 3 and len(set(search)) > 1 and len(set(fresh)) > 1
        rows.append({"run": p.get("source_run"), "search_seed": p.get("search_seed"), "genes": len(pairs),
                     "rho": float(spearmanr(search, fresh).statistic) if varied else None, "search": search,
                     "fresh": fresh})
    pooled = stats.describe([r["rho"] for r in rows if r["rho"] is not None], confidence)
    if pooled["ci_low"] is not None:  # a t interval may pass the bounds of a correlation: cut at them
        pooled["ci_low"], pooled["ci_high"] = max(pooled["ci_low"], -1.0), min(pooled["ci_high"], 1.0)
    return {"searches": rows, "pooled": pooled, "confidence": confidence,
            "note": "the mean of the per-search Spearman correlations, with the t interval over searches (an "
                    "approximation: cut at -1 and 1)"}


def rediscovery(searches: list[dict], reference: str, features=TESTED) -> dict:
    """Per strategy and feature (of ``features``) the searches whose winner holds it
    (``stats.solve_rate``), in the top 5, the evaluations until the first holding it and the base
    rate of generation 0; each other strategy against ``reference`` by Fisher's exact test, Holm over
    the features, Barnard's beside."""
    unknown = [f for f in features if f not in FEATURES]
    if unknown or not features:
        raise UserError(f"rediscovery features {unknown or features}: use some of {', '.join(FEATURES)}")
    tested = {f: FEATURES[f] for f in features}
    by_strategy: dict[str, list] = {}
    for s in searches:
        by_strategy.setdefault(str(s["strategy"]), []).append(s)
    summary = {}
    for strategy, runs in by_strategy.items():
        summary[strategy] = rows = {}
        drawn = sum(r["generation0"] for r in runs)
        for feature in tested:
            each = [r["features"][feature] for r in runs]
            firsts = [e["first_evaluation"] for e in each if e["first_evaluation"] is not None]
            rows[feature] = {**stats.solve_rate(sum(e["found"] for e in each), len(runs)),
                             "in_top_5": sum(e["in_top_5"] for e in each),
                             "first_evaluation_median": statistics.median(firsts) if firsts else None,
                             "first_evaluation_range": [min(firsts), max(firsts)] if firsts else None,
                             "base_rate": sum(e["generation0_holding"] for e in each) / drawn if drawn else None}

    def counts(strategy: str) -> dict:
        return {f: (summary[strategy][f]["solved"], summary[strategy][f]["n"]) for f in tested}

    comparisons = {}
    for strategy in [s for s in summary if s != reference] if reference in summary else []:
        fisher = stats.solve_rates_versus(counts(strategy), counts(reference), test="fisher")
        barnard = stats.solve_rates_versus(counts(strategy), counts(reference), test="barnard")
        comparisons[strategy] = {f: {**fisher[f], "p_barnard_holm": barnard[f].get("p_holm"),
                                     "words": REDISCOVERY_WORDS.get(fisher[f]["verdict"], fisher[f]["verdict"])}
                                 for f in tested}
    return {"features": {f: sorted(o) for f, o in tested.items()}, "reference": reference,
            "strategies": summary, "comparisons": comparisons}


def select_rate(means: dict[str, float], lower_is_better: bool) -> dict:
    """The rate of a grid (its rates in order, as written) with the baseline's best mean, ties to the
    smaller rate; ``at_edge``: it is the grid's first or last (the edge rule)."""
    rates = list(means)
    if any(means[r] is None for r in rates):
        raise UserError(f"the baseline has no mean at rate {next(r for r in rates if means[r] is None)}: no rate "
                        "can be selected")
    sign = 1 if lower_is_better else -1
    best = min(rates, key=lambda r: (sign * means[r], float(r)))
    return {"rates": rates, "baseline_mean": means, "selected": best, "at_edge": best in (rates[0], rates[-1])}


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def store_times(records: list, gap_s: float) -> dict:
    """Per role of a store's records (each with ``role``, ``created_at``, ``time_s``): how many
    trainings, the first and last stored, the gaps longer than ``gap_s`` in which none was stored, and
    the summed time of their trainings."""
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
    """One row per training, in the order stored: its role, generation, gene, times, milliseconds per
    step, device, precision, CUDA graph, status and validation loss."""
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


def run_times(run_dir, gap_s: float = 600.0, trainings: bool = True) -> dict:
    """The machine time of the run store in ``run_dir`` (``times.json``)."""
    from evo_attention.search.store import RunStore

    with RunStore.open(run_dir, readonly=True) as store:
        records = store.evaluations()
    out = {"run": str(run_dir), "gap_s": gap_s, "roles": store_times(records, gap_s)}
    if trainings:
        out["trainings"] = training_rows(records)
    return out
