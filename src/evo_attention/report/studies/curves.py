"""A difficulty curve: reads a curve result (the ``knob`` and its ``values``, per gene its ``points`` with mean
accuracy, interval, the tokens scored and ``breaks_at``, the chance accuracy per point; with a solve threshold the
``solve`` block, per point the solve count and verdict against the reference, per gene its ``solve_break``) and
renders the curve and solve tables, the notes on what their cells mean (a partial evaluation's), and ``curve.md``.
"""

from __future__ import annotations

from typing import Mapping

from evo_attention.report.attachments import CURVE_FIGURE
from evo_attention.report.studies.common import partial_note, table_markdown
from evo_attention.util import stats
from evo_attention.util.format import code, md_cell, number


BREAK_MARK = "↓"  # marks the cell of the value where a gene breaks


def curve_knob_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def curve_cell(row: Mapping, breaks: bool = False) -> str:
    """A gene at one value: mean accuracy ± its interval's half-width, the seeds that finished when some did not,
    ``BREAK_MARK`` where the gene breaks."""
    if row.get("mean") is None:
        return "failed" if row.get("n_failed") else "-"
    text = f"{row['mean']:.3f}" + (f" ± {row['half_width']:.3f}" if row.get("half_width") is not None else "")
    if row.get("n_failed"):
        text += f" ({row.get('n_ok')}/{row.get('n_ok', 0) + row['n_failed']})"
    return f"{BREAK_MARK} {text}" if breaks else text


def curve_breaks_text(gene: Mapping, knob: str) -> str:
    if gene.get("breaks_at") is not None:
        return f"{knob}={curve_knob_text(gene['breaks_at'])}"
    return "holds" if gene.get("holds") else "-"


def _gene_table(result: Mapping, last: str, cell, break_of, last_cell) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of a row per gene (its key in column 1): ``cell(point, breaks)`` per value of the
    knob (``breaks`` at the value ``break_of(gene)``), then the column ``last``, ``last_cell(gene, knob)``."""
    knob, values = result.get("knob", "knob"), result.get("values") or []
    rows = [[str(gene.get("name", "")), str(gene.get("gene", ""))]
            + [cell(row, at is not None and row.get("value") == at) for row in gene.get("points") or []]
            + [last_cell(gene, knob)] for gene in result.get("genes") or [] for at in [break_of(gene)]]
    return (["Configuration", "Gene"] + [f"{knob}={curve_knob_text(v)}" for v in values] + [last], rows,
            "ll" + "r" * len(values) + "l")


def curve_table(result: Mapping) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of a curve: a row per gene, a column per value of the knob, where it breaks; the
    last row is the chance accuracy."""
    headers, rows, align = _gene_table(result, f"Breaks at (mean < {result.get('break_at', 0.5):g})", curve_cell,
                                       lambda gene: gene.get("breaks_at"), curve_breaks_text)
    rows.append(["chance", None] + [number(p.get("chance_accuracy"), ".3f") for p in result.get("points") or []]
                + [""])
    return headers, rows, align


def curve_note(result: Mapping) -> str:
    """What a curve's cells and breakpoints mean."""
    seeds = result.get("seeds") or []
    conf = stats.percent(result.get("confidence", 0.95))
    spread = (f"the mean over {len(seeds)} seeds ± the half-width of its {conf} t interval"
              if len(seeds) > 1 else "one seed (no interval)")
    return (f"Each cell: validation accuracy (the fraction of answers right), {spread}; (k/n) when only k of n seeds "
            f"finished. A gene breaks at the first value, in the order given, where its mean accuracy falls below "
            f"{result.get('break_at', 0.5):g} ({BREAK_MARK} marks that cell); it holds when its mean stays at or "
            "above it at every value. The last row is chance accuracy.")


def solve_cell(row: Mapping, breaks: bool = False) -> str:
    """A gene at one point: solved/n [exact interval], its verdict against the reference (Holm p) when it has one,
    ``BREAK_MARK`` where its solve rate first falls below one half."""
    solve = row.get("solve") or {}
    if not solve.get("n"):
        return "-"
    text = f"{solve['solved']}/{solve['n']} [{solve['ci_low']:.2f}, {solve['ci_high']:.2f}]"
    versus = row.get("solve_versus")
    if versus and versus.get("verdict") != stats.UNDETERMINED:
        named = f" vs {versus['versus']}" if row.get("solve_versus_plain") else ""  # a matched reference: named
        text += f" {versus['verdict']}{named} (Holm p {versus['p_holm']:.3g})"
    return f"{BREAK_MARK} {text}" if breaks else text


def solve_break_text(gene: Mapping, knob: str) -> str:
    """Where a gene's solve rate falls below one half, with its range."""
    found = gene.get("solve_break") or {}
    low, high = (found.get("range") or [None, None])
    span = (f"{knob}={curve_knob_text(low)}" if low is not None else "-") + " .. " + \
        (f"{knob}={curve_knob_text(high)}" if high is not None else "beyond the values")
    if found.get("at") is None:
        return f"holds (could break: {span})" if low is not None else "holds"
    return f"{knob}={curve_knob_text(found['at'])} ({span})"


def solve_table(result: Mapping) -> tuple[list[str], list[list[str]], str] | None:
    """(headers, rows, align) of a curve's solve counts (None without a solve threshold)."""
    solve = result.get("solve")
    if not solve:
        return None
    return _gene_table(result, f"Solve rate < {solve.get('half', 0.5):g} at (range)", solve_cell,
                       lambda gene: (gene.get("solve_break") or {}).get("at"), solve_break_text)


def solve_note(result: Mapping) -> str:
    solve = result.get("solve") or {}
    conf = stats.percent(result.get("confidence", 0.95))
    return (f"A seed solves a point when its accuracy is at least {solve.get('threshold', 0):g}. Each cell: solved "
            f"seeds / finished seeds [the exact (Clopper-Pearson) {conf} interval of the solve rate]; against "
            f"{solve.get('reference')} at the same point by {str(solve.get('test', 'fisher')).capitalize()}'s exact "
            f"test, Holm over {solve.get('family_size')} comparisons (a verdict is shown where the Holm p is below "
            f"{solve.get('alpha', 0.05):g}). A gene's solve rate falls below {solve.get('half', 0.5):g} at the "
            f"first value where it does ({BREAK_MARK}); the range runs from the first value whose interval reaches "
            "below it to the first whose interval lies below it." + (
                f" Parameter-matched: each gene is compared with {solve.get('reference')} widened in its "
                "feed-forward to the gene's parameter count at that point (the rows named by their FFN width, within "
                "0.5%; a gene of the reference's size with the reference itself), and a verdict names the row it used."
                if solve.get("matched") else ""))


def curve_markdown(result: Mapping) -> str:
    """``curve.md``: what was swept and trained, then the table and the figure."""
    m = result.get("model") or {}
    knob, seeds = result.get("knob"), result.get("seeds") or []
    values = ", ".join(curve_knob_text(v) for v in result.get("values") or [])
    lines = [
        f"# Difficulty curve: accuracy against {knob} ({result.get('task')})", "",
        f"Data {code(result.get('base_data'), False)} with {knob} = {values}; {m.get('d_model')}d x "
        f"{m.get('n_layers')} layers x {m.get('n_heads')} heads (FFN {m.get('d_ff')}), {m.get('block', 'gpt2')} "
        f"block; {result.get('steps')} steps of batch {m.get('batch_size')}, lr {number(m.get('learning_rate'), 'g')} "
        f"({m.get('lr_schedule')}); seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}.", "",
        curve_note(result), "", *([partial, ""] if (partial := partial_note(result)) else []),
    ]
    if result.get("interrupted"):
        lines += ["**Interrupted**: the cells without a result did not finish; run the same command again to "
                  "resume.", ""]
    lines += [curve_table_markdown(result).rstrip(), ""]
    solved = solve_table(result)
    if solved:
        lines += ["## Solve rates", "", solve_note(result), "", table_markdown(*solved, code_column=1), ""]
    rates = rate_table(result)
    if rates:
        lines += ["## Learning rates", "", rate_note(result), "", table_markdown(*rates, code_column=1), ""]
    lines += [f"![accuracy against {knob}]({CURVE_FIGURE})", ""]
    return "\n".join(lines)


def rate_table(result: Mapping):
    """(headers, rows, align) of each gene's selected rate per point (``*``: an end of the grid), or None."""
    grids = result.get("grids")
    if not grids:
        return None
    knob = result.get("knob")
    headers = ["gene", "key"] + [f"{knob}={curve_knob_text(g['value'])}" for g in grids]
    rows = []
    for gene in result.get("genes") or []:
        cells = []
        for grid in grids:
            row = (grid.get("genes") or {}).get(gene["gene"])
            cells.append("-" if row is None else f"{row['selected']:g}" + ("*" if row.get("at_edge") else ""))
        rows.append([gene["name"], gene["gene"], *cells])
    return headers, rows, ["l", "l"] + ["r"] * len(grids)


def rate_note(result: Mapping) -> str:
    """What the rate table shows."""
    grids = result.get("grids") or [{}]
    rates = ", ".join(f"{r:g}" for r in grids[0].get("rates") or [])
    seeds = ", ".join(str(s) for s in grids[0].get("tuning_seeds") or [])
    return (f"Each gene at each point trained at its best rate of {rates}, chosen by mean accuracy on the validation "
            f"split over the tuning seeds {seeds} (never a curve seed); `*`: an end of the grid, which should then "
            "be widened.")


def curve_table_markdown(result: Mapping) -> str:
    """A curve's table as ``curve.md`` (and the docs) show it."""
    return table_markdown(*curve_table(result), code_column=1) + "\n"
