"""A study's learning-rate grid: reads the ``grid`` block of a validation, ablation, transfer or compare result
(``rates``, the tuning and verdict seeds, per gene its ``curve``, ``selected`` rate and ``at_edge``; a ladder's
holds one per size under ``sizes``) and renders its markdown section, the per-gene rate column of the study
tables, the figure's file name, and the warning for a gene whose best rate is an end of the grid.
"""

from __future__ import annotations

from typing import Mapping

from evo_attention.report.attachments import output_stem
from evo_attention.report.studies.common import digits_for
from evo_attention.util.format import code, fmt, markdown_table, md_cell


GRID_SENTENCE = ("Each gene and the baseline were trained at their own learning rate, the best of a grid on tuning "
                 "seeds of their own (see \"Each gene at its own best learning rate\" below).")
WIDEN = "the grid should be widened"


def grid_figure_name(kind: str, eval_split: str = "valid") -> str:
    """The figure of a study's learning-rate grid: ``validation_lr_grid.png`` (``KIND[_test]_lr_grid.png``)."""
    return f"{output_stem(kind, eval_split)}_lr_grid.png"


def grid_rate_cell(rate) -> str:
    return "-" if rate is None else f"{rate:g}"


def grid_rates(result: Mapping, size: str | None = None) -> dict:
    """Gene key -> the rate it was measured at (at ``size`` for a ladder); empty without a grid."""
    grid = result.get("grid") or {}
    if "sizes" in grid:
        grid = next((s for s in grid["sizes"] if s.get("size") == size), {})
    return {key: row.get("selected") for key, row in (grid.get("genes") or {}).items()}


def edge_warnings(genes: Mapping[str, Mapping], rates, names: Mapping[str, str] | None = None,
                  where: str = "") -> list[str]:
    """A sentence per gene whose selected rate is an end of the grid: the grid should be widened."""
    names = names or {}
    out = []
    for key, row in genes.items():
        if not row.get("at_edge"):
            continue
        end = "smallest" if row.get("selected") == min(rates) else "largest"
        name = names.get(key) or ("the baseline" if row.get("baseline") else None)  # a name, else the key alone
        who = f"{name} (`{key}`)" if name else f"`{key}`"
        out.append(f"the best rate of {who}{where} is the grid's {end}, {grid_rate_cell(row.get('selected'))}: "
                   f"{WIDEN}")
    return out


def _grid_order(genes: Mapping[str, Mapping]) -> list[tuple[str, Mapping]]:
    return sorted(genes.items(), key=lambda item: not item[1].get("baseline"))  # the baseline first


def _grid_label(key: str, row: Mapping, names: Mapping[str, str] | None) -> str:
    return (names or {}).get(key) or ("baseline" if row.get("baseline") else "")


def grid_table(genes: Mapping[str, Mapping], rates, metric: str,
               names: Mapping[str, str] | None = None) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, align) of a grid: per gene (the baseline first) its mean at every rate (with the failed
    tuning seeds), the selected rate and whether it is an end of the grid."""
    d = digits_for(metric)
    headers = ["Gene"] + [f"lr {r:g}" for r in rates] + ["Selected", "At an edge"]
    rows = [[f"{label}: {key}" if label else key]
            + [fmt(point.get("mean"), d) + (f" ({point['n_failed']} failed)" if point.get("n_failed") else "")
               for point in row.get("curve") or []]
            + [grid_rate_cell(row.get("selected")), "yes" if row.get("at_edge") else "no"]
            for key, row in _grid_order(genes) for label in [_grid_label(key, row, names)]]
    return headers, rows, "l" + "r" * (len(rates) + 1) + "l"


def grid_section(result: Mapping, kind: str, names: Mapping[str, str] | None = None) -> list[str]:
    """The markdown of a result's learning-rate grid (nothing without one): how the rates were chosen, each
    gene's curve and rate (per size for a ladder), a warning per edge winner, and the figure."""
    grid = result.get("grid")
    if not grid:
        return []
    rates, tuning, verdict = grid.get("rates") or [], grid.get("tuning_seeds") or [], grid.get("verdict_seeds") or []
    label = grid.get("metric_label", result.get("metric_label", "perplexity"))
    split = result.get("eval_split", "valid")
    measured = "the validation split" if split == "valid" else f"the {split} split"
    lines = [
        "## Each gene at its own best learning rate", "",
        f"Every gene, the baseline included, was trained at each rate of the grid "
        f"{', '.join(f'{r:g}' for r in rates)} with the tuning seeds {', '.join(map(str, tuning))} and measured on "
        f"the validation split. Its rate is the one with the best mean {label} over the tuning seeds, among the "
        f"rates at which every tuning seed finished (ties: the smaller rate). The comparisons above are measured at the selected rates with the seeds "
        f"{', '.join(map(str, verdict))}, disjoint from the tuning seeds, on {measured}; each gene is paired by "
        f"seed with the baseline at the baseline's own rate.", "",
    ]
    blocks = [(str(s["size"]), s["genes"]) for s in grid["sizes"]] if "sizes" in grid else [(None, grid["genes"])]
    warnings = []
    for size, genes in blocks:
        headers, rows, align = grid_table(genes, rates, grid.get("metric", ""), names)
        if size is not None:
            lines += [f"### {size}", ""]
        firsts = [(f"{md_cell(_grid_label(k, g, names))}: " if _grid_label(k, g, names) else "") + code(k)
                  for k, g in _grid_order(genes)]
        md_rows = [[first] + [md_cell(c) for c in row[1:]] for first, row in zip(firsts, rows)]
        lines += [markdown_table(headers, md_rows, align).rstrip(), ""]
        warnings += edge_warnings(genes, rates, names, "" if size is None else f" at {size}")
    lines += [f"- **Warning:** {w}." for w in warnings] + ([""] if warnings else [])  # not in a table: pipes stay
    lines += [f"![Learning-rate grid]({grid_figure_name(kind, split)})", ""]
    return lines
