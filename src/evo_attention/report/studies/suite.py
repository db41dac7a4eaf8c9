"""Genes on a suite of tasks (``compare --suite``, ``validate --suite``): reads a suite result (``suite`` with
its ``points``, ``baseline`` and ``genes`` rows with their accuracy per point and suite accuracy, the paired
comparison with several seeds) and renders the suite table, ``*_suite.md`` and the rows of the heat map.
"""

from __future__ import annotations

from typing import Mapping

from evo_attention.report.studies.common import (change_text, ci_text, comparison_note, p_text, paired_change_header,
                                                 partial_note, table_markdown, verdict_cell)
from evo_attention.util import stats
from evo_attention.util.format import code, fmt, md_cell


def suite_cell(mean, sd=None, failed: int = 0, digits: int = 3) -> str:
    """A suite table's cell: ``0.512 ± 0.020`` (the sd only with several seeds), ``(1 failed)``."""
    text = fmt(mean, digits) + ("" if sd is None else f" ± {fmt(sd, digits)}")
    return text + (f" ({failed} failed)" if failed else "")


def suite_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of a suite study: per gene (the baseline first) its accuracy on every point and its
    suite accuracy (mean ± sd over the seeds, a failed training counting 0), the interval, and against the
    baseline the paired change, Holm's p and the verdict."""
    labels = [p["label"] for p in result["suite"]["points"]]
    conf = stats.percent(result.get("confidence", 0.95))
    headers = ["Name", "Gene"] + labels + ["Suite accuracy", f"{conf} CI", paired_change_header("suite_accuracy", conf),
                                           f"p (Holm, {result.get('family_size') or 0})", "Verdict"]
    rows = []
    for r in [result["baseline"]] + list(result.get("genes", [])):
        cells = [str(r.get("name", "")), str(r.get("gene", ""))]
        cells += [suite_cell(c.get("mean"), c.get("sd"), c.get("n_failed", 0))
                  for c in (r["points"][label] for label in labels)]
        cells += [suite_cell(r.get("mean"), r.get("sd"), digits=4), ci_text(r.get("ci_low"), r.get("ci_high"), 4)]
        if r is result["baseline"]:
            cells += ["-", "-", "baseline (reference)"]
        elif r.get("verdict") is None:
            cells += ["-", "-", "one seed: no comparison"]
        else:
            cells += [change_text(r, "suite_accuracy"), p_text(r.get("p_holm")), verdict_cell(r)]
        rows.append(cells)
    return headers, rows, "ll" + "r" * (len(labels) + 4) + "l"


def mean_words(suite: Mapping) -> str:
    """How a suite's score averages its points' accuracies."""
    weighted = any(p.get("weight", 1) != 1 for p in suite.get("points") or [])
    return "mean accuracy (weighted by the points' weights below)" if weighted else "mean accuracy"


def suite_points_lines(suite: Mapping) -> list[str]:
    """The points of a suite as markdown bullets: label, data, steps and (where not 1) weight."""
    return [f"- {code(p['label'], False)}: {code(p['data'], False)}, {p.get('steps')} steps"
            + ("" if p.get("weight", 1) == 1 else f", weight {p['weight']:g}") for p in suite["points"]]


def suite_markdown(result: Mapping, figure: str | None = None) -> str:
    """The text of ``compare_suite.md`` / ``validation_suite.md``."""
    suite, seeds = result["suite"], result.get("seeds") or []
    title = "Genes compared on a suite" if result.get("study") == "compare" else "Multi-seed validation on a suite"
    lines = [f"# {title}: {md_cell(suite['name'])}", "", result.get("headline", ""), "",
             f"Every gene and the vanilla baseline were trained on every point of suite {md_cell(suite['name'])} "
             f"({md_cell(suite.get('source') or '')}) with seed{'s' if len(seeds) != 1 else ''} "
             f"{', '.join(map(str, seeds))}, and measured by accuracy over the answer positions on the "
             f"{result.get('eval_split')} split. A gene's suite accuracy is the {mean_words(suite)} over the points on one "
             "seed, a failed training counting 0 on its point; the cells are the mean ± sd over the seeds of the "
             "same accuracies. " + (comparison_note(result) if result.get("family_size") else
                               "With one seed there is no paired comparison."), "",
             table_markdown(*suite_table(result), code_column=1), "",
             *([partial, ""] if (partial := partial_note(result)) else []),
             "The points:", ""] + suite_points_lines(suite) + [""]
    failures = [(r.get("name"), f) for r in [result["baseline"]] + list(result.get("genes", []))
                for f in r.get("failures", [])]
    if failures:
        lines += ["Failed trainings (each scores 0 accuracy on its point):", ""]
        lines += [f"- {md_cell(n)}, point {code(f['point'], False)}, seed {f['seed']}: {f['status']}"
                  + (f" ({md_cell(f['error'])})" if f.get("error") else "") for n, f in failures] + [""]
    if figure:
        lines += [f"![Accuracy per gene and point]({figure})", ""]
    return "\n".join(lines)


def suite_heatmap_rows(result: Mapping) -> tuple[list[str], list[dict]]:
    """The heat map of a suite study: columns (the points, then 'suite'), and per gene (the baseline first) its
    name, and its mean, sd and failures per column."""
    labels = [p["label"] for p in result["suite"]["points"]]
    rows = []
    for r in [result["baseline"]] + list(result.get("genes", [])):
        cells = [r["points"][label] for label in labels]
        rows.append({"name": str(r.get("name") or r.get("str")),
                     "means": [c.get("mean") for c in cells] + [r.get("mean")],
                     "sds": [c.get("sd") for c in cells] + [r.get("sd")],
                     "failed": [c.get("n_failed", 0) for c in cells] + [0]})
    return labels + ["suite"], rows
