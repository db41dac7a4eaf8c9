"""CSV and markdown table writers, and atomic file writing for every report output.

Thin: the rows come from ``RunSummary``; this module only formats cells. Files are written to a
temporary name and renamed into place, so a reader never sees a half-written report.
"""

from __future__ import annotations

import csv
import io
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from .summary import EVALUATION_COLUMNS, RunSummary

COMPONENT_COLUMNS = ("field", "option", "n_ok", "n_failed", "best_perplexity", "mean_perplexity", "in_top")


# -- files --------------------------------------------------------------------------------------
@contextmanager
def atomic_target(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` in one step."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically."""
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8", newline="\n")
    return Path(path)


# -- cells --------------------------------------------------------------------------------------
def csv_cell(value: Any) -> str:
    """A CSV cell: empty for None/NaN/inf, ``true``/``false`` for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    return str(value)


def fmt(value: Any, digits: int = 2) -> str:
    """A human-readable number: fixed ``digits`` for floats, thousands separators for ints."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def md_cell(value: Any) -> str:
    """Text safe inside a markdown table cell (pipes escaped, one line)."""
    text = str(value).replace("\r", " ").replace("\n", " ").strip()
    return text.replace("|", "\\|")


def code(text: Any) -> str:
    """Inline code for a markdown table cell (a gene key)."""
    return f"`{md_cell(text)}`" if text is not None else "-"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                   align: str | None = None) -> str:
    """A GitHub-flavoured markdown table. Cells are used as given (format and escape them with
    ``fmt``/``md_cell``/``code``); ``align`` is one character per column, ``l`` or ``r``."""
    align = align or "l" * len(headers)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- CSV ----------------------------------------------------------------------------------------
def write_csv(path: str | os.PathLike, columns: Sequence[str], rows: Sequence[dict],
              header: Sequence[str] | None = None) -> Path:
    """Write ``rows`` (dicts) as CSV with ``columns``, under ``header`` names if given."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header or columns)
    for row in rows:
        writer.writerow([csv_cell(row.get(c)) for c in columns])
    return write_text(path, buffer.getvalue())


def write_evaluations_csv(summary: RunSummary, path: str | os.PathLike) -> Path:
    """``evaluations.csv``: one row per stored evaluation, every role."""
    return write_csv(path, EVALUATION_COLUMNS, summary.evaluation_rows())


def _component_header(summary: RunSummary) -> list[str]:
    return [c if c != "in_top" else f"in_top_{summary.top_n}" for c in COMPONENT_COLUMNS]


def write_component_csv(summary: RunSummary, path: str | os.PathLike) -> Path:
    """``component_analysis.csv``: one row per (gene field, option)."""
    return write_csv(path, COMPONENT_COLUMNS, summary.components, header=_component_header(summary))


def component_table(summary: RunSummary) -> str:
    """The component analysis as a markdown table (empty string when nothing was evaluated)."""
    if not summary.components:
        return ""
    headers = ["Field", "Option", "OK runs", "Failed", "Best ppl", "Mean ppl", f"In top {summary.top_n}"]
    rows = [[md_cell(r["field"]), code(r["option"]), fmt(r["n_ok"]), fmt(r["n_failed"]),
             fmt(r["best_perplexity"]), fmt(r["mean_perplexity"]), fmt(r["in_top"])]
            for r in summary.components]
    return markdown_table(headers, rows, "llrrrrr")


def component_markdown(summary: RunSummary) -> str:
    """The text of ``component_analysis.md``."""
    intro = (f"For each gene field and each option that occurred in the search: how many evaluations "
             f"finished (OK runs) or failed, the best and mean validation perplexity of the finished "
             f"ones, and how many of the best {summary.top_n} distinct genes use the option. "
             f"Lower perplexity is better.\n")
    table = component_table(summary)
    if not table:
        return f"# Component analysis\n\n{intro}\n{summary.statement} Nothing to analyse.\n"
    note = "" if summary.outcome == "ok" else f"{summary.statement}\n\n"
    return f"# Component analysis\n\n{intro}\n{note}{table}"


def write_component_markdown(summary: RunSummary, path: str | os.PathLike) -> Path:
    return write_text(path, component_markdown(summary))
