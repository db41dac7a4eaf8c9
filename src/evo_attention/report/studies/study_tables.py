"""The tables of a registered study (``evo-attention study report``), each rendered from one result file.

A document marks a generated table with the file it comes from and the table it shows::

    <!-- generated: docs/findings3/d4/family.json table=d4-family -->
    | ... the table ... |
    <!-- end generated -->

``blocks`` finds such blocks; ``render`` writes a table from its file's payload. Tables (``TABLES``):

- ``verdicts``: a validation's verdict table; ``suite``: a suite validation's table; ``grid``: a
  validation's learning-rate grid (each gene's mean per rate, the selected rate, edges);
- ``suite-rate``: a rate selected on a grid (``selected.json``: each rate's baseline mean, the selected one);
- ``search-top``: a search's best genes (``final_results.json``: its top 5 and the baseline);
- ``versus``: the genes of one validation against a gene of another, paired by seed;
- ``strategies``: each strategy's validated winner per search seed, then each strategy against the
  reference strategy, paired by search seed (by today's rule for a file without its ``analysis`` mark);
- ``rediscovery``: per feature and strategy the searches whose winner (top 5) holds it, the
  evaluations until the first program holding it, the base rate; where the file has a registered
  rediscovery rule, each search's winner and the rate of searches rediscovering against the bar;
  then each strategy against the reference;
- ``reliability``: each search's rank correlation of search and fresh scores, and the pooled mean;
- ``d4-family``: each cell's gene against its matched model with Holm over the cells (where the
  file has the family), then the trend over tokens per parameter.
"""

from __future__ import annotations

import math
import re

from evo_attention.report.studies.common import lower_is_better, table_markdown, verdict_cell
from evo_attention.report.studies.lr_grid import grid_section
from evo_attention.report.studies.suite import suite_table
from evo_attention.report.studies.validation import current_validation, validation_table_markdown
from evo_attention.util import stats
from evo_attention.util.format import code, markdown_table

BLOCK = re.compile(r"(<!-- generated: (?P<file>\S+) table=(?P<table>[\w-]+) -->\n)(?P<body>.*?)"
                   r"(<!-- end generated -->)", re.S)


def num(value, digits: int = 3) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def p_text(value) -> str:
    if value is None or value != value:  # NaN: the test is undefined
        return "-"
    return f"{value:.1e}" if value < 1e-3 else f"{value:.3f}"


def change_text(c: dict, log: bool = False, digits: int = 3) -> str:
    """A paired comparison's change with its 95% interval ("-" where it has none); a difference of
    logs as the relative change it is (exp(d) - 1, in percent); else in the metric's units."""
    if c["diff_ci_low"] is None:
        return "-"
    if log:
        low, mid, high = (100 * math.expm1(c[k]) for k in ("diff_ci_low", "difference", "diff_ci_high"))
        return f"{mid:+.2f}% [{low:+.2f}, {high:+.2f}]"
    return f"{c['difference']:+.{digits}f} [{c['diff_ci_low']:+.{digits}f}, {c['diff_ci_high']:+.{digits}f}]"


def verdicts(payload: dict) -> str:
    return validation_table_markdown(current_validation(payload))


def grid(payload: dict) -> str:
    lines = grid_section(current_validation(payload), "validation")
    return "\n".join(line for line in lines if line.startswith("|")) + "\n"


def suite(payload: dict) -> str:
    return table_markdown(*suite_table(current_validation(payload)), code_column=1) + "\n"


def suite_rate(payload: dict) -> str:
    """A rate selected on a grid: each rate's baseline mean, the selected one marked."""
    headers = ["Learning rate", "Baseline mean suite accuracy", "Selected"]
    rows = [[r, num(payload["baseline_mean"][r], 4), "**yes**" if r == payload["selected"] else ""]
            for r in payload["rates"]]
    return markdown_table(headers, rows, "lrl")


def search_top(payload: dict) -> str:
    metric = "suite_accuracy" if payload.get("suite") else "perplexity"
    headers = ["Rank", "Gene", "Generation", "Suite accuracy" if metric == "suite_accuracy" else "Perplexity"]
    rows = [[str(i), code(g["gene"]), str(g["generation"]), num(g[metric], 4)]
            for i, g in enumerate(payload["top_5"], start=1)]
    base = payload.get("baseline") or {}
    if base:
        rows.append(["baseline", code(base["gene"]), "-", num(base.get(metric), 4)])
    return markdown_table(headers, rows, "llrr")


def versus(payload: dict) -> str:
    """Each gene of the first file against the reference gene of the second, paired by seed (mean,
    paired change with its interval, test, Holm p, the equivalence test's Holm p, verdict)."""

    def mean(values) -> str:
        kept = [v for v in values if v is not None]
        return num(sum(kept) / len(kept), 4) if kept else "-"

    # the scored split and the metric's name where the file records them
    metric = (f"{payload['eval_split']} {payload['metric_label']}" if payload.get("metric_label") and payload.get("eval_split")
              else (payload.get("metric") or "value").replace("_", " "))
    headers = ["Gene", f"Mean {metric} ({len(payload['seeds'])} seeds)",
               "vs the reference: paired change [95% CI]", "Test", "p (Holm)",
               f"Equivalence p (Holm, margin {payload['margin']:g})", "Verdict"]
    rows = [[code(payload["reference"]), mean(payload["reference_values"]), "reference", "", "", "", ""]] + [
        [code(name), mean(c["values"]), change_text(c, payload.get("log", False)), str(c["test"]),
         p_text(c["p_holm"]), p_text(c["p_tost_holm"]), c["verdict_label"]] for name, c in payload["genes"].items()]
    return markdown_table(headers, rows, "lrrlrrl")


def _reference_first(reference: str, names) -> list[str]:
    return [reference] + sorted(n for n in names if n != reference)


def strategies(payload: dict) -> str:
    names = _reference_first(payload["reference"], payload["searches"])
    headers = ["Search seed"] + [f"{n}: validated winner (mean of its fresh seeds)" for n in names]
    searches = payload["searches"]
    rows = [[str(seed)] + [f"{code(w['gene'])} {w['mean']:.3f}" for w in (searches[n][str(seed)] for n in names)]
            for seed in payload["search_seeds"]]
    first = markdown_table(headers, rows, "l" + "r" * len(names))
    headers = ["Strategy", f"vs {payload['reference']}: paired change [95% CI]", "p (Holm)", "Verdict",
               "Detectable effect"]
    # studies.results.compare_strategies's rule: winners' means paired by search seed, a loss on the log scale
    lower, means = lower_is_better(payload.get("metric")), payload["means"]
    comparisons = stats.current_comparisons(payload, payload["comparisons"], {n: means[n] for n in names[1:]},
                                            means[names[0]], margin=payload["margin"], log=lower,
                                            lower_is_better=lower)
    rows = []
    for n in names[1:]:
        c = comparisons[n]
        log = c.get("relative") is not None  # a linear-scale metric (suite accuracy) has none: units
        if log:
            mde = "-" if c.get("mde_relative") is None else f"{100 * c['mde_relative']:.2f}%"
        else:
            mde = "-" if c.get("mde") is None else f"{c['mde']:.4f}"
        rows.append([n, change_text(c, log, digits=4), p_text(c["p_holm"]), verdict_cell(c), mde])
    return first + "\n" + markdown_table(headers, rows, "lrrlr")


def rediscovery(payload: dict) -> str:
    ref = payload["reference"]
    names = _reference_first(ref, payload["strategies"])
    headers = ["Feature", "Strategy", "Winner holds it", "Rate [95% CI]", "Top 5 holds it",
               "First evaluation holding it: median (range)", "Base rate (generation 0)"]
    rows = []
    for feature in payload["features"]:
        for n in names:
            r = payload["strategies"][n][feature]
            first = ("-" if r["first_evaluation_median"] is None else
                     f"{r['first_evaluation_median']:g} ({r['first_evaluation_range'][0]}-{r['first_evaluation_range'][1]})")
            base = "-" if r["base_rate"] is None else f"{r['base_rate']:.3f}"
            rows.append([feature, n, f"{r['solved']}/{r['n']}", f"{r['rate']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]",
                         f"{r['in_top_5']}/{r['n']}", first, base])
    first_table = markdown_table(headers, rows, "llrrrrr")
    if payload.get("outcome"):
        first_table += "\n" + _rediscovered(payload)
    if not any(payload["comparisons"].values()):
        return first_table
    headers = ["Feature", "Strategy", f"Difference in rate vs {ref}", "p (Fisher)",
               f"p (Holm, {len(payload['features'])})", "p (Barnard, Holm)", "Words"]
    rows = [[feature, n, f"{c['difference']:+.2f}", p_text(c["p_value"]), p_text(c["p_holm"]),
             p_text(c["p_barnard_holm"]), c["words"]]
            for n in names[1:] for feature, c in payload["comparisons"][n].items()]
    return first_table + "\n" + markdown_table(headers, rows, "llrrrrl")


def _rediscovered(payload: dict) -> str:
    """Each search's winner, its validated verdict and whether the registered rule holds; then the
    rate per strategy with its exact interval against the bar."""
    o = payload["outcome"]
    rule = " or ".join("(" + " and ".join(alt) + ")" for alt in o["rule"])
    rows = []
    for s in payload["searches"]:
        v = s.get("validated") or {}
        change = (f"{100 * v['relative']:+.2f}%" if v.get("relative") is not None else
                  "-" if v.get("difference") is None else f"{v['difference']:+.3f}")  # accuracy: in units
        values = [x for x in v.get("values") or [] if x is not None]
        rows.append([str(s.get("seed")), s["strategy"], code(s["winner"] or "-"),
                     ", ".join(f for f, r in s["features"].items() if r["found"]) or "-",
                     f"{v.get('verdict', '-')} vs {v.get('against', '-')} ({change})" if v else "not validated",
                     "-" if not values else f"{min(values):.3f}", "yes" if s.get("rediscovered") else "no"])
    parts = [markdown_table(["Search seed", "Strategy", "Winner", "Holds", "Validated", "Lowest fresh value",
                             "Rediscovered"], rows, "lllllrl")]
    rows = [[n, f"{r['solved']}/{r['n']}", f"{r['rate']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]", f"{o['bar']:g}",
             r["verdict"]] for n, r in o["rates"].items()]
    parts.append(f"Rediscovered: {rule}" + (f" (solves: every fresh value >= {o['solve_at']:g})" if o.get("solve_at")
                                             is not None else "") + ".\n")
    parts.append(markdown_table(["Strategy", "Searches rediscovering", "Rate [95% exact CI]", "Bar", "Against the bar"],
                                rows, "lrrrl"))
    return "\n".join(parts)


def reliability(payload: dict) -> str:
    """Per search: its top genes' search scores against their fresh-seed means and Spearman's rho;
    then the pooled mean with its interval."""
    rows = [[str(r.get("search_seed") or "-"), str(r["genes"]), "-" if r["rho"] is None else f"{r['rho']:+.2f}"]
            for r in payload["searches"]]
    p = payload["pooled"]
    ci = "-" if p["ci_low"] is None else f"[{p['ci_low']:+.2f}, {p['ci_high']:+.2f}]"
    rows.append([f"**pooled ({p['n']} searches)**", "", f"{num(p['mean'], 2)} {ci}"])
    return markdown_table(["Search seed", "Genes", "Spearman rho (search score vs fresh mean)"], rows, "lrr")


def d4_family(payload: dict) -> str:
    """The cells (paired change of the gene against its matched model, exact and t p, Holm over the
    cells, the equivalence test's Holm p, verdict), then the trend: the mean per-seed slope of the
    change (of logs on a log-scale metric: a relative change per doubling, else in units) on log2 of
    tokens per parameter and its tests."""
    parts = []
    if "family" in payload:
        size, m = len(payload["family"]), payload["margin"]
        log = all(c["scale"] == "log" for c in payload["family"].values())  # the cells share one scale
        headers = ["Cell", "Matched FFN", "Pairs", "Paired change [95% CI]", "p (exact)", "p (t)", f"p (Holm, {size})",
                   f"Equivalence p (Holm, ±{f'{100 * m:g}%' if log else f'{m:g}'})", "Verdict"]
        rows = [[name, str(c.get("d_ff") or "-"), str(c["n_pairs"]), change_text(c, log), p_text(c["p_exact"]),
                 p_text(c["p_t"]), p_text(c["p_holm"]), p_text(c["p_tost_holm"]), c["verdict_label"]]
                for name, c in payload["family"].items()]
        parts.append(markdown_table(headers, rows, "lrrrrrrrl"))
    if "trend" in payload:
        t = payload["trend"]
        cells = ", ".join(f"{name} ({level:g})" for name, level in t["cells"].items())
        log = t.get("log", True)  # a trend without it is of a log-scale metric
        per_doubling = ("-" if t["mean_slope"] is None else f"{100 * math.expm1(t['mean_slope']):+.2f}%" if log
                        else f"{t['mean_slope']:+.4f}")
        headers = ["Trend cells (tokens per parameter)", "Seeds",
                   f"Slopes per seed ({'log ' * log}change per doubling)", "Mean slope", "Per doubling",
                   "p (exact sign-flip)", "p (t)", "Words"]
        rows = [[cells, str(len(t["seeds"])), ", ".join(f"{v:+.4f}" for v in t["slopes"]),
                 num(t["mean_slope"], 4), per_doubling, p_text(t["p_exact"]), p_text(t["p_t"]), t["words"]]]
        parts.append(markdown_table(headers, rows, "lrlrrrrl"))
    return "\n".join(parts)


TABLES = {"verdicts": verdicts, "suite": suite, "grid": grid, "suite-rate": suite_rate, "search-top": search_top,
          "versus": versus, "strategies": strategies, "rediscovery": rediscovery, "d4-family": d4_family,
          "reliability": reliability}


def render(table: str, payload: dict) -> str:
    return TABLES[table](payload)


def block(path: str, table: str, body: str) -> str:
    """A generated block: its marker, the table, its end."""
    return f"<!-- generated: {path} table={table} -->\n{body}<!-- end generated -->"
