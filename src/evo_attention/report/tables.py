"""The run's CSV files and ``component_analysis.md``: the rows come from ``RunSummary``, the component table is
``markdown.components_table`` (the reports'). Files are written atomically, so no reader sees half a file.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Sequence

from evo_attention.report.markdown import components_table
from evo_attention.report.summary import RunSummary
from evo_attention.util.files import write_text
from evo_attention.util.format import csv_cell

COMPONENT_COLUMNS = ("field", "option", "n_ok", "n_failed", "best_perplexity", "mean_perplexity", "in_top")


def write_csv(path: str | os.PathLike, columns: Sequence[str], rows: Sequence[dict],
              header: Sequence[str] | None = None) -> Path:
    """Write ``rows`` (dicts) as CSV with ``columns``, under ``header`` names if given."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header or columns)
    for row in rows:
        writer.writerow([csv_cell(row.get(c)) for c in columns])
    return write_text(path, buffer.getvalue())


def write_component_csv(summary: RunSummary, path: str | os.PathLike) -> Path:
    """``component_analysis.csv``: one row per (gene field, option)."""
    return write_csv(path, COMPONENT_COLUMNS, summary.components,
                     header=[c if c != "in_top" else f"in_top_{summary.top_n}" for c in COMPONENT_COLUMNS])


def component_markdown(summary: RunSummary) -> str:
    """The text of ``component_analysis.md``."""
    intro = (f"For each gene field and each option that occurred in the search: how many evaluations "
             f"finished (OK runs) or failed, the best and mean validation perplexity of the finished "
             f"ones, and how many of the best {summary.top_n} distinct genes use the option. "
             f"Lower perplexity is better.\n")
    if not summary.components:
        return f"# Component analysis\n\n{intro}\n{summary.statement} Nothing to analyse.\n"
    note = "" if summary.outcome == "ok" else f"{summary.statement}\n\n"
    return f"# Component analysis\n\n{intro}\n{note}{components_table(summary)}\n"
