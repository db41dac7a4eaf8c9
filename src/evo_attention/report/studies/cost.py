"""What each validated gene costs: reads a validation result (``baseline`` and ``genes`` rows, each
with the ``cost`` medians over its seeds) and renders the cost table, the baseline first and every
gene relative to it. A result written before costs were kept has none: both renderers give None.
"""

from __future__ import annotations

from typing import Mapping

from evo_attention.util.format import code, markdown_table, number


def cost_table(result: Mapping) -> tuple[list[str], list[list[str]], str] | None:
    """(headers, rows, align) of what each validated gene costs (medians over its seeds), or None
    for a result without costs (one written before they were kept)."""
    rows_in = [result.get("baseline") or {}] + list(result.get("genes", []))
    if not any(r.get("cost") for r in rows_in):
        return None
    base = rows_in[0].get("cost") or {}
    columns = {"params": ",.0f", "flops": ".3g", "train_ms_per_step": ".1f", "latency_ms": ".1f"}  # cost -> format
    headers = ["Gene", "Params", "FLOPs / train step", "Train ms / step", "Latency ms"]
    rows = []
    for i, r in enumerate(rows_in):
        cost = r.get("cost") or {}
        cells = [str(r.get("gene", ""))]
        for name, spec in columns.items():
            value, ref = cost.get(name), base.get(name)
            relative = i > 0 and value is not None and ref  # a gene's cost against the baseline's (row 0)
            cells.append(number(value, spec) + (f" ({value / ref:.2f}x)" if relative else ""))
        rows.append(cells)
    return headers, rows, "l" + "r" * (len(headers) - 1)


def cost_markdown(result: Mapping) -> str | None:
    """The cost table of a validation result as markdown; None for a result without costs."""
    costs = cost_table(result)
    if not costs:
        return None
    headers, rows, align = costs
    return markdown_table(headers, [[code(c) if i == 0 else c for i, c in enumerate(row)] for row in rows],
                          align).rstrip() + "\n"
